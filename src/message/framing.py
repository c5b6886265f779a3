"""Framings: how messages are laid out as bytes in a journal.

A journal declares its framing with the `content-type` label. A `Framing` turns one message
into one complete frame (`marshal`), fills a message from one frame's payload (`unmarshal`),
and makes a `FrameDecoder` which splits a journal's byte stream into frames.

A `FrameDecoder` is sans-I/O, after h11: the caller feeds it whatever bytes it read (any chunk
size, from any source, sync or async) and pulls events until it returns None. Events are
`Frame` (a whole frame and its [begin, end) journal offsets) and `Desync` (a byte range that is
not a frame and was skipped to find the next one). Offsets are exact whatever the chunking, so
a reader can checkpoint `decoder.offset` and later resume there.

Three framings are built in, as in Gazette: `application/x-ndjson` (`framing_json`),
`text/csv` (`framing_csv`) and `application/x-protobuf-fixed` (`framing_fixed`). Others may be
added with `register_framing`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from gazette.broker.protocol import protocol_pb2 as pb

__all__ = [
    "CONTENT_TYPE_LABEL",
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_JSON_LINES",
    "CONTENT_TYPE_PROTO_FIXED",
    "DEFAULT_MAX_FRAME_SIZE",
    "Desync",
    "Frame",
    "FrameDecoder",
    "Framing",
    "FramingError",
    "MarshalError",
    "UnknownFramingError",
    "UnmarshalError",
    "framing_for",
    "framing_for_spec",
    "known_content_types",
    "register_framing",
]

CONTENT_TYPE_LABEL = "content-type"
"""The JournalSpec label naming the framing of the journal's messages."""
CONTENT_TYPE_CSV = "text/csv"
CONTENT_TYPE_JSON_LINES = "application/x-ndjson"
CONTENT_TYPE_PROTO_FIXED = "application/x-protobuf-fixed"

DEFAULT_MAX_FRAME_SIZE = 64 << 20
"""Frames larger than this (a fixed frame's payload, a JSON line, a CSV record) are taken to be
corruption: decoders report them as Desync rather than buffering without bound."""


class FramingError(Exception):
    """Base of the errors of this module."""


class UnknownFramingError(FramingError, LookupError):
    """No framing is registered for a content type, or a journal declares none."""


class MarshalError(FramingError, ValueError):
    """A message can't be framed (it lacks the framing's methods, or its value can't be encoded)."""


class UnmarshalError(FramingError, ValueError):
    """A frame's payload can't be decoded into the given message."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One whole frame: its journal offsets [begin, end), and the payload the framing's
    `unmarshal` takes (the frame without its framing overhead: header, line terminator)."""

    begin: int
    end: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Desync:
    """Bytes [begin, end) of the journal which are not a frame, skipped to find the next frame.

    `reason` says what was wrong, and at which offset.
    """

    begin: int
    end: int
    reason: str


class FrameDecoder(abc.ABC):
    """Splits a byte stream into `Frame` and `Desync` events; never does I/O.

    Contract:
    - `feed(data)` appends the next bytes of the stream; it never raises on bad content.
    - `next_event()` returns the next event, or None when more bytes are needed. Call it until
      it returns None after each `feed`. Events are contiguous and in stream order: each begins
      where the previous one ended, the first at the decoder's initial offset.
    - `offset` is the journal offset at which the next event will begin: where a reader would
      resume. While a Desync is being accumulated it stays at the Desync's beginning.
    - `reset(offset)` discards all buffered state, for when the stream jumps (a seek, or a read
      that resumes at a later offset because content was removed).
    - `at_boundary()` is True when nothing is buffered: the stream read so far is exactly the
      events returned.

    Decoders are not thread-safe; use one per stream.
    """

    __slots__ = ("_buf", "_pos", "_base", "_scan", "_skip_from", "_skip_reason", "max_frame_size")

    def __init__(self, offset: int = 0, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._base = offset  # Journal offset of _buf[0].
        self._pos = 0  # Index in _buf of the next unconsumed byte.
        self._scan = 0  # Index in _buf at which subclasses resume searching (>= _pos).
        self._skip_from: int | None = None  # Offset where the pending Desync begins.
        self._skip_reason = ""

    @property
    def offset(self) -> int:
        if self._skip_from is not None:
            return self._skip_from
        return self._base + self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append `data`, the bytes following those fed before."""
        if not data:
            return
        pos = self._pos
        if pos:
            # Deleting a bytearray's prefix only advances its start, so this doesn't copy.
            del self._buf[:pos]
            self._base += pos
            self._scan -= pos
            self._pos = 0
        self._buf += data

    def reset(self, offset: int) -> None:
        """Forget everything buffered; the next byte fed is at journal `offset`."""
        self._buf = bytearray()
        self._base = offset
        self._pos = self._scan = 0
        self._skip_from = None
        self._skip_reason = ""

    def at_boundary(self) -> bool:
        return self._skip_from is None and self._pos == len(self._buf)

    @abc.abstractmethod
    def next_event(self) -> Frame | Desync | None:
        """The next Frame or Desync, or None if more bytes must be fed first."""

    def events(self) -> list[Frame | Desync]:
        """All events available now (a convenience over repeated `next_event`)."""
        out: list[Frame | Desync] = []
        while (ev := self.next_event()) is not None:
            out.append(ev)
        return out

    # Helpers for subclasses.

    def _consume_to(self, index: int) -> int:
        """Consume through _buf[index]; returns the journal offset of `index`."""
        self._pos = index
        if self._scan < index:
            self._scan = index
        return self._base + index

    def _start_skip(self, reason: str) -> None:
        if self._skip_from is None:
            self._skip_from = self._base + self._pos
            self._skip_reason = reason

    def _discard_all_but(self, keep: int) -> None:
        """While skipping: drop buffered bytes except the last `keep`, bounding memory."""
        cut = max(self._pos, len(self._buf) - keep)
        self._pos = cut
        if self._scan < cut:
            self._scan = cut

    def _end_skip(self, index: int) -> Desync:
        """Finish the pending Desync at _buf[index], which becomes the next unconsumed byte."""
        begin = self._skip_from
        assert begin is not None
        ev = Desync(begin, self._consume_to(index), self._skip_reason)
        self._skip_from = None
        self._skip_reason = ""
        return ev


@runtime_checkable
class Framing(Protocol):
    """The layout of messages within journals of one content type.

    - `content_type` is the value of the journal's `content-type` label.
    - `marshal(msg)` returns one complete frame of `msg` (header or terminator included),
      ready to append. It raises MarshalError if `msg` lacks what the framing needs. It may
      assume the message passed validation and carries its UUID already.
    - `unmarshal(payload, msg)` fills `msg` from the payload of one `Frame` produced by this
      framing's decoder; it raises UnmarshalError if the payload doesn't decode into `msg`.
    - `decoder(offset)` returns a new `FrameDecoder` for a stream beginning at journal `offset`.

    Framings are stateless as far as callers can tell, and safe to share between threads.
    """

    content_type: str

    def marshal(self, msg: object) -> bytes: ...

    def unmarshal(self, payload: bytes, msg: object) -> None: ...

    def decoder(self, offset: int = 0) -> FrameDecoder: ...


_registry: dict[str, Framing] = {}
_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    # Each module registers its framing on import, via _register_builtin.
    from gazette.message import framing_csv, framing_fixed, framing_json  # noqa: F401


def _register_builtin(f: Framing) -> None:
    _registry.setdefault(f.content_type, f)


def register_framing(f: Framing) -> None:
    """Register `f` for its content type, replacing any framing registered before (including
    a built-in one). Typically called once at import time, before framings are looked up."""
    _load_builtins()
    _registry[f.content_type] = f


def known_content_types() -> list[str]:
    """The content types having a registered framing, sorted."""
    _load_builtins()
    return sorted(_registry)


def framing_for(content_type: str) -> Framing:
    """The framing registered for `content_type`; UnknownFramingError if there is none."""
    _load_builtins()
    try:
        return _registry[content_type]
    except KeyError:
        raise UnknownFramingError(
            f"no framing for content type {content_type!r} (known: {', '.join(sorted(_registry))})"
        ) from None


def framing_for_spec(spec: pb.JournalSpec) -> Framing:
    """The framing of a journal, by its `content-type` label."""
    from gazette.broker.protocol.labels import value_of

    content_type = value_of(spec.labels, CONTENT_TYPE_LABEL)
    if not content_type:
        raise UnknownFramingError(
            f"journal {spec.name!r} has no {CONTENT_TYPE_LABEL!r} label naming its framing"
        )
    try:
        return framing_for(content_type)
    except UnknownFramingError as exc:
        raise UnknownFramingError(f"journal {spec.name!r}: {exc}") from None
