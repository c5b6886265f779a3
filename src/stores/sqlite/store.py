"""SQLiteStore: a consumer Store of an embedded SQLite database, recorded to a recovery log.

The database lives in the Recorder's directory on local disk and is driven by one APSW
connection, in a thread owned by the store (`run`); its files are recorded through a
`RecordingVFS` (see docs/sqlite-store.md). The consumer transaction is an SQL transaction,
begun on demand by `transact` (never by `run`); `start_commit` writes the serialized
``consumer.Checkpoint`` into table ``gazette_checkpoint`` within it, commits, and resolves
once the commit is in the log. How an application uses it: docs/sqlite-app.md.

Recovery: the consumer runtime plays the log into a directory and hands it off to its author
(a `RecoveredLog`), then `from_recovered` opens the store recording onwards (`recover` does
both); `open` rebuilds each database from its played page files and reopens it through the
VFS, and SQLite then rolls back a hot journal or replays a WAL as after a power loss.

Failure is crash-only: a commit that fails (a `wait_for` future failed, SQL failed, or the
Recorder did, e.g. `RecorderFenced` once a newer primary took the log over) raises
`StoreFailed` from that error, and so do later commits, `transact` and `build_hints` (`run`
still runs, as RocksDB's reads still read); the runtime destroys the store and recovers the
shard afresh.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import itertools
import logging
import os
import shutil
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import apsw

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer import recovery
from gazette.consumer.protocol import pb
from gazette.consumer.store import Checkpoint, OpFuture, RecoveredLog, Shard
from gazette.consumer.store_errors import StoreClosed, StoreFailed
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.recorder import Recorder, RecorderBroken, RecordingFailed
from gazette.stores.sqlite.bridge import RecorderBridge
from gazette.stores.sqlite.pagestore import (
    PAGES_SUFFIX,
    PageStore,
    generation_of,
    is_wal_generation,
    rebuild,
)
from gazette.stores.sqlite.vfs import RecordingVFS

__all__ = [
    "DB_NAME",
    "DEFAULT_PAGE_SIZE",
    "JOURNAL_MODES",
    "SQLiteStore",
    "rebuild_played",
    "recover",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DB_NAME = "primary.db"
JOURNAL_MODES = frozenset({"delete", "truncate", "persist", "wal"})
"""Journal modes the store supports (MEMORY and OFF leave no recoverable journal)."""
DEFAULT_PAGE_SIZE = 1024
"""The page size of a new database: a commit records every page it changes whole, and
SQLite's 4 KiB made a small transaction's log 2.5x larger (docs/sqlite-app.md)."""

_CHECKPOINT_DDL = """
CREATE TABLE IF NOT EXISTS gazette_checkpoint (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    checkpoint BLOB NOT NULL
);
INSERT OR IGNORE INTO gazette_checkpoint (id, checkpoint) VALUES (0, x'');
"""

_vfs_names = itertools.count()


def _played_page_files(links: dict[str, int]) -> dict[str, list[tuple[int, str]]]:
    """Database (relative path) -> its live page files (generation, relative path) in
    generation order, from recorded `links`."""
    out: dict[str, list[tuple[int, str]]] = {}
    for link in links:
        rel = link.lstrip("/")
        head = os.path.dirname(rel)
        if head.endswith(PAGES_SUFFIX):
            db = head[: -len(PAGES_SUFFIX)]
            gen = generation_of(db, rel)
            if gen is not None:
                out.setdefault(db, []).append((gen, rel))
    for gens in out.values():
        gens.sort()
    return out


def rebuild_played(
    directory: Path, links: dict[str, int]
) -> dict[str, list[tuple[int, int, bool]]]:
    """Rebuild every database of played `directory` from its page files (then removed from
    local disk), given the recorded `links` of the played FSM; returns the (generation, size,
    is a WAL generation) of each database's page files."""
    played = _played_page_files(links)
    out: dict[str, list[tuple[int, int, bool]]] = {}
    for db, page_files in played.items():
        pages = directory / (db + PAGES_SUFFIX)
        gens = [g for g, _ in page_files]
        wal = [is_wal_generation(rel) for _, rel in page_files]
        files = [directory / rel for _, rel in page_files]
        if all(f.exists() for f in files):
            sizes = [f.stat().st_size for f in files]
            stats = rebuild(files, directory / db)
            log.info(
                "rebuilt database db=%s page_files=%d records=%d bytes_read=%d size=%d torn=%s",
                db,
                stats.files,
                stats.records,
                stats.bytes_read,
                stats.size,
                stats.torn_tail,
            )
            shutil.rmtree(pages)
        elif not (directory / db).exists():
            raise FileNotFoundError(f"neither {db} nor its page files are in {directory}")
        else:
            # Reopened in place: the local database is current; page-file sizes only steer
            # the next compaction.
            sizes = [0] * len(gens)
        out[db] = list(zip(gens, sizes, wal, strict=True))
    return out


class SQLiteStore:
    """A recorded SQLite store (module docs). Create with `from_recovered` or `open`."""

    def __init__(self) -> None:  # Use `from_recovered` or `open`.
        self.recorder: Recorder
        self.directory: Path
        self.path: Path
        self._vfs: RecordingVFS | None = None
        self._bridge: RecorderBridge
        self._thread: concurrent.futures.ThreadPoolExecutor
        self._conn: apsw.Connection | None = None
        self._loop: asyncio.AbstractEventLoop
        self._page_stores: dict[str, PageStore] = {}
        self._sync_waits = True
        self._on_loop = False
        # Jobs queued on the loop (``on_loop``): (future, context, fn, args, gate).
        self._jobs: deque[_LoopJob] = deque()
        self._jobs_scheduled = False
        self._jobs_gate: asyncio.Future[Any] | None = None  # What the next job waits for.
        self._closed = False
        self._error: BaseException | None = None  # What failed a commit (`failed`).

    @classmethod
    async def from_recovered(cls, recovered: RecoveredLog, **open_args: Any) -> SQLiteStore:
        """Open the store in a played-back, handed-off ``recovered.directory``, recording
        onwards through ``recovered.recorder()``. `open_args` and errors are `open`'s."""
        return await cls.open(recovered.recorder(), **open_args)

    @classmethod
    async def open(
        cls,
        recorder: Recorder,
        *,
        db_name: str = DB_NAME,
        journal_mode: str = "wal",
        bootstrap_sql: str = "",
        sync_waits: bool | None = None,
        on_loop: bool = False,
        compaction_factor: float = 1.5,
        min_compaction_bytes: int = 1 << 20,
        cache_size_kib: int = 64 << 10,
        wal_checkpoint_pages: int = 1000,
        page_size: int | None = DEFAULT_PAGE_SIZE,
    ) -> SQLiteStore:
        """Open the store in `recorder`'s directory, recording through `recorder` (a
        `Recorder` on the running loop).

        The directory is empty (a new store) or was just played back from the recorder's log.
        `bootstrap_sql` runs first (pragmas, tables). ``synchronous=FULL`` is set and checked;
        `journal_mode` must be one of `JOURNAL_MODES`. `sync_waits`: whether each xSync waits
        for the log (docs/sqlite-store.md); `start_commit` always does. By default SQLite
        runs in a thread of the store's own, and `sync_waits` is True. With `on_loop`, it
        runs on the event loop's thread instead, as native apsw runs on its caller's: each
        `run` blocks the loop while its function runs, and no thread hand-over or contention
        for the GIL is paid (docs/sqlite-store.md, "SQLite on the loop"). `sync_waits` must
        then be False (its default there: nothing may wait on the loop).

        `page_size` applies to a new database (None: SQLite's default, 4096); an existing
        one keeps its own. Each commit records the pages it changed whole, so smaller pages
        record less per small transaction (docs/sqlite-app.md, "What a transaction costs").

        In WAL mode, a commit leaving `wal_checkpoint_pages` or more in the WAL checkpoints it
        (PASSIVE, instead of SQLite's auto-checkpoint, whose copies would be recorded again);
        the next commit starts the WAL over.

        Raises `apsw.Error` for SQL errors, and `RecordingFailed` (from the bridge) if the
        recorder failed (the store is not opened).
        """
        journal_mode = journal_mode.lower()
        if journal_mode not in JOURNAL_MODES:
            raise ValueError(f"journal_mode {journal_mode!r} is not one of {sorted(JOURNAL_MODES)}")
        if sync_waits is None:
            sync_waits = not on_loop
        if on_loop and sync_waits:
            raise ValueError("sync_waits=True needs SQLite in a thread: on_loop cannot wait")
        self = cls()
        self._on_loop = on_loop
        self.recorder = recorder
        self.directory = recorder.directory
        self.path = self.directory / db_name
        self._loop = asyncio.get_running_loop()
        # The SQLite thread; on_loop, only rebuilding the database runs there.
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sqlite-store")

        links = dict(recorder.fsm.links)
        page_files = await self._loop.run_in_executor(
            self._thread, rebuild_played, self.directory, links
        )
        recorded = {p.lstrip("/") for p in links if not os.path.dirname(p).endswith(PAGES_SUFFIX)}
        self._bridge = RecorderBridge(recorder, self._loop)
        self._vfs = RecordingVFS(
            f"gazette-store-{os.getpid()}-{next(_vfs_names)}",
            self.directory,
            self._bridge,
            recorded=recorded,
            page_files=page_files,
            sync_waits=sync_waits,
            sequential=journal_mode == "wal",
            compaction_factor=compaction_factor,
            min_compaction_bytes=min_compaction_bytes,
        )
        self._page_stores = self._vfs.page_stores
        self._sync_waits = sync_waits
        try:
            await self.run(
                self._open_connection,
                bootstrap_sql,
                journal_mode,
                cache_size_kib,
                wal_checkpoint_pages,
                page_size,
            )
            await self._barrier_on_loop()
        except BaseException:
            self.destroy()
            raise
        return self

    def _open_connection(
        self,
        conn_unused: object,
        bootstrap_sql: str,
        journal_mode: str,
        cache_kib: int,
        wal_checkpoint_pages: int,
        page_size: int | None,
    ) -> None:
        assert self._vfs is not None
        flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
        conn = apsw.Connection(str(self.path), flags=flags, vfs=self._vfs.name)
        self._conn = conn
        conn.execute(f"PRAGMA cache_size = -{cache_kib}")
        if page_size is not None:
            conn.execute(f"PRAGMA page_size = {int(page_size)}")
        if bootstrap_sql:
            # Stepped to its end: APSW runs a script's statements as its rows are read, so
            # one returning rows (``PRAGMA journal_mode=...``) would leave the rest unrun.
            conn.execute(bootstrap_sql).fetchall()
        conn.execute("PRAGMA synchronous = FULL")
        mode = conn.execute(f"PRAGMA journal_mode = {journal_mode}").fetchall()[0][0]
        if mode != journal_mode:
            raise apsw.SQLError(f"journal_mode is {mode!r}, not {journal_mode!r}")
        if conn.execute("PRAGMA synchronous").fetchall()[0][0] != 2:
            raise apsw.SQLError("synchronous=FULL is required by the recording VFS")
        if journal_mode == "wal":
            # Its checkpoints' copies of WAL frames are not recorded again: the WAL is kept.
            conn.set_wal_hook(self.vfs.wal_hook(wal_checkpoint_pages))
        conn.execute(_CHECKPOINT_DDL)
        self._bridge.sync(wait=not self._on_loop)  # (On the loop, `open` waits instead.)

    async def _barrier_on_loop(self) -> None:
        """On the loop (``on_loop``), wait until everything handed over is in the log: what
        a job in the SQLite thread waits for by ``bridge.sync()``."""
        if self._on_loop:
            barrier = _start_barrier(self._bridge, self.recorder)
            if isinstance(barrier, BaseException):
                raise barrier
            await barrier

    # -- The application API ---------------------------------------------------------------

    @property
    def connection(self) -> apsw.Connection:
        """The APSW connection: use it only within functions passed to `run` or `transact`."""
        if self._conn is None:
            raise StoreClosed("the store is not open")
        return self._conn

    @property
    def bridge(self) -> RecorderBridge:
        return self._bridge

    def stats(self) -> dict[str, int]:
        """Counters: barriers waited on, bytes handed to the recorder, page-store bytes and
        compactions (valid after `close` too)."""
        stores = self._page_stores.values()
        return {
            "barriers": self._bridge.barriers,
            "bytes_recorded": self._bridge.bytes_recorded,
            "page_bytes": sum(p.bytes_recorded for p in stores),
            "wal_bytes_kept": sum(p.wal_bytes_kept for p in stores),
            "compactions": sum(p.compactions for p in stores),
        }

    @property
    def vfs(self) -> RecordingVFS:
        if self._vfs is None:
            raise StoreClosed("the store is closed")
        return self._vfs

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` in the store's SQLite thread (or, ``on_loop``, in a
        callback of the loop, blocking it meanwhile); return its result.

        `run` begins no transaction: `fn` sees the connection as it is. Between consumer
        transactions that is autocommit, where each statement that writes commits (and is
        recorded) at once, without a Checkpoint, so a write made so is not exactly-once;
        while a consumer transaction is open (a `transact` since the last `start_commit`),
        `fn`'s statements belong to it and read its uncommitted changes. Use `transact` for
        the consumer's reads and writes, and `run` for what stands outside them (queries of
        an HTTP handler, maintenance).

        Calls (of `run`, `transact` and commits) run one at a time, in call order. Cancelled
        before it starts, `fn` does not run; once started, it runs to its end whatever
        happens to the await. Raises `StoreClosed` once the store is closed; a store whose
        commit failed still runs `fn` (queries of the state it has), but `transact` refuses.
        """
        return await self._submit(fn, *args)

    def _submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``fn(connection, *args)`` on the SQLite thread (or ``on_loop``, the loop's
        queue of jobs) now; its future.

        As ``run_in_executor``, without its second (concurrent) future chained to this one:
        the SQLite thread resolves this future itself, with one call into the loop. A job
        whose future is cancelled before it starts does not run; a job's
        ``concurrent.futures.CancelledError`` reaches the caller as a cancellation.
        """
        return self._queue(fn, args, None)

    def _queue(
        self, fn: Callable[..., T], args: tuple[Any, ...], gate: asyncio.Future[Any] | None
    ) -> asyncio.Future[T]:
        """`_submit`; on the loop, the job also waits for `gate` to be done (a commit's
        dependencies), and so do the jobs queued after it."""
        if self._closed:
            raise StoreClosed("the store is closed")
        fut: asyncio.Future[T] = self._loop.create_future()
        ctx = contextvars.copy_context()
        if self._on_loop:
            self._jobs.append((fut, ctx, fn, args, gate))
            self._schedule_jobs()
        else:
            self._thread.submit(self._run_job, fut, ctx, fn, args)
        return fut

    def _schedule_jobs(self) -> None:
        if not self._jobs_scheduled:
            self._jobs_scheduled = True
            self._loop.call_soon(self._run_loop_job)

    def _run_loop_job(self) -> None:
        """Run the next job queued on the loop (``on_loop``), then let the loop turn before
        the next one: a commit's append, released by the job, is written out first.

        Before a job, while more than the bridge's `max_unsynced` bytes are recorded and not
        yet committed, the jobs wait for a barrier: SQLite cannot run ahead of the log by
        more than that (and the Recorder's memory with it), but for what one job writes."""
        self._jobs_scheduled = False
        jobs = self._jobs
        if self._jobs_gate is not None:
            if not self._jobs_gate.done() and jobs and not jobs[0][0].cancelled():
                return  # Its callback schedules the jobs again.
            self._jobs_gate = None
        while jobs:
            fut, ctx, fn, args, gate = jobs[0]
            if fut.cancelled():
                jobs.popleft()
                continue
            if gate is None or gate.done():
                gate = self._backlog_gate()
            if gate is not None and not gate.done():
                self._jobs_gate = gate
                gate.add_done_callback(self._jobs_gate_done)
                return
            jobs.popleft()
            try:
                result = ctx.run(self._call, fn, *args)
            except (KeyboardInterrupt, SystemExit):  # The loop's business: raised there once.
                fut.cancel()
                if jobs:
                    self._schedule_jobs()
                raise
            except BaseException as err:  # Delivered to the awaiting task, as from a thread.
                _set_exception(fut, err)
            else:
                _set_result(fut, result)
            finally:
                del fut
            break
        if jobs:
            self._schedule_jobs()

    def _jobs_gate_done(self, gate: asyncio.Future[Any]) -> None:
        self._schedule_jobs()

    def _run_job(
        self,
        fut: asyncio.Future[T],
        ctx: contextvars.Context,
        fn: Callable[..., T],
        args: tuple[Any, ...],
    ) -> None:
        # In the SQLite thread. (Reading the future's state here is safe under the GIL.)
        if fut.cancelled():
            return
        try:
            result = ctx.run(self._call, fn, *args)
        except BaseException as err:  # Delivered to the awaiting task, as run_in_executor.
            settle: Callable[..., None] = _set_exception
            value: Any = err
        else:
            settle, value = _set_result, result
        try:
            self._loop.call_soon_threadsafe(settle, fut, value)
        except RuntimeError:  # The loop is closed: nobody awaits the job any more.
            pass
        finally:
            del fut, value  # No cycle through a failed job's traceback.

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:  # Closed, destroyed or dropped with jobs still queued.
            raise StoreClosed("the store is closed")
        return fn(self._conn, *args)

    async def transact(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` within the current consumer transaction, which
        `start_commit` commits with its Checkpoint; return its result.

        The first `transact` after a commit begins the transaction (``BEGIN``); later ones,
        until the next `start_commit`, join it. `fn` must neither commit nor roll it back.
        Ordering, cancellation and errors are `run`'s; an exception of `fn` leaves the
        transaction open, with whatever `fn`'s statements changed before it. Raises
        `StoreFailed`, without running `fn`, once a commit failed (also one queued before)."""
        if self._error is not None:
            raise self._failed_earlier()
        return await self.run(self._in_transaction, fn, *args)

    def _in_transaction(self, conn: apsw.Connection, fn: Callable[..., T], *args: Any) -> T:
        if self._error is not None:  # A commit failed while this job was queued.
            raise self._failed_earlier()
        if not conn.in_transaction:
            conn.execute("BEGIN")
        return fn(conn, *args)

    # -- The Store contract -----------------------------------------------------------------

    def start_commit(
        self, shard: Shard, checkpoint: Checkpoint, wait_for: Sequence[OpFuture] = ()
    ) -> asyncio.Future[None]:
        """Commit the current transaction with `checkpoint` (Store contract).

        The commit job is queued at once, so later `transact` calls belong to the next
        transaction; in the SQLite thread it waits for `wait_for`, updates
        ``gazette_checkpoint`` and commits. The returned future resolves once the commit is in
        the log, or fails with `StoreFailed` from the first error (of `wait_for`, SQL, or the
        recorder): the store has then failed, and must be destroyed. With
        ``sync_waits=False`` the SQLite thread does not wait for the log: the next
        transaction runs while this one commits to the log (pipelining).
        Cancelled before its job ran, the commit leaves its transaction open; cancelled while
        its job waits for `wait_for` in the thread, the job rolls the transaction back. Either
        way the jobs behind it run on, and `wait_for`'s futures are left be.
        Raises `TypeError` at once if `checkpoint` is not a ``consumer.Checkpoint`` message,
        `StoreClosed` if the store is closed, `StoreFailed` if a commit failed.
        """
        if not isinstance(checkpoint, pb.Checkpoint):
            kind = type(checkpoint).__name__
            raise TypeError(f"checkpoint must be a consumer.Checkpoint message, not {kind}")
        data = checkpoint.SerializeToString()
        if self._closed:  # (Before a task is made for `wait_for`.)
            raise StoreClosed("the store is closed")
        if self._error is not None:
            raise self._failed_earlier()
        waiting: concurrent.futures.Future[Any] | asyncio.Future[None] | None = None
        if wait_for and self._on_loop:
            waiting = asyncio.ensure_future(_gather(wait_for))
        elif wait_for:
            waiting = asyncio.run_coroutine_threadsafe(_gather(wait_for), self._loop)
        # Queued before returning: the caller's next `transact` belongs to the next transaction.
        gate = waiting if isinstance(waiting, asyncio.Future) else None
        job = self._queue(self._commit, (data, waiting), gate)
        if waiting is not None:
            # Cancelled (or done), the job no longer waits for `wait_for`: neither the queue
            # on the loop nor the SQLite thread (whose wait then fails, rolling back).
            job.add_done_callback(lambda _: self._stop_waiting(waiting))
        return self._finish_commit(job)

    def _stop_waiting(self, waiting: concurrent.futures.Future[Any] | asyncio.Future[None]) -> None:
        waiting.cancel()
        if self._on_loop:
            self._schedule_jobs()

    def _finish_commit(self, job: asyncio.Future[None]) -> asyncio.Future[None]:
        """The future of a commit whose SQLite job is `job`: done once `job` is and, without
        `sync_waits`, once a Recorder barrier behind its operations resolves.

        Chained by callbacks rather than a task: one less task, and fewer loop turns, per
        commit. It fails with the first error. Cancelling it cancels what it waits for at
        once: the job (which then does not run, unless the SQLite thread began it), or the
        barrier's wait (the commit's operations are then recorded all the same). A failure
        fails the store (`_failed`)."""
        done = _CommitFuture(job, loop=self._loop)

        def barrier_done(barrier: asyncio.Future[Any]) -> None:
            if _relay_failure(barrier, done, self._failed):
                done.set_result(None)

        def job_done(job: asyncio.Future[None]) -> None:
            if not _relay_failure(job, done, self._failed):
                return
            if self._sync_waits:
                done.set_result(None)
                return
            # The commit's operations were handed to the loop before the job settled (FIFO).
            barrier = _start_barrier(self._bridge, self.recorder)
            if isinstance(barrier, BaseException):
                done.set_exception(self._failed(barrier))
                return
            done.waiting = barrier
            barrier.add_done_callback(barrier_done)

        job.add_done_callback(job_done)
        return done

    @property
    def failed(self) -> BaseException | None:
        """The error which failed a commit (the cause of the store's `StoreFailed`), or None."""
        return self._error

    def _failed(self, err: BaseException) -> BaseException:
        """The error a commit that failed of `err` raises: `StoreFailed` from `err`, which
        is latched as the store's failure unless one is already (`StoreFailed` and
        `StoreClosed` are raised as they are). Called from either thread."""
        if isinstance(err, (StoreFailed, StoreClosed)):
            return err
        self._latch(err)
        failed = StoreFailed(f"SQLite store in {self.directory}: commit failed: {err!r}")
        failed.__cause__ = err
        return failed

    def _latch(self, err: BaseException) -> None:
        if self._error is None:
            self._error = err
            log.warning("sqlite store failed: a commit failed dir=%s err=%r", self.directory, err)

    def _failed_earlier(self) -> StoreFailed:
        failed = StoreFailed(f"SQLite store in {self.directory} failed: {self._error!r}")
        failed.__cause__ = self._error
        return failed

    def _backlog_gate(self) -> asyncio.Future[Any] | None:
        """A barrier to wait for before the next job on the loop, if the Recorder's
        uncommitted bytes exceed `max_unsynced` (a broken Recorder: None, the job's
        recording then fails)."""
        rec = self.recorder
        if rec.uncommitted_bytes <= self._bridge.max_unsynced or rec.error is not None:
            return None
        try:
            barrier = rec.barrier(confirm=False)
        except Exception:  # Broken meanwhile: as above.
            return None
        self._bridge.barriers += 1
        return barrier

    def _commit(
        self,
        conn: apsw.Connection,
        checkpoint: bytes,
        waiting: concurrent.futures.Future[Any] | asyncio.Future[None] | None,
    ) -> None:
        if self._error is not None:  # An earlier commit failed: commit nothing.
            raise self._failed_earlier()
        try:
            if isinstance(waiting, asyncio.Future):
                waiting.result()  # On the loop: the job ran once it was done.
            elif waiting is not None:
                self._bridge.wait(waiting)
        except BaseException as err:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if not isinstance(err, (asyncio.CancelledError, concurrent.futures.CancelledError)):
                self._latch(err)  # Now: the jobs queued behind see it before the loop does.
            raise
        try:
            if not conn.in_transaction:
                conn.execute("BEGIN")
            conn.execute("UPDATE gazette_checkpoint SET checkpoint = ? WHERE id = 0", (checkpoint,))
            conn.execute("COMMIT")
            # COMMIT's own syncs handed it over; this also covers what follows the last sync
            # (e.g. a journal deletion).
            self._bridge.sync(self._sync_waits)
        except Exception as err:
            self._latch(err)
            raise

    async def build_hints(self) -> rpb.FSMHints:
        """Hints of the files recorded so far (behind a barrier): the shard's primary hints.
        Raises `StoreFailed` once a commit failed."""
        if self._error is not None:
            raise self._failed_earlier()
        return await self.recorder.build_hints()

    async def restore_checkpoint(self, shard: Shard = None) -> Checkpoint:
        """The Checkpoint of the last committed transaction (an empty one for a new store)."""
        return pb.Checkpoint.FromString(await self.run(_select_checkpoint))

    async def close(self) -> None:
        """Close the connection (recording its final checkpoint of the WAL), wait until
        everything is in the log, and stop the thread. The local files stay. Raises
        `StoreFailed` if that failed (the Recorder had failed, say)."""
        if self._closed:
            return
        try:
            if self._conn is not None:
                await self._submit(self._close_connection)  # (Also of a failed store.)
                await self._barrier_on_loop()
        except (apsw.Error, RecordingFailed, RecorderBroken) as err:
            failed = StoreFailed(f"SQLite store in {self.directory}: closing failed: {err!r}")
            raise failed from err
        finally:
            self._closed = True
            self._shutdown()

    def _close_connection(self, conn: apsw.Connection) -> None:
        conn.close()
        self._conn = None
        self._closed = True  # Jobs queued behind this one fail with StoreClosed.
        self._bridge.sync(wait=not self._on_loop)  # (On the loop, `close` waits instead.)

    def _shutdown(self, wait: bool = True) -> None:
        self._thread.shutdown(wait=wait)
        if self._vfs is not None:
            self._vfs.unregister()
            self._vfs = None

    def destroy(self) -> None:
        """Release everything and remove the store directory; nothing more is recorded."""
        self._closed = True
        self._bridge.discard()
        conn, self._conn = self._conn, None
        for fut, _ctx, _fn, _args, gate in self._jobs:
            if gate is not None and not gate.done():
                fut.cancel()  # A commit waiting for `wait_for`: cancelled, as in the thread.
            else:
                _set_exception(fut, StoreClosed("the store was destroyed"))
        self._jobs.clear()
        if conn is not None:
            try:
                if self._on_loop:
                    conn.close(True)
                else:
                    self._thread.submit(conn.close, True).result()
            except apsw.Error as err:  # Closing checkpoints a WAL; nothing of it matters now.
                log.warning("closing destroyed store dir=%s err=%r", self.directory, err)
        self._shutdown()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __del__(self) -> None:
        """An open store being collected: leave its files as a crash would, stop its
        recorder, and warn. Its connection is closed here, on whichever thread collects the
        store (often the loop's), so it cannot wait for the log: nothing more is recorded,
        and the log keeps the last commit. The closing connection does not checkpoint (a
        WAL stays as the log has it), and the recorder is abandoned, so that the directory,
        now ahead of the log, is never recorded from again: the shard's next primary plays
        the log back."""
        if self._closed or self._conn is None:
            return
        self._closed = True
        try:
            self._bridge.discard()
            self._abandon_recorder()
            conn, self._conn = self._conn, None
            try:
                conn.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
                conn.close(True)
            except apsw.Error as err:
                log.warning("closing a dropped store dir=%s err=%r", self.directory, err)
            self._shutdown(wait=False)
        finally:  # Last: warnings may be errors.
            warnings.warn(
                f"SQLiteStore {self.directory} was not closed: its changes since the last "
                "commit are not recorded (as after a crash), and its recorder is stopped; "
                "call close() or destroy()",
                ResourceWarning,
                stacklevel=1,
                source=self,
            )

    def _abandon_recorder(self) -> None:
        reason = f"the SQLiteStore of {self.directory} was dropped without close()"
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self.recorder.abandon(reason)
            return
        try:
            self._loop.call_soon_threadsafe(self.recorder.abandon, reason)
        except RuntimeError:  # The loop is closed: nothing records any more.
            pass


_LoopJob = tuple[
    asyncio.Future[Any],
    contextvars.Context,
    Callable[..., Any],
    tuple[Any, ...],
    "asyncio.Future[Any] | None",
]


class _CommitFuture(asyncio.Future[None]):
    """A commit's future (`SQLiteStore._finish_commit`): cancelling it also cancels what it
    waits for, at once (a task would reach it only at its next step)."""

    def __init__(self, waiting: asyncio.Future[Any], *, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self.waiting = waiting

    def cancel(self, msg: Any = None) -> bool:
        if self.done():
            return False
        self.waiting.cancel()
        return super().cancel(msg)


def _relay_failure(
    fut: asyncio.Future[Any],
    done: asyncio.Future[None],
    failed: Callable[[BaseException], BaseException],
) -> bool:
    """Settle `done` as done `fut` failed (with ``failed(its error)``) or was cancelled; True
    if `fut` succeeded and `done` is still to be settled."""
    if done.done():
        return False
    if fut.cancelled() or isinstance(err := fut.exception(), asyncio.CancelledError):
        done.cancel()  # (A job's cancellation arrives as an exception.)
        return False
    if err is not None:
        done.set_exception(failed(err))
        return False
    return True


def _start_barrier(bridge: RecorderBridge, recorder: Recorder) -> asyncio.Future[Any] | Exception:
    """A barrier behind everything handed to `recorder`, or the error that prevents one.

    Returned rather than raised, so that the error's traceback does not hold the calling
    callback's frame (and, through it, the future it settles)."""
    try:
        bridge.check()
        return recorder.barrier()
    except Exception as err:
        return err


def _set_result(fut: asyncio.Future[T], result: T) -> None:
    if not fut.done():  # (Cancelled while the job ran.)
        fut.set_result(result)


def _set_exception(fut: asyncio.Future[Any], err: BaseException) -> None:
    if fut.done():
        return
    if type(err) is concurrent.futures.CancelledError:
        # (A wait of the SQLite thread cancelled, e.g. by destroy().) The caller sees a
        # cancellation, as run_in_executor would show it, not an ordinary exception.
        err = asyncio.CancelledError(*err.args)
    elif isinstance(err, StopIteration):  # A future cannot hold one.
        wrapped = RuntimeError(f"the store's job raised {err!r}")
        wrapped.__cause__ = err
        err = wrapped
    fut.set_exception(err)


def _select_checkpoint(conn: apsw.Connection) -> bytes:
    rows = conn.execute("SELECT checkpoint FROM gazette_checkpoint WHERE id = 0").fetchall()
    if not rows:
        return b""
    value = rows[0][0]
    assert isinstance(value, bytes), f"gazette_checkpoint holds {type(value).__name__}"
    return value


async def _gather(futures: Sequence[OpFuture]) -> None:
    # Shielded: a commit cancelled (or destroyed) stops waiting for the caller's futures,
    # and leaves them be.
    await asyncio.gather(*(asyncio.shield(f) for f in futures))


async def recover(
    client: JournalClient,
    append_service: AppendService,
    log_name: str,
    directory: Path,
    *,
    hints: rpb.FSMHints | None = None,
    author: int | None = None,
    **open_args: Any,
) -> SQLiteStore:
    """Play `log_name` into `directory` (wiped first), take the log over as `author` (a new
    one by default), and open the store recording onwards from the played FSM, as the
    consumer runtime does (`SQLiteStore.from_recovered`).

    The hand-off fences earlier authors' Recorders, also of a log never written to. Raises
    the Player's errors (`DataLoss`...) and `open`'s.
    """
    recovered = await recovery.recover(
        client, append_service, log_name, directory, hints=hints, author=author
    )
    return await SQLiteStore.from_recovered(recovered, **open_args)
