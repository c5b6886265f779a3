"""What JSONMessage and CSVMessage share: a UUID attribute, acknowledgements, and the
introspection of a dataclass's fields into per-class codecs (built once, then cached)."""

from __future__ import annotations

import dataclasses
import types
import typing
import uuid as _uuid
from typing import Any, ClassVar, TypeVar

__all__ = ["DataclassMessage", "field_types", "optional_of"]

_Self = TypeVar("_Self", bound="DataclassMessage")


class DataclassMessage:
    """Message methods for a dataclass keeping its UUID in the attribute `uuid_field`.

    The attribute may be declared as a field (`uuid: UUID | None = None`) or not; either way
    it holds a `uuid.UUID` or None, and framings serialize it apart from the other fields.
    """

    uuid_field: ClassVar[str] = "uuid"

    def get_uuid(self) -> _uuid.UUID | None:
        return getattr(self, self.uuid_field, None)

    def set_uuid(self, uuid: _uuid.UUID) -> None:
        setattr(self, self.uuid_field, uuid)

    def new_acknowledgement(self: _Self, journal: str) -> _Self:
        """A new instance of this class with default field values (and no UUID yet)."""
        try:
            return type(self)()
        except TypeError as exc:
            raise TypeError(
                f"{type(self).__name__} can't make acknowledgements: give every field a "
                f"default, or override new_acknowledgement ({exc})"
            ) from exc


def field_types(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    """The dataclass fields of `cls` with their resolved types (Any where unresolvable)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):
        hints = {}
    return [(f, hints.get(f.name, Any)) for f in dataclasses.fields(cls)]


def optional_of(tp: Any) -> Any | None:
    """T if `tp` is `T | None` (or Optional[T]) for a single T, else None."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None
