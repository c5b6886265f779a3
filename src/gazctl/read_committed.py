"""What ``gazctl journals read --committed`` prints of a journal: its committed messages.

A raw read prints a journal as it is: messages of transactions that were rolled back (an
application's shard failed before committing and then redid its transaction) appear
beside their redone copies, messages never acknowledged appear too, and so do the
acknowledgements (ACK_TXN messages, which carry no data of their own). A user checking an
exactly-once application that way sees duplicates and empty records that no reader of the
journal ever gets. A committed read frames the journal's bytes with its framing (its
``content-type`` label), sequences them with a `Sequencer` (`ReadCommittedIter`), and
prints each committed message once, in commit order, leaving acknowledgements out.

Messages are printed as they were written: the frame's payload, as the journal holds it,
plus a newline. The read decodes no application message type, so only framings whose
frames carry their UUID where a reader finds it without one can be sequenced: JSON lines
(the top-level ``uuid`` key, `JSONMessage`'s default) and CSV (the first field). A
protobuf journal's UUID is a field of the application's message; it is refused.
"""

from __future__ import annotations

import uuid as _uuid
from typing import Any

from gazette.broker.client import RetryReader
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.gazctl.main import GazctlError
from gazette.message.envelope import Envelope
from gazette.message.framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    FrameDecoder,
    Framing,
    UnknownFramingError,
    framing_for_spec,
)
from gazette.message.iterators import ReadCommittedIter
from gazette.message.uuid import Flags

__all__ = ["CommittedMessages", "committed_framing"]

SEQUENCED_CONTENT_TYPES = (CONTENT_TYPE_JSON_LINES, CONTENT_TYPE_CSV)

_ACK = int(Flags.ACK_TXN)


def committed_framing(spec: pb.JournalSpec) -> Framing:
    """The framing of a journal whose committed messages can be read without a message
    type; GazctlError naming the journal otherwise."""
    try:
        framing = framing_for_spec(spec)
    except UnknownFramingError as err:
        raise GazctlError(f"--committed: journal {spec.name}: {err}") from None
    if framing.content_type not in SEQUENCED_CONTENT_TYPES:
        raise GazctlError(
            f"--committed: journal {spec.name} is {framing.content_type}, whose UUIDs are "
            f"fields of the application's message type; --committed reads "
            f"{' and '.join(SEQUENCED_CONTENT_TYPES)} journals (read it raw, without "
            "--committed, or with `gazctl journals export`, which takes a message class)"
        )
    return framing


class _Message:
    """A message of a JSON-lines or CSV journal: its payload as written, and its UUID."""

    __slots__ = ("payload", "uuid")

    def __init__(self) -> None:
        self.payload = b""
        self.uuid: _uuid.UUID | None = None

    def load_json(self, doc: dict[str, Any]) -> None:
        text = doc.get("uuid")
        try:
            self.uuid = _uuid.UUID(text) if isinstance(text, str) and text else None
        except ValueError:
            self.uuid = None  # Not a UUID: a message outside any transaction.

    def load_csv_row(self, row: list[str]) -> None:
        pass  # The framing gives the UUID to set_uuid.

    def set_uuid(self, uuid: _uuid.UUID) -> None:
        self.uuid = uuid

    def get_uuid(self) -> _uuid.UUID | None:
        return self.uuid


class _KeepingPayload:
    """`framing`, whose `unmarshal` also keeps the payload in the `_Message` it fills."""

    def __init__(self, framing: Framing) -> None:
        self.framing = framing
        self.content_type = framing.content_type

    def marshal(self, msg: object) -> bytes:
        return self.framing.marshal(msg)

    def unmarshal(self, payload: bytes, msg: object) -> None:
        assert isinstance(msg, _Message)
        msg.payload = payload
        self.framing.unmarshal(payload, msg)

    def decoder(self, offset: int = 0) -> FrameDecoder:
        return self.framing.decoder(offset)


def is_ack(env: Envelope) -> bool:
    """Whether the envelope's message is an acknowledgement (ACK_TXN)."""
    u = env.message.get_uuid()
    # The flags' bits (from bit 48), read as the Sequencer reads them (no version check).
    return u is not None and bool((u.int >> 48) & _ACK)


class CommittedMessages:
    """The committed messages of the journal `rr` reads (from its request's offset), each
    once and in commit order, without acknowledgements: `next()` returns the next one's
    payload. `framing` is from `committed_framing`."""

    def __init__(self, rr: RetryReader, spec: pb.JournalSpec, framing: Framing) -> None:
        self.iter = ReadCommittedIter(
            rr.client, rr.request, _KeepingPayload(framing), lambda _spec: _Message(), reader=rr
        )
        self.iter.uncommitted.spec = spec

    async def next(self) -> bytes:
        """The next committed message's payload. Raises as `ReadCommittedIter.next`:
        `OffsetNotYetAvailable` at the write head of a non-blocking read; cancellation loses
        nothing."""
        while True:
            env = await self.iter.next()
            if not is_ack(env):
                payload: bytes = env.message.payload
                return payload
