"""The Message contract and the Envelope that places a message within its journal."""

from __future__ import annotations

import uuid as _uuid
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Message", "Validator", "Envelope"]


@runtime_checkable
class Message(Protocol):
    """A message that can take part in exactly-once processing.

    `get_uuid` returns the message's UUID (None if it has none yet); `set_uuid` is called by a
    Publisher just before the message is framed, inside the journal's append ordering, so that
    journal order equals clock order. `new_acknowledgement(journal)` returns a fresh message
    of a type the journal accepts, used as an ACK_TXN for the publisher's transaction.
    """

    def get_uuid(self) -> _uuid.UUID | None: ...

    def set_uuid(self, uuid: _uuid.UUID) -> None: ...

    def new_acknowledgement(self, journal: str) -> Message: ...


@runtime_checkable
class Validator(Protocol):
    """Optional: messages that can check themselves; publishers call it before framing."""

    def validate(self) -> None: ...


@dataclass(slots=True)
class Envelope:
    """A message read from (or published to) a journal, with its byte range [begin, end)."""

    journal: str
    begin: int
    end: int
    message: Any
    content_type: str = ""
