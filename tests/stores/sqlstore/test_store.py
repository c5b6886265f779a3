"""SQLStore against a real PostgreSQL server and a sqlite3 file: application rows and the
checkpoint commit atomically; failed dependencies roll back; a newer instance of a shard
fences the older one's commits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from gazette.consumer import StoreFailed
from gazette.consumer.protocol import pb
from gazette.stores.sqlstore import DIALECTS, Fenced, SQLStore
from tests.stores.sqlstore.conftest import Backend

SHARD = "examples/shard-000"


@dataclass
class FakeShard:
    """What the store reads of a shard: its fully-qualified name."""

    fqn: str


def _checkpoint(n: int) -> pb.Checkpoint:
    cp = pb.Checkpoint()
    cp.sources["examples/input"].read_through = 100 * n
    cp.ack_intents["examples/output"] = bytes([0, n, 255])
    return cp


def _create(cur: Any) -> None:
    cur.execute("CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")


def _upsert(store: SQLStore, rows: list[tuple[int, str]]) -> Any:
    def fn(cur: Any) -> None:
        for k, v in rows:
            cur.execute(store.sql("DELETE FROM kv WHERE k = ?"), (k,))
            cur.execute(store.sql("INSERT INTO kv (k, v) VALUES (?, ?)"), (k, v))

    return fn


def _outside(backend: Backend) -> tuple[list[tuple[Any, ...]], tuple[int, bytes] | None]:
    """The committed rows of kv and the shard's (fence, checkpoint), read by another
    connection."""
    conn = backend.connect()
    try:
        cur = conn.cursor()
        try:
            cur.execute("SELECT k, v FROM kv ORDER BY k")
            rows = [tuple(r) for r in cur.fetchall()]
        except Exception:
            conn.rollback()
            rows = []
            cur = conn.cursor()
        ph = "?" if backend.name == "sqlite" else "%s"
        cur.execute(
            f"SELECT fence, checkpoint FROM gazette_checkpoints WHERE shard_fqn = {ph}", (SHARD,)
        )
        row = cur.fetchone()
        conn.rollback()
        return rows, (int(row[0]), bytes(row[1])) if row is not None else None
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def opened(backend: Backend, **kwargs: Any) -> AsyncIterator[SQLStore]:
    store = await SQLStore.open(backend.connect, **kwargs)
    try:
        yield store
    finally:
        store.destroy()


async def test_rows_and_checkpoint_commit_atomically(backend: Backend) -> None:
    async with opened(backend, shard_fqn=SHARD) as store:
        assert store.dialect is DIALECTS[backend.name]
        assert await store.restore_checkpoint(None) == pb.Checkpoint()
        assert store.fence == 1
        await store.transact(_create)
        await store.transact(_upsert(store, [(1, "one"), (2, "two")]))
        await store.start_commit(None, _checkpoint(1), [])
        cp1 = _checkpoint(1).SerializeToString(deterministic=True)
        assert _outside(backend) == ([(1, "one"), (2, "two")], (1, cp1))

        # The next transaction is not visible until it commits.
        await store.transact(_upsert(store, [(2, "deux"), (3, "three")]))
        assert _outside(backend) == ([(1, "one"), (2, "two")], (1, cp1))
        await store.start_commit(None, _checkpoint(2), [])
        cp2 = _checkpoint(2).SerializeToString(deterministic=True)
        assert _outside(backend) == ([(1, "one"), (2, "deux"), (3, "three")], (1, cp2))

        # Uncommitted work of a destroyed store is rolled back.
        await store.transact(_upsert(store, [(4, "lost")]))

    async with opened(backend) as store:
        assert await store.restore_checkpoint(FakeShard(SHARD)) == _checkpoint(2)
        assert store.fence == 2
        assert store.shard_fqn == SHARD
        rows = await store.transact(lambda cur: (cur.execute("SELECT k FROM kv"), cur.fetchall()))
        assert sorted(r[0] for r in rows[1]) == [1, 2, 3]


class DependencyError(Exception):
    pass


async def test_failed_dependency_rolls_back(backend: Backend) -> None:
    async with opened(backend, shard_fqn=SHARD) as store:
        await store.restore_checkpoint(None)
        await store.transact(_create)
        await store.transact(_upsert(store, [(1, "one")]))
        await store.start_commit(None, _checkpoint(1), [])

        async def failing_append() -> None:
            # Fails a moment later, while the commit waits on it.
            await asyncio.sleep(0.01)
            raise DependencyError("append failed")

        await store.transact(_upsert(store, [(1, "uno"), (2, "dos")]))
        with pytest.raises(StoreFailed) as raised:
            await store.start_commit(None, _checkpoint(2), [failing_append()])
        assert isinstance(raised.value.__cause__, DependencyError)
        cp1 = _checkpoint(1).SerializeToString(deterministic=True)
        assert _outside(backend) == ([(1, "one")], (1, cp1))
        with pytest.raises(StoreFailed):
            store.start_commit(None, _checkpoint(3), [])
        with pytest.raises(StoreFailed):
            await store.transact(_create)


async def test_commit_waits_and_later_work_is_the_next_transaction(backend: Backend) -> None:
    async with opened(backend, shard_fqn=SHARD) as store:
        await store.restore_checkpoint(None)
        await store.transact(_create)
        await store.transact(_upsert(store, [(1, "one")]))
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        commit = store.start_commit(None, _checkpoint(1), [gate])
        # Submitted after start_commit: the next transaction, whenever it runs.
        later = asyncio.ensure_future(store.transact(_upsert(store, [(2, "two")])))
        await asyncio.sleep(0.05)
        assert not commit.done() and not later.done()
        assert _outside(backend)[1] == (1, b"")
        gate.set_result(None)
        await commit
        await later
        cp1 = _checkpoint(1).SerializeToString(deterministic=True)
        assert _outside(backend) == ([(1, "one")], (1, cp1))
        await store.start_commit(None, _checkpoint(2), [])
        assert _outside(backend)[0] == [(1, "one"), (2, "two")]


async def test_newer_instance_fences_older_commits(backend: Backend) -> None:
    async with opened(backend, shard_fqn=SHARD) as a, opened(backend, shard_fqn=SHARD) as b:
        assert await a.restore_checkpoint(None) == pb.Checkpoint()
        await a.transact(_create)
        await a.transact(_upsert(a, [(1, "a-1")]))
        await a.start_commit(None, _checkpoint(1), [])

        # B takes the shard over: its restore increments the fence.
        assert await b.restore_checkpoint(None) == _checkpoint(1)
        assert (a.fence, b.fence) == (1, 2)

        await a.transact(_upsert(a, [(1, "zombie"), (2, "zombie")]))
        with pytest.raises(Fenced, match=SHARD) as raised:
            await a.start_commit(None, _checkpoint(2), [])
        assert raised.value.shard_fqn == SHARD and raised.value.fence == 1
        assert isinstance(raised.value, StoreFailed)
        cp1 = _checkpoint(1).SerializeToString(deterministic=True)
        assert _outside(backend) == ([(1, "a-1")], (2, cp1))  # A's rows were rolled back.
        with pytest.raises(StoreFailed):
            await a.transact(_create)

        await b.transact(_upsert(b, [(1, "b-1"), (3, "b-3")]))
        await b.start_commit(None, _checkpoint(3), [])
        cp3 = _checkpoint(3).SerializeToString(deterministic=True)
        assert _outside(backend) == ([(1, "b-1"), (3, "b-3")], (2, cp3))


async def test_shards_are_independent_rows(backend: Backend) -> None:
    async with opened(backend) as one, opened(backend) as two:
        await one.restore_checkpoint(FakeShard(SHARD))
        await two.restore_checkpoint(FakeShard("examples/shard-001"))
        await two.start_commit(None, _checkpoint(5), [])
        await one.start_commit(None, _checkpoint(4), [])
        assert await two.restore_checkpoint(FakeShard("examples/shard-001")) == _checkpoint(5)
        assert two.fence == 2


async def test_restore_needs_a_shard_name(backend: Backend) -> None:
    async with opened(backend) as store:
        with pytest.raises(ValueError):
            await store.restore_checkpoint(None)
        with pytest.raises(RuntimeError):
            store.start_commit(None, pb.Checkpoint(), [])


async def test_destroy_abandons_a_waiting_commit(backend: Backend) -> None:
    store = await SQLStore.open(backend.connect, shard_fqn=SHARD)
    await store.restore_checkpoint(None)
    await store.transact(_create)
    await store.transact(_upsert(store, [(1, "never")]))
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = store.start_commit(None, _checkpoint(1), [gate])
    await asyncio.sleep(0.05)  # The commit job now blocks the store's thread on `gate`.
    store.destroy()  # Must not deadlock on that thread.
    with pytest.raises(asyncio.CancelledError):
        await commit
    assert _outside(backend) == ([], (1, b""))
    gate.cancel()
