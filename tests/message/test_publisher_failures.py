"""Exactly-once under append failures: the real AppendService and Publisher, with the RPC
replaced by an in-memory journal that can fail a journal's next append (NOT_ALLOWED)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gazette.broker.client.append_service import AppendService, AsyncAppend
from gazette.broker.client.errors import BrokerError
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.message.envelope import Envelope
from gazette.message.framing_json import JSON_FRAMING
from gazette.message.mapping import MappingFunc
from gazette.message.publisher import Publisher, PublisherBroken
from gazette.message.sequencer import Sequencer

from .notes import JSON, Note


class MemoryAppendService(AppendService):
    """A real AppendService whose appends land in memory; `fail_next` fails one append."""

    def __init__(self) -> None:
        super().__init__(client=None)  # type: ignore[arg-type]
        self.journals: dict[str, bytearray] = {}
        self.fail_next: set[str] = set()

    async def _send(self, batch: list[AsyncAppend]) -> None:  # type: ignore[override]
        journal = batch[0].journal
        await asyncio.sleep(0)
        if journal in self.fail_next:
            self.fail_next.discard(journal)
            for a in batch:
                a._fail(BrokerError(pb.NOT_ALLOWED, journal=journal))
            return
        buf = self.journals.setdefault(journal, bytearray())
        for a in batch:
            for chunk in a._chunks():
                buf += chunk
        for a in batch:
            a._succeed(pb.AppendResponse())


def to(journal: str) -> MappingFunc:
    return lambda msg: (journal, JSON)


def committed(svc: MemoryAppendService, journal: str) -> list[tuple[Any, Any]]:
    """(txn, i) of every message a read-committed reader delivers, ACKs excluded."""
    dec = JSON_FRAMING.decoder(0)
    dec.feed(bytes(svc.journals.get(journal, b"")))
    seq, out = Sequencer(), []
    for ev in dec.events():
        m = Note()
        JSON_FRAMING.unmarshal(ev.payload, m)  # type: ignore[union-attr]
        seq.queue_uncommitted(Envelope(journal, ev.begin, ev.end, m, JSON))  # type: ignore[union-attr]
        while seq.step():
            assert seq.dequeued is not None
            out.append((seq.dequeued.message.txn, seq.dequeued.message.i))
    return [x for x in out if x != (0, 0)]


async def test_a_failed_append_breaks_the_publisher_and_surfaces_at_the_barrier() -> None:
    svc = MemoryAppendService()
    pub = Publisher(svc)
    svc.fail_next.add("bad")
    failed = pub.publish_committed(to("bad"), Note(txn=1, i=1))
    await asyncio.gather(failed.done(), return_exceptions=True)  # Released, failed.
    with pytest.raises(PublisherBroken):
        pub.publish_committed(to("good"), Note(txn=1, i=2))
    with pytest.raises(BrokerError):
        await pub.barrier()
    assert isinstance(pub.broken, BrokerError)


async def test_a_transaction_with_a_failed_append_commits_nowhere() -> None:
    svc = MemoryAppendService()
    pub = Publisher(svc)
    svc.fail_next.add("J")
    failed = pub.publish_uncommitted(to("J"), Note(txn=1, i=1))
    pub.publish_uncommitted(to("K"), Note(txn=1, i=2))
    await asyncio.gather(failed.done(), return_exceptions=True)
    with pytest.raises((PublisherBroken, BrokerError)):
        await pub.commit()
    assert committed(svc, "J") == [] and committed(svc, "K") == [], "no partial commit"


async def test_ack_keeps_its_place_before_the_next_transaction() -> None:
    svc = MemoryAppendService()
    pub = Publisher(svc)
    pub.publish_uncommitted(to("J"), Note(txn=1, i=1))
    intents = pub.build_ack_intents()
    await asyncio.sleep(0.01)  # e.g. the intents are being made durable
    pub.publish_uncommitted(to("J"), Note(txn=2, i=1))  # another task: the next transaction
    await asyncio.sleep(0.01)  # Its batch is released meanwhile.
    pub.publish_ack_intents(intents)
    await pub.commit()
    assert committed(svc, "J") == [(1, 1), (2, 1)]


async def test_aborted_intents_never_commit_and_break_the_publisher() -> None:
    svc = MemoryAppendService()
    pub = Publisher(svc)
    sent = pub.publish_uncommitted(to("J"), Note(txn=1, i=1))
    intents = pub.build_ack_intents()
    pub.abort_ack_intents(intents, RuntimeError("store commit failed"))
    await asyncio.gather(sent.done(), return_exceptions=True)
    assert committed(svc, "J") == []
    with pytest.raises(PublisherBroken):
        pub.publish_uncommitted(to("J"), Note(txn=2, i=1))


async def test_a_message_whose_ack_cannot_be_built_is_not_written() -> None:
    class NoAck(Note):
        def new_acknowledgement(self, journal: str) -> Any:
            raise TypeError("no default for a field")

    svc = MemoryAppendService()
    pub = Publisher(svc)
    with pytest.raises(TypeError):
        pub.publish_uncommitted(to("J"), NoAck(txn=1, i=1))
    await pub.barrier()
    assert bytes(svc.journals.get("J", b"")) == b""
