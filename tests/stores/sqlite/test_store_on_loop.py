"""SQLiteStore with SQLite on the event loop (``on_loop``): jobs in call order, one per turn
of the loop; a commit's append written before the next job; large transactions recorded
without waiting; what the mode refuses. (The contract shared with the threaded store is
tested, in both modes, in test_store.py.)"""

from __future__ import annotations

import asyncio
import contextvars
from pathlib import Path

import apsw
import pytest

from gazette.broker.client import AppendService, JournalClient
from gazette.recoverylog.recorder import Recorder
from gazette.stores.sqlite import SQLiteStore, recover
from tests.stores.checkpoints import rich
from tests.stores.sqlite.support import (
    MakeLog,
    assert_commits_resolve_in_log_order,
    client,
    integrity,
    make_log,
    new_recorder,
    service,
    store_broker,
)

__all__ = ["client", "make_log", "service", "store_broker"]  # Fixtures used here.

A = 0xA11CE


def _schema(conn: apsw.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")


def _upsert(conn: apsw.Connection, rows: list[tuple[int, bytes]]) -> None:
    conn.executemany("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", rows)


def _keys(conn: apsw.Connection) -> list[int]:
    return [k for (k,) in conn.execute("SELECT k FROM kv ORDER BY k")]


async def _open(service: AppendService, log: str, directory: Path, **args: object) -> SQLiteStore:
    rec = await new_recorder(service, log, directory, A)
    return await SQLiteStore.open(rec, on_loop=True, **args)  # type: ignore[arg-type]


async def test_jobs_run_in_call_order_one_per_turn_on_the_loops_thread(
    service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    store = await _open(service, await make_log(), tmp_path / "a")
    loop_thread = asyncio.get_running_loop()._thread_id  # type: ignore[attr-defined]
    seen: list[str] = []
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    def note(conn: apsw.Connection, what: str) -> str:
        import threading

        assert threading.get_ident() == loop_thread
        seen.append(what)
        return f"{what}:{var.get()}"

    def fail(conn: apsw.Connection) -> None:
        raise ValueError("boom")

    def stop(conn: apsw.Connection) -> None:
        raise StopIteration("a future cannot hold this")

    try:
        var.set("caller's")
        first = asyncio.ensure_future(store.run(note, "first"))
        skipped = asyncio.ensure_future(store.run(note, "cancelled"))
        second = asyncio.ensure_future(store.run(note, "second"))
        await asyncio.sleep(0)  # The tasks queue their jobs.
        skipped.cancel()  # Before it ran: it never runs.
        assert seen == []  # Nothing runs within the caller's turn.
        # Other callbacks of the loop run between two jobs.
        asyncio.get_running_loop().call_soon(seen.append, "other")
        assert await first == "first:caller's"
        assert await second == "second:caller's"
        assert skipped.cancelled()
        assert seen == ["first", "other", "second"]
        with pytest.raises(ValueError, match="boom"):
            await store.run(fail)
        with pytest.raises(RuntimeError, match="StopIteration"):
            await store.run(stop)
        assert await store.run(note, "still usable") == "still usable:caller's"
    finally:
        await store.close()


async def test_a_commits_append_is_sent_before_the_next_job_and_commits_resolve_in_order(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_log()
    store = await _open(service, log, tmp_path / "a")
    rec = store.recorder
    assert isinstance(rec, Recorder)
    await store.transact(_schema)
    # As a consumer: a commit starts once its predecessor is in the log; the next
    # transaction's job runs once the commit's append went out.
    sent_before_next_job = []
    pending = None
    for i in range(5):
        await store.transact(_upsert, [(i, b"x" * 5000)])
        if pending is not None:
            await pending
        rpcs = service.rpc_count
        pending = store.start_commit(None, rich(i), [])
        sent = await store.run(lambda c, rpcs=rpcs: service.rpc_count > rpcs)
        sent_before_next_job.append(sent)
    await pending
    assert sent_before_next_job == [True] * 5

    # Commits not awaited in between resolve in log order.
    await assert_commits_resolve_in_log_order(store, rec, range(10, 15), b"y" * 5000)

    await store.transact(_upsert, [(7, b"seven")])
    cancelled = store.start_commit(None, rich(7), [])
    cancelled.cancel()  # Before its job ran: it never runs.
    assert cancelled.cancelled()
    assert await store.restore_checkpoint() == rich(14)
    await store.start_commit(None, rich(8), [])
    await store.close()
    recovered = await recover(client, service, log, tmp_path / "b", on_loop=True)
    assert await recovered.restore_checkpoint() == rich(8)
    assert await recovered.run(_keys) == [0, 1, 2, 3, 4, 7, 10, 11, 12, 13, 14]
    recovered.destroy()


async def test_a_large_transaction_is_recorded_without_waiting_and_jobs_wait_for_the_backlog(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    """Hand-overs within one statement (`flush_bytes`), even past `max_unsynced`, go to the
    Recorder at once and nothing waits: the statement runs to its end. The next job waits
    until no more than `max_unsynced` recorded bytes are uncommitted."""
    log = await make_log()
    store = await _open(service, log, tmp_path / "a", cache_size_kib=1024)
    rec = store.recorder
    assert isinstance(rec, Recorder)
    store.bridge.flush_bytes = 256 << 10
    store.bridge.max_unsynced = 1 << 20
    await store.transact(_schema)
    rows = [(k, bytes([k % 251]) * 3000) for k in range(4000)]  # ~12 MB in one statement.

    def upsert_without_waiting(conn: apsw.Connection) -> tuple[int, int]:
        _upsert(conn, rows)
        return rec.uncommitted_bytes, store.stats()["barriers"]

    backlog, waited = await store.transact(upsert_without_waiting)
    assert backlog > 8 << 20 and waited == 0  # Recorded as written; nothing waited.
    backlog, waited = await store.run(lambda c: (rec.uncommitted_bytes, store.stats()["barriers"]))
    assert backlog <= 1 << 20 and waited == 1  # The next job waited for the backlog.
    await store.start_commit(None, rich(1), [])
    await store.close()
    recovered = await recover(client, service, log, tmp_path / "b", on_loop=True)
    assert await recovered.restore_checkpoint() == rich(1)
    got = await recovered.run(lambda c: c.execute("SELECT count(*), sum(length(v)) FROM kv").get)
    assert got == (4000, 4000 * 3000)
    await recovered.close()
    assert integrity(tmp_path / "b" / "primary.db") == "ok"


async def test_on_loop_refuses_waiting_syncs(
    service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    rec = await new_recorder(service, await make_log(), tmp_path / "a", A)
    with pytest.raises(ValueError, match="sync_waits=True needs SQLite in a thread"):
        await SQLiteStore.open(rec, on_loop=True, sync_waits=True)
    assert list((tmp_path / "a").iterdir()) == []  # Refused before anything was made.


async def test_jobs_queued_behind_a_commit_wait_for_its_dependencies_and_belong_to_the_next(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_log()
    store = await _open(service, log, tmp_path / "a")
    await store.transact(_schema)
    await store.transact(_upsert, [(1, b"one")])
    dependency: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = store.start_commit(None, rich(1), [dependency])
    later = [asyncio.ensure_future(store.transact(_upsert, [(k, b"later")])) for k in (2, 3)]
    await asyncio.sleep(0.05)
    assert not commit.done() and not any(f.done() for f in later)  # The loop itself runs on.
    dependency.set_result(None)
    await commit
    await asyncio.gather(*later)
    assert await store.restore_checkpoint() == rich(1)
    await store.close()  # Rows 2 and 3 were never committed.
    recovered = await recover(client, service, log, tmp_path / "b", on_loop=True)
    assert await recovered.run(_keys) == [1]
    recovered.destroy()
