"""`JSONMessage`: dataclasses as messages of the JSON-lines framing.

Subclass it as a dataclass:

    @dataclass
    class Click(JSONMessage):
        user: str = ""
        page: str = ""
        at: float = 0.0
        tags: list[str] = field(default_factory=list)

`Click(user="u1").to_json()` is `{"uuid": "<canonical UUID>", "user": "u1", ...}`: the UUID
first (once set, under the key `uuid_field`, "uuid" unless a subclass changes it), then the
fields in declaration order, keyed by field name. The UUID attribute may be declared as a field
(`uuid: UUID | None = None`) or left undeclared.

Field types and their JSON: str, int, float, bool and None as themselves; `uuid.UUID` as its
canonical string; Enums as their value; nested dataclasses as objects (recursively, the same
rules); `list[T]`, `tuple[T, ...]`, `dict[str, T]` and `dict[int, T]` element-wise; `T | None`
as null or T; `Any` and `object` values as they are (they must be JSON-encodable).

`load_json(doc)` assigns the fields present in `doc` (checking their JSON types) and ignores
unknown keys; fields missing from `doc` keep their current values, as with Go's json.Unmarshal.
`from_json(doc)` builds a new instance. Every field needs a default for `new_acknowledgement`
(which returns a default instance of the same class) unless a subclass overrides it.

Encoders and decoders are generated once per class, on first use, so that `to_json` costs
little more than building the dict by hand.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import json.encoder as json_encoder
import types
import typing
import uuid as _uuid
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from gazette.message._dataclass_message import DataclassMessage, field_types, optional_of
from gazette.message.framing import UnmarshalError
from gazette.message.framing_json import FastLoader
from gazette.message.framing_json import encode_json as _encode_json_value
from gazette.message.uuid import canonical_str

__all__ = ["JSONMessage"]

_T = TypeVar("_T", bound="JSONMessage")

_Fn = Callable[[Any], Any]


class JSONMessage(DataclassMessage):
    """Base of dataclass messages for the `application/x-ndjson` framing (module doc)."""

    def to_json(self) -> dict[str, Any]:
        return _plan(type(self)).encode(self)

    def to_json_line(self) -> bytes | None:
        """The message's whole JSON-lines frame, exactly as encoding `to_json()` would make
        it, written directly (several times faster); None if a value isn't of its field's
        declared type, in which case the framing encodes `to_json()` instead."""
        return _plan(type(self)).line(self)

    @classmethod
    def json_line_encoder(cls) -> Callable[[Any], bytes | None] | None:
        """`to_json_line` as a function of the message, for the framing to call directly;
        None if a subclass overrides `to_json_line` (the framing then calls that)."""
        if cls.to_json_line is not JSONMessage.to_json_line:
            return None
        return _plan(cls).line

    def load_json(self, doc: dict[str, Any]) -> None:
        _plan(type(self)).load(self, doc)

    @classmethod
    def from_json(cls: type[_T], doc: dict[str, Any]) -> _T:
        obj: _T = _plan(cls).construct(doc)
        return obj

    def json_fast_loader(self) -> FastLoader | None:
        """The class's `FastLoader` (see `message.framing_json`): a typed decoder of whole
        lines, built when every field's type has an exact equivalent in it; else None."""
        return _plan(type(self)).fast


class _Plan:
    __slots__ = ("encode", "line", "load", "construct", "fast")

    def __init__(
        self,
        encode: Callable[[Any], dict[str, Any]],
        line: Callable[[Any], bytes | None],
        load: Callable[[Any, dict[str, Any]], None],
        construct: Callable[[Any], Any],
        fast: FastLoader | None,
    ) -> None:
        self.encode = encode
        self.line = line
        self.load = load
        self.construct = construct
        self.fast = fast


_plans: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    p = _plans.get(cls)
    if p is None:
        p = _plans[cls] = _build_plan(cls)
    return p


def _field_error(name: str, exc: Exception) -> UnmarshalError:
    return UnmarshalError(f"field {name!r}: {exc}")


def _expected(what: str, v: Any) -> UnmarshalError:
    return UnmarshalError(f"expected {what}, not {type(v).__name__} {v!r:.40}")


# Encoders: None means the value is JSON as it is.


def _encoder(tp: Any) -> _Fn | None:
    if tp in (str, int, float, bool, type(None), Any, object):
        return None
    if tp is _uuid.UUID:
        return str
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return lambda v: _plan(type(v)).encode(v)
    inner = optional_of(tp)
    if inner is not None:
        inner_enc = _encoder(inner)
        if inner_enc is None:
            return None
        return lambda v: None if v is None else inner_enc(v)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple, set, frozenset) or origin in _SEQUENCE_ABCS:
        elem = args[0] if args else Any
        elem_enc = _encoder(elem)
        if elem_enc is None:
            return None if origin in (list, tuple) else list
        return lambda v: [elem_enc(x) for x in v]
    if origin is dict or origin in _MAPPING_ABCS:
        value_enc = _encoder(args[1] if len(args) == 2 else Any)
        if value_enc is None:
            return None
        return lambda v: {k: value_enc(x) for k, x in v.items()}
    return _encode_any


def _enum_value(v: Any) -> Any:
    return v.value


def _encode_any(v: Any) -> Any:
    """Encode a value of a type not known in advance (e.g. a union)."""
    if isinstance(v, str | int | float | bool) or v is None:
        return v
    if isinstance(v, _uuid.UUID):
        return str(v)
    if isinstance(v, enum.Enum):
        return v.value
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return _plan(type(v)).encode(v)
    if isinstance(v, dict):
        return {k: _encode_any(x) for k, x in v.items()}
    if isinstance(v, list | tuple | set | frozenset):
        return [_encode_any(x) for x in v]
    return v


_SEQUENCE_ABCS: tuple[Any, ...] = (
    typing.get_origin(typing.Sequence),
    typing.get_origin(typing.MutableSequence),
)
_MAPPING_ABCS: tuple[Any, ...] = (
    typing.get_origin(typing.Mapping),
    typing.get_origin(typing.MutableMapping),
)

# Decoders.

# (JSON class check, description) of types checked inline by generated code.
_INLINE: dict[Any, tuple[str, str]] = {
    str: ("str", "a string"),
    int: ("int", "an integer"),
    bool: ("bool", "a boolean"),
}


def _decoder(tp: Any) -> _Fn | None:
    """A function checking and converting a JSON value to `tp`; None if any value will do."""
    if tp in (Any, object):
        return None
    if tp in _INLINE:
        cls = tp

        def check(v: Any) -> Any:
            if v.__class__ is not cls:
                raise _expected(_INLINE[cls][1], v)
            return v

        return check
    if tp is float:
        return _decode_float
    if tp is type(None):
        return _decode_none
    if tp is _uuid.UUID:
        return _decode_uuid
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        enum_type = tp
        return lambda v: enum_type(v)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        dc = tp
        return lambda v: _plan(dc).construct(v)
    inner = optional_of(tp)
    if inner is not None:
        dec = _decoder(inner)
        if dec is None:
            return None
        return lambda v: None if v is None else dec(v)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, set, frozenset, tuple) or origin in _SEQUENCE_ABCS:
        if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):
            return _decode_list(_decoder(Any), tuple)  # Fixed-length tuples: not checked.
        make: Callable[[Any], Any] = origin if origin in (set, frozenset, tuple) else list
        return _decode_list(_decoder(args[0] if args else Any), make)
    if origin is dict or origin in _MAPPING_ABCS:
        key = args[0] if args else str
        if key not in (str, int, Any):
            raise TypeError(f"dict keys must be str or int for JSON, not {key}")
        return _decode_dict(int if key is int else None, _decoder(args[1] if args else Any))
    if origin in (typing.Union, types.UnionType, typing.Literal):
        return None  # Unions of several types: taken as they are.
    raise TypeError(f"unsupported field type for JSON: {tp!r}")


def _decode_float(v: Any) -> float:
    if v.__class__ is float:
        return float(v)
    if v.__class__ is int:
        return float(v)
    raise _expected("a number", v)


def _decode_none(v: Any) -> None:
    if v is not None:
        raise _expected("null", v)


def _decode_uuid(v: Any) -> _uuid.UUID:
    if v.__class__ is not str:
        raise _expected("a UUID string", v)
    try:
        return _uuid.UUID(v)
    except ValueError:
        raise _expected("a UUID string", v) from None


def _decode_list(dec: _Fn | None, make: Callable[[Any], Any]) -> _Fn:
    def decode(v: Any) -> Any:
        if v.__class__ is not list:
            raise _expected("an array", v)
        if dec is None:
            return v if make is list else make(v)
        return make([dec(x) for x in v])

    return decode


def _decode_dict(key: _Fn | None, dec: _Fn | None) -> _Fn:
    def decode(v: Any) -> Any:
        if v.__class__ is not dict:
            raise _expected("an object", v)
        if key is None and dec is None:
            return v
        if key is None:
            assert dec is not None
            return {k: dec(x) for k, x in v.items()}
        return {key(k): (x if dec is None else dec(x)) for k, x in v.items()}

    return decode


# Code generation. Field names are Python identifiers and keys are written with repr(), so
# the generated source can't be subverted by a class's contents.


def _build_plan(cls: type) -> _Plan:
    uuid_attr: str | None = getattr(cls, "uuid_field", None)
    fields = [(f, tp) for f, tp in field_types(cls) if f.name != uuid_attr]
    ns: dict[str, Any] = {
        "_field_error": _field_error,
        "_expected": _expected,
        "_MISSING": _MISSING,
        "_uuid_str": canonical_str,
        "_Err": (TypeError, ValueError, AttributeError, KeyError),
    }

    items = []
    for i, (f, tp) in enumerate(fields):
        enc = _encoder(tp)
        if enc is None:
            items.append(f"{f.name!r}: self.{f.name}")
        else:
            ns[f"_e{i}"] = enc
            items.append(f"{f.name!r}: _e{i}(self.{f.name})")
    body = ", ".join(items)
    enc_src = ["def encode(self):"]
    if uuid_attr is not None:
        enc_src += [
            f"    u = getattr(self, {uuid_attr!r}, None)",
            "    if u is not None:",
            f"        return {{{uuid_attr!r}: _uuid_str(u), {body}}}",
        ]
    enc_src.append(f"    return {{{body}}}")

    load_src = ["def load(self, doc):"]
    if uuid_attr is not None:
        load_src += [
            f"    v = doc.get({uuid_attr!r})",
            "    if v is not None:",
            "        try:",
            "            v = _decode_uuid(v)",
            "        except ValueError as exc:",
            f"            raise _field_error({uuid_attr!r}, exc) from None",
            f"    self.{uuid_attr} = v",
        ]
        ns["_decode_uuid"] = _decode_uuid
    for i, (f, tp) in enumerate(fields):
        load_src.append(f"    v = doc.get({f.name!r}, _MISSING)")
        load_src.append("    if v is not _MISSING:")
        inline = _INLINE.get(tp)
        if inline is not None:
            load_src += [
                f"        if v.__class__ is not {inline[0]}:",
                f"            raise _field_error({f.name!r}, _expected({inline[1]!r}, v))",
            ]
        else:
            dec = _decoder(tp)
            if dec is not None:
                ns[f"_d{i}"] = dec
                load_src += [
                    "        try:",
                    f"            v = _d{i}(v)",
                    "        except _Err as exc:",
                    f"            raise _field_error({f.name!r}, exc) from None",
                ]
        load_src.append(f"        self.{f.name} = v")
    if uuid_attr is None:
        load_src.append("    pass")

    line_src = _line_source(uuid_attr, fields, ns)
    exec("\n".join(enc_src + load_src + line_src), ns)  # noqa: S102
    encode, load, line = ns["encode"], ns["load"], ns["line"]
    init_fields = [f.name for f, _ in fields if f.init]
    other_fields = [f.name for f, _ in fields if not f.init]

    def construct(doc: Any) -> Any:
        if doc.__class__ is not dict:
            raise _expected("an object", doc)
        # Decode through a default-less instance, then hand the values to __init__, so that
        # __post_init__ and required fields behave as when called directly.
        holder = _Holder()
        load(holder, doc)
        values = holder.__dict__
        try:
            obj = cls(**{k: values[k] for k in init_fields if k in values})
        except TypeError as exc:
            raise UnmarshalError(f"{cls.__name__}: {exc}") from None
        for k in other_fields:
            if k in values:
                setattr(obj, k, values[k])
        if uuid_attr is not None and values.get(uuid_attr) is not None:
            setattr(obj, uuid_attr, values[uuid_attr])
        return obj

    return _Plan(encode, line, load, construct, _fast_loader(cls, uuid_attr, fields))


# Fast loading: msgspec decodes a whole line into a Struct mirroring the class, typed checks
# and UUID included, in C; a generated function then assigns what the line held. Only types
# whose msgspec decoding accepts nothing that `load` rejects are mirrored (msgspec may reject
# more: the framing then falls back to `load` for that line, which reports the error).

_FAST_SCALARS: dict[Any, Any] = {
    str: str,
    int: int,
    float: float,
    bool: bool,
    type(None): None,
    _uuid.UUID: _uuid.UUID,
}


def _fast_type(tp: Any, nested: bool = False) -> Any:
    """The msgspec type decoding exactly like `_decoder(tp)`, or _MISSING if none."""
    if tp in (Any, object):
        return Any
    if tp in _FAST_SCALARS:
        return _FAST_SCALARS[tp]
    inner = optional_of(tp)
    if inner is not None:
        mirrored = _fast_type(inner, nested)
        return _MISSING if mirrored is _MISSING else typing.Union[mirrored, None]  # noqa: UP007
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if nested:
        return _MISSING
    if origin is list and len(args) == 1:
        elem = _fast_type(args[0], nested=True)
        return _MISSING if elem is _MISSING else list[elem]  # type: ignore[valid-type]
    if origin is dict and len(args) == 2 and args[0] is str:
        value = _fast_type(args[1], nested=True)
        return _MISSING if value is _MISSING else dict[str, value]  # type: ignore[valid-type]
    return _MISSING


def _fast_loader(
    cls: type, uuid_attr: str | None, fields: list[tuple[dataclasses.Field[Any], Any]]
) -> FastLoader | None:
    mirrored: list[tuple[str, Any, Any]] = []
    if uuid_attr is not None:
        mirrored.append((uuid_attr, _uuid.UUID | None, None))
    for f, tp in fields:
        ftype = _fast_type(tp)
        if ftype is _MISSING:
            return None
        mirrored.append((f.name, typing.Union[ftype, msgspec.UnsetType], msgspec.UNSET))  # noqa: UP007
    try:
        struct = msgspec.defstruct(f"{cls.__name__}Line", mirrored)
        decode = msgspec.json.Decoder(struct).decode
    except (TypeError, ValueError):
        return None  # A field name msgspec reserves, or a type it refuses.

    src = ["def load(self, s):"]
    if uuid_attr is not None:
        src.append(f"    self.{uuid_attr} = s.{uuid_attr}")
    for f, _ in fields:
        src += [f"    v = s.{f.name}", "    if v is not _UNSET:", f"        self.{f.name} = v"]
    src.append("    pass")
    ns: dict[str, Any] = {"_UNSET": msgspec.UNSET}
    exec("\n".join(src), ns)  # noqa: S102
    return FastLoader(decode, ns["load"])


def _fstring_literal(text: str) -> str:
    return text.replace("\\", "\\\\").replace("{", "{{").replace("}", "}}").replace("'", "\\'")


def _line_source(
    uuid_attr: str | None, fields: list[tuple[dataclasses.Field[Any], Any]], ns: dict[str, Any]
) -> list[str]:
    """Source of `line(self)`, writing the JSON text of a message directly.

    Each field whose type is simple gets a guard (its value is exactly of that type, and a
    float is finite) and is formatted inline, as the json module would format it; other fields
    go through the json module's encoder. If any guard fails, `line` returns None.
    """
    ns["_s"] = json_encoder.encode_basestring
    ns["_j"] = _encode_json_value
    ns["_UUID"] = _uuid.UUID
    ns["_TF"] = ("false", "true")
    ns["_NULL"] = "null"
    guards: list[str] = []
    parts: list[str] = []  # f-string pieces, one per field, with their keys.
    src = ["def line(self):"]
    for i, (f, tp) in enumerate(fields):
        var = f"v{i}"
        src.append(f"    {var} = self.{f.name}")
        inner = optional_of(tp)
        nullable = inner is not None
        base = inner if nullable else tp
        if base is str:
            guard, frag = f"{var}.__class__ is not str", f"_s({var})"
        elif base is int:
            guard, frag = f"{var}.__class__ is not int", f"{var}!r"
        elif base is float:
            guard, frag = f"{var}.__class__ is not float or {var} - {var} != 0.0", f"{var}!r"
        elif base is bool:
            guard, frag = f"{var}.__class__ is not bool", f"_TF[{var}]"
        elif base is _uuid.UUID:
            guard, frag = f"{var}.__class__ is not _UUID", f"_s(_uuid_str({var}))"
        else:
            guard, nullable = "", False
            enc = _encoder(tp)
            if enc is None:
                frag = f"_j({var})"
            else:
                ns[f"_e{i}"] = enc
                frag = f"_j(_e{i}({var}))"
        if nullable:
            guard = f"({var} is not None and ({guard}))"
            frag = f"_NULL if {var} is None else {frag}"
        if guard:
            guards.append(guard)
        key = _fstring_literal(json.dumps(f.name, ensure_ascii=False))
        parts.append(f"{key}:{{{frag}}}")
    if guards:
        src.append(f"    if {' or '.join(guards)}:")
        src.append("        return None")
    body = ",".join(parts)
    if uuid_attr is not None:
        key = _fstring_literal(json.dumps(uuid_attr, ensure_ascii=False))
        src.append(f"    u = getattr(self, {uuid_attr!r}, None)")
        src.append("    if u is not None:")
        sep = "," if body else ""
        src.append(f"        return f'{{{{{key}:\"{{_uuid_str(u)}}\"{sep}{body}}}}}\\n'.encode()")
    src.append(f"    return f'{{{{{body}}}}}\\n'.encode()")
    return src


class _Holder:
    """A plain object receiving decoded values before a dataclass is constructed."""


_MISSING = object()
