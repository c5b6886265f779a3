"""RecorderBridge: carries file operations from the thread running SQLite to a Recorder.

The VFS callbacks of SQLite are synchronous and run in the store's SQLite thread; the
`Recorder` lives on an asyncio event loop. The bridge reports operations (create, truncate,
write, rename, unlink) to an `OpQueue` in the order SQLite performs them, and hands its
batches to the loop with ``call_soon_threadsafe`` (FIFO: the log receives them in the same
order). `sync` hands over the batch and, if asked to, blocks the SQLite thread until a
Recorder barrier behind it resolves: everything recorded so far is then committed to the log.
What is queued, counted and latched is the queue's; the bridge keeps the threads' plumbing.

Paths are relative to the Recorder's directory. A bridge is used by one SQLite thread at a
time, and never blocks the loop. SQLite may also run on the loop's thread (a store
``on_loop``): batches are then applied to the Recorder as they are handed over, and nothing
waits there (`sync` with `wait` raises `RuntimeError` rather than deadlock; `max_unsynced`
does not apply within a job: the store's queue of jobs waits for the log between jobs
instead).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from typing import Any

from gazette.recoverylog.op_batch import Op, apply_ops, from_thread
from gazette.recoverylog.op_queue import OpQueue
from gazette.recoverylog.recorder import Recorder

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
        recorder: Recorder,
        loop: asyncio.AbstractEventLoop,
        *,
        flush_bytes: int = 4 << 20,
        max_unsynced: int = 64 << 20,
    ) -> None:
        self._rec = recorder
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._queue = OpQueue(recorder.log, flush_bytes=flush_bytes, max_unsynced=max_unsynced)
        self._record = functools.partial(apply_ops, recorder, exclusive_create=True)
        # Cross-thread waits of the SQLite thread on the loop: `discard` cancels them, so that
        # destroying the store from the loop never waits on a thread that waits on the loop.
        self._waits: set[concurrent.futures.Future[Any]] = set()
        self._waits_lock = threading.Lock()
        self.deferring = False
        """Set while the store checkpoints: `sync` and `flush` then `defer`."""
        self.barriers = 0

    @property
    def recorder(self) -> Recorder:
        return self._rec

    @property
    def flush_bytes(self) -> int:
        return self._queue.flush_bytes

    @flush_bytes.setter
    def flush_bytes(self, n: int) -> None:
        self._queue.flush_bytes = n

    @property
    def max_unsynced(self) -> int:
        return self._queue.max_unsynced

    @max_unsynced.setter
    def max_unsynced(self, n: int) -> None:
        self._queue.max_unsynced = n

    @property
    def bytes_recorded(self) -> int:
        """Write bytes handed to the Recorder."""
        return self._queue.bytes

    @property
    def discarded(self) -> bool:
        """Whether `discard` was called: nothing more is recorded."""
        return self._queue.discarded

    # -- Called from the SQLite thread ------------------------------------------------------

    def create(self, path: str) -> None:
        """`path` was created (it was not a recorded file)."""
        self._queue.create(path)

    def truncate(self, path: str) -> None:
        """Recorded file `path` was truncated to zero length: it becomes a new Fnode."""
        self._queue.truncate(path)

    def unlink(self, path: str) -> None:
        """Recorded file `path` was removed."""
        self._queue.unlink(path)

    def rename(self, src: str, dst: str) -> None:
        """Recorded file `src` was renamed to `dst` (which did not exist)."""
        self._queue.rename(src, dst)

    def write(self, path: str, offset: int, data: bytes) -> None:
        """`data` was written at `offset` of recorded file `path`."""
        if self._queue.write(path, offset, data):
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
        if self._queue.must_wait and not self._on_loop_thread():
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
        queue = self._queue
        if queue.discarded:
            return
        queue.check()
        if not wait:
            self._hand_over()
            return
        if not queue.barrier_due:
            return  # Nothing recorded since the last barrier.
        if self._on_loop_thread():
            raise RuntimeError("RecorderBridge.sync would block the event loop it waits on")
        ops = queue.take_for_barrier()
        fut = from_thread(self._loop, functools.partial(self._apply_and_barrier, ops))
        try:
            self.wait(fut)
        except BaseException as err:
            raise queue.fail(err) from err
        self.barriers += 1

    def wait(self, fut: concurrent.futures.Future[Any]) -> Any:
        """Wait (in the SQLite thread) for `fut`, completed by the loop; `discard` cancels it.

        Raises concurrent.futures.CancelledError once the bridge is discarded.
        """
        with self._waits_lock:
            if self._queue.discarded:
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
            self._queue.discard()
            for fut in self._waits:
                fut.cancel()

    def check(self) -> None:
        """Raise `RecordingFailed` if the Recorder failed."""
        self._queue.check()

    # -- Internals ---------------------------------------------------------------------------

    def _on_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def _hand_over(self, dirty: bool = True) -> None:
        self._queue.check()
        ops = self._queue.take(dirty=dirty)
        if not ops:
            return
        if self._on_loop_thread():
            self._apply_handed(ops)  # Its append leaves at once.
        else:
            self._loop.call_soon_threadsafe(self._apply_handed, ops)

    # -- On the loop ----------------------------------------------------------------------------

    def _apply_handed(self, ops: list[Op]) -> None:
        if self._queue.apply(ops, self._record):
            # No other hand-over is queued behind this one (they would go together): its
            # append need not wait for the loop's next turn.
            self._rec.flush()

    def _apply_and_barrier(self, ops: list[Op]) -> asyncio.Future[Any]:
        self._queue.apply(ops, self._record)
        err = self._queue.error
        if err is not None:
            raise err
        return self._rec.barrier()
