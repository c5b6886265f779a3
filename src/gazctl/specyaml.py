"""YAML form of JournalSpecs, as gazctl reads and writes it.

The field names and value spellings are those of Gazette's gazctl: snake_case field names,
labels as a list of ``{name, value}``, codecs and flags by enum name, and durations as Go
writes them (``1m0s``, ``10s``, ``1h30m0s``). Specs here may be *partial* (a parent node of a
hierarchy fixes only what its children share), so zero values are simply omitted, and reading
fills only the fields present.

Problems raise `broker.protocol.errors.ValidationError`, naming the offending field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from google.protobuf.duration_pb2 import Duration

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError, context

__all__ = [
    "INT32",
    "INT64",
    "UINT32",
    "parse_duration",
    "format_duration",
    "labels_from_yaml",
    "spec_from_yaml",
    "spec_to_yaml",
    "yaml_int",
    "SPEC_KEYS",
]

INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
UINT32 = (0, (1 << 32) - 1)
"""Ranges of the integer types of spec fields (protobuf's, and Go's)."""

_MAX_GO_DURATION_NS = (1 << 63) - 1
"""Go's time.Duration is int64 nanoseconds: upstream's specs hold no longer duration."""

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(value: object) -> Duration:
    """A Duration from Go syntax (``"1h30m"``, ``"10s"``, ``"250ms"``) or a number of seconds.

    Raises ValidationError for anything else.
    """
    if isinstance(value, bool):
        raise ValidationError(f"invalid duration ({value!r})")
    if isinstance(value, int | float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValidationError(f"invalid duration ({value!r})")
        nanos = round(value * 1e9)
    elif isinstance(value, str):
        text = value.strip()
        sign = 1
        if text[:1] in "+-" and text:
            sign = -1 if text[0] == "-" else 1
            text = text[1:]
        if text == "0":
            nanos = 0
        else:
            pos, nanos = 0, 0
            for m in _DURATION_PART.finditer(text):
                if m.start() != pos:
                    break
                nanos += round(float(m.group(1)) * _UNITS_NS[m.group(2)])
                pos = m.end()
            if pos != len(text) or not text:
                raise ValidationError(
                    f"invalid duration ({value!r}; expected e.g. '10s', '1m30s', '2h')"
                )
        nanos *= sign
    else:
        raise ValidationError(f"invalid duration ({value!r})")
    if abs(nanos) > _MAX_GO_DURATION_NS:
        limit = Duration()
        limit.FromNanoseconds(_MAX_GO_DURATION_NS)
        raise ValidationError(
            f"invalid duration ({value!r}; beyond Go's time.Duration range of "
            f"±{format_duration(limit)})"
        )
    d = Duration()
    d.FromNanoseconds(nanos)
    return d


def _fmt_frac(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{frac:0{digits}d}".rstrip("0")


def format_duration(d: Duration) -> str:
    """Go's time.Duration.String() of `d`: ``1h0m0s``, ``1m30s``, ``10s``, ``1.5s``, ``250ms``."""
    nanos = d.ToNanoseconds()
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    n = abs(nanos)
    if n < 1_000:
        return f"{sign}{n}ns"
    if n < 1_000_000:
        return f"{sign}{_fmt_frac(n, 1_000)}µs"
    if n < 1_000_000_000:
        return f"{sign}{_fmt_frac(n, 1_000_000)}ms"
    hours, rem = divmod(n, 3_600_000_000_000)
    minutes, rem = divmod(rem, 60_000_000_000)
    secs = _fmt_frac(rem, 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}"
    if minutes:
        return f"{sign}{minutes}m{secs}"
    return f"{sign}{secs}"


def _enum_value(wrapper: Any, value: object, what: str) -> int:
    if isinstance(value, bool):
        raise ValidationError(f"invalid {what} ({value!r})")
    if isinstance(value, int):
        if value not in wrapper.values():
            raise ValidationError(f"invalid {what} ({value})")
        return value
    if isinstance(value, str):
        try:
            return int(wrapper.Value(value.strip().upper()))
        except ValueError:
            pass
    names = ", ".join(wrapper.keys())
    raise ValidationError(f"invalid {what} ({value!r}; expected one of {names})")


def yaml_int(
    value: object, field: str, bounds: tuple[int, int] = INT64, *, minimum: int | None = None
) -> int:
    """`value` as an integer of the spec field `field` (its YAML key), whose type holds
    `bounds`; `minimum`, if given, is a tighter lower bound. Raises ValidationError naming
    `field` for anything else."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"expected an integer ({value!r})", [field])
    if minimum is not None and minimum > bounds[0] and value < minimum:
        raise ValidationError(f"expected an integer >= {minimum} ({value!r})", [field])
    if not bounds[0] <= value <= bounds[1]:
        raise ValidationError(
            f"expected an integer from {bounds[0]} to {bounds[1]} ({value!r})", [field]
        )
    return value


def _str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"expected a string ({value!r})", [field])
    return value


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValidationError(f"expected a mapping ({value!r})", [field])
    return value


def _check_keys(doc: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in doc:
        if key not in allowed:
            raise ValidationError(f"unknown field {key!r} (expected one of {', '.join(allowed)})")


_FRAGMENT_KEYS = (
    "length",
    "compression_codec",
    "stores",
    "refresh_interval",
    "retention",
    "flush_interval",
    "path_postfix_template",
)
SPEC_KEYS = (
    "name",
    "replication",
    "labels",
    "fragment",
    "flags",
    "max_append_rate",
    "suspend",
)
"""JournalSpec fields of the YAML form, in the order they are written."""


def labels_from_yaml(value: object, out: pb.LabelSet, key: str = "labels") -> None:
    """Replace the labels of `out` with those of the YAML `value` (of the spec key `key`): a
    list of ``{name, value}`` in (name, value) order without duplicates, as upstream's
    LabelSet requires (a list out of order is refused, naming the first label out of place),
    or a mapping of name to value (this gazctl's shorthand, which has no order to keep)."""
    items: list[tuple[str, str]] = []
    if isinstance(value, Mapping):
        items = sorted((str(k), "" if v is None else str(v)) for k, v in value.items())
    elif isinstance(value, list):
        for i, lb in enumerate(value):
            with context(f"{key}[{i}]"):
                m = _mapping(lb, "label")
                _check_keys(m, ("name", "value"))
                v = m.get("value", "")
                item = (_str(m.get("name"), "name"), "" if v is None else str(v))
                if items and items[-1] >= item:
                    if items[-1] == item:
                        raise ValidationError(f"duplicate label {_label_text(item)}")
                    raise ValidationError(
                        "labels must be in (name, value) order without duplicates, as "
                        f"upstream requires: {_label_text(item)} goes before "
                        f"{_label_text(items[-1])}"
                    )
                items.append(item)
    elif value is not None:
        raise ValidationError(f"expected a list of {{name, value}} ({value!r})", [key])
    del out.labels[:]
    for name, val in items:
        out.labels.add(name=name, value=val)


def _label_text(item: tuple[str, str]) -> str:
    return f"{item[0]}={item[1]!r}"


def _fragment_from_yaml(doc: Mapping[str, Any], out: pb.JournalSpec.Fragment) -> None:
    _check_keys(doc, _FRAGMENT_KEYS)
    if "length" in doc:
        out.length = yaml_int(doc["length"], "length")
    if "compression_codec" in doc:
        with context("compression_codec"):
            out.compression_codec = _enum_value(  # type: ignore[assignment]
                pb.CompressionCodec, doc["compression_codec"], "compression codec"
            )
    if "stores" in doc:
        stores = doc["stores"] or []
        if isinstance(stores, str):
            stores = [stores]
        if not isinstance(stores, list):
            raise ValidationError(f"expected a list of store URLs ({stores!r})", ["stores"])
        out.stores.extend(_str(s, "stores") for s in stores)
    for key in ("refresh_interval", "retention", "flush_interval"):
        if key in doc and doc[key] is not None:
            with context(key):
                getattr(out, key).CopyFrom(parse_duration(doc[key]))
    if "path_postfix_template" in doc:
        out.path_postfix_template = _str(doc["path_postfix_template"], "path_postfix_template")


def spec_from_yaml(doc: Mapping[str, Any], out: pb.JournalSpec) -> None:
    """Set the fields of `out` present in `doc` (keys of `SPEC_KEYS` only; others are the
    caller's). Raises ValidationError for malformed values."""
    if "name" in doc:
        out.name = _str(doc["name"], "name")
    if "replication" in doc:
        out.replication = yaml_int(doc["replication"], "replication", INT32)
    if "labels" in doc:
        labels_from_yaml(doc["labels"], out.labels)
    if "fragment" in doc and doc["fragment"] is not None:
        with context("fragment"):
            _fragment_from_yaml(_mapping(doc["fragment"], "fragment"), out.fragment)
    if "flags" in doc:
        with context("flags"):
            out.flags = _enum_value(pb.JournalSpec.Flag, doc["flags"], "flags")
    if "max_append_rate" in doc:
        out.max_append_rate = yaml_int(doc["max_append_rate"], "max_append_rate")
    if "suspend" in doc and doc["suspend"] is not None:
        with context("suspend"):
            s = _mapping(doc["suspend"], "suspend")
            _check_keys(s, ("level", "offset"))
            if "level" in s:
                out.suspend.level = _enum_value(  # type: ignore[assignment]
                    pb.JournalSpec.Suspend.Level, s["level"], "suspend level"
                )
            if "offset" in s:
                out.suspend.offset = yaml_int(s["offset"], "offset")


def _nonzero_duration(d: Duration) -> bool:
    return d.seconds != 0 or d.nanos != 0


def spec_to_yaml(spec: pb.JournalSpec) -> dict[str, Any]:
    """The YAML mapping of `spec`, omitting zero-valued fields (name included if set)."""
    out: dict[str, Any] = {}
    if spec.name:
        out["name"] = spec.name
    if spec.replication:
        out["replication"] = spec.replication
    if spec.labels.labels:
        out["labels"] = [{"name": lb.name, "value": lb.value} for lb in spec.labels.labels]
    f = spec.fragment
    frag: dict[str, Any] = {}
    if f.length:
        frag["length"] = f.length
    if f.compression_codec:
        frag["compression_codec"] = pb.CompressionCodec.Name(f.compression_codec)
    if f.stores:
        frag["stores"] = list(f.stores)
    for key in ("refresh_interval", "retention", "flush_interval"):
        d = getattr(f, key)
        if _nonzero_duration(d):
            frag[key] = format_duration(d)
    if f.path_postfix_template:
        frag["path_postfix_template"] = f.path_postfix_template
    if frag:
        out["fragment"] = frag
    if spec.flags:
        try:
            out["flags"] = pb.JournalSpec.Flag.Name(spec.flags)  # type: ignore[arg-type]
        except ValueError:
            out["flags"] = spec.flags
    if spec.max_append_rate:
        out["max_append_rate"] = spec.max_append_rate
    if spec.suspend.level or spec.suspend.offset:
        susp: dict[str, Any] = {}
        if spec.suspend.level:
            susp["level"] = pb.JournalSpec.Suspend.Level.Name(spec.suspend.level)
        if spec.suspend.offset:
            susp["offset"] = spec.suspend.offset
        out["suspend"] = susp
    return out
