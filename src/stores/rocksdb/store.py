"""RocksDBStore: a consumer Store of an embedded RocksDB (rocksdict) on a fusefs mount, so
that every file operation of RocksDB is recorded into the shard's recovery log.

`RocksDBStore.from_recovered` takes a `RecoveredLog` (the log played back into a directory
and handed off to this process's author, as the consumer runtime does), mounts fusefs over
that directory at ``<directory>.mnt`` (a process of its own, see docs/fusefs.md) and opens
the database there; `RocksDBStore.open` plays the log itself first. RocksDB's options are
set for recording: no WAL recycling (a reused WAL would keep dead bytes live), a MANIFEST
rolled at `MAX_MANIFEST_FILE_SIZE` (bounds what playback reads), no mmap writes.

Transactions: `put`/`delete` go into the current transaction's WriteBatch (reads see them);
`start_commit` adds the serialized ``consumer.Checkpoint`` under `CHECKPOINT_KEY` to that
batch, writes it (to the memtable and the WAL file), then syncs the WAL files on the mount
(`_wal.WalFiles`): a sync on the mount returns once everything recorded is committed to the
log. The sync is the store's own `os.fdatasync`, not RocksDB's ``sync=True``: rocksdict holds
the GIL for the whole of a write, so a synced write would stall every other thread of the
process (the consumer's event loop) for the length of the log round trip, where
`os.fdatasync` lets them run. Syncs run in a thread of their own, so that a commit started
before the previous one is durable writes while that one syncs, and one sync covers every
commit written before it began (group commit). The store is crash-consistent because the log
is a prefix of the operations RocksDB performed, and the WAL holds each batch whole or not at
all.
Application keys must begin with a byte >= 0x01; keys beginning with 0x00 are the store's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rocksdict import BlockBasedOptions, Options, Rdict, WriteBatch, WriteOptions

from gazette.auth.client_settings import broker_client
from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.protocol import pb
from gazette.consumer.recovery import recover
from gazette.consumer.store import (
    Checkpoint,
    OpFuture,
    RecordingFenced,
    RecordingLost,
    RecoveredLog,
    Shard,
)
from gazette.consumer.store_errors import StoreClosed, StoreFailed
from gazette.fusefs import FuseMount, force_unmount, is_mounted
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.author import new_author
from gazette.stores.rocksdb._wal import NoWal, WalFiles
from gazette.stores.rocksdb.prestart import take_prestarted

__all__ = [
    "CHECKPOINT_KEY",
    "MAX_MANIFEST_FILE_SIZE",
    "InvalidKey",
    "RocksDBStore",
    "recorded_options",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

CHECKPOINT_KEY = b"\x00checkpoint"
MAX_MANIFEST_FILE_SIZE = 128 << 10
TABLE_FORMAT_VERSION = 5
"""The block-based table format the default options write: the newest that Debian's
librocksdb (7.8), behind the Spark export's native scanner (`stores.rocksdb.scan`), reads.
rocksdict (RocksDB 9.8) would write 6, whose only addition is a per-block context checksum."""

WAL_SUFFIXES = (".log",)
"""RocksDB's WAL files: their writes bypass the mount's page cache (`FuseMount.start`'s
`direct_writes`), so that a commit's WAL write reaches fusefs as one request, not two."""

_DELETED = object()


class InvalidKey(ValueError):
    """An application key is empty or begins with 0x00 (reserved for the store)."""


def recorded_options(options: Options | None = None, info_log_dir: str = "") -> Options:
    """RocksDB options suitable for a recorded database (module docs), in raw (bytes) mode.

    `info_log_dir`: where RocksDB writes its info LOG, off the mount: a LOG written all the
    time would be one Fnode whose live segment spans the whole log, so that a hinted
    playback would read everything.

    Without `options`, tables are written in `TABLE_FORMAT_VERSION`. Given `options`, their
    table settings are kept as they are: set ``BlockBasedOptions.set_format_version(5)`` to
    keep the Spark export's native scanner (it falls back to rocksdict, slower, otherwise)."""
    if options is None:
        opt = Options(raw_mode=True)
        table = BlockBasedOptions()
        table.set_format_version(TABLE_FORMAT_VERSION)
        opt.set_block_based_table_factory(table)
    else:
        opt = options
    if info_log_dir:
        opt.set_db_log_dir(info_log_dir)
    opt.create_if_missing(True)
    opt.set_recycle_log_file_num(0)
    opt.set_max_manifest_file_size(MAX_MANIFEST_FILE_SIZE)
    opt.set_allow_mmap_writes(False)
    opt.set_allow_mmap_reads(False)
    opt.set_keep_log_file_num(2)
    return opt


def _check_key(key: bytes) -> None:
    if not key or key[0] == 0:
        raise InvalidKey(f"application keys must begin with a byte >= 0x01, not {key[:8]!r}")


class RocksDBStore:
    """A recorded RocksDB store (module docs). Create with `from_recovered` or `open`."""

    def __init__(self) -> None:  # Use `from_recovered` or `open`.
        self.mount: FuseMount
        self.db: Rdict
        self.backing: Path
        """The played-back directory fusefs records (RocksDB's files, off the mount)."""
        self.info_log: Path
        """Where RocksDB writes its info LOG (not recorded)."""
        self.workdir: Path | None = None
        """The working directory of `open` (None after `from_recovered`)."""
        self.author = 0
        self._loop: asyncio.AbstractEventLoop
        self._exec = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rocksdb-store")
        """Runs the database's long calls in order: opening, flushes, compactions, close.
        Writes run on the event loop (`_write`)."""
        self._sync_exec = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="rocksdb-sync"
        )
        """Syncs the WAL files (`_wal`), while the next commit may write."""
        self._wal: WalFiles
        self._written = 0
        """Commits written to the database (to the memtable and the WAL file)."""
        self._synced = 0
        """Commits known to be in the log: `_written` as of the start of the last sync."""
        self._last_written: asyncio.Future[None] | None = None
        self._last_commit: asyncio.Future[None] | None = None
        self._batch = WriteBatch(raw_mode=True)
        self._overlay: dict[bytes, Any] = {}
        self._committing: list[dict[bytes, Any]] = []
        self._unsynced = WriteOptions()  # Made durable by `_sync_through` (module docs).
        self._unsynced.no_slowdown = True  # See `_write`.
        self.stalls = 0
        """Writes refused by a write stall, then retried."""
        self._error: BaseException | None = None
        self._closed = False
        self.commits = 0

    @classmethod
    async def from_recovered(
        cls,
        recovered: RecoveredLog,
        *,
        options: Options | None = None,
        writeback: bool = True,
        fusefs_log_level: str | None = None,
    ) -> RocksDBStore:
        """Open the store of a played-back, handed-off recovery log (module docs).

        ``recovered.directory`` becomes fusefs's backing directory, mounted at
        ``<directory>.mnt``; RocksDB's info LOG goes to ``<directory>.info-log``, both beside
        it. The fusefs process records into ``recovered.log`` as ``recovered.author`` onwards
        from ``recovered.fsm``, through its own client of ``recovered.broker_endpoint``.
        `options` are adjusted by `recorded_options`. Raises `MountFailed` or rocksdict's
        exception (the mount is then killed).

        WAL files are written with direct I/O (`WAL_SUFFIXES`): a WAL write reaches fusefs as
        RocksDB makes it, in one request, and is appended to the log while RocksDB fills its
        memtable, so that the commit's sync seldom waits for the log (docs/rocksdb-store.md,
        "Where a commit's time goes"). Other files go through the kernel's write-back cache
        (unless `writeback` is False): their pages stay cached, whereas without it the kernel
        does not keep the pages a write covers only in part, and reads of new SSTs go to
        fusefs.
        """
        self = cls()
        self._loop = asyncio.get_running_loop()
        self.backing = Path(recovered.directory).resolve()
        self.info_log = _beside(self.backing, ".info-log")
        self.author = recovered.author
        self.mount = await FuseMount.start(
            recovered.broker_endpoint,
            recovered.log,
            recovered.fsm,
            recovered.author,
            self.backing,
            _beside(self.backing, ".mnt"),
            writeback=writeback,
            direct_writes=WAL_SUFFIXES,
            log_level=fusefs_log_level,
            prestarted=take_prestarted(recovered.store_hooks, fusefs_log_level),
        )
        try:
            self.info_log.mkdir(exist_ok=True)
            opt = recorded_options(options, str(self.info_log))
            self.db = await self._run(Rdict, str(self.mount.mountpoint), opt)
            self._wal = WalFiles(self.backing, self.mount.mountpoint)
        except BaseException:
            self._exec.shutdown(wait=False)
            self._sync_exec.shutdown(wait=False)
            await self.mount.kill()
            raise
        log.info(
            "rocksdb store open log=%s directory=%s files=%d",
            recovered.log,
            self.backing,
            len(recovered.fsm.links),
        )
        return self

    @classmethod
    async def open(
        cls,
        endpoint: str,
        log_name: str,
        workdir: str | Path,
        *,
        author: int | None = None,
        hints: rpb.FSMHints | None = None,
        options: Options | None = None,
        writeback: bool = True,
        fusefs_log_level: str | None = None,
    ) -> RocksDBStore:
        """Recover the store of `log_name` into `workdir` and open it: play the log into
        ``<workdir>/backing`` (wiped first) and hand it off to `author` (a new one by
        default), as the consumer runtime does, then `from_recovered`.

        From the hand-off on, an earlier primary's commits fail. Raises the Player's errors
        (`DataLoss`...) and `from_recovered`'s. `destroy` removes `workdir`. The brokers are
        dialled with the TLS and authorization of the ``BROKER_*`` environment, here and
        in the fusefs process (`gazette.auth.client_settings`).
        """
        workdir = Path(workdir).resolve()
        author = author if author is not None else new_author()
        backing = workdir / "backing"
        backing.mkdir(parents=True, exist_ok=True)
        tls, auth = broker_client()  # as the fusefs process it starts will dial them
        client = JournalClient(endpoint, tls=tls, auth=auth)
        async with client, AppendService(client) as service:
            recovered = await recover(
                client,
                service,
                log_name,
                backing,
                hints=hints,
                author=author,
                broker_endpoint=endpoint,
            )
            self = await cls.from_recovered(
                recovered, options=options, writeback=writeback, fusefs_log_level=fusefs_log_level
            )
        self.workdir = workdir
        return self

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._loop.run_in_executor(self._exec, functools.partial(fn, *args, **kwargs))

    @property
    def directory(self) -> Path:
        """The database's directory (on the mount)."""
        return self.mount.mountpoint

    def recording_lost(self) -> RecordingLost | None:
        """A `RecordingLost` if the fusefs process exited while the store was open (killed,
        or crashed; not ended by `close` or `destroy`), else None."""
        if self._closed or not self.mount.exited:
            return None
        return RecordingLost(
            f"the fusefs process (pid {self.mount.pid}) recording {self.mount.config.log} "
            f"exited while its RocksDB store at {self.mount.mountpoint} was open"
        )

    async def recording_fenced(self) -> RecordingFenced | None:
        """A `RecordingFenced` if the fusefs process says its Recorder was fenced (another
        author took the log over), else None."""
        if self._closed or self.mount.exited:
            return None
        stats = await self.mount.stats()
        if not stats.get("fenced"):
            return None
        return RecordingFenced(
            f"the recorder of {self.mount.config.log} (fusefs pid {self.mount.pid}) was "
            f"fenced: {stats.get('error')}"
        )

    def _check(self) -> None:
        if self._error is not None:
            raise StoreFailed(f"store failed: {self._error!r}") from self._error
        if self._closed:
            raise StoreClosed("the store is closed")

    # -- Application API --------------------------------------------------------------------

    # get, put and delete run for every operation of a transaction: their checks are inline
    # (a call costs about as much as rocksdict's own put), and get allocates nothing.

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of `key`, including writes of transactions not yet committed."""
        v = self._overlay.get(key)
        if v is None:
            committing = self._committing
            i = len(committing)
            while v is None and i:
                i -= 1
                v = committing[i].get(key)
            if v is None:
                out = self.db.get(key)
                return default if out is None else out
        return default if v is _DELETED else v

    def put(self, key: bytes, value: bytes) -> None:
        """Put `key` in the current transaction. Raises `InvalidKey`."""
        if not key or key[0] == 0:
            _check_key(key)
        if self._error is not None or self._closed:
            self._check()
        self._batch.put(key, value)
        self._overlay[key] = value

    def delete(self, key: bytes) -> None:
        """Delete `key` in the current transaction. Raises `InvalidKey`."""
        if not key or key[0] == 0:
            _check_key(key)
        if self._error is not None or self._closed:
            self._check()
        self._batch.delete(key)
        self._overlay[key] = _DELETED

    def items(self, from_key: bytes = b"\x01") -> Iterator[tuple[bytes, bytes]]:
        """Application (key, value) pairs from `from_key` in key order, including writes of
        transactions not yet committed (as of the call)."""
        pending: dict[bytes, Any] = {}
        for layer in (*self._committing, self._overlay):
            pending.update(layer)
        start = max(from_key, b"\x01")  # 0x00 keys (the checkpoint) are the store's.
        keys = sorted(k for k in pending if k >= start)
        i = 0
        for k, v in self.db.items(from_key=start):
            assert isinstance(k, bytes)  # Raw mode.
            while i < len(keys) and keys[i] < k:
                pv = pending[keys[i]]
                if pv is not _DELETED:
                    yield keys[i], pv
                i += 1
            if i < len(keys) and keys[i] == k:
                pv = pending[k]
                i += 1
                if pv is not _DELETED:
                    yield k, pv
                continue
            yield k, v
        for k in keys[i:]:
            pv = pending[k]
            if pv is not _DELETED:
                yield k, pv

    # -- Store contract -----------------------------------------------------------------------

    def start_commit(
        self, shard: Shard, checkpoint: Checkpoint, wait_for: Sequence[OpFuture]
    ) -> OpFuture:
        """Commit the current transaction with `checkpoint` (one WriteBatch, then a sync of
        the WAL files); the returned future resolves once it is committed to the recovery
        log, and raises `StoreFailed` if it could not be (the store is then unusable).
        Writes made after this call belong to the next transaction. Raises `TypeError` at
        once if `checkpoint` is not a ``consumer.Checkpoint`` message.

        Commits may be started before earlier ones resolve: they are written in the order
        they were started (each once its `wait_for` resolved and the one before was
        written), a commit's write goes ahead while the one before is being synced, one
        sync covers every commit written before it began, and the futures resolve in order.
        Once a commit failed (or was cancelled) the store has failed: commits not yet
        written fail without writing anything, while one already written still succeeds if it
        becomes durable and every earlier commit succeeded."""
        data = _marshal(checkpoint)
        self._check()
        batch, overlay = self._batch, self._overlay
        self._batch, self._overlay = WriteBatch(raw_mode=True), {}
        batch.put(CHECKPOINT_KEY, data)
        overlay[CHECKPOINT_KEY] = data  # For a rebuilt batch (`_write`); 0x00 keys are the store's.
        self._committing.append(overlay)
        written: asyncio.Future[None] = self._loop.create_future()
        task = self._loop.create_task(
            self._commit(
                batch, overlay, list(wait_for), written, self._last_written, self._last_commit
            )
        )
        task.add_done_callback(functools.partial(self._commit_ended, written, overlay))
        self._last_written, self._last_commit = written, task
        return task

    async def _commit(
        self,
        batch: WriteBatch,
        overlay: dict[bytes, Any],
        wait_for: list[OpFuture],
        written: asyncio.Future[None],
        prev_written: asyncio.Future[None] | None,
        prev_commit: asyncio.Future[None] | None,
    ) -> None:
        try:
            for f in wait_for:
                await f
            if prev_written is not None and not prev_written.done():
                await asyncio.wait([prev_written])  # (Not cancelled with this commit.)
            self._check()  # A commit failed (or the store closed): write nothing.
            await self._write(batch, overlay)
            self._written += 1
            seq = self._written
            written.set_result(None)
            if self._synced < seq:
                await self._loop.run_in_executor(self._sync_exec, self._sync_through, seq)
        except BaseException as err:
            self._fail(err)
            if not written.done():
                written.set_result(None)
            task = asyncio.current_task()
            being_cancelled = task is not None and task.cancelling() > 0
            if being_cancelled:
                # Cancelled by its owner (or with the task awaiting it): it ends cancelled. As
                # a StoreFailed, the cancellation of a shard being stopped read as its failure.
                raise
            if prev_commit is not None:
                # Resolve in order, failures too (a dependency's CancelledError included).
                await asyncio.wait([prev_commit])
            if isinstance(err, StoreFailed):
                raise
            raise StoreFailed(f"commit failed: {err!r}") from err
        if prev_commit is not None:
            # Durable, but it counts only if every earlier commit did (a later commit's
            # failure does not undo this one).
            if not prev_commit.done():
                await asyncio.wait([prev_commit])
            if prev_commit.cancelled() or prev_commit.exception() is not None:
                raise StoreFailed("an earlier commit failed") from (
                    None if prev_commit.cancelled() else prev_commit.exception()
                )
        self.commits += 1

    def _commit_ended(
        self, written: asyncio.Future[None], overlay: dict[bytes, Any], task: asyncio.Task[None]
    ) -> None:
        """Done callback of a commit's task, however it ended (even cancelled before its
        first step, when its coroutine never ran)."""
        if not written.done():
            written.set_result(None)
        with contextlib.suppress(ValueError):
            self._committing.remove(overlay)
        if task.cancelled():
            self._fail(asyncio.CancelledError("a commit was cancelled"))

    def _fail(self, err: BaseException) -> None:
        if self._error is None:
            self._error = err
            if isinstance(err, asyncio.CancelledError):
                # Its owner released the store with the commit in flight (the shard stopped):
                # that commit is not acknowledged, and is no error of the store.
                log.info("rocksdb store commit abandoned: the store is being released")
            else:
                # A warning: the shard reports the failure (an error) if it is still running;
                # a zombie being stopped sees its commits fail because its log was fenced.
                log.warning("rocksdb store failed: a commit failed err=%r", err)

    async def _write(self, batch: WriteBatch, overlay: dict[bytes, Any]) -> None:
        """Write `batch` (unsynced), the transaction whose writes `overlay` holds. A write
        RocksDB would delay or stop (a write stall, while compactions catch up) is refused at
        once instead (``no_slowdown``), and retried after a pause taken on the event loop:
        rocksdict holds the GIL for the whole of a write, so a stalled write would freeze the
        process (its event loop, leases, RPCs) meanwhile. A refused write applied nothing, but
        it consumed the batch: the retry writes one rebuilt from `overlay`.

        The write runs on the event loop's thread. rocksdict holds the GIL for the whole of
        it, so in another thread it would not let the loop run meanwhile either, and the hop
        there and back cost 0.25-0.45 ms a commit (docs/rocksdb-store.md)."""
        pause = _STALL_PAUSE
        while True:
            try:
                self.db.write(batch, self._unsynced)
                return
            except Exception as err:
                if not _is_write_stall(err):
                    raise
            batch = WriteBatch(raw_mode=True)
            for key, value in overlay.items():
                if value is _DELETED:
                    batch.delete(key)
                else:
                    batch.put(key, value)
            self.stalls += 1
            if self.stalls == 1 or self.stalls % 100 == 0:
                log.warning(
                    "rocksdb write stall (compactions behind), retrying stalls=%d", self.stalls
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, _STALL_PAUSE_MAX)
            # Not retried once the store failed or began closing (the executor may be
            # closing the database meanwhile: no write may follow).
            self._check()

    def _sync_through(self, seq: int) -> None:
        """Make commit `seq` durable (in the sync thread): sync the WAL files, unless a sync
        that began after that commit was written has already completed."""
        if self._synced >= seq:
            return
        through = self._written  # Written before this sync begins, so covered by it.
        try:
            self._wal.sync()
        except NoWal as err:
            raise StoreFailed(str(err)) from None
        self._synced = max(self._synced, through)

    async def restore_checkpoint(self, shard: Shard) -> Checkpoint:
        """The Checkpoint of the last commit (an empty one for a new store)."""
        out = self.db.get(CHECKPOINT_KEY)
        return pb.Checkpoint() if out is None else pb.Checkpoint.FromString(bytes(out))

    async def build_hints(self) -> rpb.FSMHints:
        """Recovery-log hints of the store as of now (once committed): a playback from them
        reads only the live parts of the log."""
        self._check()
        return await self.mount.build_hints()

    async def compact(self) -> None:
        """Flush the memtable and compact the whole key range (for tests and maintenance)."""
        self._check()
        await self._run(self.db.flush, True)
        await self._run(self.db.compact_range, None, None)

    async def close(self) -> Any:
        """Close the database and stop the mount cleanly; returns the final (FSM, write head)
        of the recording, or None if recording had failed. Local files are kept. Commits
        still in flight may succeed (those already synced, or whose sync was under way) or
        fail (`StoreFailed`; one may still have reached the log)."""
        if self._closed:
            return None
        self._closed = True
        try:
            await self._loop.run_in_executor(self._sync_exec, self._wal.close)
            await self._run(self.db.close)
        finally:
            self._exec.shutdown(wait=False)
            self._sync_exec.shutdown(wait=False)
            result = await self.mount.stop()
        return result

    def destroy(self) -> None:
        """Release everything, without waiting for the log, and remove the local files: the
        backing directory, the mount's directory and the info LOG (and `open`'s workdir).

        Must be called from outside the event loop's running tasks' critical path: it kills
        the fusefs process (detaching the mount). The loop collects the process's exit in
        the background: await `fusefs.collect_killed()` before the loop ends."""
        self._closed = True
        # fusefs first: closing the database flushes (log round trips through the mount, with
        # the GIL held); once fusefs is dead, file operations on the mount fail at once. Its
        # watchdog may detach the mount meanwhile, and RocksDB's close then writes into the
        # plain directory beneath: removed below, with the rest.
        proc = self.mount.proc
        if not self.mount.exited:
            # (Not signalled once dead: the signal's poll could reap it before the loop's
            # child watcher, which would then warn of an unknown child.)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            _wait_exited(proc.pid)
        self.mount.remove_hand_over()
        with contextlib.suppress(RuntimeError):  # No running loop: none to collect it on.
            self.mount.collect_later()  # Its exit and pipes (`fusefs.collect_killed`).
        self._exec.shutdown(wait=True)  # A flush or compaction under way: let it end.
        self._sync_exec.shutdown(wait=True)
        self._wal.close()
        with contextlib.suppress(Exception):
            self.db.close()
        force_unmount(self.mount.mountpoint)
        if not is_mounted(self.mount.mountpoint):  # Never remove through a live mount.
            # Detached, the path is the plain directory beneath, where RocksDB's close may have
            # created files (fusefs's watchdog can detach the mount as soon as fusefs dies).
            shutil.rmtree(self.mount.mountpoint, ignore_errors=True)
        shutil.rmtree(self.backing, ignore_errors=True)
        shutil.rmtree(self.info_log, ignore_errors=True)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


_STALL_PAUSE = 0.001
_STALL_PAUSE_MAX = 0.05


def _is_write_stall(err: Exception) -> bool:
    """Whether `err` is rocksdict's error for a write refused by ``no_slowdown`` (RocksDB's
    ``Status::Incomplete("Write stall")``, raised as a plain Exception)."""
    return type(err) is Exception and "Write stall" in str(err)


def _wait_exited(pid: int, timeout: float = 2.0) -> None:
    """Wait until process `pid` has exited (a zombie or gone: its files are closed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.005)


def _beside(directory: Path, suffix: str) -> Path:
    return directory.parent / (directory.name + suffix)


def _marshal(checkpoint: Checkpoint) -> bytes:
    if not isinstance(checkpoint, pb.Checkpoint):
        raise TypeError(
            f"checkpoint must be a consumer.Checkpoint message, not {type(checkpoint).__name__}"
        )
    return checkpoint.SerializeToString()
