"""The `application/x-protobuf-fixed` framing: length-prefixed protobuf messages.

A frame is an 8-byte header, the magic word 66 33 93 36 then the payload length as a
little-endian uint32, followed by the payload: one serialized protobuf message.

Messages are objects with protobuf's `SerializeToString()` and `ParseFromString(bytes)` (see
`ProtoFrameable`): generated messages wrapped by `message.proto_message.ProtoMessage`, which
adds the Message methods, or any object of your own having all five methods.

Resynchronization. Where a frame should begin but the magic word isn't there, the decoder
scans to the next magic word and reports the bytes before it as a Desync. A length above
`max_frame_size` (64 MiB by default) is corruption too, and handled alike.

A frame cut short (its writer failed mid-frame, and whole frames follow) is harder: its header
declares more bytes than were written, so it swallows the start of the next frame. It can only
be told by content, and the decoder judges conservatively, never splitting a frame whose
payload is well-formed and consistent:

- Only a payload holding a magic word (or ending with the first bytes of one) is examined;
  real payloads rarely do, so the common path costs one `find`.
- If the payload is not well-formed protobuf wire format, the frame was cut short: the bytes
  up to the magic word are a Desync, and decoding resumes there. This is decided as soon as the
  bytes before the magic word prove it, without waiting for the whole declared length.
- If it is well-formed (the cut fell within its last length-delimited field, which then ran to
  the declared end), it was cut short only if the frames chained from the magic word run past
  the declared end and the bytes after it are not a frame. Those bytes are judged as far as
  they are at hand: a well-formed frame is never held back waiting for them, so that a whole
  frame at the end of a journal is read at once. (So here, and only here, the outcome can
  depend on where the stream was split into feeds.) A malformed payload is held back until
  the bytes before its magic word prove it malformed, or its declared length is read.

A frame cut short in a way that leaves a well-formed payload whose embedded frames end exactly
at the declared end can't be told from a message embedding frames, and is returned as a frame
(whose unmarshal will likely fail).
"""

from __future__ import annotations

import struct
from enum import Enum
from typing import Protocol, runtime_checkable

from gazette.message.framing import (
    CONTENT_TYPE_PROTO_FIXED,
    DEFAULT_MAX_FRAME_SIZE,
    Desync,
    Frame,
    FrameDecoder,
    MarshalError,
    UnmarshalError,
    _register_builtin,
)

__all__ = [
    "FIXED_FRAME_HEADER_LENGTH",
    "FIXED_FRAME_WORD",
    "FixedFraming",
    "PROTO_FIXED_FRAMING",
    "ProtoFrameable",
    "encode_fixed_frame",
]

FIXED_FRAME_WORD = b"\x66\x33\x93\x36"
FIXED_FRAME_HEADER_LENGTH = 8

_HEADER = struct.Struct("<4sI")
_WORD_PREFIX_ENDS = frozenset(FIXED_FRAME_WORD[:3])  # Last bytes of the word's 1-3 byte prefixes.
_MAX_UINT32 = 0xFFFFFFFF


@runtime_checkable
class ProtoFrameable(Protocol):
    """What the fixed protobuf framing requires of a message (generated messages qualify)."""

    def SerializeToString(self) -> bytes: ...  # noqa: N802 -- protobuf's name

    def ParseFromString(self, data: bytes) -> object: ...  # noqa: N802 -- protobuf's name


def encode_fixed_frame(payload: bytes) -> bytes:
    """The fixed frame of an already-serialized payload."""
    if len(payload) > _MAX_UINT32:
        raise MarshalError(f"payload of {len(payload)} bytes doesn't fit a fixed frame")
    return _HEADER.pack(FIXED_FRAME_WORD, len(payload)) + payload


class FixedFraming:
    """Frames protobuf messages with a fixed header. Use the registered `PROTO_FIXED_FRAMING`."""

    content_type = CONTENT_TYPE_PROTO_FIXED

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if not 0 < max_frame_size <= _MAX_UINT32:
            raise ValueError(f"max_frame_size {max_frame_size} out of range")
        self.max_frame_size = max_frame_size

    def marshal(self, msg: object) -> bytes:
        try:
            serialize = msg.SerializeToString  # type: ignore[attr-defined]
        except AttributeError:
            raise MarshalError(
                f"{type(msg).__name__} has no SerializeToString method, "
                f"as {self.content_type} requires"
            ) from None
        payload: bytes = serialize()
        if len(payload) > self.max_frame_size:
            # Readers would take it for corruption.
            raise MarshalError(
                f"{type(msg).__name__} serializes to {len(payload)} bytes, "
                f"over the limit of {self.max_frame_size}"
            )
        return _HEADER.pack(FIXED_FRAME_WORD, len(payload)) + payload

    def unmarshal(self, payload: bytes, msg: object) -> None:
        try:
            parse = msg.ParseFromString  # type: ignore[attr-defined]
        except AttributeError:
            raise UnmarshalError(
                f"{type(msg).__name__} has no ParseFromString method, "
                f"as {self.content_type} requires"
            ) from None
        try:
            parse(payload)
        except UnmarshalError:
            raise
        except Exception as exc:  # protobuf's DecodeError, or a wrapper's own error.
            raise UnmarshalError(f"{type(msg).__name__}: {exc}") from exc

    def decoder(self, offset: int = 0) -> FrameDecoder:
        return _FixedDecoder(offset, self.max_frame_size)


class _Wire(Enum):
    VALID = 1
    INVALID = 2
    INCOMPLETE = 3


def _read_varint(b: bytes, i: int, end: int) -> tuple[int, int]:
    """(value, next index); index -1 if the varint runs past `end`, -2 if it's too long."""
    value = 0
    shift = 0
    while i < end:
        byte = b[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
        if shift >= 70:
            return 0, -2
    return 0, -1


def check_wire_format(b: bytes, complete: bool) -> _Wire:
    """Whether `b` is well-formed protobuf wire format (tags, varints and lengths agree).

    If not `complete`, `b` is a prefix of the payload: the verdict is INVALID if the prefix
    proves it, else INCOMPLETE. Groups (wire types 3 and 4) are accepted without checking
    that they nest.
    """
    i, end = 0, len(b)
    short = _Wire.INCOMPLETE if not complete else _Wire.INVALID
    while i < end:
        tag, i = _read_varint(b, i, end)
        if i == -1:
            return short
        wire_type = tag & 7
        if i == -2 or tag >> 3 == 0 or wire_type > 5:
            return _Wire.INVALID
        if wire_type == 0:
            _, i = _read_varint(b, i, end)
            if i == -1:
                return short
            if i == -2:
                return _Wire.INVALID
        elif wire_type == 1:
            i += 8
        elif wire_type == 5:
            i += 4
        elif wire_type == 2:
            n, i = _read_varint(b, i, end)
            if i == -1:
                return short
            if i == -2:
                return _Wire.INVALID
            i += n
        if i > end:
            return short
    return _Wire.VALID if complete else _Wire.INCOMPLETE


def _chain_crosses(buf: bytearray, at: int, end: int, max_size: int) -> bool:
    """Whether the frame headers chained from `at` (each frame followed by the next) lead to a
    frame that runs past `end`, rather than ending at `end` or reaching bytes not a header."""
    word = len(FIXED_FRAME_WORD)
    while at < end:
        if buf[at : min(at + word, end)] != FIXED_FRAME_WORD[: end - at]:
            return False
        if at + FIXED_FRAME_HEADER_LENGTH > end:
            return True
        size = int.from_bytes(buf[at + 4 : at + 8], "little")
        if size > max_size:
            return False
        at += FIXED_FRAME_HEADER_LENGTH + size
    return at > end


class _FixedDecoder(FrameDecoder):
    __slots__ = ()

    def next_event(self) -> Frame | Desync | None:
        buf = self._buf
        # Fast path: a whole, ordinary frame is buffered.
        pos = self._pos
        n = len(buf)
        if n - pos >= FIXED_FRAME_HEADER_LENGTH and self._skip_from is None:
            word, size = _HEADER.unpack_from(buf, pos)
            end = pos + FIXED_FRAME_HEADER_LENGTH + size
            if word == FIXED_FRAME_WORD and end <= n and size <= self.max_frame_size:
                begin = pos + FIXED_FRAME_HEADER_LENGTH
                scan = self._scan
                if buf.find(FIXED_FRAME_WORD, scan if scan > begin else begin, end) < 0 and (
                    not size or buf[end - 1] not in _WORD_PREFIX_ENDS
                ):
                    payload = bytes(buf[begin:end])
                    self._pos = self._scan = end
                    base = self._base
                    return Frame(base + pos, base + end, payload)
        return self._next_event()

    def _next_event(self) -> Frame | Desync | None:
        buf = self._buf
        while True:
            if self._skip_from is not None:
                found = buf.find(FIXED_FRAME_WORD, self._scan)
                if found < 0:
                    # Keep what may be the start of a magic word split across feeds.
                    self._discard_all_but(len(FIXED_FRAME_WORD) - 1)
                    self._scan = self._pos
                    return None
                return self._end_skip(found)

            pos = self._pos
            avail = len(buf) - pos
            if avail < FIXED_FRAME_HEADER_LENGTH:
                if buf[pos : pos + 4] == FIXED_FRAME_WORD[: min(avail, 4)]:
                    return None  # A header's beginning, so far.
                self._bad_frame(f"no magic word at offset {self._base + pos}")
                continue
            if buf[pos : pos + 4] != FIXED_FRAME_WORD:
                self._bad_frame(f"no magic word at offset {self._base + pos}")
                continue

            size = int.from_bytes(buf[pos + 4 : pos + 8], "little")
            if size > self.max_frame_size:
                self._bad_frame(
                    f"frame at offset {self._base + pos} declares {size} bytes, "
                    f"over the limit of {self.max_frame_size}"
                )
                continue
            begin = pos + FIXED_FRAME_HEADER_LENGTH
            end = begin + size
            stop = min(end, len(buf))
            # Search the payload for a magic word, resuming where an earlier call stopped.
            embedded = buf.find(FIXED_FRAME_WORD, max(self._scan, begin), stop)
            if embedded < 0:
                if stop < end:
                    self._scan = max(begin, stop - (len(FIXED_FRAME_WORD) - 1))
                    return None
                if size and buf[end - 1] in _WORD_PREFIX_ENDS:
                    return self._check_tail(pos, begin, end)
                return self._frame(pos, begin, end)
            self._scan = embedded
            return self._check_embedded(pos, begin, end)

    def _frame(self, pos: int, begin: int, end: int) -> Frame:
        payload = bytes(self._buf[begin:end])
        base = self._base
        self._pos = self._scan = end
        return Frame(base + pos, base + end, payload)

    def _cut_short(self, pos: int) -> Desync:
        first = self._buf.find(FIXED_FRAME_WORD, pos + 1)
        base = self._base
        return self._desync_to(
            first, f"frame at offset {base + pos} is cut short by a frame at {base + first}"
        )

    def _check_tail(self, pos: int, begin: int, end: int) -> Frame | Desync | None:
        """The payload ends as a magic word begins: it may be a frame cut short by a frame
        whose header starts within its last three bytes. Rare enough to check closely."""
        buf = self._buf
        word = len(FIXED_FRAME_WORD)
        for n in (3, 2, 1):
            if end - n >= begin and buf[end - n : end] == FIXED_FRAME_WORD[:n]:
                break
        else:
            return self._frame(pos, begin, end)
        at = end - n
        if check_wire_format(bytes(buf[begin:end]), True) is _Wire.VALID:
            # Most likely a whole frame that happens to end so. Use the next bytes if they're
            # here, but don't hold back a well-formed frame waiting for them.
            if len(buf) >= at + word and buf[at : at + word] == FIXED_FRAME_WORD:
                return self._cut_short(pos)
            return self._frame(pos, begin, end)
        if len(buf) < at + word:
            return None  # Malformed: wait to see whether a magic word begins there.
        if buf[at : at + word] != FIXED_FRAME_WORD:
            return self._frame(pos, begin, end)
        return self._cut_short(pos)

    def _check_embedded(self, pos: int, begin: int, end: int) -> Frame | Desync | None:
        """The payload holds a magic word: decide whether the frame is whole, or cut short by
        the frame beginning there."""
        buf = self._buf
        complete = len(buf) >= end
        verdict = check_wire_format(bytes(buf[begin : min(end, len(buf))]), complete)
        if verdict is _Wire.INCOMPLETE:
            return None
        if verdict is _Wire.VALID:
            first = buf.find(FIXED_FRAME_WORD, pos + 1)
            if not _chain_crosses(buf, first, end, self.max_frame_size):
                return self._frame(pos, begin, end)
            # Well-formed, yet frames within it run past its end: a frame cut short in its
            # last field (which then swallowed the rest), unless a frame follows it. Judge by
            # the bytes at hand: a well-formed frame is never held back.
            after = buf[end : end + len(FIXED_FRAME_WORD)]
            if not after or FIXED_FRAME_WORD.startswith(after):
                return self._frame(pos, begin, end)
        return self._cut_short(pos)

    def _bad_frame(self, reason: str) -> None:
        """Begin skipping at the current position, searching from the byte after it."""
        self._start_skip(reason)
        self._scan = self._pos + 1

    def _desync_to(self, index: int, reason: str) -> Desync:
        self._start_skip(reason)
        return self._end_skip(index)


PROTO_FIXED_FRAMING = FixedFraming()
_register_builtin(PROTO_FIXED_FRAMING)
