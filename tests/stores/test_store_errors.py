"""Every recorded store fails the same way: once a newer primary's hand-off fences its
recovery log, its next commit raises `StoreFailed` (from what failed it, which the runtime
reads as a fenced recording) and every later commit and write raises `StoreFailed` too, while
the new primary commits on. One table of stores, real brokers and (for RocksDB) a real
fusefs mount. SQLStore records no log: its fence is its own (tests/stores/sqlstore)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer import StoreFailed
from gazette.consumer.store import fenced_by, recording_fenced
from gazette.stores.jsonfile import JSONFileStore
from gazette.stores.rocksdb import RocksDBStore
from gazette.stores.sqlite import SQLiteStore
from gazette.testing.broker import BrokerProcess
from tests.fusefs.support import MakeLog, client, fuse_broker, make_log, no_stale_mounts
from tests.stores.checkpoints import labeled
from tests.stores.recovery import recovered_log

__all__ = ["client", "fuse_broker", "make_log", "no_stale_mounts"]  # Fixtures used here.

A, B = 0xA11CE, 0xB0B


@pytest.fixture
async def service(client: JournalClient) -> AsyncIterator[AppendService]:
    async with AppendService(client) as svc:
        yield svc


@dataclass(frozen=True)
class Cluster:
    client: JournalClient
    service: AppendService
    endpoint: str


@dataclass(frozen=True)
class Kind:
    """How a test opens a store of one kind, as log `log`'s primary `author` in `directory`,
    and writes `value` into its current transaction."""

    open: Callable[[Cluster, str, Path, int], Awaitable[Any]]
    write: Callable[[Any, bytes], Awaitable[None]]


async def _open_rocksdb(cluster: Cluster, log: str, directory: Path, author: int) -> Any:
    return await RocksDBStore.open(cluster.endpoint, log, directory, author=author)


async def _write_rocksdb(store: RocksDBStore, value: bytes) -> None:
    store.put(b"\x01k", value)


def _open_sqlite(on_loop: bool) -> Callable[[Cluster, str, Path, int], Awaitable[Any]]:
    async def open_(cluster: Cluster, log: str, directory: Path, author: int) -> Any:
        recovered = await recovered_log(
            cluster.client, cluster.service, cluster.endpoint, log, directory, author
        )
        schema = "CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v BLOB)"
        return await SQLiteStore.from_recovered(recovered, bootstrap_sql=schema, on_loop=on_loop)

    return open_


async def _write_sqlite(store: SQLiteStore, value: bytes) -> None:
    await store.transact(lambda c: c.execute("INSERT OR REPLACE INTO kv VALUES ('k', ?)", (value,)))


async def _open_json(cluster: Cluster, log: str, directory: Path, author: int) -> Any:
    recovered = await recovered_log(
        cluster.client, cluster.service, cluster.endpoint, log, directory, author
    )
    return await JSONFileStore.open(recovered)


async def _write_json(store: JSONFileStore, value: bytes) -> None:
    store.state["k"] = value.decode()


KINDS = {
    "rocksdb": Kind(_open_rocksdb, _write_rocksdb),
    "sqlite-thread": Kind(_open_sqlite(on_loop=False), _write_sqlite),
    "sqlite-on_loop": Kind(_open_sqlite(on_loop=True), _write_sqlite),
    "jsonfile": Kind(_open_json, _write_json),
}


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
async def test_a_fenced_store_raises_store_failed_from_then_on(
    kind: Kind,
    client: JournalClient,
    service: AppendService,
    fuse_broker: BrokerProcess,
    make_log: MakeLog,
    no_stale_mounts: Path,
) -> None:
    cluster = Cluster(client, service, fuse_broker.endpoint)
    log = await make_log("errors")
    old = await kind.open(cluster, log, no_stale_mounts / "old", A)
    try:
        await kind.write(old, b"one")
        await old.start_commit(None, labeled("one"), [])
        new = await kind.open(cluster, log, no_stale_mounts / "new", B)  # Fences author A.
        try:
            await kind.write(old, b"zombie")
            with pytest.raises(StoreFailed) as failed:
                await old.start_commit(None, labeled("zombie"), [])
            assert failed.value.__cause__ is not None
            # What the runtime asks to hand the shard over rather than fail it.
            assert fenced_by(failed.value) or await recording_fenced(old)

            with pytest.raises(StoreFailed):
                await old.start_commit(None, labeled("later"), [])
            with pytest.raises(StoreFailed):
                await kind.write(old, b"later")  # (JSON: a commit, the state is a dict.)
                await old.start_commit(None, labeled("later still"), [])

            assert await new.restore_checkpoint(None) == labeled("one")
            await kind.write(new, b"two")
            await new.start_commit(None, labeled("two"), [])
        finally:
            await new.close()
    finally:
        old.destroy()
