"""Player: rebuilds a directory from a recovery log, and hands the log over to a new author.

A `Player` reads a recovery log (`playback_reader`), decodes it with the sans-I/O
`OpDecoder`, steps an `FSM` by each op and re-enacts the ops the FSM accepts on files staged
under ``<directory>/.fnodes/<fnode>`` (`staging`; an Fnode is a file across all its links).
When playback completes, each live Fnode is hard-linked at every one of its paths, property
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
ETA) is the `progress` attribute and an optional callback (`progress`).

This module holds the loop and the public `Player`; the errors (`playback_errors`), staging
(`staging`), reading (`playback_reader`) and progress (`progress`) are modules of their own,
whose public names this module exports too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from gazette.broker.client import JournalClient, append
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog import staging
from gazette.recoverylog.author import author_fence, format_author
from gazette.recoverylog.codec import (
    DecodedOp,
    Desync,
    OpDecodeError,
    PayloadChunk,
    PayloadEnd,
    encode_op,
)
from gazette.recoverylog.fsm import FSM, FnodeNotTracked, FSMError, NotHintedAuthor, WrongSeqNo
from gazette.recoverylog.hints import validate_hints
from gazette.recoverylog.playback_errors import (
    DataLoss,
    HintedSegmentBeyondHead,
    OffsetJumpOverHints,
    PlaybackError,
    UnsafeDirectory,
    UnsafePath,
    UnusedHints,
)
from gazette.recoverylog.playback_reader import PlaybackReader, write_head
from gazette.recoverylog.progress import (
    PlaybackProgress,
    PlayerState,
    ProgressTracker,
    expected_intervals,
)
from gazette.recoverylog.segments import InvalidHints
from gazette.recoverylog.staging import (
    FNODE_STAGING_DIR,
    StagedFiles,
    check_playback_directory,
    make_live,
)

__all__ = [
    "EXIT_AT_HEAD",
    "FNODE_STAGING_DIR",
    "MERGE_GAP",
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
    "check_playback_directory",
]

log = logging.getLogger(__name__)

MERGE_GAP = 64 << 10
"""Dead bytes between two hinted segments of a log which are read through rather than skipped.

Skipping costs a new Read RPC; reading a small gap is cheaper than that round trip."""

EXIT_AT_HEAD = PlayerState.EXIT_AT_HEAD
TAIL = PlayerState.TAIL


def __getattr__(name: str) -> int:
    # `recovered_bytes` is the staging module's counter, read here by the metrics exposition.
    if name == "recovered_bytes":
        return staging.recovered_bytes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

        self._reader = PlaybackReader(client, log, end_offset=end_offset, do_not_proxy=do_not_proxy)
        self._files: StagedFiles | None = None
        self._read_through = 0  # Offset of `log` to read through before acting at the head.
        self._progress = ProgressTracker(log, on_progress, progress_interval)

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

    # Progress.

    @property
    def progress(self) -> PlaybackProgress:
        """Progress as of now."""
        return self._progress.snapshot(self.state, self._reader.journal, self._reader.offset)

    @property
    def on_progress(self) -> Callable[[PlaybackProgress], None] | None:
        return self._progress.on_progress

    @property
    def progress_interval(self) -> float:
        return self._progress.interval

    @property
    def bytes_read(self) -> int:
        """Log bytes received (dead bytes read through included)."""
        return self._progress.bytes_read

    @property
    def ops_applied(self) -> int:
        return self._progress.ops_applied

    @property
    def ops_rejected(self) -> int:
        """Ops the FSM rejected (a zombie author's, a mis-sequenced one's...)."""
        return self._progress.ops_rejected

    @property
    def desync_bytes(self) -> int:
        """Bytes skipped because no op frame could be decoded from them."""
        return self._progress.desync_bytes

    def _set_state(self, state: PlayerState) -> None:
        if state is not self.state:
            log.debug(
                "player state log=%s from=%s to=%s offset=%d",
                self.log,
                self.state.value,
                state.value,
                self._reader.offset,
            )
            self.state = state
            self._report(force=True)

    def _report(self, force: bool = False) -> None:
        reader = self._reader
        self._progress.report(self.state, reader.journal, reader.offset, force=force)

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
        await staging.wipe(directory)
        progress = self._progress
        progress.start()

        for name in dict.fromkeys([self.log] + [seg.log for seg in self._segments]):
            self._heads[name] = await write_head(self.client, name)
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
        self._read_through = progress.log_head = self._heads[self.log]
        progress.intervals = expected_intervals(self._segments, self.log, self._heads)

        self._files = StagedFiles(directory / FNODE_STAGING_DIR)
        try:
            await self._play_log(fsm)
            self._files.close()
            make_live(directory, fsm, self._files)
        finally:
            await self._reader.close()
            self._files.close()
        self._set_state(PlayerState.COMPLETE)
        log.info(
            "completed playback log=%s dir=%s files=%d next_seq_no=%d bytes_read=%d",
            self.log,
            directory,
            len(fsm.live_nodes),
            fsm.next_seq_no,
            progress.bytes_read,
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

    def _feed(self, data: bytes, fsm: FSM) -> None:
        reader = self._reader
        reader.feed(data, fsm)
        progress = self._progress
        if reader.journal == self.log:
            progress.advance_head(reader.offset)
        progress.bytes_read += len(data)
        self._drain(fsm)
        self._report()

    async def _play_log(self, fsm: FSM) -> None:
        """Read the hinted segments, then the log through its head; then act on requests."""
        reader = self._reader
        progress = self._progress
        while True:
            if fsm.has_remaining_hints():
                await self._play_hinted(fsm)
                continue

            # Hints are consumed (or there were none): read the log onwards, unbounded.
            if not reader.is_open:
                reader.open(self.log, 0, 0)
            elif reader.end != self.end_offset or reader.journal != self.log:
                assert reader.journal == self.log, "hints end in another log"
                reader.open(self.log, reader.offset, 0, reset=False)

            if reader.offset < self._read_through:
                self._feed(await reader.read(), fsm)
                if self._handoff_applied:
                    return
                continue

            # Read through the write head.
            if not self.tailing.is_set():
                log.info(
                    "player reached the write head log=%s offset=%d bytes_read=%d",
                    self.log,
                    reader.offset,
                    progress.bytes_read,
                )
                self.tailing.set()
            state = self.state

            if state is PlayerState.READ_HANDOFF_BARRIER:
                # The no-op was not seen where it was appended: a corrupt frame or payload
                # before it swallowed it, and may have swallowed ops appended after it too.
                dec = reader.decoder
                payload_op = dec.payload_op
                if payload_op is not None and payload_op.first_offset >= self._read_through:
                    # Within the payload of an op appended after the no-op: read it whole.
                    self._feed(await reader.read(), fsm)
                    if self._handoff_applied:
                        return
                    continue
                log.warning(
                    "hand-off no-op not read back log=%s offset=%d; injecting again",
                    self.log,
                    self._handoff_begin,
                )
                if (
                    dec.in_payload
                    or dec.offset != self._read_through
                    or reader.offset != dec.offset
                ):
                    # Decode afresh from the no-op's end, where an append (so an op) begins:
                    # the offset fed may lie within an op. Ops read again which were applied
                    # already are rejected by the FSM (their seq_no is behind).
                    await reader.close()
                    reader.open(self.log, self._read_through, 0)
                state = PlayerState.INJECT_HANDOFF_AT_HEAD
            elif state in (PlayerState.BACKFILL, PlayerState.TAIL):
                request = self._request
                if request is None:
                    self._set_state(PlayerState.TAIL)
                    data = await reader.read_or(self._request_event)
                    if data is not None:
                        self._feed(data, fsm)
                    continue
                if request == 0:
                    if state is PlayerState.TAIL:
                        # Finish at the head as of now, not as of when backfill began.
                        self._set_state(PlayerState.EXIT_AT_HEAD)
                        self._read_through = await write_head(self.client, self.log)
                        progress.advance_head(self._read_through)
                        continue
                    state = PlayerState.EXIT_AT_HEAD
                else:
                    state = PlayerState.INJECT_HANDOFF_AT_HEAD
            self._set_state(state)

            if state is PlayerState.EXIT_AT_HEAD:
                dec = reader.decoder
                if self.end_offset and (dec.in_payload or dec.in_frame):
                    raise PlaybackError(
                        f"end_offset {self.end_offset} of {self.log} lies within a recorded op"
                    )
                if dec.in_payload:
                    # The log grew past the head, and the last read ended within a write's
                    # payload (the op is applied, its file partly written): read on to the
                    # payload's end, within the same append.
                    self._feed(await reader.read(), fsm)
                    continue
                # Between ops: complete after the last whole op (bytes of a partial frame
                # beyond it are not played).
                self._write_head = dec.offset
                return
            if state is PlayerState.INJECT_HANDOFF_AT_HEAD:
                assert self._request
                self._handoff_begin, self._read_through = await self._inject(fsm, self._request)
                progress.advance_head(self._read_through)
                self._set_state(PlayerState.READ_HANDOFF_BARRIER)
                continue
            raise AssertionError(f"unexpected player state {state}")

    async def _play_hinted(self, fsm: FSM) -> None:
        """One step of reading hinted segments: position the reader, then read and apply.

        Like upstream, the reader skips ahead to the first_offset of the segment the FSM
        expects next whenever that is beyond what was read (and far enough to be worth a new
        Read RPC); reads of segments of known extent are bounded by their last_offset.
        """
        reader = self._reader
        seg = self._next_segment(fsm)
        if seg is None:  # Hinted Fnodes remain, but their segments were all applied.
            raise UnusedHints(reader.journal, reader.offset, self._heads[reader.journal], None)
        head = self._heads[seg.log]
        fed = reader.offset
        if (
            not reader.is_open
            or seg.log != reader.journal
            or (
                seg.first_offset > fed
                and not reader.live_payload
                and (reader.exhausted or seg.first_offset - fed > self.merge_gap)
            )
        ):
            reader.open(seg.log, seg.first_offset, self._range_end(seg))
        elif reader.exhausted:
            if (seg.last_offset and fed >= seg.last_offset) or fed >= head:
                # Read through the segment, and the FSM still expects its ops.
                raise UnusedHints(seg.log, fed, head, seg)
            reader.open(seg.log, fed, self._range_end(seg), reset=False)
        elif not reader.end and fed >= head:
            raise UnusedHints(seg.log, fed, head, seg)

        data = await reader.read()
        if data:
            self._feed(data, fsm)
        else:
            reader.exhausted = True

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
        reader = self._reader
        dec = reader.decoder
        files = self._files
        assert files is not None
        while True:
            try:
                ev = dec.next_event()
            except OpDecodeError as err:
                log.warning("undecodable recovery log frame log=%s err=%s", reader.journal, err)
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
                reader.live_payload = False
            elif kind is Desync:
                assert isinstance(ev, Desync)
                self._progress.desync_bytes += ev.end - ev.begin
                log.warning(
                    "recovery log desynchronized: skipped bytes log=%s begin=%d end=%d",
                    reader.journal,
                    ev.begin,
                    ev.end,
                )

    def _apply(self, fsm: FSM, files: StagedFiles, ev: DecodedOp) -> bool:
        """Apply `ev`'s op and re-enact it; True if it is our applied hand-off no-op."""
        op = ev.op
        try:
            fsm.apply(op, ev.frame)
        except FSMError as err:
            applied = False
            self._progress.ops_rejected += 1
            if op.HasField("write"):
                self._reader.decoder.discard_payload()
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
            self._progress.ops_applied += 1
            if op.HasField("create"):
                files.create(op.seq_no)
            elif op.HasField("write"):
                self._reader.live_payload = True
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
