"""The `application/x-ndjson` framing: one compact JSON object per line.

A frame is a JSON object serialized as UTF-8 without insignificant whitespace, followed by
"\\n" (JSON escapes any newline within strings, so a frame is exactly one line). Gazette's Go
encoder writes the same, apart from escaping "<", ">" and "&" as \\u003c etc., which decodes
to the same value.

Messages are objects with two methods (see `JSONFrameable`):

- `to_json() -> dict`: the message as a JSON object, UUID included (as its canonical string,
  e.g. under the key "uuid"). Values must be what `json` can encode.
- `load_json(doc: dict) -> None`: fill the message from a decoded object.

and optionally, for speed:

- `to_json_line() -> bytes | None`: the complete frame, exactly what encoding `to_json()`
  would produce, or None to have the framing encode `to_json()` after all; or
  `json_line_encoder()`, returning that function for the message's whole class (taking the
  message), which the framing then calls directly.
- `json_fast_loader() -> FastLoader | None`: a typed decoder of a whole line and the load of
  its result into a message, which together do what parsing the line and `load_json` do,
  except that the decoder may refuse lines that `load_json` would accept.

`message.json_message.JSONMessage` implements them all for dataclasses.

Readers decode in batches with `JSONFraming.unmarshal_buffered` when messages have a fast
loader: every complete line buffered is decoded at once, and only if each one decodes, is no
longer than `max_frame_size` and fits the message's type; otherwise those lines go through the
frame-by-frame path, which reports exactly which line is a Desync or fails to unmarshal.

The decoder reports a line that is not a JSON object (invalid JSON, invalid UTF-8, a blank
line, or a line longer than `max_frame_size`) as a Desync of the whole line, newline included,
and continues with the next line.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from itertools import accumulate
from operator import add
from typing import Any, NamedTuple, Protocol, runtime_checkable

from gazette.message.framing import (
    CONTENT_TYPE_JSON_LINES,
    DEFAULT_MAX_FRAME_SIZE,
    Desync,
    Frame,
    FrameDecoder,
    MarshalError,
    UnmarshalError,
    _register_builtin,
)

__all__ = [
    "FastLoader",
    "JSONFraming",
    "JSONFrameable",
    "JSON_FRAMING",
    "encode_json",
    "parse_json_object",
]


def _no_default(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _make_encoder() -> Callable[[object], str]:
    # JSONEncoder.encode builds a new C encoder on every call, which costs more than encoding
    # a small message; so build one once and call it directly. markers=None skips the check
    # for circular references (those end in RecursionError instead).
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
    c_encoder = make(
        None, _no_default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    join = "".join

    def encode(value: object) -> str:
        return join(c_encoder(value, 0))

    return encode


_encode = _make_encoder()
encode_json: Callable[[object], str] = _encode
"""Compact JSON text of a value, as the framing writes it (non-ASCII characters unescaped,
NaN and infinities rejected with ValueError)."""
_decoder = json.JSONDecoder()
_decode = _decoder.decode
_scan_once: Callable[[str, int], tuple[Any, int]] = _decoder.scan_once  # type: ignore[attr-defined]
_JSON_SPACE = " \t\n\r"
_fast_loaders: dict[type, FastLoader | None] = {}  # Per message class; None: it has none.
_line_encoders: dict[type, Callable[[Any], bytes | None] | None] = {}  # Likewise.
_UNKNOWN: Any = object()


class FastLoader(NamedTuple):
    """A message class's batch decoding (see the module doc)."""

    decode: Callable[[bytes | bytearray], Any]
    """One line, without its newline, to an intermediate value; raises on anything it does
    not decode exactly as the frame-by-frame path would."""
    load: Callable[[Any, Any], None]
    """Fill a message (first argument) from an intermediate value."""


@runtime_checkable
class JSONFrameable(Protocol):
    """What the JSON framing requires of a message (`to_json_line` is optional)."""

    def to_json(self) -> dict[str, Any]: ...

    def load_json(self, doc: dict[str, Any]) -> None: ...


class JSONFraming:
    """Frames messages as JSON lines. Use the registered instance, `JSON_FRAMING`."""

    content_type = CONTENT_TYPE_JSON_LINES

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        # The decoder already parsed each line it returned, to tell frames from garbage; it
        # leaves (payload, document) here so that unmarshal of that very payload object, which
        # usually comes next, needn't parse it again. Identity (not equality) makes it exact,
        # and a single tuple assignment keeps it consistent across threads. Consumed once, so
        # that two messages never share the document's nested containers.
        self._last: tuple[bytes, dict[str, Any]] | None = None

    def marshal(self, msg: object) -> bytes:
        encode = _line_encoders.get(msg.__class__, _UNKNOWN)
        if encode is _UNKNOWN:
            get = getattr(msg, "json_line_encoder", None)
            encode = _line_encoders[msg.__class__] = get() if get is not None else None
        if encode is not None:
            line: bytes | None = encode(msg)
            if line is not None:
                return line
        else:
            to_line = getattr(msg, "to_json_line", None)
            if to_line is not None:
                line = to_line()
                if line is not None:
                    return line
        try:
            to_json = msg.to_json  # type: ignore[attr-defined]
        except AttributeError:
            raise MarshalError(
                f"{type(msg).__name__} has no to_json method, as {self.content_type} requires"
            ) from None
        try:
            return (_encode(to_json()) + "\n").encode()
        except (TypeError, ValueError, RecursionError) as exc:
            raise MarshalError(f"{type(msg).__name__} is not JSON-encodable: {exc}") from exc

    def unmarshal(self, payload: bytes, msg: object) -> None:
        last = self._last
        if last is not None and last[0] is payload:
            self._last = None
            doc = last[1]
        else:
            doc = parse_json_object(payload)
        try:
            load_json = msg.load_json  # type: ignore[attr-defined]
        except AttributeError:
            raise UnmarshalError(
                f"{type(msg).__name__} has no load_json method, as {self.content_type} requires"
            ) from None
        load_json(doc)

    def decoder(self, offset: int = 0) -> FrameDecoder:
        return _LineDecoder(self, offset, self.max_frame_size)

    def unmarshal_buffered(
        self, decoder: FrameDecoder, new_message: Callable[[], Any]
    ) -> tuple[int, list[int], list[Any]] | None:
        """Decode every complete line buffered in `decoder` (one this framing made) into a
        message from `new_message()`, consuming them: (begin offset of the first, each
        one's end offset, the messages). None, consuming nothing, if that takes the
        frame-by-frame path (`next_event` and `unmarshal`): nothing complete is buffered, a
        skip is pending, the messages have no fast loader, or some line does not decode."""
        if decoder.__class__ is not _LineDecoder or decoder._skip_from is not None:
            return None
        buf, pos = decoder._buf, decoder._pos
        last = buf.rfind(b"\n", pos)
        if last < 0:
            return None
        probe = new_message()
        cls = probe.__class__
        fast = _fast_loaders.get(cls, _UNKNOWN)
        if fast is _UNKNOWN:
            get = getattr(probe, "json_fast_loader", None)
            fast = _fast_loaders[cls] = get() if get is not None else None
        if fast is None:
            return None
        assert isinstance(fast, FastLoader)
        lines = buf[pos:last].split(b"\n")
        if max(map(len, lines)) > self.max_frame_size:
            return None
        try:
            decoded = list(map(fast.decode, lines))
            msgs = [probe]
            msgs += [new_message() for _ in range(len(lines) - 1)]
            if len(set(map(type, msgs))) != 1:
                return None
            deque(map(fast.load, msgs, decoded), maxlen=0)
        except Exception:  # noqa: BLE001 - the frame-by-frame path reports it
            return None
        begin = decoder._base + pos
        # Each line's end: the lengths so far, plus a newline each.
        ends = list(map(add, accumulate(map(len, lines)), range(begin + 1, begin + 1 + len(lines))))
        decoder._pos = decoder._scan = last + 1
        return begin, ends, msgs


def parse_json_object(payload: bytes) -> dict[str, Any]:
    """Decode one line's payload, which must be a JSON object; UnmarshalError if it isn't."""
    try:
        text = payload.decode()
    except ValueError as exc:
        raise UnmarshalError(f"invalid UTF-8: {exc}") from None
    try:
        # JSONDecoder.decode costs two regular-expression matches more than this fast path.
        doc, end = _scan_once(text, 0)
        if end != len(text) and text[end:].strip(_JSON_SPACE):
            raise ValueError
    except (ValueError, StopIteration):
        try:  # Either not JSON, or JSON with leading space: decode properly, for the error.
            doc = _decode(text)
        except ValueError as exc:
            raise UnmarshalError(f"invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise UnmarshalError(f"JSON value is a {type(doc).__name__}, not an object")
    return doc


class _LineDecoder(FrameDecoder):
    __slots__ = ("_framing",)

    def __init__(self, framing: JSONFraming, offset: int, max_frame_size: int) -> None:
        super().__init__(offset, max_frame_size)
        self._framing = framing

    def next_event(self) -> Frame | Desync | None:
        buf = self._buf
        nl = buf.find(b"\n", self._scan)
        if nl < 0:
            self._scan = len(buf)
            if self._skip_from is None and len(buf) - self._pos > self.max_frame_size:
                self._start_skip(
                    f"line at offset {self.offset} is longer than {self.max_frame_size} bytes"
                )
            if self._skip_from is not None:
                self._discard_all_but(0)
            return None
        if self._skip_from is not None:
            return self._end_skip(nl + 1)

        pos = self._pos
        base = self._base
        self._pos = self._scan = nl + 1
        if nl - pos > self.max_frame_size:
            return Desync(
                base + pos,
                base + nl + 1,
                f"line at offset {base + pos} is longer than {self.max_frame_size} bytes",
            )
        line = bytes(buf[pos:nl])
        try:
            doc = parse_json_object(line)
        except UnmarshalError as exc:
            return Desync(base + pos, base + nl + 1, f"at offset {base + pos}: {exc}")
        self._framing._last = (line, doc)
        return Frame(base + pos, base + nl + 1, line)


JSON_FRAMING = JSONFraming()
_register_builtin(JSON_FRAMING)
