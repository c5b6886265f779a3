"""FSMHints as stored in etcd: Gazette's JSON encoding, or binary protobuf.

Gazette marshals hints with Go's encoding/json over its generated structs, so
the JSON is compact, has snake_case keys in field order, omits zero scalars
(tags ``omitempty``) but always writes the repeated fields `live_nodes`,
`properties` and `segments` (``null`` when empty), and escapes ``<``, ``>``,
``&``, U+2028 and U+2029 as Go does. `hints_to_json` reproduces those bytes.
Readers tell the encodings apart by a leading ``{``.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.message import DecodeError

from gazette.broker.protocol.errors import ValidationError, context
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.segments import InvalidHints, copy_segment, validate_segment

__all__ = [
    "InvalidHints",
    "hints_from_bytes",
    "hints_from_json",
    "hints_to_json",
    "validate_hints",
]

_SEGMENT_INTS = (
    "author",
    "first_seq_no",
    "first_offset",
    "first_checksum",
    "last_seq_no",
    "last_offset",
)
_UINT32 = frozenset(("author", "first_checksum"))

_GO_ESCAPES = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def _str(value: str) -> str:
    # json.dumps already escapes quotes, backslashes and control characters
    # like Go; the characters of _GO_ESCAPES never occur inside its escapes.
    return json.dumps(value, ensure_ascii=False).translate(_GO_ESCAPES)


def _list(items: list[str]) -> str:
    return "[" + ",".join(items) + "]" if items else "null"


def _segment_json(s: rpb.Segment) -> str:
    parts = [f'"{name}":{v}' for name in _SEGMENT_INTS if (v := getattr(s, name))]
    if s.log:
        parts.append('"log":' + _str(s.log))
    return "{" + ",".join(parts) + "}"


def hints_to_json(hints: rpb.FSMHints) -> bytes:
    """The JSON of `hints`, byte-for-byte as Gazette's ``json.Marshal(hints)``."""
    parts = []
    if hints.log:
        parts.append('"log":' + _str(hints.log))
    nodes = []
    for node in hints.live_nodes:
        fnode = f'"fnode":{node.fnode},' if node.fnode else ""
        segs = _list([_segment_json(s) for s in node.segments])
        nodes.append("{" + fnode + '"segments":' + segs + "}")
    parts.append('"live_nodes":' + _list(nodes))
    props = []
    for p in hints.properties:
        fields = []
        if p.path:
            fields.append('"path":' + _str(p.path))
        if p.content:
            fields.append('"content":' + _str(p.content))
        props.append("{" + ",".join(fields) + "}")
    parts.append('"properties":' + _list(props))
    return ("{" + ",".join(parts) + "}").encode("utf-8")


# Decoding follows Go's json.Unmarshal into the generated structs: keys match
# field names case-insensitively, unknown keys are ignored, null leaves the
# zero value, and integers must be integral and in range.


def _fields(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidHints(f"{where}: expected a JSON object, not {type(value).__name__}")
    # A later duplicate (in folded case) wins, as in Go.
    return {k.lower(): v for k, v in value.items()}


def _int(value: Any, where: str, bits: int, signed: bool) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidHints(f"{where}: expected an integer, not {value!r}")
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not lo <= value <= hi:
        raise InvalidHints(f"{where}: {value} out of range")
    return value


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidHints(f"{where}: expected a string, not {value!r}")
    return value


def _array(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidHints(f"{where}: expected an array, not {type(value).__name__}")
    return value


def _segment_from(value: Any, where: str) -> rpb.Segment:
    f = _fields(value, where)
    seg = rpb.Segment()
    for name in _SEGMENT_INTS:
        if name in f:
            v = _int(f[name], f"{where}.{name}", 32 if name in _UINT32 else 64, name not in _UINT32)
            setattr(seg, name, v)
    seg.log = _text(f.get("log"), f"{where}.log")
    return seg


def hints_from_json(data: bytes | str) -> rpb.FSMHints:
    """Parse Gazette's JSON encoding of FSMHints (raises `InvalidHints`)."""
    try:
        doc = json.loads(data, parse_float=_reject_float, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidHints(f"invalid hints JSON: {exc}") from None
    hints = rpb.FSMHints()
    if doc is None:
        return hints
    f = _fields(doc, "hints")
    hints.log = _text(f.get("log"), "log")
    for i, n in enumerate(_array(f.get("live_nodes"), "live_nodes")):
        where = f"live_nodes[{i}]"
        nf = _fields(n, where)
        node = hints.live_nodes.add(fnode=_int(nf.get("fnode"), f"{where}.fnode", 64, True))
        for j, s in enumerate(_array(nf.get("segments"), f"{where}.segments")):
            node.segments.append(_segment_from(s, f"{where}.segments[{j}]"))
    for i, p in enumerate(_array(f.get("properties"), "properties")):
        where = f"properties[{i}]"
        pf = _fields(p, where)
        hints.properties.add(
            path=_text(pf.get("path"), f"{where}.path"),
            content=_text(pf.get("content"), f"{where}.content"),
        )
    return hints


def _reject_float(text: str) -> Any:
    raise InvalidHints(f"expected an integer, not {text}")


def _reject_constant(text: str) -> Any:
    raise InvalidHints(f"invalid JSON constant {text}")


def hints_from_bytes(data: bytes) -> rpb.FSMHints:
    """Parse stored hints: JSON if `data` begins with ``{``, else binary protobuf.

    Raises `InvalidHints` for data which is neither. The hints are not
    validated (see `validate_hints`, `FSM.from_hints`).
    """
    if not data:
        raise InvalidHints("empty hints")
    if data[:1] == b"{":
        return hints_from_json(data)
    try:
        return rpb.FSMHints.FromString(data)
    except DecodeError as exc:
        raise InvalidHints(f"invalid hints proto: {exc}") from None


def validate_hints(hints: rpb.FSMHints) -> None:
    """Raise `ValidationError` if a segment of `hints` is malformed.

    A segment leaving `log` empty is of `hints.log`, and so must not repeat it.
    """
    for node in hints.live_nodes:
        for seg in node.segments:
            if not seg.log:
                seg = copy_segment(seg)
                seg.log = hints.log
            elif seg.log == hints.log:
                raise ValidationError("contained segment.Log duplicates FSMHints.Log")
            with context("Segment"):
                validate_segment(seg)
