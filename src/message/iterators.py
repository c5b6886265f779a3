"""Iterators of message Envelopes read from a journal.

- `ReadUncommittedIter` decodes every message of a journal, in journal order: duplicates,
  messages of transactions never acknowledged, and acknowledgements themselves included.
- `ReadCommittedIter` feeds those to a `Sequencer` and yields only committed messages, once
  each, in the order their transactions committed. When an acknowledgement commits messages
  that have left the Sequencer's ring, it re-reads their byte range with a second reader
  (a *replay*) and hands the envelopes to the Sequencer.

Both are async iterators (``async for env in it``) over a `RetryReader`, so broker restarts and
reassignments are ridden out. A non-blocking read (``ReadRequest.block`` false) raises
`OffsetNotYetAvailable` at the write head; calling `next()` again later continues where it
stopped. A read with ``end_offset`` ends there (StopAsyncIteration; a partial frame left at the
end raises `TruncatedFrame`).

Decoding is the framing's (``content-type`` label of the journal): bytes are fed to its
sans-I/O frame decoder. A desynchronised frame (fixed framing's magic word missing) is skipped
and logged, as are offset jumps over content removed from the journal; after a jump the decoder
restarts at the new offset, dropping any partial frame.
"""

from __future__ import annotations

import collections
import functools
import logging
from collections.abc import Callable
from itertools import repeat
from typing import Any

from gazette.broker.client.journal_client import JournalClient
from gazette.broker.client.list import get_journal
from gazette.broker.client.retry_reader import RetryReader
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.message.envelope import Envelope
from gazette.message.framing import (
    CONTENT_TYPE_LABEL,
    Desync,
    Frame,
    FrameDecoder,
    Framing,
    framing_for_spec,
)
from gazette.message.sequencer import MustStartReplay, QueueOutcome, Sequencer

__all__ = [
    "NewMessageFunc",
    "ReadUncommittedIter",
    "ReadCommittedIter",
    "MessageDecodeError",
    "TruncatedFrame",
    "read_range",
]

log = logging.getLogger(__name__)

NewMessageFunc = Callable[[pb.JournalSpec], Any]
"""A new, empty message of the type that the journal (given by its spec) holds."""


class MessageDecodeError(Exception):
    """A frame's payload could not be unmarshalled into a message."""

    def __init__(self, journal: str, begin: int, end: int, cause: BaseException) -> None:
        super().__init__(
            f"unmarshal of message journal={journal} begin={begin} end={end} failed: {cause}"
        )
        self.journal = journal
        self.begin = begin
        self.end = end


class TruncatedFrame(Exception):
    """The read ended (at ``end_offset``) inside a frame."""

    def __init__(self, journal: str, offset: int) -> None:
        super().__init__(f"read of journal={journal} ended inside a frame at offset {offset}")
        self.journal = journal
        self.offset = offset


def _request(journal: str | pb.ReadRequest) -> pb.ReadRequest:
    if isinstance(journal, pb.ReadRequest):
        return journal
    return pb.ReadRequest(journal=journal, block=True)


class ReadUncommittedIter:
    """Envelopes of every message of ``request.journal`` (a name: read from offset 0, blocking).

    `framing` is a `Framing`, or the journal's `pb.JournalSpec` (its ``content-type`` label
    selects the framing), or None to fetch the spec from the broker at the first `next()`.
    `new_message(spec)` returns an empty message to unmarshal each frame into; with a Framing
    given directly, the spec passed is a stub holding the journal name and content type.
    Envelopes carry the request's journal name (with any ``;meta`` suffix).

    `reader` is the RetryReader (exposed for its `offset`, jump and restart counts).
    """

    def __init__(
        self,
        client: JournalClient,
        journal: str | pb.ReadRequest,
        framing: Framing | pb.JournalSpec | None,
        new_message: NewMessageFunc,
        *,
        reader: RetryReader | None = None,
    ) -> None:
        self.client = client
        self.reader = reader if reader is not None else RetryReader(client, _request(journal))
        self.new_message = new_message
        self.journal = self.reader.journal
        self.spec: pb.JournalSpec | None = None
        self.framing: Framing | None = None
        if isinstance(framing, pb.JournalSpec):
            self._init(framing)
        elif framing is not None:
            spec = pb.JournalSpec(name=self.journal.split(";", 1)[0])
            spec.labels.labels.add(name=CONTENT_TYPE_LABEL, value=framing.content_type)
            self.spec, self.framing = spec, framing
        self._decoder: FrameDecoder | None = None
        self._next_offset = -1  # Journal offset of the next byte the decoder expects.
        self._slow_until = -1  # Decode frame by frame until the decoder reaches this offset.
        self._ready: collections.deque[Envelope] = collections.deque()  # Decoded, not taken.
        self.desyncs = 0
        self.jumps = 0

    def _init(self, spec: pb.JournalSpec) -> None:
        self.spec = spec
        self.framing = framing_for_spec(spec)

    async def next(self) -> Envelope:
        """The next envelope. Raises StopAsyncIteration at ``end_offset``, the reader's errors
        (`OffsetNotYetAvailable` for non-blocking reads at the head, ...), `MessageDecodeError`
        and `TruncatedFrame`. Cancellation loses nothing: buffered bytes stay decoded."""
        ready = self._ready
        if ready:
            return ready.popleft()
        batch = await self.next_batch()
        if len(batch) > 1:
            ready.extend(batch)
            return ready.popleft()
        return batch[0]

    async def next_batch(self) -> list[Envelope]:
        """The next envelopes: at least one, and as many as are decoded from what was read
        so far (all complete frames of a read, where the framing decodes them in batches).
        Raises as `next`."""
        ready = self._ready
        if ready:
            out = list(ready)
            ready.clear()
            return out
        if self.framing is None:
            self._init(await get_journal(self.client, self.journal))
        framing = self.framing
        spec = self.spec
        assert framing is not None and spec is not None
        batched = getattr(framing, "unmarshal_buffered", None)
        new_message: Callable[[], Any] | None = None
        while True:
            decoder = self._decoder
            if decoder is not None:
                if batched is not None and decoder.offset >= self._slow_until:
                    if new_message is None:
                        new_message = functools.partial(self.new_message, spec)
                    got = batched(decoder, new_message)
                    if got is not None:
                        begin, ends, msgs = got
                        begins = [begin]
                        begins += ends[:-1]
                        return list(
                            map(
                                Envelope,
                                repeat(self.journal),
                                begins,
                                ends,
                                msgs,
                                repeat(framing.content_type),
                            )
                        )
                    # Frame by frame through what is buffered: it holds something that
                    # doesn't decode in a batch (and is reported precisely this way).
                    self._slow_until = self._next_offset
                ev = decoder.next_event()
                if ev is not None:
                    if isinstance(ev, Frame):
                        msg = self.new_message(spec)
                        try:
                            framing.unmarshal(ev.payload, msg)
                        except Exception as err:
                            raise MessageDecodeError(self.journal, ev.begin, ev.end, err) from err
                        return [Envelope(self.journal, ev.begin, ev.end, msg, framing.content_type)]
                    self._desync(ev)
                    continue

            data = await self.reader.read()
            if not data:
                if decoder is not None and not decoder.at_boundary():
                    raise TruncatedFrame(self.journal, decoder.offset)
                raise StopAsyncIteration
            start = self.reader.offset - len(data)
            if decoder is None:
                decoder = self._decoder = framing.decoder(start)
            elif start != self._next_offset:
                # The reader skipped content (and logged it). A frame begun before the jump
                # can't be completed: say so, as that message is lost to this reader.
                self.jumps += 1
                (log.debug if decoder.at_boundary() else log.warning)(
                    "message reader offset jump journal=%s from=%d to=%d partial_frame_at=%s",
                    self.journal,
                    self._next_offset,
                    start,
                    None if decoder.at_boundary() else decoder.offset,
                )
                decoder.reset(start)
                self._slow_until = -1
            self._next_offset = start + len(data)
            decoder.feed(data)

    def _desync(self, ev: Desync) -> None:
        self.desyncs += 1
        log.warning(
            "message frame desync journal=%s begin=%d end=%d reason=%s",
            self.journal,
            ev.begin,
            ev.end,
            ev.reason,
        )

    def __aiter__(self) -> ReadUncommittedIter:
        return self

    async def __anext__(self) -> Envelope:
        return await self.next()

    def close(self) -> None:
        """Cancel the reader's RPC."""
        self.reader.close()


class ReadCommittedIter:
    """Committed envelopes of a journal: a `ReadUncommittedIter` sequenced by `sequencer`.

    Arguments are those of `ReadUncommittedIter`, plus the `Sequencer` (restored from a
    checkpoint, or new). Replays read the required range with a new RetryReader of the same
    client and request parameters.
    """

    def __init__(
        self,
        client: JournalClient,
        journal: str | pb.ReadRequest,
        framing: Framing | pb.JournalSpec | None,
        new_message: NewMessageFunc,
        sequencer: Sequencer | None = None,
        *,
        reader: RetryReader | None = None,
    ) -> None:
        self.uncommitted = ReadUncommittedIter(client, journal, framing, new_message, reader=reader)
        self.sequencer = sequencer if sequencer is not None else Sequencer()
        self.replays = 0

    async def next(self) -> Envelope:
        """The next committed envelope. Raises as `ReadUncommittedIter.next`, plus the
        Sequencer's errors (`ReplayError`, ...)."""
        seq = self.sequencer
        it = self.uncommitted
        while True:
            try:
                stepped = seq.step()
            except MustStartReplay:
                # A replay did not complete (it failed or was cancelled): run it again rather
                # than wedge the iterator.
                await self._replay()
                continue
            if stepped:
                env = seq.dequeued
                assert env is not None
                return env
            env = await it.next()
            if seq.queue_uncommitted(env) is QueueOutcome.ACK_COMMIT_REPLAY:
                await self._replay()

    async def _replay(self) -> None:
        journal, begin, end = self.sequencer.replay_range()
        self.replays += 1
        self.sequencer.start_replay(await read_range(self.uncommitted, journal, begin, end))

    def __aiter__(self) -> ReadCommittedIter:
        return self

    async def __anext__(self) -> Envelope:
        return await self.next()

    def close(self) -> None:
        """Cancel the reader's RPC."""
        self.uncommitted.close()


async def read_range(
    like: ReadUncommittedIter, journal: str, begin: int, end: int
) -> list[Envelope]:
    """The envelopes of `journal` within [begin, end), read (uncommitted) with a new reader of
    `like`'s client, request parameters, framing and message type: a Sequencer's replay.

    Undecodable frames are skipped (the main read path reported them already). Raises the
    reader's errors; cancellation cancels the read.
    """
    if begin >= end:
        # Nothing to read (e.g. restored mid-dequeue of an ACK at offset 0). Never read: an
        # end_offset of 0 would mean "no end" and block at the write head.
        return []
    req = pb.ReadRequest()
    req.CopyFrom(like.reader.request)
    req.journal, req.offset, req.end_offset, req.block = journal, begin, end, True
    log.info("sequencer replay journal=%s begin=%d end=%d", journal, begin, end)
    replay = ReadUncommittedIter(like.client, req, like.framing, like.new_message)
    replay.spec = like.spec  # The real spec, when it was given or fetched.
    envelopes = []
    try:
        while True:
            try:
                envelopes.append(await replay.next())
            except StopAsyncIteration:
                break
            except MessageDecodeError as err:
                log.warning("skipping undecodable frame in replay journal=%s err=%s", journal, err)
    finally:
        replay.close()
    return envelopes
