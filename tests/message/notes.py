"""The message type of the message-layer tests (importable by producer subprocesses)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from gazette.message import JSONMessage

JSON = "application/x-ndjson"


@dataclass
class Note(JSONMessage):
    """A test message: who published it, in which transaction, and its index there."""

    producer: str = ""
    txn: int = 0
    i: int = 0
    uuid: uuid.UUID | None = None
