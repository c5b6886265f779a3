"""OpQueue: file operations of a thread that must not await, queued for a Recorder's loop.

The recorded stores observe file operations where nothing may await: SQLite's VFS callbacks
in the SQLite store's thread, pyfuse3's handlers on trio in the fusefs server. The Recorder
lives on an asyncio loop (another thread's, or the same). Both stores hand operations over
through this queue, which does no I/O and knows no thread, loop or Recorder:

- it keeps the operations (`op_batch.Op`) in the order they were reported, coalescing
  contiguous writes to one file into one operation (`op_batch.WriteRun`);
- it counts the bytes queued and those handed over since the last barrier, and says when a
  hand-over is due (`write` returns True past `flush_bytes`) and when the producer should
  wait for a barrier before going on (`must_wait`, past `max_unsynced`);
- `take` cuts the queued operations into a batch for the loop; `take_for_barrier` also
  starts a new barrier period (what a barrier behind the batch covers is everything so far);
- on the loop, `apply` records a batch through the function it is given (e.g.
  `op_batch.apply_ops` bound to a Recorder), unless recording failed, and says whether no
  other batch is behind it (so the caller may release the Recorder's append at once);
- it latches the first failure, of either side (`fail`): `check` then raises
  `RecordingFailed`, and later batches are not applied. `discard` drops what is queued and
  anything reported later (the store is being destroyed).

The caller moves each batch to the loop (``loop.call_soon_threadsafe``, whose FIFO keeps the
batches in order, or a direct call on the loop's own thread) and waits for barriers in its
own way (a blocked thread, a trio event).

Threads: the producing methods (reporting operations, `take`, `take_for_barrier`) are
called from one thread at a time, `apply` from the loop; `fail`, `discard`, `error` and
`discarded` from either. Each counter has one writer (but for `discard`, after which the
counts no longer matter), and the GIL makes each update of the error and the discard flag
atomic: a batch racing a failure or a discard may still be cut, but it is not applied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gazette.recoverylog.op_batch import CREATE, LINK, RENAME, TRUNCATE, UNLINK, Op, WriteRun
from gazette.recoverylog.recorder import RecordingFailed

__all__ = ["OpQueue"]


class OpQueue:
    """File operations queued in order for a Recorder on a loop (module docs).

    `log` names the recovery log in errors. `flush_bytes`: queued write bytes past which
    `write` says a hand-over is due. `max_unsynced`: bytes queued or handed over since the
    last barrier past which `must_wait` says the producer should wait for one (bounds the
    memory of a producer that runs ahead of the log). `on_failure` is called once, with the
    first failure latched, from the thread that latched it.
    """

    def __init__(
        self,
        log: str,
        *,
        flush_bytes: int = 4 << 20,
        max_unsynced: int = 64 << 20,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.log = log
        self.flush_bytes = flush_bytes
        self.max_unsynced = max_unsynced
        self._on_failure = on_failure
        self._ops: list[Op] = []
        self._run = WriteRun()  # The open (coalescing) write, not yet in `_ops`.
        self.queued_bytes = 0
        """Write bytes reported and not yet taken."""
        self._handed_bytes = 0  # Taken since the last barrier.
        self._dirty = False  # A batch that asks for a barrier was taken since the last one.
        self.ops = 0
        """Operations taken (a coalesced write counts once)."""
        self.bytes = 0
        """Write bytes taken."""
        self._taken = 0  # Batches taken (by the producer) and applied (by the loop).
        self._applied = 0
        self._error: BaseException | None = None
        self._discarded = False

    # -- The producer's thread -----------------------------------------------------------

    def create(self, path: str) -> None:
        """`path` was created (a new file, or a new Fnode at the path)."""
        self._push((CREATE, path, 0, b""))

    def truncate(self, path: str) -> None:
        """Recorded file `path` was truncated to zero length: it becomes a new Fnode."""
        self._push((TRUNCATE, path, 0, b""))

    def unlink(self, path: str) -> None:
        """Recorded file `path` was removed."""
        self._push((UNLINK, path, 0, b""))

    def rename(self, src: str, dst: str) -> None:
        """Recorded file `src` was renamed to `dst`."""
        self._push((RENAME, src, 0, dst.encode()))

    def link(self, src: str, dst: str) -> None:
        """Recorded file `src` was linked at `dst` too."""
        self._push((LINK, src, 0, dst.encode()))

    def write(self, path: str, offset: int, data: bytes | bytearray | memoryview) -> bool:
        """`data` was written at `offset` of recorded file `path` (copied unless it is bytes:
        a caller's buffer may be reused). Returns whether `flush_bytes` are queued: a
        hand-over is due."""
        if not data or self._discarded:
            return False
        if not isinstance(data, bytes):
            data = bytes(data)
        run = self._run
        if not run.extend(path, offset, data):
            self._seal()
            run.start(path, offset)
            run.add(data)
        self.queued_bytes += len(data)
        return self.queued_bytes >= self.flush_bytes

    def take(self, *, dirty: bool = True) -> list[Op]:
        """The queued operations, as the next batch for the loop (empty if nothing is queued,
        or the queue was discarded).

        A `dirty` batch makes `barrier_due` true until the next `take_for_barrier`; one that
        is not (operations no commit depends on) is covered by the next barrier all the same,
        but does not call for one."""
        self._seal()
        ops = self._ops
        if not ops or self._discarded:
            return []
        self._ops = []
        self._taken += 1
        self._dirty = self._dirty or dirty
        self.ops += len(ops)
        self.bytes += self.queued_bytes
        self._handed_bytes += self.queued_bytes
        self.queued_bytes = 0
        return ops

    def take_for_barrier(self) -> list[Op]:
        """`take`, for a batch a barrier follows: a new barrier period starts (`barrier_due`
        is false and `must_wait` counts from zero until more is reported)."""
        ops = self.take()
        self._dirty = False
        self._handed_bytes = 0
        return ops

    @property
    def barrier_due(self) -> bool:
        """Whether a barrier now would cover anything: operations are queued, or a dirty
        batch was taken since the last `take_for_barrier`."""
        return self._dirty or bool(self._ops) or self._run.path is not None

    @property
    def unsynced_bytes(self) -> int:
        """Write bytes queued, or taken since the last `take_for_barrier`."""
        return self._handed_bytes + self.queued_bytes

    @property
    def must_wait(self) -> bool:
        """Whether the producer should wait for a barrier before going on: `max_unsynced`
        bytes are queued or in flight."""
        return self._handed_bytes + self.queued_bytes >= self.max_unsynced

    def discard(self) -> None:
        """Drop the queued operations and any reported later; no batch is applied any more."""
        self._discarded = True
        self._ops = []
        self._run.clear()
        self.queued_bytes = 0

    @property
    def discarded(self) -> bool:
        return self._discarded

    # -- Either thread -------------------------------------------------------------------

    @property
    def error(self) -> BaseException | None:
        """The first failure latched (`fail`), if any."""
        return self._error

    def fail(self, err: BaseException) -> RecordingFailed:
        """Latch `err` as the failure of recording, unless one is latched already (the first
        stays); the `RecordingFailed` to raise for `err`."""
        if self._error is None:
            self._error = err
            if self._on_failure is not None:
                self._on_failure(err)
        return self._failed(err)

    def check(self) -> None:
        """Raise `RecordingFailed` (from the latched failure) once recording failed."""
        err = self._error
        if err is not None:
            raise self._failed(err) from err

    # -- The loop ----------------------------------------------------------------------------

    def apply(self, ops: Sequence[Op], record: Callable[[Sequence[Op]], None]) -> bool:
        """Record batch `ops` with `record`, unless recording failed or the queue was
        discarded; an error of `record` is latched (`fail`), not raised.

        Returns whether the batch was recorded and no batch taken after it is yet to be
        applied: the caller may then release what was recorded at once rather than at the
        loop's next turn (a later batch, already on its way, would go with it otherwise)."""
        if ops:
            self._applied += 1
        if self._error is not None or self._discarded:
            return False
        try:
            record(ops)
        except BaseException as err:  # The Recorder is broken, or the producer has a bug.
            self.fail(err)
            return False
        return self._applied == self._taken

    # -- Internals ---------------------------------------------------------------------------

    def _push(self, op: Op) -> None:
        if self._discarded:
            return
        self._seal()
        self._ops.append(op)

    def _seal(self) -> None:
        op = self._run.seal()
        if op is not None:
            self._ops.append(op)

    def _failed(self, err: BaseException) -> RecordingFailed:
        return RecordingFailed(f"recording to {self.log} failed: {err!r}")
