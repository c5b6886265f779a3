"""RecordingLink: carries file operations from the trio FUSE handlers to an asyncio Recorder.

The fusefs process runs pyfuse3 on trio in its main thread and an asyncio event loop in a
second thread, which hosts the `JournalClient`, `AppendService` and `Recorder`. FUSE handlers
call the link's plain methods *after* the operation happened on the backing directory and
before they return to the kernel, without awaiting in between: operations are therefore
queued in the order the kernel saw them complete. Queued operations are handed to the loop
with ``call_soon_threadsafe`` (FIFO) after every write, on every `barrier`, and by a periodic
`tick` of the server.

A write is handed over at once, so that the Recorder appends it while the writer goes on:
RocksDB writes a batch to its WAL, then inserts it into its memtable (milliseconds), then
syncs the WAL, and without the kernel's write-back cache the write reaches us at the first
step. By the sync the write is often committed, and an fsync's barrier then resolves without
another append (``confirm=False``): the sync waits for one FUSE round trip, not for the log.
A fenced mount learns of it at its next append rather than at such an fsync. Writes handed
over while an append is in flight still share the next one.

`barrier` hands everything over and resolves (in trio) once a Recorder barrier behind it
commits: every operation queued before the call is then in the log. Once recording failed
(e.g. the log was fenced by a new primary), every later mutating handler and barrier fails.
The failure is logged once: a fence as a WARNING (a newer primary took the log over, as it
should once this process's shard moved), anything else as an ERROR.

What is queued, counted and latched is an `OpQueue`'s (shared with the SQLite store); the
link keeps the plumbing between trio's thread and the loop's.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import logging
from typing import Any

import trio

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog.op_batch import Op, apply_ops, from_thread
from gazette.recoverylog.op_queue import OpQueue
from gazette.recoverylog.recorder import Recorder, RecorderFenced

__all__ = ["RecordingLink"]

log = logging.getLogger(__name__)


MAX_UNSYNCED_BYTES = 64 << 20
"""Bytes handed over since the last barrier past which writers wait for one (bounds the
memory of a writer that never fsyncs while the log is slower than it)."""


class RecordingLink:
    """Queues operations of the trio thread into `recorder`, which lives on `loop`."""

    def __init__(self, recorder: Recorder, loop: asyncio.AbstractEventLoop) -> None:
        self._rec = recorder
        self._loop = loop
        self._queue = OpQueue(
            recorder.log, max_unsynced=MAX_UNSYNCED_BYTES, on_failure=self._log_failure
        )
        self._record = functools.partial(apply_ops, recorder)
        self.barriers = 0

    @property
    def recorder(self) -> Recorder:
        return self._rec

    @property
    def error(self) -> BaseException | None:
        return self._queue.error

    @property
    def fenced(self) -> bool:
        """Whether recording ended because another author fenced the log (module docs)."""
        return isinstance(self._queue.error, RecorderFenced)

    @property
    def ops(self) -> int:
        """Operations handed to the loop."""
        return self._queue.ops

    @property
    def bytes(self) -> int:  # Shadows the type within the class: `write` says builtins.bytes.
        """Write bytes handed to the loop."""
        return self._queue.bytes

    def _log_failure(self, err: BaseException) -> None:
        """Recording failed with `err` (either thread): called once, by the queue."""
        if isinstance(err, RecorderFenced):
            log.warning(
                "recording fenced: another author took the log over (a newer primary); "
                "file changes are refused from now on log=%s err=%r",
                self._rec.log,
                err,
            )
        else:
            log.error("recording failed log=%s err=%r", self._rec.log, err)

    # -- Trio thread -------------------------------------------------------------------------

    def check(self) -> None:
        """Raise `RecordingFailed` once recording failed."""
        self._queue.check()

    def create(self, path: str) -> None:
        self._queue.create(path)

    def truncate(self, path: str) -> None:
        self._queue.truncate(path)

    def unlink(self, path: str) -> None:
        self._queue.unlink(path)

    def rename(self, src: str, dst: str) -> None:
        self._queue.rename(src, dst)

    def link(self, src: str, dst: str) -> None:
        self._queue.link(src, dst)

    def write(self, path: str, offset: int, data: builtins.bytes) -> None:
        """Queue a write and hand it over at once (module docs)."""
        self._queue.write(path, offset, data)
        self.hand_over()

    def hand_over(self) -> None:
        """Hand queued operations to the loop (without waiting for them to commit)."""
        ops = self._queue.take()
        if ops:
            self._loop.call_soon_threadsafe(self._queue.apply, ops, self._record)

    @property
    def must_throttle(self) -> bool:
        """Whether a writer should wait for a `barrier` (see `MAX_UNSYNCED_BYTES`)."""
        return self._queue.must_wait

    async def barrier(self, *, confirm: bool = True) -> int:
        """Wait until every operation queued so far is committed to the log; return the
        log's write head then. Raises `RecordingFailed` if it could not be, or (`confirm`,
        as `Recorder.barrier`) if the log was fenced since."""
        self.check()
        ops = self._queue.take_for_barrier()
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        cfut = from_thread(self._loop, functools.partial(self._apply_and_barrier, ops, confirm))

        def wake(_: Any) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        cfut.add_done_callback(wake)
        await done.wait()
        try:
            head = int(cfut.result().commit.end)
        except BaseException as err:
            raise self._queue.fail(err) from err
        self.barriers += 1
        return head

    # -- Loop thread -------------------------------------------------------------------------

    def _apply_and_barrier(self, ops: list[Op], confirm: bool) -> asyncio.Future[pb.AppendResponse]:
        self._queue.apply(ops, self._record)
        err = self._queue.error
        if err is not None:
            raise err
        return self._rec.barrier(confirm=confirm)
