"""SQLStore: a consumer Store in a remote SQL database, over any DB-API 2.0 connection.

The application's state is rows of the database; the shard's Checkpoint is a row of table
``gazette_checkpoints`` (`CHECKPOINTS_TABLE`), keyed by the shard's fully-qualified name,
which the store updates in the same SQL transaction as the application's changes. Nothing is
recorded to a recovery log.

Fencing, as upstream: `restore_checkpoint` increments the row's ``fence`` (inserting the row
if missing) and remembers it; `start_commit` updates the checkpoint only ``WHERE fence`` is
still the remembered one. Once a newer primary of the shard restored (incremented the fence),
the older one's commit updates no row and is rolled back, failing with `Fenced`: a zombie
primary can never commit over its successor.

DB-API calls block, so one worker thread owned by the store makes every call on its
connection, in submission order (`run`, `transact`). The connection is made by the
``connect`` callable given to `open`, in that thread (sqlite3 connections refuse other
threads). The consumer transaction is the connection's implicit DB-API transaction;
`start_commit` queues its commit job at once, so work submitted after it belongs to the next
transaction.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gazette.consumer.protocol import pb
from gazette.consumer.store import Checkpoint, OpFuture, Shard
from gazette.consumer.store_errors import StoreClosed, StoreFailed

__all__ = [
    "CHECKPOINTS_TABLE",
    "DIALECTS",
    "Dialect",
    "Fenced",
    "SQLStore",
    "detect_dialect",
    "detect_placeholder",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

CHECKPOINTS_TABLE = "gazette_checkpoints"

Connection = Any
"""A DB-API 2.0 connection (PEP 249 has no runtime protocol to check against)."""
Cursor = Any
"""A DB-API 2.0 cursor."""


@dataclass(frozen=True)
class Dialect:
    """What differs between the SQL dialects the store speaks."""

    name: str
    key_type: str
    """Column type of ``shard_fqn`` (MySQL can't index unbounded TEXT)."""
    blob_type: str
    """Column type of ``checkpoint``."""
    upsert_missing: bool
    """Whether ``INSERT ... ON CONFLICT (shard_fqn) DO NOTHING`` is understood."""


DIALECTS: dict[str, Dialect] = {
    "postgresql": Dialect("postgresql", "TEXT", "BYTEA", True),
    "sqlite": Dialect("sqlite", "TEXT", "BLOB", True),
    "mysql": Dialect("mysql", "VARCHAR(512)", "LONGBLOB", False),
    "generic": Dialect("generic", "VARCHAR(512)", "BLOB", False),
}

_DRIVER_DIALECTS = {
    "psycopg": "postgresql",
    "psycopg2": "postgresql",
    "pg8000": "postgresql",
    "sqlite3": "sqlite",
    "pysqlite2": "sqlite",
    "MySQLdb": "mysql",
    "pymysql": "mysql",
    "mysql": "mysql",
}

_PLACEHOLDERS = {"qmark": "?", "format": "%s", "pyformat": "%s"}


def _driver_module(conn: Connection) -> str:
    return type(conn).__module__.split(".")[0]


def detect_dialect(conn: Connection) -> Dialect:
    """The SQL dialect of DB-API connection `conn`, from its driver module (``generic`` for
    drivers not in the table)."""
    return DIALECTS[_DRIVER_DIALECTS.get(_driver_module(conn), "generic")]


def detect_placeholder(conn: Connection) -> str:
    """The positional placeholder (``?`` or ``%s``) of `conn`'s driver, from its module's
    ``paramstyle``. Raises ValueError for ``numeric`` and ``named`` drivers (pass
    ``placeholder`` to `SQLStore.open`)."""
    module = _driver_module(conn)
    paramstyle = getattr(sys.modules.get(module), "paramstyle", "qmark")
    placeholder = _PLACEHOLDERS.get(paramstyle)
    if placeholder is None:
        raise ValueError(f"driver {module} has paramstyle {paramstyle!r}: pass placeholder=")
    return placeholder


class Fenced(StoreFailed):
    """The shard's checkpoint fence moved on: another instance restored the shard since
    this one did. The transaction was rolled back. A `StoreFailed`, as every failed commit
    of a store is."""

    def __init__(self, shard_fqn: str, fence: int) -> None:
        super().__init__(
            f"checkpoint of shard {shard_fqn!r} is fenced: its fence is no longer {fence} "
            "(a newer primary restored the shard); transaction rolled back"
        )
        self.shard_fqn = shard_fqn
        self.fence = fence


class SQLStore:
    """A Store of application rows and a fenced checkpoint row (module docs). Use `open`."""

    def __init__(self) -> None:  # Use `open`.
        self.dialect: Dialect
        self.placeholder: str
        """The driver's positional placeholder (``?`` or ``%s``), for the application's SQL."""
        self._shard_fqn: str | None = None
        self._fence: int | None = None
        self._conn: Connection | None = None
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sql-store")
        self._loop: asyncio.AbstractEventLoop
        self._commit: asyncio.Future[None] | None = None
        self._waiting: concurrent.futures.Future[Any] | None = None
        self._error: BaseException | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        connect: Callable[[], Connection],
        *,
        shard_fqn: str | None = None,
        dialect: str | None = None,
        placeholder: str | None = None,
    ) -> SQLStore:
        """Connect (calling `connect` in the store's thread) and create ``gazette_checkpoints``
        if it's missing.

        `shard_fqn` names the shard's checkpoint row if the shard passed to
        `restore_checkpoint` has no ``fqn``. `dialect` (a key of `DIALECTS`) and
        `placeholder` override what `detect_dialect` finds. The connection must not be in
        autocommit mode. Raises the driver's errors.
        """
        self = cls()
        self._loop = asyncio.get_running_loop()
        self._shard_fqn = shard_fqn
        try:
            await self._submit(self._connect, connect, dialect, placeholder)
        except BaseException:
            self.destroy()
            raise
        return self

    def _connect(
        self, connect: Callable[[], Connection], dialect: str | None, placeholder: str | None
    ) -> None:
        conn = connect()
        self._conn = conn
        self.dialect = DIALECTS[dialect] if dialect is not None else detect_dialect(conn)
        self.placeholder = placeholder or detect_placeholder(conn)
        d = self.dialect
        ddl = (
            f"CREATE TABLE IF NOT EXISTS {CHECKPOINTS_TABLE} ("
            f"shard_fqn {d.key_type} PRIMARY KEY, "
            "fence INTEGER NOT NULL, "
            f"checkpoint {d.blob_type} NOT NULL)"
        )
        for attempt in range(3):
            try:
                cur = conn.cursor()
                cur.execute(ddl)
                cur.close()
                conn.commit()
                return
            except Exception:
                # Concurrent CREATE TABLE IF NOT EXISTS can race in PostgreSQL (a unique
                # violation in its catalog): the table exists on the next attempt.
                conn.rollback()
                if attempt == 2:
                    raise

    # -- The application API ---------------------------------------------------------------

    @property
    def connection(self) -> Connection:
        """The DB-API connection: use it only within functions passed to `run`."""
        if self._conn is None:
            raise StoreClosed("the store is not open")
        return self._conn

    @property
    def shard_fqn(self) -> str | None:
        return self._shard_fqn

    @property
    def fence(self) -> int | None:
        """The fence taken by `restore_checkpoint` (None before it)."""
        return self._fence

    @property
    def failed(self) -> BaseException | None:
        """The error which failed a commit, or None."""
        return self._error

    def sql(self, statement: str) -> str:
        """`statement` with each ``?`` replaced by the driver's placeholder."""
        return statement if self.placeholder == "?" else statement.replace("?", self.placeholder)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` in the store's thread; return its result.

        Calls run one at a time, in call order, within the open consumer transaction (what
        they change commits with the next `start_commit`). Cancelling the await does not stop
        `fn`. Raises `StoreClosed` once closed, `StoreFailed` once a commit failed.
        """
        self._check()
        return await self._submit(fn, self._conn, *args)

    async def transact(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(cursor, *args)`` in the store's thread with a fresh cursor (closed
        afterwards); as `run`."""
        return await self.run(_with_cursor, fn, *args)

    def _check(self) -> None:
        if self._closed:
            raise StoreClosed("the SQL store is closed")
        if self._error is not None:
            raise StoreFailed(f"SQL store failed: {self._error!r}") from self._error

    def _submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, fn, *args)
        return self._loop.run_in_executor(self._thread, call)

    # -- The Store contract -----------------------------------------------------------------

    async def restore_checkpoint(self, shard: Shard = None) -> Checkpoint:
        """Take the shard's next fence and return its last committed Checkpoint.

        In one transaction: insert the shard's row if it's missing (fence 0, an empty
        checkpoint), increment its fence, and read it back with the checkpoint. From then on
        commits of earlier instances of the shard fail with `Fenced`. Raises ValueError if
        neither `shard` nor `open` named the shard.
        """
        fqn = getattr(shard, "fqn", None) or self._shard_fqn
        if not fqn:
            raise ValueError("the shard has no fqn and SQLStore.open was given no shard_fqn")
        self._check()
        fence, raw = await self._submit(self._restore, str(fqn))
        self._shard_fqn = str(fqn)
        self._fence = fence
        log.info("restored SQL store checkpoint shard=%s fence=%d", fqn, fence)
        return pb.Checkpoint.FromString(raw)

    def _restore(self, fqn: str) -> tuple[int, bytes]:
        conn = self.connection
        t = CHECKPOINTS_TABLE
        try:
            cur = conn.cursor()
            try:
                if self.dialect.upsert_missing:
                    cur.execute(
                        self.sql(
                            f"INSERT INTO {t} (shard_fqn, fence, checkpoint) VALUES (?, 0, ?) "
                            "ON CONFLICT (shard_fqn) DO NOTHING"
                        ),
                        (fqn, b""),
                    )
                else:
                    cur.execute(self.sql(f"SELECT fence FROM {t} WHERE shard_fqn = ?"), (fqn,))
                    if cur.fetchone() is None:
                        cur.execute(
                            self.sql(
                                f"INSERT INTO {t} (shard_fqn, fence, checkpoint) VALUES (?, 0, ?)"
                            ),
                            (fqn, b""),
                        )
                cur.execute(
                    self.sql(f"UPDATE {t} SET fence = fence + 1 WHERE shard_fqn = ?"), (fqn,)
                )
                cur.execute(
                    self.sql(f"SELECT fence, checkpoint FROM {t} WHERE shard_fqn = ?"), (fqn,)
                )
                row = cur.fetchone()
            finally:
                cur.close()
            conn.commit()
        except BaseException:
            _rollback(conn)
            raise
        if row is None:
            raise RuntimeError(f"row of shard {fqn!r} vanished from {t}")
        return int(row[0]), bytes(row[1])

    def start_commit(
        self, shard: Shard, checkpoint: Checkpoint, wait_for: Sequence[OpFuture] = ()
    ) -> asyncio.Future[None]:
        """Commit the open transaction with `checkpoint` (Store contract, module docs).

        The commit job is queued at once: in the store's thread it waits for `wait_for`,
        updates the checkpoint where the fence is still this instance's, and commits. The
        returned future resolves once committed, or fails (after a rollback) with
        `StoreFailed`: `Fenced` (a newer instance restored the shard), or `StoreFailed` from
        the first error of `wait_for` or the driver's; the store is then unusable. Raises
        `StoreClosed`/`StoreFailed` at once if already unusable, and
        RuntimeError before `restore_checkpoint`.
        """
        self._check()
        if self._fence is None or self._shard_fqn is None:
            raise RuntimeError("start_commit before restore_checkpoint")
        if self._commit is not None and not self._commit.done():
            raise RuntimeError("start_commit called while the previous commit is in flight")
        waiting: concurrent.futures.Future[Any] | None = None
        if wait_for:
            waiting = asyncio.run_coroutine_threadsafe(_gather(wait_for), self._loop)
        self._waiting = waiting
        job = self._submit(
            self._commit_job,
            checkpoint.SerializeToString(deterministic=True),
            self._shard_fqn,
            self._fence,
            waiting,
        )
        self._commit = asyncio.ensure_future(self._finish_commit(job, waiting))
        return self._commit

    async def _finish_commit(
        self, job: asyncio.Future[None], waiting: concurrent.futures.Future[Any] | None
    ) -> None:
        try:
            await job
        except BaseException as err:
            if waiting is not None:
                waiting.cancel()  # If this task was cancelled, the thread stops waiting.
            if self._error is None:
                self._error = err
                log.warning("SQL store commit failed shard=%s err=%r", self._shard_fqn, err)
            if isinstance(err, StoreFailed) or not isinstance(err, Exception):
                raise  # already named, or a cancellation (not an Exception)
            raise StoreFailed(f"SQL store commit failed: {err!r}") from err

    def _commit_job(
        self,
        checkpoint: bytes,
        fqn: str,
        fence: int,
        waiting: concurrent.futures.Future[Any] | None,
    ) -> None:
        conn = self.connection
        try:
            if waiting is not None:
                waiting.result()
            cur = conn.cursor()
            try:
                cur.execute(
                    self.sql(
                        f"UPDATE {CHECKPOINTS_TABLE} SET checkpoint = ? "
                        "WHERE shard_fqn = ? AND fence = ?"
                    ),
                    (checkpoint, fqn, fence),
                )
                updated = cur.rowcount
            finally:
                cur.close()
            if updated != 1:
                raise Fenced(fqn, fence)
            conn.commit()
        except BaseException:
            _rollback(conn)
            raise

    async def close(self) -> None:
        """Wait for a commit in flight, roll back anything uncommitted, close the connection
        and stop the thread."""
        if self._closed:
            return
        self._closed = True
        commit = self._commit
        if commit is not None and not commit.done():
            await asyncio.wait([commit])
        try:
            if self._conn is not None:
                await self._submit(self._close_connection)
        finally:
            self._thread.shutdown(wait=True)

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            _rollback(conn)
            conn.close()

    def destroy(self) -> None:
        """Abandon the open transaction and a commit in flight (it is rolled back), close
        the connection and stop the thread (Store contract). Blocks until the thread is done
        with its current call."""
        if self._closed and self._conn is None:
            return
        self._closed = True
        if self._waiting is not None:
            self._waiting.cancel()  # A commit job waiting on the loop stops waiting.
        commit = self._commit
        if commit is not None and not commit.done():
            commit.cancel()
        with contextlib.suppress(RuntimeError):  # The thread was shut down by `close`.
            self._thread.submit(self._close_connection)
        self._thread.shutdown(wait=True)


def _with_cursor(conn: Connection, fn: Callable[..., T], *args: Any) -> T:
    cur = conn.cursor()
    try:
        return fn(cur, *args)
    finally:
        cur.close()


def _rollback(conn: Connection) -> None:
    try:
        conn.rollback()
    except Exception as err:  # The connection may be broken: it's closed next anyway.
        log.warning("rollback failed err=%r", err)


async def _gather(futures: Sequence[OpFuture]) -> None:
    await asyncio.gather(*futures)
