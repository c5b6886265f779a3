"""`CSVMessage`: dataclasses as messages of the CSV framing.

Subclass it as a dataclass; its fields are the record's columns in declaration order, after
the UUID column which the framing writes from `get_uuid()`:

    @dataclass
    class Reading(CSVMessage):
        sensor: str = ""
        value: float = 0.0
        ok: bool = True

Field types and their text: str as itself; int and float as `str` / `repr` write them (repr
round-trips floats exactly); bool as "true" / "false" (reading also accepts Go's other forms:
1, t, T, TRUE, True, 0, f, F, FALSE, False); `uuid.UUID` canonically; an Enum by its value;
`T | None` as T or, for None, the empty field. The UUID attribute (`uuid_field`, "uuid") is not
a column even if declared as a field.

`load_csv_row(row)` requires exactly one value per field.
"""

from __future__ import annotations

import enum
import uuid as _uuid
from collections.abc import Callable
from typing import Any

from gazette.message._dataclass_message import DataclassMessage, field_types, optional_of
from gazette.message.framing import UnmarshalError

__all__ = ["CSVMessage"]

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


class CSVMessage(DataclassMessage):
    """Base of dataclass messages for the `text/csv` framing (module doc)."""

    def to_csv_row(self) -> list[str]:
        return _plan(type(self))[0](self)

    def load_csv_row(self, row: list[str]) -> None:
        _plan(type(self))[1](self, row)


_Plan = tuple[Callable[[Any], list[str]], Callable[[Any, list[str]], None]]
_plans: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    p = _plans.get(cls)
    if p is None:
        p = _plans[cls] = _build_plan(cls)
    return p


def _parse_bool(s: str) -> bool:
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError(f"invalid boolean {s!r}")


def _format_bool(v: bool) -> str:
    return "true" if v else "false"


def _codec(tp: Any) -> tuple[Callable[[Any], str] | None, Callable[[str], Any] | None]:
    """(format, parse) of a field type; None where the text is the value."""
    if tp is str:
        return None, None
    if tp is int:
        return str, int
    if tp is float:
        return repr, float
    if tp is bool:
        return _format_bool, _parse_bool
    if tp is _uuid.UUID:
        return str, _uuid.UUID
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        members = list(tp)
        value_type = type(members[0].value) if members else str
        _, parse_value = _codec(value_type)
        enum_type = tp

        def parse_enum(s: str) -> Any:
            return enum_type(parse_value(s) if parse_value else s)

        return lambda v: str(v.value), parse_enum
    inner = optional_of(tp)
    if inner is not None:
        fmt, parse = _codec(inner)

        def format_optional(v: Any) -> str:
            if v is None:
                return ""
            return v if fmt is None else fmt(v)

        def parse_optional(s: str) -> Any:
            if not s:
                return None
            return s if parse is None else parse(s)

        return format_optional, parse_optional
    raise TypeError(f"unsupported field type for CSV: {tp!r}")


def _build_plan(cls: type) -> _Plan:
    uuid_attr = getattr(cls, "uuid_field", None)
    fields = [(f, tp) for f, tp in field_types(cls) if f.name != uuid_attr]
    names = [f.name for f, _ in fields]
    codecs = [_codec(tp) for _, tp in fields]
    ns: dict[str, Any] = {}
    items = []
    for i, (name, (fmt, _)) in enumerate(zip(names, codecs, strict=True)):
        if fmt is None:
            items.append(f"self.{name}")
        else:
            ns[f"_f{i}"] = fmt
            items.append(f"_f{i}(self.{name})")
    exec(f"def to_row(self):\n    return [{', '.join(items)}]\n", ns)  # noqa: S102
    to_row: Callable[[Any], list[str]] = ns["to_row"]
    parsers = [(name, parse) for name, (_, parse) in zip(names, codecs, strict=True)]

    def load_row(self: Any, row: list[str]) -> None:
        if len(row) != len(parsers):
            raise UnmarshalError(
                f"{cls.__name__} has {len(parsers)} CSV columns after the UUID, "
                f"but the record has {len(row)}"
            )
        for (name, parse), text in zip(parsers, row, strict=True):
            if parse is None:
                setattr(self, name, text)
                continue
            try:
                setattr(self, name, parse(text))
            except ValueError as exc:
                raise UnmarshalError(f"field {name!r}: {exc}") from None

    return to_row, load_row
