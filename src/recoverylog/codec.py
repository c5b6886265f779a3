"""The framing of RecordedOps in a recovery log, and a sans-I/O decoder of it.

Each op is a fixed protobuf frame: the magic word ``66 33 93 36``, the uint32
little-endian length of the marshaled op, then the marshaled `RecordedOp`. The
frame of a Write op is followed by exactly `write.length` raw bytes of content.
The op's meta-fields (`first_offset`, `last_offset`, `log`) are never written;
a reader sets them from where it read the op.

`OpDecoder` consumes log bytes in pieces of any size and produces events:

- `DecodedOp`: an op and its marshaled bytes (the input of the FSM checksum).
  For a Write op, the payload follows as zero or more `PayloadChunk` events and
  then exactly one `PayloadEnd`, so that a reader applies writes to a file with
  memory bounded by what it feeds, and may `discard_payload()` of ops it does
  not apply.
- `Desync`: a range of bytes which are not a frame (corruption, or reading
  from an offset which is not a frame boundary), skipped up to the next magic
  word.

The decoder never performs I/O: callers feed it bytes from a journal reader,
whether synchronous, asyncio or trio.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from gazette.recoverylog import recoverylog_pb2 as rpb

__all__ = [
    "DEFAULT_MAX_FRAME_LENGTH",
    "HEADER_LENGTH",
    "MAGIC",
    "DecodedOp",
    "Desync",
    "OpDecodeError",
    "OpDecoder",
    "OpEvent",
    "PayloadChunk",
    "PayloadEnd",
    "encode_op",
    "encode_write",
]

MAGIC = b"\x66\x33\x93\x36"
HEADER_LENGTH = 8
# Ops are tens of bytes (paths and property contents being their largest part);
# a header claiming more is taken for corruption rather than buffered.
DEFAULT_MAX_FRAME_LENGTH = 1 << 26

_LENGTH = struct.Struct("<I")


def _frame(body: bytes) -> bytes:
    return MAGIC + _LENGTH.pack(len(body)) + body


def encode_op(op: rpb.RecordedOp) -> bytes:
    """The frame of `op`: header and marshaled op (a Write's payload not included).

    Meta-fields are not encoded. ``frame[HEADER_LENGTH:]`` is what the FSM
    checksums.
    """
    if op.first_offset or op.last_offset or op.log:
        stripped = rpb.RecordedOp()
        stripped.CopyFrom(op)
        stripped.ClearField("first_offset")
        stripped.ClearField("last_offset")
        stripped.ClearField("log")
        op = stripped
    return _frame(op.SerializeToString())


def encode_write(op: rpb.RecordedOp, payload: bytes | bytearray | memoryview) -> bytes:
    """The frame of Write `op` followed by its `payload`.

    `op.write.length` must equal ``len(payload)`` (`ValueError` otherwise). To
    avoid copying a large payload, append ``encode_op(op)`` and the payload
    separately instead.
    """
    if not op.HasField("write"):
        raise ValueError("not a Write op")
    if op.write.length != len(payload):
        raise ValueError(f"write.length {op.write.length} != payload length {len(payload)}")
    return encode_op(op) + bytes(payload)


@dataclass(frozen=True, slots=True)
class DecodedOp:
    """An op read from the log.

    `op.first_offset` is the journal offset of its frame and `op.last_offset`
    the offset just past it (and past a Write's payload); `op.log` is the
    decoder's log. `frame` is the marshaled op, without header or payload.
    """

    op: rpb.RecordedOp
    frame: bytes


@dataclass(frozen=True, slots=True)
class PayloadChunk:
    """Content of the current Write op: `data` is at `offset` of file `fnode`."""

    fnode: int
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class PayloadEnd:
    """The current Write op's payload is complete (emitted even if discarded)."""

    op: rpb.RecordedOp


@dataclass(frozen=True, slots=True)
class Desync:
    """Journal bytes [begin, end) are not a frame, and were skipped.

    Adjacent Desync events may describe one corrupted region.
    """

    begin: int
    end: int


OpEvent = DecodedOp | PayloadChunk | PayloadEnd | Desync


class OpDecodeError(ValueError):
    """A frame at [begin, end) holds bytes which do not unmarshal as a RecordedOp.

    The decoder has consumed the frame; if it was a Write, its payload was not
    recognized and will likely be reported as a `Desync` next.
    """

    def __init__(self, begin: int, end: int, reason: str) -> None:
        super().__init__(f"invalid RecordedOp frame at [{begin}, {end}): {reason}")
        self.begin = begin
        self.end = end


class OpDecoder:
    """Decodes a stream of recovery-log bytes into `OpEvent`s (see the module docs).

    `feed` bytes read from journal `log` from `offset` onwards, then call
    `next_event` until it returns None (meaning: feed more). After a seek, or a
    jump of the journal reader, `reset` to the new offset. The decoder holds at
    most the bytes fed and not yet consumed; payload bytes are handed out as
    soon as they are fed.
    """

    __slots__ = (
        "log",
        "max_frame_length",
        "_buf",
        "_pos",
        "_offset",
        "_write",
        "_remaining",
        "_file_offset",
        "_discard",
    )

    def __init__(
        self, offset: int = 0, log: str = "", max_frame_length: int = DEFAULT_MAX_FRAME_LENGTH
    ) -> None:
        self.log = log
        self.max_frame_length = max_frame_length
        self._buf = bytearray()
        self._pos = 0
        self._offset = offset  # Journal offset of _buf[_pos].
        self._write: rpb.RecordedOp | None = None  # Write op whose payload is being read.
        self._remaining = 0
        self._file_offset = 0
        self._discard = False

    @property
    def offset(self) -> int:
        """Journal offset of the next byte not yet consumed by an event."""
        return self._offset

    @property
    def buffered(self) -> int:
        """Bytes fed and not yet consumed."""
        return len(self._buf) - self._pos

    @property
    def in_frame(self) -> bool:
        """Whether bytes fed and not yet consumed begin a frame that is not complete yet."""
        buf, pos = self._buf, self._pos
        n = min(len(buf) - pos, len(MAGIC))
        return n > 0 and buf[pos : pos + n] == MAGIC[:n]

    @property
    def in_payload(self) -> bool:
        """Whether a Write's payload is being read (its `PayloadEnd` is still to come)."""
        return self._write is not None

    @property
    def payload_op(self) -> rpb.RecordedOp | None:
        """The Write op whose payload is being read (with its meta-fields), or None."""
        return self._write

    @property
    def payload_remaining(self) -> int:
        """Payload bytes of the current Write not yet consumed."""
        return self._remaining

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes which follow those already fed."""
        buf = self._buf
        pos = self._pos
        if pos == len(buf):
            buf.clear()
            self._pos = 0
        elif pos >= 1 << 16:
            del buf[:pos]
            self._pos = 0
        buf += data

    def reset(self, offset: int, log: str | None = None) -> None:
        """Drop buffered bytes and any partial op, and continue at `offset` (of `log`)."""
        self._buf = bytearray()
        self._pos = 0
        self._offset = offset
        self._write = None
        self._remaining = 0
        self._discard = False
        if log is not None:
            self.log = log

    def discard_payload(self) -> None:
        """Skip the rest of the current Write's payload without `PayloadChunk` events.

        `PayloadEnd` is still emitted once it's all consumed. Raises
        `RuntimeError` if no payload is being read.
        """
        if self._write is None:
            raise RuntimeError("no Write payload is being read")
        self._discard = True

    def next_event(self) -> OpEvent | None:
        """The next event, or None if more bytes must be fed first.

        Raises `OpDecodeError` for a frame which does not unmarshal (after
        consuming it).
        """
        if self._write is not None:
            return self._payload_event()

        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < 4:
            if avail == 0 or buf[pos:] == MAGIC[:avail]:
                return None
            return self._desync()
        if not buf.startswith(MAGIC, pos):
            return self._desync()
        if avail < HEADER_LENGTH:
            return None
        (length,) = _LENGTH.unpack_from(buf, pos + 4)
        if length > self.max_frame_length:
            return self._desync()
        end = pos + HEADER_LENGTH + length
        if len(buf) < end:
            return None

        first = self._offset
        last = first + HEADER_LENGTH + length
        frame = bytes(buf[pos + HEADER_LENGTH : end])  # Small: two copies beat a memoryview.
        self._pos = end
        self._offset = last
        try:
            op = rpb.RecordedOp.FromString(frame)
        except DecodeError as exc:
            raise OpDecodeError(first, last, str(exc)) from None

        if op.HasField("write"):
            write = op.write
            if write.length < 0:
                raise OpDecodeError(first, last, f"negative write length {write.length}")
            last += write.length
            self._write = op
            self._remaining = write.length
            self._file_offset = write.offset
            self._discard = False
        op.first_offset = first
        op.last_offset = last
        op.log = self.log
        return DecodedOp(op, frame)

    def _payload_event(self) -> PayloadChunk | PayloadEnd | None:
        op = self._write
        assert op is not None
        remaining = self._remaining
        if remaining:
            pos = self._pos
            n = min(len(self._buf) - pos, remaining)
            if n == 0:
                return None
            self._pos = pos + n
            self._offset += n
            self._remaining = remaining = remaining - n
            if not self._discard:
                with memoryview(self._buf) as view:
                    data = bytes(view[pos : pos + n])
                offset = self._file_offset
                self._file_offset = offset + n
                return PayloadChunk(op.write.fnode, offset, data)
            if remaining:
                return None
        self._write = None
        self._discard = False
        return PayloadEnd(op)

    def _desync(self) -> Desync:
        # Skip to the next magic word; without one, keep only a tail which may
        # be the start of one. Always skip at least one byte.
        buf = self._buf
        pos = self._pos
        nxt = buf.find(MAGIC, pos + 1)
        if nxt == -1:
            nxt = len(buf)
            for keep in (3, 2, 1):
                if nxt - keep > pos and buf.endswith(MAGIC[:keep]):
                    nxt -= keep
                    break
        begin = self._offset
        self._offset = begin + (nxt - pos)
        self._pos = nxt
        return Desync(begin, self._offset)
