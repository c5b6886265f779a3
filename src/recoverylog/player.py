"""Player: rebuilds a directory from a recovery log, and hands the log over to a new author.

A `Player` reads a recovery log with a `RetryReader`, decodes it with the sans-I/O `OpDecoder`,
steps an `FSM` by each op and re-enacts the ops the FSM accepts on local files. Files are staged
under ``<directory>/.fnodes/<fnode>`` while playing (an Fnode is a file across all its links);
when playback completes, each live Fnode is hard-linked at every one of its paths, property
files are written, and ``.fnodes`` is removed. The FSM is then handed over (`Player.fsm`), so
that a Recorder continues recording the log from exactly the state that was played.

With `FSMHints`, the Player reads only the hinted (live) segments: as upstream, whenever the
segment the FSM expects next begins beyond what was read, it seeks there (a new Read RPC), so
dead portions of the log between segments are skipped (gaps under `MERGE_GAP` are read
through). A segment's first_offset is a lower bound (a Recorder knows no better), so reading
starts at most that much early; reads of segments whose last_offset is known (hints of a played
FSM) are bounded by it. Reaching a log's write head, or the end of a segment, with hints left
unused means the log lost content (`DataLoss`: `UnusedHints`, ...).

States (`PlayerState`)::

    BACKFILL -> TAIL -> EXIT_AT_HEAD ----------------------------------------> COMPLETE
                    \\-> INJECT_HANDOFF_AT_HEAD <-> READ_HANDOFF_BARRIER ------^

A Player first *backfills* the log up to its write head, learnt up front with an empty append
(a barrier, as upstream; it orders after every append in flight). At the head it sets the
`tailing` event and, unless asked to finish, *tails* the log with blocking reads: a hot standby.
`finish_at_head` completes at the (then current) write head. `inject_handoff(author)` appends a
no-op sequenced at the FSM's current seq_no and checksum, which also sets the journal register
``author=<author>``; once the Player reads that no-op back and the FSM accepts it, the log is the
new author's, and the previous author's Recorder appends fail with `RegisterMismatch`. If
another writer raced the no-op (the FSM rejects it), the Player reads on and injects again.

The Player holds O(read chunk) memory regardless of file sizes: write payloads stream from the
decoder into the staged files at their offsets. Progress (bytes read of bytes to read, rate,
ETA) is the `progress` attribute and an optional callback.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gazette.broker.client import JournalClient, RetryReader, append
from gazette.broker.client.errors import OffsetJump
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.author import author_fence, format_author
from gazette.recoverylog.codec import (
    DecodedOp,
    Desync,
    OpDecodeError,
    OpDecoder,
    PayloadChunk,
    PayloadEnd,
    encode_op,
)
from gazette.recoverylog.fsm import FSM, FnodeNotTracked, FSMError, NotHintedAuthor, WrongSeqNo
from gazette.recoverylog.hints import validate_hints
from gazette.recoverylog.segments import InvalidHints, format_segment

__all__ = [
    "EXIT_AT_HEAD",
    "FNODE_STAGING_DIR",
    "TAIL",
    "DataLoss",
    "HintedSegmentBeyondHead",
    "OffsetJumpOverHints",
    "PlaybackError",
    "PlaybackProgress",
    "Player",
    "PlayerState",
    "UnsafeDirectory",
    "UnsafePath",
    "UnusedHints",
]

log = logging.getLogger(__name__)

recovered_bytes = 0
"""Bytes this process's Players wrote to local files (upstream's
``gazette_recoverylog_recovered_bytes_total``; the consumer's /debug/metrics renders it)."""

FNODE_STAGING_DIR = ".fnodes"
"""Subdirectory of the playback directory in which Fnodes are staged while playing."""

MERGE_GAP = 64 << 10
"""Dead bytes between two hinted segments of a log which are read through rather than skipped.

Skipping costs a new Read RPC; reading a small gap is cheaper than that round trip."""

_MAX_OPEN_FILES = 256


class PlayerState(enum.Enum):
    """Where a Player is in playback (see the module docstring)."""

    BACKFILL = "backfill"
    """Reading the log up to the write head learnt when playback began."""
    TAIL = "tail"
    """At the head, following new ops as they are appended (a hot standby)."""
    EXIT_AT_HEAD = "exit_at_head"
    """Asked to finish: reading to the current write head, then completing."""
    INJECT_HANDOFF_AT_HEAD = "inject_handoff_at_head"
    """Asked to hand off: appending the hand-off no-op at the head."""
    READ_HANDOFF_BARRIER = "read_handoff_barrier"
    """Reading up to the injected no-op, to learn whether it was sequenced."""
    COMPLETE = "complete"
    """Playback completed: the tree is live and `Player.fsm` may be recorded onwards."""


EXIT_AT_HEAD = PlayerState.EXIT_AT_HEAD
TAIL = PlayerState.TAIL


class PlaybackError(Exception):
    """Playback cannot complete."""


class UnsafeDirectory(PlaybackError):
    """The playback directory is one which a Player refuses to wipe (``/``, a home...)."""


class UnsafePath(PlaybackError):
    """A path of the log would place a file outside the playback directory."""


class DataLoss(PlaybackError):
    """The log no longer holds content which the hints say is live: playback would be wrong."""


class UnusedHints(DataLoss):
    """A write head (or the end of a hinted range) was read through with hints unused."""

    def __init__(self, log_name: str, offset: int, head: int, remaining: rpb.Segment | None):
        nxt = format_segment(remaining) if remaining is not None else "hinted Fnodes"
        super().__init__(
            f"read {log_name} through offset {offset} (write head {head}) but the FSM has "
            f"unused hints (next: {nxt}); possible data loss"
        )
        self.log = log_name
        self.offset = offset
        self.head = head
        self.remaining = remaining


class HintedSegmentBeyondHead(DataLoss):
    """A hinted segment lies beyond its log's write head."""

    def __init__(self, segment: rpb.Segment, head: int) -> None:
        super().__init__(
            f"write head of {segment.log} is {head}, vs hinted {format_segment(segment)}; "
            "possible data loss"
        )
        self.segment = segment
        self.head = head


class OffsetJumpOverHints(DataLoss):
    """The log's content jumped over a range holding hinted ops (its fragments are gone)."""

    def __init__(self, jump: OffsetJump, segment: rpb.Segment) -> None:
        super().__init__(
            f"offset jump of {jump.journal} from {jump.from_offset} to {jump.to_offset} skips "
            f"hinted {format_segment(segment)}; possible data loss"
        )
        self.jump = jump
        self.segment = segment


@dataclass(frozen=True, slots=True)
class PlaybackProgress:
    """A snapshot of a Player's progress.

    `bytes_to_read` is the length of the hinted ranges still to be read plus the distance from
    the start of the final (unhinted) portion of the log to its write head; it grows while
    tailing. `bytes_read` counts log bytes received (dead bytes read through included).
    """

    state: PlayerState
    log: str
    offset: int
    bytes_read: int
    bytes_to_read: int
    ops_applied: int
    ops_rejected: int
    desync_bytes: int
    elapsed: float

    @property
    def rate(self) -> float:
        """Bytes read per second since playback began."""
        return self.bytes_read / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Estimated seconds until the write head is reached (None before any rate is known)."""
        remaining = max(0, self.bytes_to_read - self.bytes_read)
        if remaining == 0:
            return 0.0
        rate = self.rate
        return remaining / rate if rate > 0 else None


class _StagedFiles:
    """Fnode files under the staging directory, with a bounded cache of open descriptors."""

    def __init__(self, root: Path, max_open: int = _MAX_OPEN_FILES) -> None:
        self.root = root
        self.live: set[int] = set()
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._max_open = max_open
        self._prefix = os.path.join(root, "")  # Plain strings: pathlib costs per op add up.

    def path(self, fnode: int) -> str:
        return f"{self._prefix}{fnode}"

    def _cache(self, fnode: int, fd: int) -> None:
        self._fds[fnode] = fd
        while len(self._fds) > self._max_open:
            _, old = self._fds.popitem(last=False)
            os.close(old)

    def create(self, fnode: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        self._cache(fnode, os.open(self.path(fnode), flags, 0o666))
        self.live.add(fnode)

    def write(self, fnode: int, offset: int, data: bytes) -> None:
        fd = self._fds.get(fnode)
        if fd is None:
            fd = os.open(self.path(fnode), os.O_WRONLY | os.O_CLOEXEC)
            self._cache(fnode, fd)
        else:
            self._fds.move_to_end(fnode)
        n = os.pwrite(fd, data, offset)
        while n < len(data):  # Short writes are rare, but allowed.
            n += os.pwrite(fd, memoryview(data)[n:], offset + n)
        global recovered_bytes
        recovered_bytes += n

    def remove(self, fnode: int) -> None:
        fd = self._fds.pop(fnode, None)
        if fd is not None:
            os.close(fd)
        os.unlink(self.path(fnode))
        self.live.discard(fnode)

    def close(self) -> None:
        fds, self._fds = self._fds, OrderedDict()
        for fd in fds.values():
            os.close(fd)


def check_playback_directory(directory: Path) -> Path:
    """The resolved `directory`, or `UnsafeDirectory` if a Player must not wipe it.

    Refused: the root and top-level directories, the user's home and its ancestors, the
    current directory and its ancestors, and anything which exists but is not a directory.
    """
    path = Path(directory).resolve()
    if len(path.parts) < 3:
        raise UnsafeDirectory(f"refusing to play into {path}: too close to the root")
    for what, other in (("home", Path.home()), ("current", Path.cwd())):
        other = other.resolve()
        if path == other or path in other.parents:
            raise UnsafeDirectory(f"refusing to play into {path}: it holds the {what} directory")
    if path.exists() and not path.is_dir():
        raise UnsafeDirectory(f"refusing to play into {path}: not a directory")
    return path


def _wipe(directory: Path) -> None:
    # The directory itself is kept: it may be a mount point.
    directory.mkdir(parents=True, exist_ok=True)
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    (directory / FNODE_STAGING_DIR).mkdir()


async def _in_thread_to_completion(fn: Callable[[Path], None], arg: Path) -> None:
    """Run `fn(arg)` in a thread; if cancelled meanwhile, wait for it, then re-raise.

    No thread outlives the call, so that a later `play` never races a wipe still running.
    """
    task = asyncio.ensure_future(asyncio.to_thread(fn, arg))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                continue
        raise


def _relative_path(path: str) -> PurePosixPath:
    parts = path.lstrip("/").split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] == FNODE_STAGING_DIR:
        raise UnsafePath(f"log path {path!r} does not name a file within the playback directory")
    return PurePosixPath(*parts)


class Player:
    """Plays recovery log `log` into `directory`, optionally guided by `hints`.

    `hints` (or None, to read the log from its beginning) must name `log`. `directory` is wiped
    when `play` begins (see `check_playback_directory` for what is refused). `on_progress`, if
    given, is called with a `PlaybackProgress` at most every `progress_interval` seconds while
    reading, and at each state change. `do_not_proxy` lets brokers answer reads of persisted
    fragments with a URL the Player fetches itself.

    `end_offset`, if non-zero, plays `log` exactly through that offset instead of through its
    write head: it must be an op boundary at or before the write head (a write head learnt
    earlier, for instance). Players given the same hints and `end_offset` build the same tree
    wherever they run, however much the log grew since (an export splits a shard this way).
    Only with `EXIT_AT_HEAD`.

    One `play` per Player. The Player is used from one event loop; `inject_handoff` and
    `finish_at_head` may be called at any time from that loop's tasks.
    """

    def __init__(
        self,
        client: JournalClient,
        log: str,
        hints: rpb.FSMHints | None,
        directory: Path | str,
        *,
        on_progress: Callable[[PlaybackProgress], None] | None = None,
        progress_interval: float = 1.0,
        do_not_proxy: bool = False,
        merge_gap: int = MERGE_GAP,
        end_offset: int = 0,
    ) -> None:
        if not log:
            raise ValueError("a recovery log journal is required")
        if end_offset < 0:
            raise ValueError(f"invalid end_offset {end_offset}")
        self.end_offset = end_offset
        self.client = client
        self.log = log
        self.hints = hints
        self.directory = Path(directory)
        self.on_progress = on_progress
        self.progress_interval = progress_interval
        self.do_not_proxy = do_not_proxy
        self.merge_gap = merge_gap

        self.state = PlayerState.BACKFILL
        self.tailing = asyncio.Event()
        """Set once the Player has read through the write head and follows the log."""

        self._fsm: FSM | None = None
        self._played = False
        self._request: int | None = None  # None: tail on; 0: finish at head; else: hand-off.
        self._request_event = asyncio.Event()
        self._handoff_begin = -1  # Offset of the latest injected no-op.
        self._handoff_applied = False
        self._write_head = 0

        # Hinted segments in log order, and the one the FSM is applying.
        self._segments: list[rpb.Segment] = []
        self._segment_index: dict[int, int] = {}  # first_seq_no -> index in _segments.
        self._segment: rpb.Segment | None = None
        self._heads: dict[str, int] = {}  # Write heads learnt by barriers.

        self._dec = OpDecoder(0, log)
        self._live_payload = False  # The decoder is within the payload of an applied write.
        self._files: _StagedFiles | None = None
        self._rr: RetryReader | None = None
        self._read_task: asyncio.Future[bytes] | None = None
        self._read_log = log
        self._read_end = 0  # end_offset of the current reader (0: unbounded).
        self._exhausted = False  # The current (bounded) reader reached its end_offset.
        self._fed = 0  # Journal offset just past the last byte fed to the decoder.
        self._read_through = 0  # Offset of `log` to read through before acting at the head.

        # Progress: byte intervals expected to be read, in order ((log, begin, end), an end of
        # None being the write head of `log`), and the first not yet read through.
        self._intervals: list[tuple[str, int, int | None]] = [(log, 0, None)]
        self._interval_cursor = 0
        self._log_head = 0  # Latest known write head of `log`.

        self.bytes_read = 0
        self.ops_applied = 0
        self.ops_rejected = 0
        self.desync_bytes = 0
        self._started = 0.0
        self._last_progress = 0.0

    # Control.

    def is_linked(self, path: str) -> bool:
        """Whether `path` (as recorded: ``/CURRENT``) is a link of the FSM played so far
        (while playing too: files are linked into the directory once playback completes)."""
        return self._fsm is not None and path in self._fsm.links

    @property
    def fsm(self) -> FSM:
        """The played FSM: valid once `play` returned (then record onwards from it)."""
        if self.state is not PlayerState.COMPLETE or self._fsm is None:
            raise RuntimeError("playback has not completed")
        return self._fsm

    @property
    def write_head(self) -> int:
        """Offset of the log through which playback completed (valid with `fsm`): the end of
        the last whole op read, never within one (a write read past the head is read whole).

        After a hand-off, the end of the injected no-op: a Recorder continuing the log from
        `fsm` passes it as its `write_head` (a lower bound of the offsets of its ops).
        """
        if self.state is not PlayerState.COMPLETE:
            raise RuntimeError("playback has not completed")
        return self._write_head

    def finish_at_head(self) -> None:
        """Ask `play` to complete once it has read through the log's current write head."""
        self._set_request(0)

    def inject_handoff(self, author: int) -> None:
        """Ask `play` to take over the log for `author` at the head, then complete.

        `author` must be non-zero. Raises `RuntimeError` if a finish was already requested.
        """
        if not 0 < author <= 0xFFFFFFFF:
            raise ValueError(f"invalid author {author}")
        self._set_request(author)

    def _set_request(self, request: int) -> None:
        if self._request is not None and self._request != request:
            raise RuntimeError("playback was already asked to finish (once per Player)")
        self._request = request
        self._request_event.set()

    @property
    def progress(self) -> PlaybackProgress:
        """Progress as of now."""
        return PlaybackProgress(
            state=self.state,
            log=self._read_log,
            offset=self._fed,
            bytes_read=self.bytes_read,
            bytes_to_read=self.bytes_read + self._remaining_estimate(),
            ops_applied=self.ops_applied,
            ops_rejected=self.ops_rejected,
            desync_bytes=self.desync_bytes,
            elapsed=time.monotonic() - self._started if self._started else 0.0,
        )

    def _remaining_estimate(self) -> int:
        intervals = self._intervals

        def end_of(i: int) -> int:
            end = intervals[i][2]
            return self._log_head if end is None else end

        i = self._interval_cursor
        while i < len(intervals) and not (
            intervals[i][0] == self._read_log and end_of(i) > self._fed
        ):
            i += 1
        self._interval_cursor = i
        if i == len(intervals):
            return 0
        out = end_of(i) - max(intervals[i][1], self._fed)
        for j in range(i + 1, len(intervals)):
            out += max(0, end_of(j) - intervals[j][1])
        return out

    def _set_state(self, state: PlayerState) -> None:
        if state is not self.state:
            log.debug(
                "player state log=%s from=%s to=%s offset=%d",
                self.log,
                self.state.value,
                state.value,
                self._fed,
            )
            self.state = state
            self._report(force=True)

    def _report(self, force: bool = False) -> None:
        if self.on_progress is None:
            return
        now = time.monotonic()
        if force or now - self._last_progress >= self.progress_interval:
            self._last_progress = now
            self.on_progress(self.progress)

    # Playback.

    async def play(self, until: PlayerState = EXIT_AT_HEAD) -> FSM:
        """Play the log; return the FSM (also `fsm`) once playback completes.

        `until` is `EXIT_AT_HEAD` (complete at the write head) or `TAIL` (follow the log
        until `finish_at_head` or `inject_handoff`). On completion the directory holds exactly
        the log's live files and properties.

        With `EXIT_AT_HEAD`, a finish is requested at once (so `inject_handoff` then raises
        `RuntimeError`); with `TAIL`, requests made before `play` are honoured at the head.

        Raises `InvalidHints` (or another `ValueError`) for bad hints, `UnsafeDirectory`,
        `DataLoss` subclasses when hinted content is missing from the log, `UnsafePath`, and the
        broker client's errors that its retries do not cover (`JournalNotFound`...). If `play`
        is cancelled or fails, no path of the tree has been linked (the staging directory may
        remain; the next `play` wipes it).
        """
        if self._played:
            raise RuntimeError("play may be called once per Player")
        self._played = True
        if until is EXIT_AT_HEAD:
            self.finish_at_head()
        elif until is TAIL and self.end_offset:
            raise ValueError("a Player with an end_offset plays until=EXIT_AT_HEAD")
        elif until is not TAIL:
            raise ValueError(f"play(until=...) must be EXIT_AT_HEAD or TAIL, not {until}")

        fsm = self._fsm = self._new_fsm()
        directory = check_playback_directory(self.directory)
        self._segments = fsm.hinted_segments
        self._segment_index = {seg.first_seq_no: i for i, seg in enumerate(self._segments)}
        log.info(
            "playback begins log=%s dir=%s hinted_segments=%d",
            self.log,
            directory,
            len(self._segments),
        )
        await _in_thread_to_completion(_wipe, directory)
        self._started = self._last_progress = time.monotonic()

        for name in dict.fromkeys([self.log] + [seg.log for seg in self._segments]):
            self._heads[name] = await self._barrier(name)
        if self.end_offset:
            if self.end_offset > self._heads[self.log]:
                raise PlaybackError(
                    f"end_offset {self.end_offset} is beyond the write head "
                    f"{self._heads[self.log]} of {self.log}"
                )
            self._heads[self.log] = self.end_offset
        for seg in self._segments:
            head = self._heads[seg.log]
            if seg.first_offset >= head or seg.last_offset > head:
                raise HintedSegmentBeyondHead(seg, head)
        self._read_through = self._log_head = self._heads[self.log]
        self._intervals = self._expected_intervals()

        self._files = _StagedFiles(directory / FNODE_STAGING_DIR)
        try:
            await self._play_log(fsm)
            self._files.close()
            self._make_live(directory, fsm, self._files)
        finally:
            await self._close_reader()
            self._files.close()
        self._set_state(PlayerState.COMPLETE)
        log.info(
            "completed playback log=%s dir=%s files=%d next_seq_no=%d bytes_read=%d",
            self.log,
            directory,
            len(fsm.live_nodes),
            fsm.next_seq_no,
            self.bytes_read,
        )
        return fsm

    def _new_fsm(self) -> FSM:
        hints = self.hints
        if hints is None:
            return FSM(self.log)
        if hints.log != self.log:
            raise InvalidHints(f"hints are of log {hints.log!r}, not {self.log!r}")
        try:
            validate_hints(hints)
        except ValidationError as err:
            raise InvalidHints(f"invalid hints: {err}") from err
        return FSM.from_hints(hints)

    def _expected_intervals(self) -> list[tuple[str, int, int | None]]:
        """What playback is expected to read: the extents of hinted segments (those of
        unknown extent reaching to the next segment of their log, or its head), then the
        hinted log from the end of the last one through its head."""
        segs = self._segments
        out: list[tuple[str, int, int | None]] = []
        for i, seg in enumerate(segs):
            end: int | None = seg.last_offset
            if not end:
                nxt = segs[i + 1] if i + 1 < len(segs) else None
                if nxt is not None and nxt.log == seg.log:
                    end = max(seg.first_offset, nxt.first_offset)
                else:
                    end = None if seg.log == self.log else self._heads[seg.log]
            begin = seg.first_offset
            if out and out[-1][0] == seg.log:
                last_end = out[-1][2]
                if last_end is None or begin <= last_end:
                    end = None if last_end is None or end is None else max(last_end, end)
                    out[-1] = (seg.log, out[-1][1], end)
                    continue
            out.append((seg.log, begin, end))
        if not out:
            return [(self.log, 0, None)]
        if out[-1][2] is not None:
            out.append((self.log, out[-1][2], None))
        return out

    def _range_end(self, seg: rpb.Segment) -> int:
        """The end_offset of a read of `seg`: the last_offset of the chain of segments of
        known extent which follow it closely in its log (0: unknown, read unbounded)."""
        end = seg.last_offset
        if not end:
            return 0
        for nxt in self._segments[self._segment_index[seg.first_seq_no] + 1 :]:
            if nxt.log != seg.log or not nxt.last_offset or nxt.first_offset - end > self.merge_gap:
                break
            end = max(end, nxt.last_offset)
        return end

    def _next_segment(self, fsm: FSM) -> rpb.Segment | None:
        """The hinted segment the FSM is applying (cached while the FSM is within it)."""
        seg = self._segment
        n = fsm.next_seq_no
        if seg is None or not seg.first_seq_no <= n <= seg.last_seq_no:
            seg = self._segment = fsm.next_hinted_segment
        return seg

    async def _barrier(self, name: str) -> int:
        """The write head of `name`, as of an empty append ordered after all appends before it."""
        resp = await append(self.client, pb.AppendRequest(journal=name))
        return resp.commit.end

    # Reading.

    def _open_reader(self, name: str, begin: int, end: int, *, reset: bool = True) -> None:
        """Read `name` from `begin` to `end` (0: unbounded) with a new RetryReader.

        With `reset`, the decoder starts afresh at `begin`; without, the new reader continues
        where the previous one ended (`begin` must be the offset fed so far).
        """
        assert self._read_task is None
        if self._rr is not None:
            self._rr.close()
        if name == self.log and self.end_offset:
            end = min(end, self.end_offset) if end else self.end_offset
        req = pb.ReadRequest(
            journal=name, offset=begin, end_offset=end, block=True, do_not_proxy=self.do_not_proxy
        )
        self._rr = RetryReader(self.client, req)
        if reset:
            self._dec.reset(begin, name)
            self._live_payload = False
            self._fed = begin
        else:
            assert name == self._read_log and begin == self._fed
        self._read_log = name
        self._read_end = end
        self._exhausted = False

    async def _close_reader(self) -> None:
        task, self._read_task = self._read_task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except BaseException:  # noqa: B036 - the outcome of a read being abandoned.
                pass
        if self._rr is not None:
            self._rr.close()

    async def _read(self) -> bytes:
        """The next content of the current reader (waits for a pending read if there is one)."""
        assert self._rr is not None
        task, self._read_task = self._read_task, None
        if task is not None:
            return await task
        return await self._rr.read()

    async def _read_or_request(self) -> bytes | None:
        """The next content, or None if a finish or hand-off request arrives first.

        A read still pending when a request arrives is kept for the next `_read`.
        """
        assert self._rr is not None
        if self._read_task is None:
            self._read_task = asyncio.ensure_future(self._rr.read())
        task = self._read_task
        if not task.done() and not self._request_event.is_set():
            waiter = asyncio.ensure_future(self._request_event.wait())
            try:
                await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        if task.done():
            self._read_task = None
            return task.result()
        return None

    def _feed(self, data: bytes, fsm: FSM) -> None:
        assert self._rr is not None
        start = self._rr.offset - len(data)
        if start != self._fed:
            self._jumped(OffsetJump(self._read_log, self._fed, start), fsm)
        self._fed = start + len(data)
        if self._fed > self._log_head and self._read_log == self.log:
            self._log_head = self._fed
        self.bytes_read += len(data)
        self._dec.feed(data)
        self._drain(fsm)
        self._report()

    def _jumped(self, jump: OffsetJump, fsm: FSM) -> None:
        for seg in fsm.hinted_segments:
            if (
                seg.log == jump.journal
                and seg.first_offset < jump.to_offset
                and (seg.last_offset == 0 or seg.last_offset > jump.from_offset)
            ):
                raise OffsetJumpOverHints(jump, seg)
        log.warning(
            "recovery log offset jump log=%s from=%d to=%d (content is gone; continuing)",
            jump.journal,
            jump.from_offset,
            jump.to_offset,
        )
        self._dec.reset(jump.to_offset, jump.journal)
        self._live_payload = False

    async def _play_log(self, fsm: FSM) -> None:
        """Read the hinted segments, then the log through its head; then act on requests."""
        while True:
            if fsm.has_remaining_hints():
                await self._play_hinted(fsm)
                continue

            # Hints are consumed (or there were none): read the log onwards, unbounded.
            if self._rr is None:
                self._open_reader(self.log, 0, 0)
            elif self._read_end != self.end_offset or self._read_log != self.log:
                assert self._read_log == self.log, "hints end in another log"
                self._open_reader(self.log, self._fed, 0, reset=False)

            if self._fed < self._read_through:
                self._feed(await self._read(), fsm)
                if self._handoff_applied:
                    return
                continue

            # Read through the write head.
            if not self.tailing.is_set():
                log.info(
                    "player reached the write head log=%s offset=%d bytes_read=%d",
                    self.log,
                    self._fed,
                    self.bytes_read,
                )
                self.tailing.set()
            state = self.state

            if state is PlayerState.READ_HANDOFF_BARRIER:
                # The no-op was not seen where it was appended: a corrupt frame or payload
                # before it swallowed it, and may have swallowed ops appended after it too.
                dec = self._dec
                payload_op = dec.payload_op
                if payload_op is not None and payload_op.first_offset >= self._read_through:
                    # Within the payload of an op appended after the no-op: read it whole.
                    self._feed(await self._read(), fsm)
                    if self._handoff_applied:
                        return
                    continue
                log.warning(
                    "hand-off no-op not read back log=%s offset=%d; injecting again",
                    self.log,
                    self._handoff_begin,
                )
                if dec.in_payload or dec.offset != self._read_through or self._fed != dec.offset:
                    # Decode afresh from the no-op's end, where an append (so an op) begins:
                    # `_fed` may lie within an op. Ops read again which were applied already
                    # are rejected by the FSM (their seq_no is behind).
                    await self._close_reader()
                    self._open_reader(self.log, self._read_through, 0)
                state = PlayerState.INJECT_HANDOFF_AT_HEAD
            elif state in (PlayerState.BACKFILL, PlayerState.TAIL):
                request = self._request
                if request is None:
                    self._set_state(PlayerState.TAIL)
                    data = await self._read_or_request()
                    if data is not None:
                        self._feed(data, fsm)
                    continue
                if request == 0:
                    if state is PlayerState.TAIL:
                        # Finish at the head as of now, not as of when backfill began.
                        self._set_state(PlayerState.EXIT_AT_HEAD)
                        self._read_through = await self._barrier(self.log)
                        self._log_head = max(self._log_head, self._read_through)
                        continue
                    state = PlayerState.EXIT_AT_HEAD
                else:
                    state = PlayerState.INJECT_HANDOFF_AT_HEAD
            self._set_state(state)

            if state is PlayerState.EXIT_AT_HEAD:
                if self.end_offset and (self._dec.in_payload or self._dec.in_frame):
                    raise PlaybackError(
                        f"end_offset {self.end_offset} of {self.log} lies within a recorded op"
                    )
                if self._dec.in_payload:
                    # The log grew past the head, and the last read ended within a write's
                    # payload (the op is applied, its file partly written): read on to the
                    # payload's end, within the same append.
                    self._feed(await self._read(), fsm)
                    continue
                # Between ops: complete after the last whole op (bytes of a partial frame
                # beyond it are not played).
                self._write_head = self._dec.offset
                return
            if state is PlayerState.INJECT_HANDOFF_AT_HEAD:
                assert self._request
                self._handoff_begin, self._read_through = await self._inject(fsm, self._request)
                self._log_head = max(self._log_head, self._read_through)
                self._set_state(PlayerState.READ_HANDOFF_BARRIER)
                continue
            raise AssertionError(f"unexpected player state {state}")

    async def _play_hinted(self, fsm: FSM) -> None:
        """One step of reading hinted segments: position the reader, then read and apply.

        Like upstream, the reader skips ahead to the first_offset of the segment the FSM
        expects next whenever that is beyond what was read (and far enough to be worth a new
        Read RPC); reads of segments of known extent are bounded by their last_offset.
        """
        seg = self._next_segment(fsm)
        if seg is None:  # Hinted Fnodes remain, but their segments were all applied.
            raise UnusedHints(self._read_log, self._fed, self._heads[self._read_log], None)
        head = self._heads[seg.log]
        fed = self._fed
        if (
            self._rr is None
            or seg.log != self._read_log
            or (
                seg.first_offset > fed
                and not self._live_payload
                and (self._exhausted or seg.first_offset - fed > self.merge_gap)
            )
        ):
            self._open_reader(seg.log, seg.first_offset, self._range_end(seg))
        elif self._exhausted:
            if (seg.last_offset and fed >= seg.last_offset) or fed >= head:
                # Read through the segment, and the FSM still expects its ops.
                raise UnusedHints(seg.log, fed, head, seg)
            self._open_reader(seg.log, fed, self._range_end(seg), reset=False)
        elif not self._read_end and fed >= head:
            raise UnusedHints(seg.log, fed, head, seg)

        data = await self._read()
        if data:
            self._feed(data, fsm)
        else:
            self._exhausted = True

    async def _inject(self, fsm: FSM, author: int) -> tuple[int, int]:
        """Append the hand-off no-op sequenced at `fsm`'s state; its [begin, end) offsets."""
        noop = rpb.RecordedOp(seq_no=fsm.next_seq_no, checksum=fsm.next_checksum, author=author)
        req = pb.AppendRequest(journal=self.log, union_registers=author_fence(author))
        resp = await append(self.client, req, encode_op(noop))
        log.info(
            "injected hand-off no-op log=%s author=%s seq_no=%d offset=%d",
            self.log,
            format_author(author),
            noop.seq_no,
            resp.commit.begin,
        )
        return resp.commit.begin, resp.commit.end

    # Applying ops.

    def _drain(self, fsm: FSM) -> None:
        """Apply the decoder's events; stops early once the hand-off no-op is applied."""
        dec = self._dec
        files = self._files
        assert files is not None
        while True:
            try:
                ev = dec.next_event()
            except OpDecodeError as err:
                log.warning("undecodable recovery log frame log=%s err=%s", self._read_log, err)
                continue
            if ev is None:
                return
            kind = type(ev)
            if kind is PayloadChunk:
                assert isinstance(ev, PayloadChunk)
                files.write(ev.fnode, ev.offset, ev.data)
            elif kind is DecodedOp:
                assert isinstance(ev, DecodedOp)
                if self._apply(fsm, files, ev):
                    return
            elif kind is PayloadEnd:
                self._live_payload = False
            elif kind is Desync:
                assert isinstance(ev, Desync)
                self.desync_bytes += ev.end - ev.begin
                log.warning(
                    "recovery log desynchronized: skipped bytes log=%s begin=%d end=%d",
                    self._read_log,
                    ev.begin,
                    ev.end,
                )

    def _apply(self, fsm: FSM, files: _StagedFiles, ev: DecodedOp) -> bool:
        """Apply `ev`'s op and re-enact it; True if it is our applied hand-off no-op."""
        op = ev.op
        try:
            fsm.apply(op, ev.frame)
        except FSMError as err:
            applied = False
            self.ops_rejected += 1
            if op.HasField("write"):
                self._dec.discard_payload()
            expected = isinstance(err, FnodeNotTracked | NotHintedAuthor) or (
                isinstance(err, WrongSeqNo) and err.behind
            )
            (log.debug if expected else log.info)(
                "did not apply recovery log op log=%s offset=%d err=%s",
                op.log,
                op.first_offset,
                err,
            )
        else:
            applied = True
            self.ops_applied += 1
            if op.HasField("create"):
                files.create(op.seq_no)
            elif op.HasField("write"):
                self._live_payload = True
            elif op.HasField("unlink"):
                fnode = op.unlink.fnode
                if fnode not in fsm.live_nodes:
                    files.remove(fnode)
        if (
            self.state is PlayerState.READ_HANDOFF_BARRIER
            and op.author == self._request
            and op.first_offset >= self._handoff_begin
        ):
            if applied:
                self._handoff_applied = True
                self._write_head = op.last_offset
                return True
            log.info(
                "hand-off no-op lost a race with another writer log=%s offset=%d; retrying",
                self.log,
                op.first_offset,
            )
            self._set_state(PlayerState.INJECT_HANDOFF_AT_HEAD)
        return False

    # Completion.

    def _make_live(self, directory: Path, fsm: FSM, files: _StagedFiles) -> None:
        """Link staged Fnodes at their paths and write properties; all or nothing.

        Synchronous, so that cancellation cannot interrupt it; on failure every path linked
        so far is removed again.
        """
        if fsm.has_remaining_hints():
            raise AssertionError("completing playback with unused hints")
        if files.live != set(fsm.live_nodes):
            raise AssertionError(
                f"staged Fnodes {sorted(files.live)} != live Fnodes {sorted(fsm.live_nodes)}"
            )
        made: set[PurePosixPath] = {PurePosixPath()}  # Parent directories made so far.

        def target_of(path: str) -> str:
            rel = _relative_path(path)
            if rel.parent not in made:
                os.makedirs(directory / rel.parent, exist_ok=True)
                made.add(rel.parent)
            return os.path.join(directory, rel)

        try:
            for fnode, node in fsm.live_nodes.items():
                staged = files.path(fnode)
                for link in sorted(node.links):
                    os.link(staged, target_of(link))
            for path, content in fsm.properties.items():
                with open(target_of(path), "x", encoding="utf-8", newline="") as f:
                    f.write(content)
        except BaseException:
            for child in directory.iterdir():
                if child.name == FNODE_STAGING_DIR:
                    continue
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            raise
        shutil.rmtree(directory / FNODE_STAGING_DIR)
