"""Reading recovery logs for a Player: positioned, bounded reads feeding the op decoder.

A `PlaybackReader` holds one `RetryReader` at a time, opened where the Player asks: at the
first offset of the next hinted segment (a seek over dead log is a new Read RPC), bounded by
the end of a run of segments of known extent, or unbounded to follow the log's head. Every
read is fed to a sans-I/O `OpDecoder`, whose events the Player applies. When the log's
content jumps (its fragments were removed, or an append failed and a new primary rolled past
its offsets), the jump is fatal if it skips the end of a hinted segment (`jump_over_hints`,
`OffsetJumpOverHints`) and otherwise logged, the decoder continuing at the jump's end.

A read left pending while the Player attends to a request (a finish, a hand-off) is kept and
returned by the next read, so that no content is lost or read twice. `write_head` learns a
journal's write head the way upstream does: with an empty append, ordered after every
append in flight.
"""

from __future__ import annotations

import asyncio
import logging

from gazette.broker.client import JournalClient, RetryReader, append
from gazette.broker.client.errors import OffsetJump
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.codec import OpDecoder
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.playback_errors import OffsetJumpOverHints

__all__ = ["PlaybackReader", "jump_over_hints", "write_head"]

log = logging.getLogger(__name__)


async def write_head(client: JournalClient, journal: str) -> int:
    """The write head of `journal`, as of an empty append ordered after all appends before it."""
    resp = await append(client, pb.AppendRequest(journal=journal))
    return resp.commit.end


class PlaybackReader:
    """Reads the journals of a recovery log `log` and feeds what it reads to `decoder`.

    `end_offset`, if non-zero, bounds every read of `log` (a Player playing exactly through
    it). `do_not_proxy` lets brokers answer reads of persisted fragments with a URL the
    reader fetches itself. Used from one event loop.
    """

    def __init__(
        self, client: JournalClient, log: str, *, end_offset: int = 0, do_not_proxy: bool = False
    ) -> None:
        self.client = client
        self.log = log
        self.end_offset = end_offset
        self.do_not_proxy = do_not_proxy
        self.decoder = OpDecoder(0, log)
        self.live_payload = False
        """The decoder is within the payload of a write which the FSM applied (set by the
        Player; cleared whenever the decoder starts afresh)."""
        self.journal = log
        """The journal being read."""
        self.end = 0
        """end_offset of the current read (0: unbounded)."""
        self.exhausted = False
        """The current (bounded) read reached its end."""
        self.offset = 0
        """Offset of `journal` just past the last byte fed to the decoder."""
        self._rr: RetryReader | None = None
        self._pending: asyncio.Future[bytes] | None = None

    @property
    def is_open(self) -> bool:
        return self._rr is not None

    def open(self, journal: str, begin: int, end: int, *, reset: bool = True) -> None:
        """Read `journal` from `begin` to `end` (0: unbounded) with a new RetryReader.

        With `reset`, the decoder starts afresh at `begin`; without, the new read continues
        where the previous one ended (`begin` must be the offset fed so far).
        """
        assert self._pending is None
        if self._rr is not None:
            self._rr.close()
        if journal == self.log and self.end_offset:
            end = min(end, self.end_offset) if end else self.end_offset
        req = pb.ReadRequest(
            journal=journal,
            offset=begin,
            end_offset=end,
            block=True,
            do_not_proxy=self.do_not_proxy,
        )
        self._rr = RetryReader(self.client, req)
        if reset:
            self._reset_decoder(begin, journal)
            self.offset = begin
        else:
            assert journal == self.journal and begin == self.offset
        self.journal = journal
        self.end = end
        self.exhausted = False

    async def close(self) -> None:
        """Abandon a pending read and close the current RetryReader."""
        task, self._pending = self._pending, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except BaseException:  # noqa: B036 - the outcome of a read being abandoned.
                pass
        if self._rr is not None:
            self._rr.close()

    async def read(self) -> bytes:
        """The next content of the current read (that of a pending read if there is one);
        b"" once a bounded read reached its end."""
        assert self._rr is not None
        task, self._pending = self._pending, None
        if task is not None:
            return await task
        return await self._rr.read()

    async def read_or(self, event: asyncio.Event) -> bytes | None:
        """The next content, or None if `event` is set first.

        A read still pending when `event` is set is kept for the next `read`.
        """
        assert self._rr is not None
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._rr.read())
        task = self._pending
        if not task.done() and not event.is_set():
            waiter = asyncio.ensure_future(event.wait())
            try:
                await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        if task.done():
            self._pending = None
            return task.result()
        return None

    def feed(self, data: bytes, fsm: FSM) -> None:
        """Feed `data`, just read, to the decoder, after handling a jump of the content
        before it (`OffsetJumpOverHints` if it skips a segment hinted by `fsm`)."""
        assert self._rr is not None
        start = self._rr.offset - len(data)
        if start != self.offset:
            self._jumped(OffsetJump(self.journal, self.offset, start), fsm)
        self.offset = start + len(data)
        self.decoder.feed(data)

    def _jumped(self, jump: OffsetJump, fsm: FSM) -> None:
        skipped = jump_over_hints(jump, fsm.hinted_segments)
        if skipped is not None:
            raise OffsetJumpOverHints(jump, skipped)
        log.warning(
            "recovery log offset jump log=%s from=%d to=%d (content is gone; continuing)",
            jump.journal,
            jump.from_offset,
            jump.to_offset,
        )
        self._reset_decoder(jump.to_offset, jump.journal)

    def _reset_decoder(self, offset: int, journal: str) -> None:
        self.decoder.reset(offset, journal)
        self.live_payload = False


def jump_over_hints(jump: OffsetJump, segments: list[rpb.Segment]) -> rpb.Segment | None:
    """The first of `segments` (hinted, not yet applied) whose end `jump` skips, else None.

    As upstream, a jump is fatal only when a hinted segment of known extent ends inside the
    skipped range: its last ops are gone for certain. A jump within a segment is not: the
    range may be a failed append the recorder retried further on (which is where a new
    primary rolls past a failed append's offsets), and if it did hold hinted ops, the FSM
    refuses every later op of the segment (wrong sequence number) and the read through the
    segment's end (or through the head, for an open segment) fails with `UnusedHints`.
    """
    for seg in segments:
        if seg.log == jump.journal and jump.from_offset < seg.last_offset <= jump.to_offset:
            return seg
    return None
