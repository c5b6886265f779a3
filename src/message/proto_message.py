"""`ProtoMessage`: a generated protobuf message as a Message of the fixed protobuf framing.

Generated messages have no `get_uuid` / `set_uuid`; `ProtoMessage(msg, uuid_field="uuid")`
adds them, keeping the UUID in a field of `msg` that is either `bytes` (the 16 UUID bytes) or
`string` (the canonical text form). An empty field reads as no UUID. With `uuid_field=None` the
message carries no UUID: `get_uuid` returns None and `set_uuid` does nothing, opting it out of
exactly-once processing (readers take each such message as committed when read).

    m = ProtoMessage(my_pb2.Event(user="u1"))
    frame = PROTO_FIXED_FRAMING.marshal(m)   # after a publisher has called m.set_uuid(...)
    out = ProtoMessage(my_pb2.Event())
    PROTO_FIXED_FRAMING.unmarshal(payload, out)   # out.msg is the decoded Event

The framing itself needs only `SerializeToString` and `ParseFromString`, so any object having
those and the Message methods may be framed without this adapter.
"""

from __future__ import annotations

import uuid as _uuid
from typing import Any, Generic, TypeVar

__all__ = ["ProtoMessage"]

_M = TypeVar("_M")

# google.protobuf.descriptor.FieldDescriptor.TYPE_STRING / TYPE_BYTES; literal so that this
# module needn't import protobuf.
_TYPE_STRING = 9
_TYPE_BYTES = 12

_field_kinds: dict[tuple[Any, str], bool] = {}  # (descriptor, field) -> holds bytes?


def _holds_bytes(msg: Any, field: str) -> bool:
    descriptor = msg.DESCRIPTOR
    key = (descriptor, field)
    kind = _field_kinds.get(key)
    if kind is None:
        fd = descriptor.fields_by_name.get(field)
        if fd is None:
            raise ValueError(f"{descriptor.full_name} has no field {field!r} to hold UUIDs")
        if fd.type not in (_TYPE_BYTES, _TYPE_STRING) or _is_repeated(fd):
            raise ValueError(
                f"{descriptor.full_name}.{field} must be a singular bytes or string field "
                "to hold UUIDs"
            )
        kind = _field_kinds[key] = fd.type == _TYPE_BYTES
    return kind


def _is_repeated(fd: Any) -> bool:
    repeated = getattr(fd, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    return bool(fd.label == 3)  # LABEL_REPEATED, for older protobuf.


class ProtoMessage(Generic[_M]):
    """A protobuf message `msg` with the Message methods, its UUID in field `uuid_field`."""

    __slots__ = ("msg", "uuid_field", "_bytes")

    def __init__(self, msg: _M, uuid_field: str | None = "uuid") -> None:
        self.msg = msg
        self.uuid_field = uuid_field
        self._bytes = _holds_bytes(msg, uuid_field) if uuid_field is not None else False

    def get_uuid(self) -> _uuid.UUID | None:
        if self.uuid_field is None:
            return None
        value = getattr(self.msg, self.uuid_field)
        if not value:
            return None
        if self._bytes:
            return _uuid.UUID(bytes=value)
        return _uuid.UUID(value)

    def set_uuid(self, uuid: _uuid.UUID) -> None:
        if self.uuid_field is not None:
            setattr(self.msg, self.uuid_field, uuid.bytes if self._bytes else str(uuid))

    def new_acknowledgement(self, journal: str) -> ProtoMessage[_M]:
        """A wrapper of a new, empty message of the same type."""
        return ProtoMessage(type(self.msg)(), self.uuid_field)

    def SerializeToString(self) -> bytes:  # noqa: N802 -- protobuf's name
        data: bytes = self.msg.SerializeToString()  # type: ignore[attr-defined]
        return data

    def ParseFromString(self, data: bytes) -> None:  # noqa: N802 -- protobuf's name
        """Replace the message's content by the decoding of `data` (protobuf's DecodeError
        if it's malformed)."""
        self.msg.ParseFromString(data)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"ProtoMessage({self.msg!r}, uuid_field={self.uuid_field!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProtoMessage):
            return NotImplemented
        return bool(self.msg == other.msg) and self.uuid_field == other.uuid_field

    __hash__ = None  # type: ignore[assignment]
