"""New primaries after failovers, with the real runtime: etcd, a broker, and `gazette-consumer`
processes of the counter application (tests/consumer/counter_app.py, RocksDB over fusefs).

What a new primary leaves behind, on every path to PRIMARY (the first assignment, and a hot
standby promoted after its primary's SIGKILL): backup hints of the state it recovered, written
as upstream's consumers write them; and a Sequencer restored from a checkpoint taken mid-stream
that goes on over committed-only input without taking any of it for a transaction span."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import gazette.consumer.replica as replica_mod
from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.hints import load_hints
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.consumer.replica import ReplicaContext, ShardReplica
from gazette.keyspace.etcd import Etcd
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.publisher import Publisher
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.testing.etcd import EtcdServer
from tests.consumer.counter_app import Add
from tests.consumer.support import (
    Setup,
    apply_shards,
    caught_up,
    check_totals,
    primary_of,
    until_primary,
    until_ready,
)

HINT_INTERVAL = 600
"""Seconds between primary hints writes: longer than the test, so none is due."""


async def feed_committed(
    client: JournalClient, journal: str, stop: asyncio.Event, expected: dict[str, int]
) -> None:
    """Publish committed Adds (OUTSIDE_TXN only), a few at a time, until `stop`; `expected`
    sums what was acknowledged."""
    async with AppendService(client) as svc:
        pub = Publisher(svc)
        mapping = lambda _m: (journal, CONTENT_TYPE_JSON_LINES)  # noqa: E731
        i = 0
        while not stop.is_set():
            for _ in range(5):
                key = f"k{i % 7}"
                pub.publish_committed(mapping, Add(key, i))
                await pub.barrier()
                expected[key] = expected.get(key, 0) + i
                i += 1
            await asyncio.sleep(0.05)  # Paces the load.


async def hints_of(
    stub: pb_grpc.ShardStub,
) -> tuple[rpb.FSMHints | None, list[rpb.FSMHints | None]]:
    """The shard's primary hints and its backup slots (None where none is stored)."""
    resp = await stub.GetHints(pb.GetHintsRequest(shard="shard-000"))
    assert resp.status == pb.OK, resp
    primary = resp.primary_hints.hints if resp.primary_hints.HasField("hints") else None
    return primary, [b.hints if b.HasField("hints") else None for b in resp.backup_hints]


async def test_new_primaries_write_backup_hints_and_resume_committed_input_cleanly(
    new_setup: Callable[..., Setup], client: JournalClient
) -> None:
    """Two processes start together (the standby loads hints before any exist); the shard
    commits one message per transaction (max_txn_duration 1 ns: every checkpoint is taken
    right after a committed message); its primary is SIGKILLed mid-stream twice.

    - Each new primary writes the hints of the state it recovered as ``backup.0``, shifting
      the older backups, before it reports PRIMARY, as upstream's consumers do: the first
      primary (of an empty log), and each promoted standby, whatever hints it started from
      (none; then ``backup.0``). Primary hints wait for the hints interval, as upstream's.
    - Each new primary reads on from its predecessor's last checkpoint without the
      Sequencer reporting a discarded span, and the totals stay exact."""
    s = new_setup()
    await s.create_journals(client)
    spec = s.shard_specs(hot_standbys=1)[0]
    spec.max_txn_duration.FromNanoseconds(1)
    recovery_log = f"{s.prefix}/recovery/shard-000"
    procs = s.start(2, hint_interval=HINT_INTERVAL)
    both = [pb.ReplicaStatus.STANDBY, pb.ReplicaStatus.PRIMARY]
    async with s.stubs() as stubs:
        stub = stubs["consumer-0"]
        await apply_shards(stub, [spec])
        await until_ready(stub, both, "a primary and a standby")

        primary, backups = await hints_of(stub)
        assert primary is None  # Not before the hints interval.
        assert len(backups) == spec.hint_backups == 2
        first = backups[0]
        assert first is not None, "the first primary wrote no backup hints"
        assert first.log == recovery_log
        assert backups[1] is None

        expected: dict[str, int] = {}
        stop = asyncio.Event()
        feeder = asyncio.create_task(feed_committed(client, s.inputs[0], stop, expected))
        previous = first
        for _ in range(2):
            await asyncio.sleep(1.5)  # The primary commits transactions until it is killed.
            victim = await primary_of(stub, "shard-000")
            survivor = next(k for k in procs if k != victim)
            procs[victim].kill()
            await until_primary(stubs[survivor], survivor, "the standby's promotion")
            await until_ready(stubs[survivor], [pb.ReplicaStatus.PRIMARY], "PRIMARY")
            primary, backups = await hints_of(stubs[survivor])
            assert primary is None
            recovered = backups[0]
            assert recovered is not None and recovered.log == recovery_log
            assert recovered.live_nodes, "backup hints of the promoted standby have no files"
            assert recovered != previous
            assert backups[1] == previous  # Shifted along.
            previous = recovered
            procs[victim].start()
            await until_ready(stubs[survivor], both, "a new standby")
            assert not feeder.done()
        # The last primary reads on.
        await caught_up(client, stubs[await primary_of(stub, "shard-000")], s.inputs[0])
        stop.set()
        await feeder
        await check_totals(client, stubs[await primary_of(stub, "shard-000")], s, expected)

    logs = b"".join(p.log_path.read_bytes() for p in procs.values())
    assert b"span discarded" not in logs
    assert b"level=ERROR logger=message.sequencer" not in logs


@dataclass
class AssignmentKV:
    """The fields of an assignment's KeyValue that hints writes are guarded on."""

    key: str
    create_revision: int


async def test_recovered_hints_are_retried_until_they_are_stored(
    etcd_server: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storing a new primary's recovered hints fails while its assignment guard does not
    hold (here: a stale assignment, as while the runtime has not yet seen the new one): it
    is retried, not given up, and the hints are stored once the guard holds."""
    monkeypatch.setattr(replica_mod, "RECOVERED_HINTS_RETRY", 0.01)
    root = f"/test-failover/{os.getpid()}-{tmp_path.name}"
    akey = f"{root}/assign/shard-000#z0#consumer-0#0"
    hints = rpb.FSMHints(log=f"{root}/recovery/shard-000")
    async with Etcd(etcd_server.endpoint) as etcd:
        await etcd.put(akey.encode(), b"")
        created = int((await etcd.get(akey.encode())).kvs[0].create_revision)
        ctx = ReplicaContext(
            app=None,  # type: ignore[arg-type]
            etcd=etcd,
            client=None,  # type: ignore[arg-type]
            broker_endpoint="",
            workdir=tmp_path,
            root=root,
            status_changed=lambda: None,
        )
        spec = pb.ShardSpec(id="shard-000", hint_prefix=f"{root}/hints", hint_backups=2)
        replica = ShardReplica(ctx, spec, AssignmentKV(akey, created + 1000))
        storing = asyncio.create_task(replica._store_recovered_hints(hints))
        try:
            await asyncio.sleep(0.3)  # Retries, every 0.01 s, that fail.
            assert not storing.done()
            assert await load_hints(etcd, spec.hint_prefix, spec.id, backups=2) == [None] * 3
            replica.shard.assignment = AssignmentKV(akey, created)
            await asyncio.wait_for(storing, 10)
        finally:
            storing.cancel()
        assert await load_hints(etcd, spec.hint_prefix, spec.id, backups=2) == [None, hints, None]
