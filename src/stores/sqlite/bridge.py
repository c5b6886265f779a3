"""RecorderBridge: carries file operations from the thread running SQLite to a Recorder.

The VFS callbacks of SQLite are synchronous and run in the store's SQLite thread; the
`Recorder` lives on an asyncio event loop. The bridge queues operations (create, truncate,
write, rename, unlink) in the order SQLite performs them, coalescing contiguous writes to one file,
and hands them to the loop in batches with ``call_soon_threadsafe`` (FIFO: the log receives
them in the same order). `sync` hands over the batch and, if asked to, blocks the SQLite
thread until a Recorder barrier behind it resolves: everything recorded so far is then
committed to the log.

With a `RemoteRecorder` (a Recorder in a process of its own), operations are sent to it
from the SQLite thread instead, and the loop only asks for its barriers and waits for them.

Paths are relative to the Recorder's directory. A bridge is used by one SQLite thread at a
time. It never blocks the loop (but for a remote barrier's request, which may wait behind a
hand-over being sent, at most `recoverylog.remote.SEND_TIMEOUT`). SQLite may also run on
the loop's thread (a store ``on_loop``, with a Recorder in process): operations are then
applied to the Recorder as they are handed over, and nothing waits there (`sync` with `wait`
raises `RuntimeError` rather than deadlock; `max_unsynced` does not apply within a job: the
store's queue of jobs waits for the log between jobs instead).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable
from typing import Any

from gazette.recoverylog.op_batch import (
    CREATE,
    RENAME,
    TRUNCATE,
    UNLINK,
    Op,
    WriteRun,
    apply_ops,
    from_thread,
)
from gazette.recoverylog.recorder import Recorder, RecordingFailed
from gazette.recoverylog.remote import RemoteRecorder, RemoteRecordingFailed

__all__ = ["RecorderBridge"]


class RecorderBridge:
    """Queues file operations of the SQLite thread into `recorder` on `loop` (module docs).

    Construct it on the loop's thread.

    `flush_bytes`: queued bytes which trigger a hand-over without waiting.
    `max_unsynced`: bytes handed over since the last waited barrier which make the next
    hand-over wait for a barrier (bounds the memory of huge transactions).
    """

    def __init__(
        self,
        recorder: Recorder | RemoteRecorder,
        loop: asyncio.AbstractEventLoop,
        *,
        flush_bytes: int = 4 << 20,
        max_unsynced: int = 64 << 20,
    ) -> None:
        self._rec = recorder
        self._remote = recorder if isinstance(recorder, RemoteRecorder) else None
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self.flush_bytes = flush_bytes
        self.max_unsynced = max_unsynced
        self._ops: list[Op] = []
        # Cross-thread waits of the SQLite thread on the loop: `discard` cancels them, so that
        # destroying the store from the loop never waits on a thread that waits on the loop.
        self._waits: set[concurrent.futures.Future[Any]] = set()
        self._waits_lock = threading.Lock()
        self._queued = 0
        self._run = WriteRun()  # The open (coalescing) write.
        self._unsynced = 0
        # Hand-overs queued on the loop (counted by the SQLite thread) and applied there
        # (counted by the loop): each counter has one writer.
        self._handed = 0
        self._applied = 0
        self._dirty = False  # Ops were handed over since the last barrier resolved.
        self._error: BaseException | None = None
        self._discard = False
        self.deferring = False
        """Set while the store checkpoints: `sync` and `flush` then `defer`."""
        self.barriers = 0
        self.bytes_recorded = 0

    @property
    def recorder(self) -> Recorder | RemoteRecorder:
        return self._rec

    @property
    def discarded(self) -> bool:
        """Whether `discard` was called: nothing more is recorded."""
        return self._discard

    # -- Called from the SQLite thread ------------------------------------------------------

    def create(self, path: str) -> None:
        """`path` was created (it was not a recorded file)."""
        self._push((CREATE, path, 0, b""))

    def truncate(self, path: str) -> None:
        """Recorded file `path` was truncated to zero length: it becomes a new Fnode."""
        self._push((TRUNCATE, path, 0, b""))

    def unlink(self, path: str) -> None:
        """Recorded file `path` was removed."""
        self._push((UNLINK, path, 0, b""))

    def rename(self, src: str, dst: str) -> None:
        """Recorded file `src` was renamed to `dst` (which did not exist)."""
        self._push((RENAME, src, 0, dst.encode()))

    def write(self, path: str, offset: int, data: bytes) -> None:
        """`data` was written at `offset` of recorded file `path`."""
        if not data:
            return
        if not isinstance(data, bytes):
            data = bytes(data)  # SQLite may reuse its buffer.
        run = self._run
        if not run.extend(path, offset, data):
            self._seal()
            run.start(path, offset)
            run.add(data)
        self._queued += len(data)
        if self._queued >= self.flush_bytes:
            self.flush()

    def flush(self) -> None:
        """Hand queued operations to the loop without waiting for them to commit (but wait
        for a barrier if `max_unsynced` bytes are in flight)."""
        self._flush(dirty=not self.deferring)

    def defer(self) -> None:
        """Hand queued operations to the loop, to be committed with the next barrier: unlike
        `flush`, a later waited `sync` does not wait for them unless other operations were
        queued since (it still waits if `max_unsynced` bytes are in flight).

        For operations no commit depends on, such as a checkpoint's: the log keeps
        operations in order, so a crash before they are committed plays back an earlier,
        equally valid state, and the next commit's barrier covers them.
        """
        self._flush(dirty=False)

    def _flush(self, dirty: bool) -> None:
        self._seal()
        if self._unsynced + self._queued >= self.max_unsynced and not self._on_loop_thread():
            self._sync()
            return
        # (On the loop's thread nothing may wait: the store's queue waits between jobs.)
        self._hand_over(dirty)

    def sync(self, wait: bool = True) -> None:
        """Hand queued operations to the loop; with `wait`, return once everything recorded
        so far is committed to the log.

        Raises `RecordingFailed` once the Recorder failed, `RuntimeError` if called from the
        loop's thread with `wait`. While `deferring`, this is `defer`.
        """
        if self.deferring:
            self.defer()
        else:
            self._sync(wait)

    def _sync(self, wait: bool = True) -> None:
        self._seal()
        if self._discard:
            self._ops.clear()
            return
        self.check()
        if not wait:
            self._hand_over()
            return
        if not self._ops and not self._dirty:
            return  # Nothing recorded since the last barrier.
        if self._on_loop_thread():
            raise RuntimeError("RecorderBridge.sync would block the event loop it waits on")
        ops = self._take()
        self._dirty = False
        start: Callable[[], asyncio.Future[Any]]
        if self._remote is not None:
            try:
                self._remote.record(ops)  # From this thread: the loop only waits.
            except RemoteRecordingFailed as err:
                self._error = self._error or err
                self.check()
            start = self._remote.barrier
        else:
            start = functools.partial(self._apply_and_barrier, ops)
        fut = from_thread(self._loop, start)
        try:
            self.wait(fut)
        except BaseException as err:
            if self._error is None:
                self._error = err
            raise RecordingFailed(f"recording to {self._rec.log} failed: {err!r}") from err
        self._unsynced = 0
        self.barriers += 1

    def wait(self, fut: concurrent.futures.Future[Any]) -> Any:
        """Wait (in the SQLite thread) for `fut`, completed by the loop; `discard` cancels it.

        Raises concurrent.futures.CancelledError once the bridge is discarded.
        """
        with self._waits_lock:
            if self._discard:
                fut.cancel()
            self._waits.add(fut)
        try:
            return fut.result()
        finally:
            with self._waits_lock:
                self._waits.discard(fut)

    def discard(self) -> None:
        """Drop queued and later operations (the store is being destroyed), and cancel every
        wait of the SQLite thread on the loop."""
        with self._waits_lock:
            self._discard = True
            for fut in self._waits:
                fut.cancel()
        self._ops.clear()
        self._run.clear()

    # -- Internals ---------------------------------------------------------------------------

    def check(self) -> None:
        """Raise `RecordingFailed` if the Recorder failed."""
        if self._error is None and self._remote is not None:
            self._error = self._remote.error
        err = self._error
        if err is not None:
            raise RecordingFailed(f"recording to {self._rec.log} failed: {err!r}") from err

    def _on_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def _push(self, op: Op) -> None:
        self._seal()
        self._ops.append(op)

    def _seal(self) -> None:
        op = self._run.seal()
        if op is not None:
            self._ops.append(op)

    def _take(self) -> list[Op]:
        ops, self._ops = self._ops, []
        self._unsynced += self._queued
        self.bytes_recorded += self._queued
        self._queued = 0
        return ops

    def _hand_over(self, dirty: bool = True) -> None:
        self.check()
        if self._ops and not self._discard:
            self._dirty = self._dirty or dirty
            if self._remote is None:
                self._handed += 1
                if self._on_loop_thread():
                    self._apply_handed(self._take())  # Its append leaves at once.
                else:
                    self._loop.call_soon_threadsafe(self._apply_handed, self._take())
                return
            try:
                self._remote.record(self._take())
            except RemoteRecordingFailed as err:
                if self._error is None:
                    self._error = err
                self.check()
        else:
            self._ops.clear()

    # -- On the loop ----------------------------------------------------------------------------

    def _apply(self, ops: list[Op]) -> None:
        if self._error is not None or self._discard:
            return
        rec = self._rec
        assert isinstance(rec, Recorder)
        try:
            apply_ops(rec, ops, exclusive_create=True)
        except BaseException as err:  # The Recorder is broken, or the VFS has a bug.
            self._error = err

    def _apply_handed(self, ops: list[Op]) -> None:
        self._applied += 1
        self._apply(ops)
        if self._applied == self._handed and self._error is None:
            # No other hand-over is queued behind this one (they would go together): its
            # append need not wait for the loop's next turn.
            rec = self._rec
            assert isinstance(rec, Recorder)
            rec.flush()

    def _apply_and_barrier(self, ops: list[Op]) -> asyncio.Future[Any]:
        self._apply(ops)
        if self._error is not None:
            raise self._error
        return self._rec.barrier()
