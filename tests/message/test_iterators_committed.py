"""Exactly-once reading on a real broker: ReadCommittedIter over several producers'
transactions, acknowledged, abandoned, rolled back, replayed, and cut short by SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gazette.broker.client import AppendService, JournalClient, OffsetNotYetAvailable
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.selector import format_label_selector
from gazette.message import CSVMessage, ProtoMessage
from gazette.message.envelope import Envelope
from gazette.message.framing_json import JSON_FRAMING
from gazette.message.iterators import ReadCommittedIter, ReadUncommittedIter
from gazette.message.mapping import MappingFunc, rendezvous_mapping
from gazette.message.publisher import Publisher
from gazette.message.sequencer import Sequencer
from gazette.message.uuid import Clock, get_producer_id
from gazette.testing.broker import BrokerProcess
from tests.message.conftest import MakeTopic, Note
from tests.message.notes import JSON

REPO = Path(__file__).resolve().parents[2]

Key = tuple[str, int, int]  # (producer, txn, i)


async def read_journal(
    client: JournalClient, journal: str, *, committed: bool, ring: int = 1024
) -> tuple[list[Envelope], ReadCommittedIter | ReadUncommittedIter]:
    """Every envelope of `journal` up to its write head."""
    req = pb.ReadRequest(journal=journal, block=False)
    it: ReadCommittedIter | ReadUncommittedIter
    if committed:
        it = ReadCommittedIter(client, req, None, lambda spec: Note(), Sequencer(ring_size=ring))
    else:
        it = ReadUncommittedIter(client, req, None, lambda spec: Note())
    out = []
    try:
        async for env in it:
            out.append(env)
    except OffsetNotYetAvailable:
        pass
    finally:
        it.close()
    return out, it


def keys(envs: list[Envelope]) -> list[Key]:
    """Keys of the data messages (acknowledgements have no producer name)."""
    return [(e.message.producer, e.message.txn, e.message.i) for e in envs if e.message.producer]


def check_order(envs: list[Envelope]) -> None:
    """Per producer name, committed messages of a journal arrive in (txn, i) order."""
    by_producer: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p, t, i in keys(envs):
        by_producer[p].append((t, i))
    for p, seq in by_producer.items():
        assert seq == sorted(seq), f"producer {p} out of order: {seq}"


def to(journal: str) -> MappingFunc:
    return lambda msg: (journal, "application/x-ndjson")


async def test_committed_reader_sees_exactly_the_committed_messages(
    client: JournalClient, make_topic: MakeTopic
) -> None:
    topic = await make_topic(2)
    one, two = topic.names
    async with AppendService(client) as svc:
        a, b, c = Publisher(svc), Publisher(svc), Publisher(svc)
        d = Publisher(svc, clock=Clock(1 << 60))

        for i in range(5):  # A: transaction 0 over both journals, acknowledged.
            a.publish_uncommitted(to((one, two)[i % 2]), Note(producer="a", txn=0, i=i))
        for i in range(4):  # B: never acknowledged.
            b.publish_uncommitted(to((one, two)[i % 2]), Note(producer="b", txn=0, i=i))
        await a.commit()
        for i in range(3):  # C: outside of transactions.
            c.publish_committed(to(one), Note(producer="c", txn=0, i=i))
            a.publish_uncommitted(to(one), Note(producer="a", txn=1, i=i))
            b.publish_uncommitted(to(one), Note(producer="b", txn=1, i=i))
            await asyncio.sleep(0)
        await a.commit()

        # D: a consumer-style producer. Transaction 0 commits; its ACK intents are kept (as a
        # consumer checkpoints them). Transaction 1 is published, then the process "fails"
        # and recovers the checkpoint: it re-appends the kept intents, which roll transaction
        # 1 back, and goes on with transaction 2 from a clock past everything it wrote.
        for i in range(3):
            d.publish_uncommitted(to(two), Note(producer="d", txn=0, i=i))
        kept = d.build_ack_intents()
        d.publish_ack_intents(kept)
        for i in range(3):
            d.publish_uncommitted(to(two), Note(producer="d", txn=1, i=i))
        await d.barrier()
        d2 = Publisher(svc, clock=Clock(d.clock + 1000), producer=d.producer)
        d2.publish_ack_intents(kept)
        for i in range(2):
            d2.publish_uncommitted(to(two), Note(producer="d", txn=2, i=i))
        await d2.commit()
        for p in (a, b, c, d):
            await p.barrier()

    want = Counter(
        [("a", 0, i) for i in range(5)]
        + [("a", 1, i) for i in range(3)]
        + [("c", 0, i) for i in range(3)]
        + [("d", 0, i) for i in range(3)]
        + [("d", 2, i) for i in range(2)]
    )
    got: Counter[Key] = Counter()
    uncommitted: Counter[Key] = Counter()
    for journal in (one, two):
        envs, _ = await read_journal(client, journal, committed=True)
        check_order(envs)
        got.update(keys(envs))
        raw, _ = await read_journal(client, journal, committed=False)
        uncommitted.update(keys(raw))
    assert got == want  # Exactly once each; B's and D's rolled-back messages never appear.
    assert uncommitted[("b", 0, 0)] == 1 and uncommitted[("d", 1, 0)] == 1


async def test_long_transactions_are_replayed(client: JournalClient, make_topic: MakeTopic) -> None:
    topic = await make_topic(1)
    journal = topic.names[0]
    async with AppendService(client) as svc:
        a, c = Publisher(svc), Publisher(svc)
        for i in range(10):
            a.publish_uncommitted(to(journal), Note(producer="a", i=i))
            c.publish_committed(to(journal), Note(producer="c", i=i))
            await asyncio.sleep(0)
        await a.commit()
        await c.barrier()

    envs, it = await read_journal(client, journal, committed=True, ring=4)
    assert isinstance(it, ReadCommittedIter) and it.replays == 1
    assert keys(envs) == [("c", 0, i) for i in range(10)] + [("a", 0, i) for i in range(10)]

    envs, it = await read_journal(client, journal, committed=True, ring=64)
    assert isinstance(it, ReadCommittedIter) and it.replays == 0
    assert sorted(keys(envs)) == sorted(
        [("c", 0, i) for i in range(10)] + [("a", 0, i) for i in range(10)]
    )


class Producer:
    """A `txn_producer` subprocess."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc = proc
        self.name = name

    @classmethod
    async def start(
        cls, endpoint: str, selector: str, name: str, first: int, txns: int, per: int
    ) -> Producer:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.message.txn_producer",
            endpoint,
            selector,
            name,
            str(first),
            str(txns),
            str(per),
            cwd=REPO,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        return cls(proc, name)

    async def expect(self, line: str) -> None:
        assert self.proc.stdout is not None
        got = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        assert got.decode().strip() == line, f"{self.name}: {got!r} (wanted {line!r})"

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")

    async def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert await self.proc.wait() == -signal.SIGKILL

    async def finish(self) -> None:
        await self.expect("done")
        assert await asyncio.wait_for(self.proc.wait(), 30) == 0


async def test_producers_killed_before_their_ack(
    client: JournalClient, make_topic: MakeTopic, message_broker: BrokerProcess
) -> None:
    topic = await make_topic(3)
    selector = format_label_selector(topic.selector)
    txns, per = 4, 12
    # Where each producer is SIGKILLed: after publishing this transaction, before its ACK.
    # A replacement process (a new ProducerID, same name) carries on with the next one.
    kill_after = {"p0": 1, "p1": 0, "p2": None}

    async def start(name: str, first: int) -> Producer:
        return await Producer.start(
            message_broker.endpoint, selector, name, first, txns - first, per
        )

    producers = {name: await start(name, 0) for name in kill_after}
    committed: set[tuple[str, int]] = set()
    killed: set[tuple[str, int]] = set()
    try:
        for t in range(txns):  # Round robin: producers' transactions interleave in journals.
            for name in kill_after:
                p = producers[name]
                await p.expect(f"published {t}")
                if kill_after[name] == t:
                    await p.kill()
                    killed.add((name, t))
                    if t + 1 < txns:
                        producers[name] = await start(name, t + 1)
                    else:
                        del producers[name]
                else:
                    p.send("ack")
                    await p.expect(f"committed {t}")
                    committed.add((name, t))
        for p in producers.values():
            await p.finish()
    finally:
        for p in producers.values():
            if p.proc.returncode is None:
                p.proc.kill()
                await p.proc.wait()

    assert killed == {("p0", 1), ("p1", 0)}
    want = Counter((name, t, i) for name, t in committed for i in range(per))
    got: Counter[Key] = Counter()
    uncommitted: Counter[Key] = Counter()
    producer_ids: dict[str, set[bytes]] = defaultdict(set)
    for journal in topic.names:
        envs, _ = await read_journal(client, journal, committed=True)
        check_order(envs)
        got.update(keys(envs))
        raw, _ = await read_journal(client, journal, committed=False)
        uncommitted.update(keys(raw))
        for e in raw:
            if e.message.producer:
                producer_ids[e.message.producer].add(get_producer_id(e.message.uuid))
    assert got == want  # Every committed message once; nothing of a killed transaction.
    for name, t in killed:  # ...although the killed transactions' messages are in the journals.
        assert sum(uncommitted[(name, t, i)] for i in range(per)) == per
    assert {k: len(v) for k, v in producer_ids.items()} == {"p0": 2, "p1": 2, "p2": 1}


async def test_restore_from_a_checkpoint_mid_transaction(
    client: JournalClient, make_topic: MakeTopic
) -> None:
    """A reader checkpointed while a transaction is open resumes exactly where it stopped,
    replaying the transaction's head from before its resume offset when the ACK arrives."""
    topic = await make_topic(1)
    journal = topic.names[0]
    async with AppendService(client) as svc:
        a, c = Publisher(svc), Publisher(svc)
        for i in range(5):
            a.publish_uncommitted(to(journal), Note(producer="a", i=i))
        await a.barrier()
        for i in range(3):
            c.publish_committed(to(journal), Note(producer="c", i=i))
        await c.barrier()
        await a.commit()

    def reader(offset: int, seq: Sequencer) -> ReadCommittedIter:
        req = pb.ReadRequest(journal=journal, offset=offset, block=False)
        return ReadCommittedIter(client, req, None, lambda spec: Note(), seq)

    first = reader(0, Sequencer())
    assert keys([await first.next(), await first.next()]) == [("c", 0, 0), ("c", 0, 1)]
    # c/0 was stepped past (processed); c/1 is the envelope in hand, not yet processed.
    states = first.sequencer.checkpoint(None)
    offsets = first.sequencer.read_through()
    first.close()
    assert any(s.begin == 0 for s in states.values())  # A's open span begins at offset 0.
    assert 0 < offsets[journal]

    resumed = reader(offsets[journal], Sequencer(states, offsets=offsets))
    envs = []
    try:
        async for env in resumed:
            envs.append(env)
    except OffsetNotYetAvailable:
        pass
    resumed.close()
    assert resumed.replays == 1
    assert keys(envs) == [("c", 0, 1), ("c", 0, 2)] + [("a", 0, i) for i in range(5)]


@dataclass
class Row(CSVMessage):
    name: str = ""
    n: int = 0
    uuid: uuid.UUID | None = None


@pytest.mark.parametrize("content_type", ["text/csv", "application/x-protobuf-fixed"])
async def test_transactions_in_every_framing(
    client: JournalClient, make_topic: MakeTopic, content_type: str
) -> None:
    topic = await make_topic(2, content_type=content_type)

    def new(name: str = "", n: int = 0) -> Any:
        if content_type == "text/csv":
            return Row(name=name, n=n)
        # A Label's `value` (a string field) carries the UUID; its `name` the payload.
        return ProtoMessage(pb.Label(name=f"{name}:{n}" if name else ""), uuid_field="value")

    def ident(msg: Any) -> tuple[str, int]:
        if isinstance(msg, Row):
            return msg.name, msg.n
        name, _, n = msg.msg.name.partition(":")
        return name, int(n or 0)

    mapping = rendezvous_mapping(lambda m: str(ident(m)), topic.partitions)
    async with AppendService(client) as svc:
        a, b, c = Publisher(svc), Publisher(svc), Publisher(svc)
        for n in range(20):
            a.publish_uncommitted(mapping, new("a", n))
            b.publish_uncommitted(mapping, new("b", n))  # Never acknowledged.
            c.publish_committed(mapping, new("c", n))
        await a.commit()
        for p in (b, c):
            await p.barrier()

    got = []
    for journal in topic.names:
        req = pb.ReadRequest(journal=journal, block=False)
        it = ReadCommittedIter(client, req, None, lambda spec: new())
        try:
            async for env in it:
                assert env.content_type == content_type
                got.append(ident(env.message))
        except OffsetNotYetAvailable:
            pass
        it.close()
    data = sorted(x for x in got if x[0])  # Acknowledgements carry no name.
    assert data == sorted([("a", n) for n in range(20)] + [("c", n) for n in range(20)])
    assert len(got) - len(data) == len({mapping(new("a", n))[0] for n in range(20)})


async def _raw_append(client: JournalClient, journal: str, data: bytes) -> None:
    from gazette.broker.client.append_service import AppendService as _Svc

    svc = _Svc(client)
    aa = svc.start_append(pb.AppendRequest(journal=journal))
    aa.write(data)
    aa.release()
    await aa.done()
    await svc.close()


async def test_replay_over_an_undecodable_frame_still_delivers(
    client: JournalClient, make_topic: MakeTopic
) -> None:
    from gazette.message.iterators import MessageDecodeError
    from gazette.message.publisher import Publisher as _Pub

    (j,) = (await make_topic(1)).names
    to_j = lambda msg: (j, JSON)  # noqa: E731
    async with AppendService(client) as svc:
        pub = _Pub(svc)
        pub.publish_uncommitted(to_j, Note(txn=1, i=1))
        await pub.barrier()
        await _raw_append(client, j, b'{"i":"not-an-int"}\n')
        pub.publish_uncommitted(to_j, Note(txn=1, i=2))
        await pub.commit()
        pub.publish_committed(to_j, Note(txn=2, i=1))
        await pub.barrier()
    # A one-slot ring forces a replay of [txn 1's first message, its ACK), over the bad frame.
    it = ReadCommittedIter(
        client,
        pb.ReadRequest(journal=j, block=True),
        None,
        lambda spec: Note(),
        Sequencer(ring_size=1),
    )
    got = []
    try:
        while len(got) < 3:
            try:
                env = await asyncio.wait_for(it.next(), 5)
            except MessageDecodeError:
                continue  # reported once by the main read path; the caller skips it
            if env.message.txn:
                got.append((env.message.txn, env.message.i))
    finally:
        it.close()
    assert got == [(1, 1), (1, 2), (2, 1)]
    assert it.replays >= 1


async def test_restore_while_an_ack_at_offset_zero_was_dequeued(
    client: JournalClient, make_topic: MakeTopic
) -> None:
    from gazette.message.publisher import fast_uuid

    (j,) = (await make_topic(1)).names
    ack = Note()
    ack.set_uuid(fast_uuid(0x010203040506, (1 << 60) | 5 << 4, 2))
    await _raw_append(client, j, JSON_FRAMING.marshal(ack))
    seq = Sequencer()
    it = ReadCommittedIter(
        client, pb.ReadRequest(journal=j, block=True), None, lambda spec: Note(), seq
    )
    await asyncio.wait_for(it.next(), 5)
    states, offsets = seq.checkpoint(), seq.read_through()
    it.close()
    restored = Sequencer(states, offsets=offsets)
    it2 = ReadCommittedIter(
        client,
        pb.ReadRequest(journal=j, offset=offsets.get(j, 0), block=True),
        None,
        lambda spec: Note(),
        restored,
    )
    try:
        env = await asyncio.wait_for(it2.next(), 5)  # hung forever before the fix
    finally:
        it2.close()
    assert env.message.get_uuid() == ack.get_uuid()
