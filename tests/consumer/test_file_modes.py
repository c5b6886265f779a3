"""Real `gazette-consumer` processes keep their shards' state private to their user: the
RocksDB store's files (made by RocksDB through the fusefs mount, and the fusefs process's
backing files), its info LOG, a hot standby's playback of the recovery log and the
processes' logs are 0600 files in 0700 directories, even when the consumers are started with
a umask that lets others read (docs/file-modes.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc.aio
import pytest

from gazette.broker.client import JournalClient
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from tests.consumer.support import (
    Setup,
    apply_shards,
    feed,
    primary_of,
    stat_through,
    until_ready,
    write_head,
)
from tests.file_modes import entries, not_private, open_umask

ROCKSDB = "tests.consumer.counter_app:Counter"
SQLITE = "tests.consumer.spark.apps:SQLiteCounter"


@pytest.mark.parametrize("app", [ROCKSDB, SQLITE])
async def test_consumer_stores_and_playbacks_are_private(
    app: str, new_setup: Callable[..., Setup], client: JournalClient
) -> None:
    await _check_private(new_setup(), client, app)


async def _check_private(s: Setup, client: JournalClient, app: str) -> None:
    await s.create_journals(client)
    procs = [s.consumer(0), s.consumer(1)]
    with open_umask():
        for proc in procs:
            proc.app = app  # The counter of the same input, over this store.
            proc.start()
    async with grpc.aio.insecure_channel(procs[0].endpoint) as channel:
        stub = pb_grpc.ShardStub(channel)
        await apply_shards(stub, s.shard_specs(hot_standbys=1))
        both = [pb.ReplicaStatus.STANDBY, pb.ReplicaStatus.PRIMARY]
        await until_ready(stub, both, "a primary and a standby")
        stop = asyncio.Event()
        feeder = asyncio.create_task(feed(client, s.inputs[0], stop, {}))
        await asyncio.sleep(1.0)  # The shard processes input: both stores make their files.
        stop.set()
        await feeder
        await stat_through(stub, "shard-000", s.inputs[0], await write_head(client, s.inputs[0]))
        primary = await primary_of(stub, "shard-000")

        found = {}
        for proc in procs:
            found.update(entries(proc.workdir))
        names = sorted(str(p.relative_to(s.tmp)) for p in found)
        assert sum(1 for p in found if p.name == "consumer.log") == 2, names
        standby = next(p for p in procs if p.suffix != primary)
        assert any(p.is_file() for p in entries(standby.workdir / "shards")), "no playback"
        if app == ROCKSDB:
            # The primary's files, seen through the mount and in the backing directory.
            assert sum(1 for p in found if p.name == "CURRENT") >= 2, names
            assert any(p.name.endswith(".mnt") for p in found), names
            assert any(p.parent.name.endswith(".info-log") for p in found), names
        else:
            made = {p.name for p in found}
            assert {"primary.db", "primary.db-wal", "primary.db-shm"} <= made, names
        assert not_private(found) == {}
