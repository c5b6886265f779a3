"""Recorder: appends the file operations of a directory to a recovery log, as they happen.

A Recorder owns an `FSM` and sequences every operation it is told about (create, write, link,
unlink, and the compositions rename and truncate) as a `RecordedOp` carrying the FSM's next
seq_no and checksum and the Recorder's author. The op is applied to the FSM at once and its
frame (with a Write's payload) is buffered for the log; nothing is awaited. A Recorder records
only operations which *already happened* to the local files: an op which contradicts the
recorded file tree (removing an unknown path, ...) means the two have diverged, and breaks the
Recorder (crash-only, as upstream's panics).

Appending (see docs of `Recorder` for the exact contract):

- Ops reach the log in recording order, each whole within one append. Ops are buffered in
  appends of at most 1 MiB, released at the loop's next turn (or by `flush`) unless an append
  is in flight: ops recorded meanwhile accumulate and are released together once it commits.
  Each append depends on the one before; the AppendService sends appends released together
  as one RPC (up to its batch size), so a stream of small ops costs few RPCs. Write payloads
  are split into ops of at most `MAX_WRITE_CHUNK` bytes.
- Every append checks the author's fence register (``author=<author>``): once another author
  (a Player's hand-off to a new primary) unions its own fence, this Recorder's appends fail
  with RegisterMismatch.
- The first failed append breaks the Recorder: every later call raises `RecorderFenced`
  (the log was fenced by another author) or `RecorderBroken` (any other cause). Appends
  released after the failing one are never sent (each depends on the one before it, and a
  batch of them commits or fails as one), so the log never holds a gap of this Recorder's
  ops. Ops not yet released when the Recorder breaks are never sent.
- `barrier()` resolves once everything recorded before it is committed; `build_hints()`
  returns hints of the FSM as of its call, once they are committed.

Offsets: when an op is recorded, a Recorder cannot yet know where it lands (appends of other
writers interleave), so as upstream its `first_offset` is the write head last observed in an
append response, a lower bound, and `last_offset` is left unknown (0). `Recorder.open` learns
the write head with a barrier before recording anything. Once the append holding an op
commits, its exact offset is known (the commit's begin, plus the appends batched before it in
the same RPC, plus the op's position within its append): the Recorder then raises the
`first_offset` of every Segment which that op began to it, so that hints (built behind a
barrier) let a Player seek straight to each live segment rather than read from a stale head.

A Recorder is driven from one asyncio event loop: its methods must be called from the loop's
thread while the loop runs (the `record_*` methods are plain functions; appends are released
and their outcomes observed by loop callbacks the Recorder schedules, not by a task).
"""

from __future__ import annotations

import asyncio
import logging
import os
import posixpath
from collections import deque
from pathlib import Path
from typing import Any, NoReturn

from gazette.broker.client.append_service import (
    BUFFER_IN_MEMORY_LIMIT,
    AppendService,
    AsyncAppend,
    DependencyFailed,
)
from gazette.broker.client.errors import RegisterMismatch
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.author import author_fence, format_author
from gazette.recoverylog.codec import HEADER_LENGTH, encode_op
from gazette.recoverylog.fsm import FSM, FSMError

__all__ = [
    "MAX_WRITE_CHUNK",
    "PROPERTY_PATHS",
    "InvalidPath",
    "PathExists",
    "PropertyPathError",
    "Recorder",
    "RecorderBroken",
    "RecorderError",
    "RecorderFenced",
    "RecorderInconsistent",
    "RecordingFailed",
    "UnknownFnode",
    "UnknownPath",
    "WriteHeadRegressed",
]

log = logging.getLogger(__name__)

PROPERTY_PATHS: frozenset[str] = frozenset({"/IDENTITY"})
"""Recorded paths tracked as properties (small files held in hints) rather than as Fnodes.

As upstream: RocksDB writes its IDENTITY by renaming a temporary file onto it, which is
recorded as a Property op with the file's content; any other operation on it is an error.
"""

MAX_WRITE_CHUNK = 512 << 10
"""Largest payload of one recorded Write op; larger writes are recorded as several ops.

Keeps every op within an append small enough to stay buffered in memory (`AsyncAppend`
spills larger content to a temporary file)."""

_APPEND_BYTES = BUFFER_IN_MEMORY_LIMIT


class RecorderError(Exception):
    """Base class of the Recorder's errors."""


class InvalidPath(RecorderError, ValueError):
    """A path is not within the recorded directory, or has a ``..`` component.

    Raised before anything is recorded; the Recorder stays usable.
    """


class RecorderInconsistent(RecorderError):
    """An operation contradicts the file tree recorded so far.

    Since a Recorder records operations which already happened, the local files and the log
    have diverged: the Recorder is broken (later calls raise `RecorderBroken` from this).
    """


class UnknownPath(RecorderInconsistent):
    """The path is not a recorded file."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{what} of unknown path {path!r}")
        self.path = path


class UnknownFnode(RecorderInconsistent):
    """The Fnode is not a live recorded file."""

    def __init__(self, fnode: int, what: str) -> None:
        super().__init__(f"{what} of unknown fnode {fnode}")
        self.fnode = fnode


class PathExists(RecorderInconsistent):
    """The path is already a recorded file (exclusive create, or link onto it)."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{what} of existing path {path!r}")
        self.path = path


class PropertyPathError(RecorderInconsistent):
    """A property path (see `PROPERTY_PATHS`) was used other than as a rename target."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"unexpected {what} of property path {path!r}")
        self.path = path


class WriteHeadRegressed(RecorderError):
    """An append committed below the write head observed before (broker data loss?)."""

    def __init__(self, log: str, begin: int, write_head: int) -> None:
        super().__init__(f"append to {log} committed at {begin} < observed write head {write_head}")
        self.log = log
        self.begin = begin
        self.write_head = write_head


class RecorderBroken(RecorderError):
    """The Recorder stopped recording: an append failed, or an op was inconsistent.

    `log` is the recovery log, `offset` the write head observed before the failure (the lost
    ops lie at or beyond it), and ``__cause__`` the first error (e.g. a `BrokerError`).
    Every call after the failure raises this again.
    """

    def __init__(self, log: str, offset: int, cause: BaseException) -> None:
        super().__init__(f"recorder of {log} stopped at offset >= {offset}: {cause!r}")
        self.log = log
        self.offset = offset
        self.__cause__ = cause


class RecorderFenced(RecorderBroken):
    """An append failed with RegisterMismatch: another author fenced the log.

    Typically a Player injected a hand-off to a new primary; this Recorder is a zombie.
    ``__cause__`` is the `RegisterMismatch`.
    """


class RecordingFailed(Exception):
    """Raised to a writer outside the Recorder's event loop (a fusefs request, a SQLite VFS
    call) once the Recorder failed, e.g. fenced by a new primary: nothing more can be
    recorded, and the store writing is unusable from then on (crash-only). ``__cause__``,
    where set, is the Recorder's error."""


def _root_cause(err: BaseException) -> BaseException:
    while isinstance(err, DependencyFailed) and err.__cause__ is not None:
        err = err.__cause__
    return err


def _mark_retrieved(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()


class Recorder:
    """Records operations on files of `directory` into recovery log `log` (module docs).

    Prefer `await Recorder.open(...)`, which learns the log's write head and fences a log
    the FSM was not recovered from. The constructor is for callers that already know both:
    e.g. right after a Player's hand-off, passing the hand-off's commit end as `write_head`.
    `check_fence=False` disables the register check (for tests of zombie recorders only).

    Paths given to the ``record_*`` methods are relative to `directory`, or absolute paths
    within it; they are recorded as upstream does, as ``/`` + the path relative to
    `directory` (so the log is independent of where the directory is).

    The ``record_*`` methods raise `RecorderBroken`/`RecorderFenced` once the Recorder is
    broken, a `RecorderInconsistent` subclass for an op contradicting the recorded files (and
    the Recorder is then broken), and `InvalidPath` for a path outside `directory`.
    """

    def __init__(
        self,
        fsm: FSM,
        author: int,
        directory: str | os.PathLike[str],
        append_service: AppendService,
        log: str,
        *,
        write_head: int = 0,
        check_fence: bool = True,
    ) -> None:
        if not log:
            raise ValueError("log is required")
        if not 0 < author <= 0xFFFFFFFF:
            raise ValueError(f"author {author} is not a non-zero uint32")
        self._fsm = fsm
        self._author = author
        self._dir = posixpath.normpath(os.path.abspath(os.fspath(directory)))
        self._svc = append_service
        self._log = log
        self._fence = author_fence(author)
        self._request = self._make_request(check_fence)
        self._write_head = write_head
        self._last_resp: pb.AppendResponse | None = None
        # Journal offset at which the next append of the last response's batch begins (-1:
        # unknown, the batch holding content of another writer).
        self._batch_cursor = -1
        # Segments begun by recorded ops whose append has not committed yet, in recording
        # order: (append, position of the op within it, the FSM's Segment).
        self._unplaced: deque[tuple[AsyncAppend, int, rpb.Segment]] = deque()

        # Appends being filled (not yet released), in order; the last is open for writing.
        self._pending: list[AsyncAppend] = []
        # Released appends whose outcome `_pump` has not yet observed, in order.
        self._inflight: deque[AsyncAppend] = deque()
        self._last: AsyncAppend | None = None  # The last released append.
        # Barrier futures, each resolved once its target append commits (in order).
        self._waiters: deque[tuple[AsyncAppend, asyncio.Future[pb.AppendResponse]]] = deque()
        self._pump_due = False  # `_pump` is scheduled.
        self._watched: AsyncAppend | None = None  # The append `_pump` waits for.
        self._error: RecorderBroken | None = None
        self._closed = False
        self._uncommitted = 0

        self.ops_recorded = 0
        self.bytes_recorded = 0

    @classmethod
    async def open(
        cls,
        fsm: FSM,
        author: int,
        directory: str | os.PathLike[str],
        append_service: AppendService,
        log: str,
        *,
        fence_log: bool | None = None,
    ) -> Recorder:
        """A Recorder of `log`, ready to record (upstream's NewRecorder).

        Issues a barrier to learn the write head (a lower bound of every op's offset). Then,
        if `fence_log` (by default: if `log` is not the log `fsm` was recovered from, e.g. a
        new FSM), appends a no-op sequenced by the FSM with ``union_registers`` = the
        author's fence, so that earlier recorders of the log are fenced out. Otherwise the
        fence is expected to be in place already, set by a Player's hand-off
        (`InjectHandoff`) to `author`, as upstream. From then on, every append checks it.

        Raises `RecorderBroken` (or `RecorderFenced`) if an append fails.
        """
        rec = cls(fsm, author, directory, append_service, log, check_fence=False)
        await rec.barrier()
        if fence_log is None:
            fence_log = log != fsm.last_log
        if fence_log:
            rec._request = pb.AppendRequest(journal=log, union_registers=rec._fence)
            rec._process(rpb.RecordedOp())
            await rec.barrier()
        rec._request = rec._make_request(True)
        return rec

    def _make_request(self, check_fence: bool) -> pb.AppendRequest:
        req = pb.AppendRequest(journal=self._log)
        if check_fence:
            req.check_registers.include.CopyFrom(self._fence)
        return req

    # -- Public state --------------------------------------------------------------------

    @property
    def log(self) -> str:
        return self._log

    @property
    def author(self) -> int:
        return self._author

    @property
    def directory(self) -> Path:
        return Path(self._dir)

    @property
    def fsm(self) -> FSM:
        """The Recorder's FSM: read it, never modify it."""
        return self._fsm

    @property
    def write_head(self) -> int:
        """The log's write head last observed in an append response."""
        return self._write_head

    @property
    def uncommitted_bytes(self) -> int:
        """Bytes of recorded ops not yet known to be committed."""
        return self._uncommitted

    @property
    def error(self) -> RecorderBroken | None:
        """The error which broke the Recorder, or None while it records."""
        return self._error

    def check(self) -> None:
        """Raise `RecorderBroken`/`RecorderFenced` if broken, RuntimeError if closed."""
        if self._error is not None:
            raise self._fresh_error()
        if self._closed:
            raise RuntimeError(f"recorder of {self._log} is closed")

    def recorded_path(self, path: str | os.PathLike[str]) -> str:
        """`path` as recorded in the log (``/`` + path relative to `directory`).

        Raises `InvalidPath` if it's outside `directory` or has a ``..`` component.
        """
        p = os.fspath(path)
        if ".." in p.split(os.sep):
            raise InvalidPath(f"path {p!r} has a '..' component")
        if os.path.isabs(p):
            rel = posixpath.relpath(posixpath.normpath(p), self._dir)
            if rel == ".." or rel.startswith("../"):
                raise InvalidPath(f"path {p!r} is not within {self._dir}")
        else:
            rel = posixpath.normpath(p)
        if rel in (".", ""):
            raise InvalidPath(f"path {p!r} names the recorded directory itself")
        return "/" + rel

    def fnode(self, path: str | os.PathLike[str]) -> int | None:
        """The Fnode recorded at `path`, or None."""
        return self._fsm.links.get(self.recorded_path(path))

    def links(self, fnode: int) -> frozenset[str]:
        """The recorded paths of live `fnode` (empty if it's not live)."""
        node = self._fsm.live_nodes.get(fnode)
        return frozenset(node.links) if node is not None else frozenset()

    # -- Recording -----------------------------------------------------------------------

    def record_create(self, path: str | os.PathLike[str]) -> int:
        """Record that `path` was created, or truncated if it exists (O_CREAT|O_TRUNC).

        Returns the Fnode now at `path`: a new one either way (a truncation is recorded as
        unlink + create, as upstream).
        """
        return self.record_open(path, create=True, truncate=True)

    def record_truncate(self, path: str | os.PathLike[str]) -> int:
        """Record that the existing file at `path` was truncated to zero length.

        Recorded as unlink + create; returns the new Fnode. Other links of the old Fnode
        keep its content in the log (unlike on disk, where they share the inode).
        """
        return self.record_open(path, truncate=True)

    def record_open(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = False,
        truncate: bool = False,
        exclusive: bool = False,
    ) -> int:
        """Record an open of `path` for writing with os.open-like flags; return its Fnode.

        `create` (O_CREAT) records a create if `path` is not a recorded file (which is
        `UnknownPath` otherwise); `exclusive` (O_EXCL) requires that it was not
        (`PathExists`); `truncate` (O_TRUNC) of an existing file records unlink + create.
        An open of an existing file without truncation records nothing.
        """
        p = self.recorded_path(path)
        self.check()
        if p in PROPERTY_PATHS:
            self._inconsistent(PropertyPathError(p, "open"))
        fnode = self._fsm.links.get(p)
        if fnode is None and not create:
            self._inconsistent(UnknownPath(p, "open without create"))
        if fnode is not None and exclusive:
            self._inconsistent(PathExists(p, "exclusive create"))
        if fnode is not None and truncate:
            self._process(
                rpb.RecordedOp(unlink=rpb.RecordedOp.Link(fnode=fnode, path=p)), fnode=fnode
            )
            fnode = None
        if fnode is None:
            self._process(rpb.RecordedOp(create=rpb.RecordedOp.Create(path=p)), fnode=-1)
            fnode = self._fsm.links[p]
        return fnode

    def record_write(self, fnode: int, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Record that `data` was written at `offset` of `fnode`.

        Payloads beyond `MAX_WRITE_CHUNK` are recorded as several Write ops. An empty write
        records nothing. The data is copied before returning.
        """
        self.check()
        if offset < 0:
            raise ValueError(f"negative write offset {offset}")
        if fnode not in self._fsm.live_nodes:
            self._inconsistent(UnknownFnode(fnode, "write"))
        n = len(data)
        if n <= MAX_WRITE_CHUNK and isinstance(data, bytes):
            if n:
                self._write_op(fnode, offset, data)
            return
        with memoryview(data) as view:
            flat = view.cast("B")
            for i in range(0, n, MAX_WRITE_CHUNK):
                self._write_op(fnode, offset + i, bytes(flat[i : i + MAX_WRITE_CHUNK]))

    def _write_op(self, fnode: int, offset: int, chunk: bytes) -> None:
        op = rpb.RecordedOp(
            write=rpb.RecordedOp.Write(fnode=fnode, offset=offset, length=len(chunk))
        )
        self._process(op, chunk, fnode)

    def record_link(self, fnode: int, path: str | os.PathLike[str]) -> None:
        """Record that `path` was hard-linked to the file `fnode`."""
        p = self.recorded_path(path)
        self.check()
        if p in PROPERTY_PATHS:
            self._inconsistent(PropertyPathError(p, "link"))
        if fnode not in self._fsm.live_nodes:
            self._inconsistent(UnknownFnode(fnode, "link"))
        if p in self._fsm.links:
            self._inconsistent(PathExists(p, "link"))
        self._process(rpb.RecordedOp(link=rpb.RecordedOp.Link(fnode=fnode, path=p)), fnode=fnode)

    def record_unlink(self, path: str | os.PathLike[str]) -> None:
        """Record that `path` was removed (the file is gone with its last link)."""
        p = self.recorded_path(path)
        self.check()
        if p in PROPERTY_PATHS:
            self._inconsistent(PropertyPathError(p, "unlink"))
        fnode = self._fsm.links.get(p)
        if fnode is None:
            self._inconsistent(UnknownPath(p, "unlink"))
        self._process(rpb.RecordedOp(unlink=rpb.RecordedOp.Link(fnode=fnode, path=p)), fnode=fnode)

    def record_rename(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """Record that file `src` was renamed to `dst`, replacing any file there.

        Recorded as upstream: unlink of `dst` if it exists, link of `src`'s Fnode at `dst`,
        unlink of `src`. A rename onto a property path records a Property op with the
        content of the renamed file, read from `directory`. As POSIX rename, a rename
        between two links of the same file records nothing.
        """
        s, d = self.recorded_path(src), self.recorded_path(dst)
        self.check()
        links = self._fsm.links
        fnode = links.get(s)
        if fnode is None:
            self._inconsistent(UnknownPath(s, "rename"))
        prev = links.get(d)
        if prev == fnode:
            return
        content: str | None = None
        if d in PROPERTY_PATHS:
            try:
                content = Path(self._dir, d[1:]).read_bytes().decode()
            except (OSError, UnicodeDecodeError) as err:
                self._inconsistent(RecorderInconsistent(f"reading property {d!r}: {err}"))
        if prev is not None:
            self._process(
                rpb.RecordedOp(unlink=rpb.RecordedOp.Link(fnode=prev, path=d)), fnode=prev
            )
        if content is not None:
            self._process(rpb.RecordedOp(property=rpb.Property(path=d, content=content)))
        else:
            self._process(
                rpb.RecordedOp(link=rpb.RecordedOp.Link(fnode=fnode, path=d)), fnode=fnode
            )
        self._process(rpb.RecordedOp(unlink=rpb.RecordedOp.Link(fnode=fnode, path=s)), fnode=fnode)

    # -- Barriers and hints --------------------------------------------------------------

    def barrier(self, *, confirm: bool = True) -> asyncio.Future[pb.AppendResponse]:
        """A future resolving once every op recorded so far is committed to the log.

        Its result is the response of an append at least as late as the last op (its
        ``commit.end`` is a write head). With nothing uncommitted, an empty append is issued:
        it still fails if the log was fenced since. Without `confirm`, no append is issued
        once the last op's append has committed: the future resolves with its response (at
        once, or once the appends before it are seen committed, in order). Every op is then
        in the log, ahead of any later fence, which is all a file sync needs.
        The future fails with `RecorderFenced` or `RecorderBroken` if any op recorded before
        it was not committed. Cancelling it cancels only the wait. Raises `RecorderBroken`
        at once if already broken.
        """
        self.check()
        fut: asyncio.Future[pb.AppendResponse] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_mark_retrieved)
        self._release()
        target = self._last
        if not confirm and target is not None and (resp := target.response) is not None:
            if not self._inflight:  # Observed: every earlier append committed too.
                fut.set_result(resp)
                return fut
            # Committed, not yet observed: `_pump` resolves it in order, once it observed
            # the appends before it.
            self._waiters.append((target, fut))
            self._schedule_pump()
            return fut
        if target is None or target.is_done():
            deps = [target] if target is not None else []  # In case it failed.
            target = self._svc.start_append(self._request, deps)
            self._release_one(target)
        self._waiters.append((target, fut))
        self._schedule_pump()
        return fut

    def flush(self) -> None:
        """Release the ops recorded so far now, rather than at the loop's next turn, unless
        an append is in flight (they then go together once it commits, as always).

        For a caller that records a whole batch at once, e.g. a store's commit: its append
        leaves a loop turn earlier. Never raises (a failure breaks the Recorder, as ever).
        """
        self._pump()

    async def build_hints(self) -> rpb.FSMHints:
        """FSMHints of the FSM as of this call, returned once all their ops are committed.

        Raises `RecorderBroken`/`RecorderFenced` if they could not be committed.
        """
        fsm = self._fsm
        hints = fsm.build_hints(self._log)
        # The FSM's Segments in the order build_hints copied them: once the barrier resolves,
        # each has its exact first_offset (if this Recorder began it), to be copied over.
        live = [seg for fnode in sorted(fsm.live_nodes) for seg in fsm.live_nodes[fnode].segments]
        await self.barrier()
        hinted = (seg for node in hints.live_nodes for seg in node.segments)
        for out, seg in zip(hinted, live, strict=True):
            if out.first_seq_no == seg.first_seq_no and out.first_offset < seg.first_offset:
                out.first_offset = seg.first_offset
        return hints

    async def throttle(self, max_uncommitted: int = 64 << 20) -> None:
        """Wait for a barrier if more than `max_uncommitted` recorded bytes are uncommitted.

        Call it between writes to bound the memory of a fast writer.
        """
        if self._uncommitted > max_uncommitted:
            await self.barrier()

    def abandon(self, reason: str) -> None:
        """Stop recording at once, as if an append had failed with `reason`: appends not yet
        committed are dropped, and every later call raises `RecorderBroken`. For an owner
        that can no longer keep its files and the log in step (a store dropped without
        closing): its directory must not be recorded from again. Call on the loop's thread."""
        self._break(RuntimeError(reason))

    async def close(self) -> None:
        """Wait until everything recorded is committed; later calls raise RuntimeError.

        Raises `RecorderBroken`/`RecorderFenced` if it could not be.
        """
        if self._closed:
            return
        try:
            await self.barrier()
            # Ops recorded while it was pending are committed too.
            while self._inflight or self._pending:
                await self.barrier()
        finally:
            self._closed = True

    # -- Internals -----------------------------------------------------------------------

    def _fresh_error(self) -> RecorderBroken:
        # A new instance per raise, so that tracebacks do not pile up on one object.
        err = self._error
        assert err is not None
        return type(err)(err.log, err.offset, err.__cause__ or err)

    def _inconsistent(self, err: RecorderInconsistent) -> NoReturn:
        self._break(err)
        raise err

    def _process(self, op: rpb.RecordedOp, payload: bytes = b"", fnode: int = 0) -> None:
        """Sequence, apply and buffer `op`. `fnode` is the Fnode the op concerns (-1: the one
        a create makes; 0: none), whose Segment the op may begin."""
        fsm = self._fsm
        op.author = self._author
        op.seq_no = seq_no = fsm.next_seq_no
        op.checksum = fsm.next_checksum
        frame = encode_op(op)
        op.first_offset = self._write_head
        op.log = self._log
        try:
            fsm.apply(op, frame[HEADER_LENGTH:])
        except FSMError as err:  # The checks above should have caught it: a bug.
            wrapped = RecorderInconsistent(f"FSM rejected a recorded op: {err}")
            wrapped.__cause__ = err
            self._inconsistent(wrapped)
        a, position = self._buffer(frame, payload)
        if fnode:
            # The op begins a Segment if it creates its Fnode, or is the first op of this
            # author on it (recording on from a hand-off). Such Segments are placed exactly
            # once the append commits.
            node = fsm.live_nodes.get(seq_no if fnode < 0 else fnode)
            if node is not None and (seg := node.segments[-1]).first_seq_no == seq_no:
                self._unplaced.append((a, position, seg))

    def _buffer(self, frame: bytes, payload: bytes) -> tuple[AsyncAppend, int]:
        """Buffer an op; returns its append and its position within that append."""
        size = len(frame) + len(payload)
        a = self._pending[-1] if self._pending else None
        if a is None or a.size + size > _APPEND_BYTES:
            a = self._new_pending()
        position = a.size
        if len(payload) <= 4096:
            a.write(frame + payload)  # One buffer write: cheaper than two for small ops.
        else:
            a.write(frame)
            a.write(payload)
        self._uncommitted += size
        self.ops_recorded += 1
        self.bytes_recorded += size
        self._schedule_pump()
        return a, position

    def _new_pending(self) -> AsyncAppend:
        # Every append depends on the one before it: the AppendService sends a run of them
        # queued together as one RPC (which commits or fails as a whole), and once one fails,
        # every later one fails with DependencyFailed unsent, so the log never holds ops
        # beyond a failed one.
        prev = self._pending[-1] if self._pending else self._last
        a = self._svc.start_append(self._request, [prev] if prev is not None else [])
        self._pending.append(a)
        return a

    def _release(self) -> None:
        pending, self._pending = self._pending, []
        for i, a in enumerate(pending):
            try:
                self._release_one(a)
            except BaseException as err:
                self._break(err)  # (Done already if the service was closed.)
                for rest in pending[i + 1 :]:  # Neither released nor left hanging.
                    if not rest.is_done():
                        rest.abort(self._error)
                raise

    def _release_one(self, a: AsyncAppend) -> None:
        try:
            a.release()
        except RuntimeError as err:  # The AppendService is closed.
            self._break(err)
            raise self._fresh_error() from err
        self._inflight.append(a)
        self._last = a

    def _schedule_pump(self) -> None:
        """Have `_pump` run soon (once, however often this is called before it runs), unless
        it waits for an append already: it runs once that one is done."""
        if not self._pump_due and self._watched is None:
            self._pump_due = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        # Observes the outcome of released appends in order: advances the write head,
        # resolves barriers, and breaks the Recorder on the first failure. Buffered ops are
        # released only while nothing is in flight, so that they accumulate in few appends
        # (one per MiB) rather than one per loop turn, which would cost an AsyncAppend per op
        # when ops come one per turn (a FUSE server, SQLite's callbacks).
        # Runs as a loop callback (scheduled by `_schedule_pump`, and again once the append
        # it waits for is done): no task, whose steps would cost more per append.
        self._pump_due = False
        inflight = self._inflight
        while self._error is None:
            if not inflight:
                if not self._pending:
                    return
                try:
                    self._release()
                except BaseException:  # The service is closed: the Recorder is broken.
                    return
            a = inflight[0]
            if not a.is_done():
                if self._watched is not a:
                    self._watched = a
                    a.add_done_callback(self._append_done)
                return
            err = a.error()
            if err is not None:
                self._break(err)
                return
            resp = a.response
            assert resp is not None
            inflight.popleft()
            if self._watched is a:  # Done before its callback ran: that one is a no-op now.
                self._watched = None
            self._uncommitted -= a.size
            try:
                self._observe(a, resp)
            except Exception as failure:  # WriteHeadRegressed; anything else is a bug,
                self._break(failure)  # which must fail the waiters, not leave them hanging.
                return
            while self._waiters and self._waiters[0][0] is a:
                fut = self._waiters.popleft()[1]
                if not fut.done():
                    fut.set_result(resp)

    def _append_done(self, a: AsyncAppend) -> None:
        if self._watched is a:
            self._watched = None
            self._pump()

    def _observe(self, a: AsyncAppend, resp: pb.AppendResponse) -> None:
        """Advance the write head past committed append `a`, and place the ops it holds."""
        commit = resp.commit
        if resp is not self._last_resp:  # Appends batched into one RPC share its response.
            if commit.begin < self._write_head:
                raise WriteHeadRegressed(self._log, commit.begin, self._write_head)
            self._write_head = commit.end
            self._last_resp = resp
            # The batch's appends complete together, so the rest of it is already done and
            # next in line. Its content is theirs in order, unless the AppendService batched
            # another writer's appends with them (same request): then sizes don't add up,
            # and the ops keep their lower bounds.
            size = a.size
            for other in self._inflight:
                if other.response is not resp:
                    break
                size += other.size
            self._batch_cursor = commit.begin if size == commit.end - commit.begin else -1
        begin = self._batch_cursor
        unplaced = self._unplaced
        if begin < 0:
            while unplaced and unplaced[0][0] is a:
                unplaced.popleft()
            return
        self._batch_cursor = begin + a.size
        while unplaced and unplaced[0][0] is a:
            _, position, seg = unplaced.popleft()
            seg.first_offset = max(seg.first_offset, begin + position)

    def _break(self, err: BaseException) -> None:
        if self._error is not None:
            return
        cause = _root_cause(err)
        cls = RecorderFenced if isinstance(cause, RegisterMismatch) else RecorderBroken
        self._error = cls(self._log, self._write_head, cause)
        log.warning(
            "recorder broken log=%s author=%s write_head=%d err=%r",
            self._log,
            format_author(self._author),
            self._write_head,
            cause,
        )
        pending, self._pending = self._pending, []
        for a in pending:
            a.abort(self._error)
        self._unplaced.clear()
        waiters, self._waiters = self._waiters, deque()
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(self._fresh_error())
