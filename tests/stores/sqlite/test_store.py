"""SQLiteStore end to end against a real broker: transactions recorded, then played back into
fresh directories, byte for byte and row for row; checkpoints; journal modes; hand-off; opening
from a RecoveredLog as the consumer runtime does."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import random
import sys
import threading
import warnings
from pathlib import Path

import apsw
import pytest

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer import StoreClosed, StoreFailed
from gazette.consumer.protocol import pb
from gazette.recoverylog.recorder import RecorderFenced, RecordingFailed
from gazette.stores.sqlite import SQLiteStore, recover
from gazette.stores.sqlite.pagestore import is_wal_generation
from gazette.stores.sqlite.store import rebuild_played
from gazette.testing.broker import BrokerProcess
from tests.stores.checkpoints import labeled, rich
from tests.stores.recovery import recovered_log
from tests.stores.sqlite.support import (
    MakeLog,
    assert_commits_resolve_in_log_order,
    client,
    dump,
    integrity,
    make_log,
    new_recorder,
    play,
    service,
    store_broker,
)

__all__ = ["client", "make_log", "service", "store_broker"]  # Fixtures used here.

A, B = 0xA11CE, 0xB0B


def _schema(conn: apsw.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")


def _upsert(conn: apsw.Connection, rows: list[tuple[int, bytes]]) -> None:
    conn.executemany("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", rows)


def _delete_mod7(conn: apsw.Connection, r: int) -> None:
    conn.execute("DELETE FROM kv WHERE k % 7 = ?", (r,))


async def _workload(store: SQLiteStore, seed: int, txns: int, rows: int) -> None:
    rnd = random.Random(seed)
    await store.transact(_schema)
    for t in range(txns):
        batch = [
            (rnd.randrange(rows * 4), rnd.randbytes(rnd.choice((10, 200, 3000))))
            for _ in range(rows)
        ]
        await store.transact(_upsert, batch)
        if t % 3 == 0:
            await store.transact(_delete_mod7, t % 7)
        await store.start_commit(None, labeled(f"cp-{t}"), [])


ON_LOOP = pytest.mark.parametrize("on_loop", [False, True], ids=["thread", "on_loop"])
"""SQLite in the store's thread, and on the loop: the same contract."""


@ON_LOOP
@pytest.mark.parametrize("journal_mode", ["wal", "delete", "truncate", "persist"])
async def test_transactions_play_back_identically(
    client: JournalClient,
    service: AppendService,
    make_log: MakeLog,
    tmp_path: Path,
    journal_mode: str,
    on_loop: bool,
) -> None:
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "primary", A)
    store = await SQLiteStore.open(
        rec, journal_mode=journal_mode, min_compaction_bytes=256 << 10, on_loop=on_loop
    )
    await _workload(store, seed=1, txns=30, rows=200)
    assert await store.restore_checkpoint() == labeled("cp-29")
    expected = await store.run(lambda c: list(c.execute("SELECT k, v FROM kv ORDER BY k")))
    hints = await rec.build_hints()
    compactions = sum(p.compactions for p in store.vfs.page_stores.values())
    assert compactions > 0  # The workload rewrites the database more than once.

    for name, h in (("cold", None), ("hinted", hints)):
        target = tmp_path / name
        _, fsm = await play(client, log, target, h)
        rebuild_played(target, dict(fsm.links))
        assert integrity(target / "primary.db") == "ok"
        rows = [r[1:] for r in dump(target / "primary.db") if r[0] == "kv"]
        assert rows == expected
    await store.close()


async def test_live_database_file_is_reconstructed_byte_for_byte(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "primary", A)
    store = await SQLiteStore.open(rec, journal_mode="truncate", min_compaction_bytes=128 << 10)
    await _workload(store, seed=2, txns=12, rows=100)
    # A rollback-journal store between transactions: the database file is all there is.
    await rec.barrier()
    local = (tmp_path / "primary" / "primary.db").read_bytes()
    _, fsm = await play(client, log, tmp_path / "played")
    rebuild_played(tmp_path / "played", dict(fsm.links))
    assert (tmp_path / "played" / "primary.db").read_bytes() == local
    await store.close()


@ON_LOOP
async def test_checkpoint_round_trip_and_recovery_handoff(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path, on_loop: bool
) -> None:
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "a", A)
    store = await SQLiteStore.open(rec, on_loop=on_loop)
    assert await store.restore_checkpoint() == pb.Checkpoint()
    await store.transact(_schema)
    await store.transact(_upsert, [(1, b"one")])
    await store.start_commit(None, rich(1), [])
    # Uncommitted changes of the next transaction are not recovered.
    await store.transact(_upsert, [(2, b"two")])
    await rec.barrier()

    second = await recover(client, service, log, tmp_path / "b", author=B)
    assert await second.restore_checkpoint() == rich(1)
    assert await second.run(lambda c: list(c.execute("SELECT k, v FROM kv"))) == [(1, b"one")]

    # The first store was fenced by the hand-off: its next commit fails (in its xSync, or,
    # on the loop where nothing waits there, once the Recorder's append of it is refused).
    with pytest.raises(StoreFailed) as failed:
        await store.start_commit(None, labeled("zombie"), [])
    assert isinstance(failed.value.__cause__, RecorderFenced if on_loop else apsw.IOError)
    assert isinstance(rec.error, RecorderFenced)

    # The new primary commits onwards, and a third recovery sees it.
    await second.transact(_upsert, [(3, b"three")])
    await second.start_commit(None, rich(2), [])
    await second.close()
    third = await recover(client, service, log, tmp_path / "c")
    assert await third.restore_checkpoint() == rich(2)
    rows = await third.run(lambda c: list(c.execute("SELECT k FROM kv ORDER BY k")))
    assert rows == [(1,), (3,)]
    third.destroy()
    assert not (tmp_path / "c").exists()
    store.destroy()


@ON_LOOP
async def test_wait_for_failure_fails_the_commit(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path, on_loop: bool
) -> None:
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "a", A)
    store = await SQLiteStore.open(rec, on_loop=on_loop)
    await store.transact(_schema)
    await store.start_commit(None, labeled("cp-0"), [])
    await store.transact(_upsert, [(1, b"x")])

    async def fails() -> None:
        raise RuntimeError("append failed")

    with pytest.raises(StoreFailed, match="append failed") as failed:
        await store.start_commit(None, labeled("cp"), [fails()])
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert await store.restore_checkpoint() == labeled("cp-0")
    assert await store.run(lambda c: list(c.execute("SELECT * FROM kv"))) == []
    await store.close()


async def test_checkpoint_must_be_a_message(
    service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_log()
    store = await SQLiteStore.open(await new_recorder(service, log, tmp_path / "a", A))
    try:
        await store.transact(_schema)
        await store.transact(_upsert, [(1, b"one")])
        with pytest.raises(TypeError, match="consumer.Checkpoint"):
            store.start_commit(None, b"cp", [])  # type: ignore[arg-type]
        await store.start_commit(None, rich(3), [])  # The transaction is still open.
        assert await store.restore_checkpoint() == rich(3)
        assert await store.run(lambda c: list(c.execute("SELECT k FROM kv"))) == [(1,)]
    finally:
        await store.close()


def _keys(conn: apsw.Connection) -> list[int]:
    return [k for (k,) in conn.execute("SELECT k FROM kv ORDER BY k")]


class _Recorded:
    """What a store recovered from `log`, recorded by `store`, would hold now: its checkpoint
    and the keys of ``kv``, played back into a new directory without fencing `store`."""

    def __init__(self, client: JournalClient, store: SQLiteStore, log: str, tmp_path: Path) -> None:
        self.client, self.store, self.log, self.tmp_path = client, store, log, tmp_path
        self.plays = 0

    async def __call__(self) -> tuple[pb.Checkpoint, list[int]]:
        await self.store.recorder.barrier()
        self.plays += 1
        target = self.tmp_path / f"played-{self.plays}"
        _, fsm = await play(self.client, self.log, target)
        rebuild_played(target, dict(fsm.links))
        rows = dump(target / "primary.db")
        checkpoint = next(r[2] for r in rows if r[0] == "gazette_checkpoint")
        assert isinstance(checkpoint, bytes)
        keys = [k for t, k, *_ in rows if t == "kv" and isinstance(k, int)]  # (INTEGER keys.)
        return pb.Checkpoint.FromString(checkpoint), keys


@ON_LOOP
async def test_run_begins_no_transaction_and_joins_an_open_one(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path, on_loop: bool
) -> None:
    """`run` as its docstring states it: between consumer transactions a write commits (and
    is recorded) at once, without a checkpoint; while a `transact` has a transaction open,
    `run` reads its uncommitted changes and its writes commit with it."""
    log = await make_log()
    store = await SQLiteStore.open(
        await new_recorder(service, log, tmp_path / "a", A), on_loop=on_loop
    )
    recorded = _Recorded(client, store, log, tmp_path)

    def upsert(conn: apsw.Connection, k: int) -> tuple[bool, list[int]]:
        _upsert(conn, [(k, b"x")])
        return conn.in_transaction, _keys(conn)

    try:
        await store.transact(_schema)
        await store.start_commit(None, labeled("cp-1"), [])
        assert await store.run(upsert, 1) == (False, [1])
        assert await recorded() == (labeled("cp-1"), [1])  # Committed, the checkpoint as it was.

        await store.transact(_upsert, [(2, b"x")])
        assert await store.run(upsert, 3) == (True, [1, 2, 3])  # Within it, seeing key 2.
        assert await recorded() == (labeled("cp-1"), [1])
        await store.start_commit(None, labeled("cp-2"), [])
        assert await recorded() == (labeled("cp-2"), [1, 2, 3])
        assert await store.run(upsert, 4) == (False, [1, 2, 3, 4])  # Autocommit again.
    finally:
        await store.close()


@ON_LOOP
async def test_transact_begins_the_transaction_that_start_commit_commits(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path, on_loop: bool
) -> None:
    """The first `transact` after a commit begins the consumer transaction, later ones join
    it, one whose function fails leaves it open with what that function changed, and
    `start_commit` commits all of it with its checkpoint."""
    log = await make_log()
    store = await SQLiteStore.open(
        await new_recorder(service, log, tmp_path / "a", A), on_loop=on_loop
    )
    recorded = _Recorded(client, store, log, tmp_path)
    in_transaction = lambda c: c.in_transaction  # noqa: E731

    def begin(conn: apsw.Connection) -> bool:
        was = conn.in_transaction
        _schema(conn)
        _upsert(conn, [(1, b"x")])
        return was

    def insert_twice(conn: apsw.Connection, k: int) -> None:
        conn.execute("INSERT INTO kv (k, v) VALUES (?, 'x')", (k,))
        conn.execute("INSERT INTO kv (k, v) VALUES (?, 'x')", (k,))

    try:
        assert not await store.run(in_transaction)
        assert await store.transact(begin) is True  # BEGIN came before `begin` ran.
        await store.transact(_upsert, [(2, b"x")])
        with pytest.raises(apsw.ConstraintError):
            await store.transact(insert_twice, 3)
        assert await store.run(in_transaction)
        assert await store.run(_keys) == [1, 2, 3]
        assert await recorded() == (pb.Checkpoint(), [])  # Nothing of it committed.

        await store.start_commit(None, labeled("cp-1"), [])
        assert not await store.run(in_transaction)
        assert await recorded() == (labeled("cp-1"), [1, 2, 3])
        await store.transact(_upsert, [(4, b"x")])
        assert await store.run(in_transaction)  # The next transaction.
    finally:
        await store.close()


async def test_jobs_run_in_order_with_the_callers_context_and_errors_reach_the_caller(
    service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_log()
    store = await SQLiteStore.open(await new_recorder(service, log, tmp_path / "a", A))
    seen: list[str] = []
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    def note(conn: apsw.Connection, what: str) -> str:
        seen.append(what)
        return f"{what}:{var.get()}"

    def stop(conn: apsw.Connection) -> None:
        raise StopIteration("a future cannot hold this")

    def fail(conn: apsw.Connection) -> None:
        raise ValueError("boom")

    try:
        var.set("caller's")
        assert await store.run(note, "first") == "first:caller's"
        # Queued together: one runs after the other, in call order.
        gate = threading.Event()
        blocked = asyncio.ensure_future(store.run(lambda c: gate.wait(10)))
        skipped = asyncio.ensure_future(store.run(note, "cancelled"))
        after = asyncio.ensure_future(store.run(note, "after"))
        await asyncio.sleep(0)
        skipped.cancel()  # Before it started: it never runs.
        gate.set()
        assert await blocked is True
        assert await after == "after:caller's"
        assert skipped.cancelled()
        assert seen == ["first", "after"]
        with pytest.raises(ValueError, match="boom"):
            await store.run(fail)
        with pytest.raises(RuntimeError, match="StopIteration") as info:
            await asyncio.wait_for(store.run(stop), 30)  # (Not a hang either.)
        assert isinstance(info.value.__cause__, StopIteration)
        assert await store.run(note, "still usable") == "still usable:caller's"
    finally:
        await store.close()


async def _commit_waiting_for_its_dependency(
    service: AppendService, make_log: MakeLog, tmp_path: Path, on_loop: bool
) -> tuple[SQLiteStore, asyncio.Future[None], asyncio.Future[None], asyncio.Future[None]]:
    """A store (rich(0) committed) whose next commit waits for a future never resolved, and
    a `transact` queued behind it: (store, commit, later, the dependency)."""
    rec = await new_recorder(service, await make_log(), tmp_path / "a", A)
    store = await SQLiteStore.open(rec, on_loop=on_loop)
    await store.transact(_schema)
    await store.start_commit(None, rich(0), [])
    await store.transact(_upsert, [(1, b"one")])
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = store.start_commit(None, rich(1), [never])
    later = asyncio.ensure_future(store.transact(_upsert, [(2, b"two")]))
    await asyncio.sleep(0.2)  # The commit's job waits for `never` (in the thread: it began).
    assert not commit.done() and not later.done()
    return store, commit, later, never


@ON_LOOP
async def test_destroy_cancels_a_commit_waiting_for_its_dependencies(
    service: AppendService, make_log: MakeLog, tmp_path: Path, on_loop: bool
) -> None:
    store, commit, later, never = await _commit_waiting_for_its_dependency(
        service, make_log, tmp_path, on_loop
    )
    store.destroy()
    # A cancellation, as for the other stores; not an error of the commit.
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(commit, 30)
    with pytest.raises(StoreClosed):  # Queued behind: it never runs.
        await asyncio.wait_for(later, 30)
    assert not never.cancelled()  # The caller's own future is left be.
    assert not (tmp_path / "a").exists()


@ON_LOOP
async def test_a_commit_cancelled_while_waiting_for_its_dependencies_frees_the_jobs_behind(
    service: AppendService, make_log: MakeLog, tmp_path: Path, on_loop: bool
) -> None:
    store, commit, later, never = await _commit_waiting_for_its_dependency(
        service, make_log, tmp_path, on_loop
    )
    commit.cancel()
    await asyncio.wait_for(later, 30)  # Not stuck behind the cancelled commit.
    assert not never.cancelled()
    assert await store.restore_checkpoint() == rich(0)
    await store.start_commit(None, rich(2), [])
    # On the loop the cancelled job never ran: its transaction went on, and commits now.
    # In the thread it had begun, and rolled its transaction back.
    expected = [1, 2] if on_loop else [2]
    assert await store.run(lambda c: [k for (k,) in c.execute("SELECT k FROM kv")]) == expected
    await store.close()


async def test_pipelined_commits_resolve_in_log_order_and_a_cancelled_one_never_runs(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    """With ``sync_waits=False`` (the consumer's pipelining) a commit resolves once a
    barrier behind its operations does, in order; cancelling one before its job starts
    leaves its transaction open, uncommitted."""
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "a", A)
    store = await SQLiteStore.open(rec, sync_waits=False)
    await store.transact(_schema)
    await assert_commits_resolve_in_log_order(store, rec, range(5), b"x" * 5000)

    gate = threading.Event()
    await store.transact(_upsert, [(7, b"seven")])
    blocked = asyncio.ensure_future(store.run(lambda c: gate.wait(10)))
    await asyncio.sleep(0)
    cancelled = store.start_commit(None, rich(7), [])
    cancelled.cancel()  # Before its job started: it never runs (cancelled at once).
    gate.set()
    assert await blocked is True
    assert cancelled.cancelled()
    assert await store.restore_checkpoint() == rich(4)  # Not committed by the cancelled one.
    await store.start_commit(None, rich(8), [])
    await store.close()
    recovered = await recover(client, service, log, tmp_path / "b")
    assert await recovered.restore_checkpoint() == rich(8)
    rows = await recovered.run(lambda c: [k for (k,) in c.execute("SELECT k FROM kv ORDER BY k")])
    assert rows == [0, 1, 2, 3, 4, 7]
    recovered.destroy()


@ON_LOOP
async def test_a_pipelined_commit_fails_once_the_recorder_is_broken(
    service: AppendService, make_log: MakeLog, tmp_path: Path, on_loop: bool
) -> None:
    """The commit's job succeeds (SQLite does not wait for the log), and its future then
    fails with `StoreFailed` from the `RecordingFailed` of the bridge: the recorder could not
    take its operations. The store has failed: later commits, `transact` and `build_hints`
    raise `StoreFailed` from that same error."""
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "a", A)
    store = await SQLiteStore.open(rec, sync_waits=False, on_loop=on_loop)
    await store.transact(_schema)
    await store.start_commit(None, rich(1), [])
    rec.abandon("the test broke it")
    await store.transact(_upsert, [(1, b"one")])
    with pytest.raises(StoreFailed, match="the test broke it") as failed:
        await asyncio.wait_for(store.start_commit(None, rich(2), []), 30)
    assert isinstance(failed.value.__cause__, RecordingFailed)
    assert store.failed is failed.value.__cause__
    for later in (
        lambda: store.start_commit(None, rich(3), []),
        lambda: store.transact(_upsert, [(3, b"three")]),
        store.build_hints,
    ):
        with pytest.raises(StoreFailed) as raised:
            await later()
        assert raised.value.__cause__ is store.failed
    store.destroy()


class _DependencyFailed(Exception):
    pass


@ON_LOOP
async def test_a_failed_dependency_fails_the_store(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path, on_loop: bool
) -> None:
    """A commit whose `wait_for` future fails rolls its transaction back and raises
    `StoreFailed` from that error; a `transact` queued behind it fails without running, and
    later commits fail too: nothing after the failed transaction is committed."""
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "a", A)
    store = await SQLiteStore.open(rec, on_loop=on_loop)
    await store.transact(_schema)
    await store.start_commit(None, rich(1), [])
    dependency: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    await store.transact(_upsert, [(1, b"one")])
    commit = store.start_commit(None, rich(2), [dependency])
    queued = asyncio.ensure_future(store.transact(_upsert, [(2, b"two")]))
    await asyncio.sleep(0.01)  # The commit waits on its dependency, the transact behind it.
    dependency.set_exception(_DependencyFailed("an append of the transaction failed"))
    with pytest.raises(StoreFailed) as failed:
        await commit
    assert isinstance(failed.value.__cause__, _DependencyFailed)
    with pytest.raises(StoreFailed) as raised:
        await queued
    assert raised.value.__cause__ is store.failed is failed.value.__cause__
    with pytest.raises(StoreFailed):
        await store.start_commit(None, rich(3), [])
    await rec.barrier()
    store.destroy()

    played = await recover(client, service, log, tmp_path / "b")
    assert await played.restore_checkpoint() == rich(1)
    assert await played.run(lambda c: list(c.execute("SELECT k FROM kv"))) == []
    played.destroy()


async def test_bootstrap_sql_runs_whole_when_a_statement_returns_rows(
    service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    # A pragma that answers a row, then tables: every statement runs, as it would in the
    # sqlite3 shell.
    script = (
        "PRAGMA user_version = 7; PRAGMA user_version; "
        "CREATE TABLE a (x); PRAGMA page_size; CREATE TABLE b (y)"
    )
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "a", A)
    store = await SQLiteStore.open(rec, bootstrap_sql=script)
    try:
        tables = await store.run(
            lambda c: [r[0] for r in c.execute("SELECT name FROM sqlite_master ORDER BY name")]
        )
        assert {"a", "b"} <= set(tables)
        assert await store.run(lambda c: c.execute("PRAGMA user_version").fetchall()) == [(7,)]
    finally:
        await store.close()


@pytest.mark.parametrize("journal_mode", ["wal", "delete"])
async def test_from_recovered(
    client: JournalClient,
    service: AppendService,
    store_broker: BrokerProcess,
    make_log: MakeLog,
    tmp_path: Path,
    journal_mode: str,
) -> None:
    log, endpoint = await make_log(), store_broker.endpoint
    # A new store, of a log never written to.
    recovered = await recovered_log(client, service, endpoint, log, tmp_path / "a", A)
    first = await SQLiteStore.from_recovered(recovered, journal_mode=journal_mode)
    assert first.directory == tmp_path / "a"
    assert await first.restore_checkpoint() == pb.Checkpoint()
    await _workload(first, seed=3, txns=6, rows=50)
    await first.start_commit(None, rich(7), [])
    expected = await first.run(lambda c: list(c.execute("SELECT k, v FROM kv ORDER BY k")))
    hints = await first.recorder.build_hints()

    # The next primary, from hints: the checkpoint round-trips through the log, and the
    # hand-off fenced the first store.
    recovered = await recovered_log(client, service, endpoint, log, tmp_path / "b", B, hints)
    second = await SQLiteStore.from_recovered(recovered, journal_mode=journal_mode)
    assert second.recorder.author == B
    assert await second.restore_checkpoint() == rich(7)
    assert await second.run(lambda c: list(c.execute("SELECT k, v FROM kv ORDER BY k"))) == expected
    with pytest.raises(StoreFailed) as failed:
        await first.start_commit(None, labeled("zombie"), [])
    assert isinstance(failed.value.__cause__, apsw.IOError)
    first.destroy()
    await second.transact(_upsert, [(-1, b"second")])
    await second.start_commit(None, rich(8), [])
    await second.close()

    # A third, from the whole log.
    recovered = await recovered_log(client, service, endpoint, log, tmp_path / "c", 0xC)
    third = await SQLiteStore.from_recovered(recovered, journal_mode=journal_mode)
    try:
        assert await third.restore_checkpoint() == rich(8)
        assert await third.run(lambda c: list(c.execute("SELECT v FROM kv WHERE k = -1"))) == [
            (b"second",)
        ]
    finally:
        third.destroy()


def _wal_generations(links: dict[str, int]) -> list[str]:
    return sorted(p for p in links if is_wal_generation(p))


async def test_wal_checkpoints_keep_the_wal_instead_of_recording_pages_again(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    """In WAL mode the store's checkpoints copy WAL frames into the database without
    recording them again: each WAL is kept as a WAL generation until a base holds its
    frames; playback rebuilds the database from them, and a recovered store goes on from
    there (its compaction removes them)."""
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "primary", A)
    # Checkpoints every 64 WAL pages; no compaction within the first workload.
    store = await SQLiteStore.open(
        rec, journal_mode="wal", wal_checkpoint_pages=64, min_compaction_bytes=64 << 20
    )
    await _workload(store, seed=4, txns=20, rows=100)
    stats = store.stats()
    db_size = (tmp_path / "primary" / "primary.db").stat().st_size
    assert stats["compactions"] == 0
    assert stats["wal_bytes_kept"] > db_size  # Several checkpointed WALs, kept.
    # Only the database's first pages (written before WAL mode) were recorded as page records:
    # before this change, each checkpoint recorded every page it copied.
    assert stats["page_bytes"] < 64 << 10
    expected = await store.run(lambda c: list(c.execute("SELECT k, v FROM kv ORDER BY k")))
    hints = await rec.build_hints()
    kept = _wal_generations(dict(rec.fsm.links))
    assert len(kept) >= 3

    for name, h in (("cold", None), ("hinted", hints)):
        target = tmp_path / name
        _, fsm = await play(client, log, target, h)
        assert _wal_generations(dict(fsm.links)) == kept
        rebuild_played(target, dict(fsm.links))
        assert integrity(target / "primary.db") == "ok"
        assert [r[1:] for r in dump(target / "primary.db") if r[0] == "kv"] == expected
    # A last small transaction stays in the WAL (under 64 pages: no checkpoint of the
    # store's). If the store's last checkpoint left the WAL wholly copied, this transaction
    # starts it over, and the checkpointed WAL becomes one more generation (the store's
    # checkpoints are PASSIVE: a WAL is kept when SQLite restarts it). Closing checkpoints
    # the last WAL (SQLite's own checkpoint: its copies are recorded) and deletes it: not kept.
    await store.transact(_upsert, [(-1, b"last")])
    await store.start_commit(None, labeled("last"), [])
    last = _wal_generations(dict(rec.fsm.links))
    assert last[: len(kept)] == kept and len(last) - len(kept) <= 1
    expected = await store.run(lambda c: list(c.execute("SELECT k, v FROM kv ORDER BY k")))
    assert (tmp_path / "primary" / "primary.db-wal").stat().st_size > 0
    await store.close()
    _, fsm = await play(client, log, tmp_path / "closed")
    assert _wal_generations(dict(fsm.links)) == last
    rebuild_played(tmp_path / "closed", dict(fsm.links))
    assert [r[1:] for r in dump(tmp_path / "closed" / "primary.db") if r[0] == "kv"] == expected

    # A recovered store rebuilds from the WAL generations, and its first compaction removes
    # them from the log's live files.
    second = await recover(
        client,
        service,
        log,
        tmp_path / "second",
        author=B,
        journal_mode="wal",
        wal_checkpoint_pages=64,
        min_compaction_bytes=256 << 10,
    )
    assert await second.run(lambda c: list(c.execute("SELECT k, v FROM kv ORDER BY k"))) == (
        expected
    )
    await _workload(second, seed=5, txns=10, rows=100)
    assert second.stats()["compactions"] > 0
    expected = await second.run(lambda c: list(c.execute("SELECT k, v FROM kv ORDER BY k")))
    links = dict(second.recorder.fsm.links)
    assert not set(kept) & set(links)  # Removed by a compaction since.
    await second.close()
    _, fsm = await play(client, log, tmp_path / "third")
    rebuild_played(tmp_path / "third", dict(fsm.links))
    assert integrity(tmp_path / "third" / "primary.db") == "ok"
    assert [r[1:] for r in dump(tmp_path / "third" / "primary.db") if r[0] == "kv"] == expected


@pytest.mark.parametrize("compacting", [False, True])
async def test_each_commit_waits_for_one_barrier_checkpoints_included(
    client: JournalClient,
    service: AppendService,
    make_log: MakeLog,
    tmp_path: Path,
    compacting: bool,
) -> None:
    """A commit waits for the log once: not again for a restarted WAL's header (the files
    are sequential) nor for its checkpoint's operations (with compactions handed over in
    pieces, too), which go with the next commit's barrier and play back either way."""
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "primary", A)
    store = await SQLiteStore.open(
        rec,
        journal_mode="wal",
        wal_checkpoint_pages=32,
        min_compaction_bytes=(64 << 10) if compacting else (64 << 20),
    )
    if compacting:
        store.bridge.flush_bytes = 16 << 10  # Hand a compaction over in several pieces.
    await store.transact(_schema)
    await store.start_commit(None, labeled("schema"), [])
    rnd = random.Random(7)
    for t in range(24):
        before = store.stats()["barriers"]
        rows = [(rnd.randrange(2000), rnd.randbytes(300)) for _ in range(60)]
        await store.transact(_upsert, rows)
        await store.start_commit(None, labeled(f"cp-{t}"), [])
        assert store.stats()["barriers"] - before == 1, f"commit {t}"
    assert store.stats()["wal_bytes_kept"] > 0  # Checkpoints happened (WALs kept).
    assert (store.stats()["compactions"] > 0) == compacting
    expected = await store.run(lambda c: list(c.execute("SELECT k, v FROM kv ORDER BY k")))
    _, fsm = await play(client, log, tmp_path / "played")
    rebuild_played(tmp_path / "played", dict(fsm.links))
    assert integrity(tmp_path / "played" / "primary.db") == "ok"
    assert [r[1:] for r in dump(tmp_path / "played" / "primary.db") if r[0] == "kv"] == expected
    await store.close()


async def _executor_let_go(store: SQLiteStore) -> None:
    """Wait until the store's SQLite thread holds no reference to it: a call's result wakes
    the loop before the thread drops the call (which references the store), so `del store`
    could otherwise leave it alive for a moment."""
    await asyncio.wrap_future(store._thread.submit(int))


@pytest.mark.parametrize("journal_mode", ["wal", "delete"])
async def test_a_store_dropped_without_close_warns_and_is_left_as_a_crash_leaves_it(
    client: JournalClient,
    service: AppendService,
    make_log: MakeLog,
    tmp_path: Path,
    journal_mode: str,
) -> None:
    """Garbage collection of an open store (on the loop's thread, where the connection's
    closing checkpoint cannot wait for the log) warns once, clearly, and records nothing
    more: the log holds the last commit, as after a crash. Its files are not checkpointed,
    and its recorder is stopped, so that the directory (ahead of the log by the uncommitted
    transaction) cannot be recorded from again."""
    log = await make_log()
    directory = tmp_path / "a"
    rec = await new_recorder(service, log, directory, A)
    store = await SQLiteStore.open(rec, journal_mode=journal_mode)
    await store.transact(_schema)
    await store.transact(_upsert, [(i, b"x" * 200) for i in range(200)])
    await store.start_commit(None, labeled("cp-1"), [])
    await store.transact(_upsert, [(1000 + i, b"y" * 200) for i in range(100)])  # Not committed.
    await _executor_let_go(store)
    unraisable: list[object] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del store
            gc.collect()
    finally:
        sys.unraisablehook = hook
    assert unraisable == []
    messages = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert len(messages) == 1 and "was not closed" in messages[0], messages
    if journal_mode == "wal":
        assert (directory / "primary.db-wal").stat().st_size > 0  # Not checkpointed away.
    assert rec.error is not None and "dropped without close()" in str(rec.error)

    # The directory in place cannot be recorded from again: the first commit fails.
    with pytest.raises(Exception, match="dropped without close"):  # noqa: PT011
        again = await SQLiteStore.open(rec, journal_mode=journal_mode)
        try:
            await again.transact(_upsert, [(5000, b"z")])
            await again.start_commit(None, labeled("cp-2"), [])
        finally:
            again.destroy()

    _, fsm = await play(client, log, tmp_path / "played")
    rebuild_played(tmp_path / "played", dict(fsm.links))
    assert integrity(tmp_path / "played" / "primary.db") == "ok"
    rows = [r[1:] for r in dump(tmp_path / "played" / "primary.db") if r[0] == "kv"]
    assert rows == [(i, b"x" * 200) for i in range(200)]


async def test_a_dropped_store_is_cleaned_up_when_warnings_are_errors(
    service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    rec = await new_recorder(service, await make_log(), tmp_path / "a", A)
    store = await SQLiteStore.open(rec)
    await store.transact(_schema)
    await store.start_commit(None, labeled("cp-1"), [])
    await _executor_let_go(store)
    unraisable: list[sys.UnraisableHookArgs] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            del store
            gc.collect()
    finally:
        sys.unraisablehook = hook
    # Only the warning, raised as an error once the cleanup was done.
    assert [u.exc_type for u in unraisable] == [ResourceWarning]
    assert rec.error is not None


@ON_LOOP
async def test_a_job_queued_behind_close_fails_with_store_closed(
    service: AppendService, make_log: MakeLog, tmp_path: Path, on_loop: bool
) -> None:
    log = await make_log()
    store = await SQLiteStore.open(
        await new_recorder(service, log, tmp_path / "a", A), on_loop=on_loop
    )
    closing = asyncio.ensure_future(store.close())
    await asyncio.sleep(0)  # close() queued its job.
    behind = asyncio.ensure_future(store.run(lambda c: c.execute("SELECT 1").get))
    await closing
    with pytest.raises(StoreClosed):
        await behind
    with pytest.raises(StoreClosed):
        await store.run(lambda c: None)
