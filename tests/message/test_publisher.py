"""Publisher: UUID assignment, per-journal batching, ACK intents, and a broker round trip."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.broker.client import AppendService, JournalClient, OffsetNotYetAvailable
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.message import JSON_FRAMING, Envelope, Flags, UnknownFramingError
from gazette.message.iterators import ReadCommittedIter, ReadUncommittedIter
from gazette.message.mapping import MappingFunc, NoPartitions, modulo_mapping, random_mapping
from gazette.message.publisher import AckIntent, Publisher, fast_uuid
from gazette.message.uuid import (
    Clock,
    ProducerID,
    build_uuid,
    clock_from_unix_ns,
    get_clock,
    get_flags,
    get_producer_id,
)
from tests.kit.eventually import eventually
from tests.message.conftest import JSON, MakeTopic, Note

PRODUCER = ProducerID(bytes.fromhex("0b0203040506"))


class FakeAppend:
    def __init__(self, service: FakeService, journal: str) -> None:
        self.service = service
        self.journal = journal
        self.data = bytearray()
        self.released = False
        self.aborted = False
        self.callbacks: list[Any] = []
        self.dependencies: Any = ()

    def write(self, data: bytes) -> None:
        assert not self.released
        self.data += data

    def release(self) -> FakeAppend:
        self.released = True
        self.service.released.append(self)
        return self

    def abort(self, cause: BaseException | None = None) -> None:
        self.aborted = True

    def is_done(self) -> bool:
        return False

    def error(self) -> BaseException | None:
        return None

    def add_done_callback(self, fn: Any) -> None:
        self.callbacks.append(fn)


class FakeService:
    """Records what a Publisher starts, writes and releases (nothing is sent)."""

    def __init__(self) -> None:
        self.started: list[FakeAppend] = []
        self.released: list[FakeAppend] = []

    def start_append(self, request: pb.AppendRequest, dependencies: Any = ()) -> FakeAppend:
        a = FakeAppend(self, request.journal)
        a.dependencies = tuple(dependencies)
        self.started.append(a)
        return a


def fake_publisher(**kw: Any) -> tuple[Publisher, FakeService]:
    svc = FakeService()
    return Publisher(svc, **kw), svc  # type: ignore[arg-type]


def to(journal: str, content_type: str = JSON) -> MappingFunc:
    return lambda msg: (journal, content_type)


def decode(data: bytes | bytearray) -> list[Note]:
    dec = JSON_FRAMING.decoder(0)
    dec.feed(bytes(data))
    out = []
    for ev in dec.events():
        n = Note()
        JSON_FRAMING.unmarshal(ev.payload, n)  # type: ignore[union-attr]
        out.append(n)
    assert dec.at_boundary()
    return out


@given(
    producer=st.binary(min_size=6, max_size=6),
    clock=st.integers(min_value=0, max_value=(1 << 64) - 1),
    flags=st.integers(min_value=0, max_value=0x3FF),
)
def test_fast_uuid_is_build_uuid(producer: bytes, clock: int, flags: int) -> None:
    u = fast_uuid(int.from_bytes(producer, "big"), clock, flags)
    want = build_uuid(ProducerID(producer), Clock(clock), flags)
    assert u == want and u.bytes == want.bytes and str(u) == str(want) and hash(u) == hash(want)
    assert u.is_safe == uuid.SafeUUID.unknown


async def test_manual_clock_ticks_across_timestamps() -> None:
    start = Clock(clock_from_unix_ns(1_700_000_000 * 10**9) | 0xD)  # 3 ticks from a boundary.
    pub, _ = fake_publisher(clock=start, producer=PRODUCER)
    uuids = []
    for i in range(40):
        msg = Note(i=i)
        pub.publish_committed(to("a/j"), msg)
        assert msg.uuid is not None
        uuids.append(msg.uuid)
    assert [get_clock(u) for u in uuids] == [start + 1 + i for i in range(40)]
    for u in uuids:
        assert u == build_uuid(PRODUCER, get_clock(u), Flags.OUTSIDE_TXN)
        assert get_producer_id(u) == PRODUCER
    assert pub.clock == start + 40

    # A manual clock moves only when told to, and never backwards.
    pub.update_clock(0)
    assert pub.clock == start + 40
    now = time.time_ns()
    pub.update_clock(now)
    msg = Note()
    pub.publish_committed(to("a/j"), msg)
    assert msg.uuid is not None and get_clock(msg.uuid) == clock_from_unix_ns(now) + 1


async def test_automatic_clock_follows_wall_time() -> None:
    pub, _ = fake_publisher()
    clocks = []
    for _ in range(5):
        before = clock_from_unix_ns(time.time_ns())
        for _ in range(50):
            msg = Note()
            pub.publish_committed(to("a/j"), msg)
            assert msg.uuid is not None
            clocks.append(get_clock(msg.uuid))
        assert clocks[-50] > before  # Each new batch re-reads the wall clock.
        assert clocks[-1] < clock_from_unix_ns(time.time_ns() + 1_000_000_000)
        await asyncio.sleep(0.01)  # Release the batch: the next one opens afresh.
    assert clocks == sorted(set(clocks))
    assert clocks[-1] - clocks[0] > (40_000_000 // 100) << 4  # >= 40 ms of sleeps passed.


async def test_messages_of_a_journal_share_a_batch_until_the_loop_runs() -> None:
    pub, svc = fake_publisher()
    a1 = pub.publish_committed(to("a/one"), Note(i=1))
    b1 = pub.publish_committed(to("a/two"), Note(i=2))
    a2 = pub.publish_committed(to("a/one"), Note(i=3))
    assert a1 is a2 and a1 is not b1
    assert len(svc.started) == 2 and not svc.released
    await asyncio.sleep(0)
    assert [a.journal for a in svc.released] == ["a/one", "a/two"]
    assert [n.i for n in decode(svc.released[0].data)] == [1, 3]
    assert [n.i for n in decode(svc.released[1].data)] == [2]

    # After the loop ran, a new batch opens.
    a3 = pub.publish_committed(to("a/one"), Note(i=4))
    assert a3 is not a1
    assert pub.flush() == [a3]
    assert svc.released[-1] is cast(Any, a3)


async def test_linger_keeps_a_batch_open_across_yields() -> None:
    # The linger is long next to the trickle's ~10 ms, so that a loaded machine (the trickle
    # then takes longer) still finds the batch open.
    pub, svc = fake_publisher(linger=0.5)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    appends = []
    for i in range(5):  # A trickle: the task yields between messages.
        appends.append(pub.publish_committed(to("a/one"), Note(i=i)))
        await asyncio.sleep(0.002)  # Paces the trickle.
    assert len(set(map(id, appends))) == 1 and not svc.released
    await eventually(lambda: svc.released, what="the batch's release", timeout=5, interval=0.002)
    assert loop.time() - t0 >= 0.5 - 0.002
    assert [n.i for n in decode(svc.released[0].data)] == list(range(5))
    # flush() still releases at once; so does a full batch.
    a = pub.publish_committed(to("a/one"), Note(i=9))
    assert pub.flush() == [a] and svc.released[-1] is cast(Any, a)
    with pytest.raises(ValueError, match="linger"):
        fake_publisher(linger=-1)


async def test_full_batches_are_released_in_order() -> None:
    pub, svc = fake_publisher(max_batch_bytes=300)
    for i in range(10):
        pub.publish_committed(to("a/one"), Note(producer="p", i=i))
    released_early = len(svc.released)
    assert released_early >= 2  # ~100-byte frames, 300-byte batches.
    await asyncio.sleep(0)
    seen = [n.i for a in svc.released for n in decode(a.data)]
    assert seen == list(range(10))
    clocks = [get_clock(n.uuid) for a in svc.released for n in decode(a.data) if n.uuid]
    assert clocks == sorted(clocks)


class Picky(Note):
    def validate(self) -> None:
        if self.i < 0:
            raise ValueError("negative i")


async def test_nothing_is_written_when_publish_fails() -> None:
    pub, svc = fake_publisher()
    with pytest.raises(ValueError, match="negative"):
        pub.publish_committed(to("a/one"), Picky(i=-1))
    assert not svc.started

    with pytest.raises(NoPartitions):
        pub.publish_committed(random_mapping(lambda: []), Note())
    with pytest.raises(UnknownFramingError):
        pub.publish_committed(to("a/one", "application/x-unknown"), Note())
    assert not svc.started

    class Unframeable:
        def set_uuid(self, u: uuid.UUID) -> None:
            self.u = u

    with pytest.raises(Exception, match="to_json"):
        pub.publish_committed(to("a/one"), Unframeable())
    await asyncio.sleep(0)
    # The batch opened for it had no content: it is aborted rather than sent empty.
    assert len(svc.started) == 1 and svc.started[0].aborted and not svc.released

    pub.publish_committed(to("a/one"), Picky(i=1))
    await asyncio.sleep(0)
    assert [n.i for n in decode(svc.released[0].data)] == [1]


async def test_ack_intents_acknowledge_each_journal_of_the_transaction() -> None:
    pub, svc = fake_publisher(producer=PRODUCER)
    assert pub.build_ack_intents() == []
    msgs = []
    for journal in ["a/two", "a/one", "a/two"]:
        msg = Note(producer="p")
        pub.publish_uncommitted(to(journal), msg)
        msgs.append(msg)
    assert pub.pending_journals() == ["a/two", "a/one"]
    for m in msgs:
        assert m.uuid is not None and get_flags(m.uuid) == Flags.CONTINUE_TXN

    intents = pub.build_ack_intents()
    assert [i.journal for i in intents] == ["a/two", "a/one"]
    assert all(isinstance(i, AckIntent) for i in intents)
    top = max(get_clock(m.uuid) for m in msgs if m.uuid)
    acks = [decode(i.intent)[0] for i in intents]
    for ack in acks:
        assert ack.uuid is not None
        assert get_flags(ack.uuid) == Flags.ACK_TXN
        assert get_producer_id(ack.uuid) == PRODUCER
        assert get_clock(ack.uuid) > top
        assert ack.producer == ""  # A fresh message from new_acknowledgement.
    assert pub.build_ack_intents() == [] and pub.pending_journals() == []

    # Building the intents released the transaction's batches, then queued one ACK append
    # per journal right behind them: each ACK's place in its journal is reserved before
    # anything published later. The ACKs wait on a gate (opened by publish_ack_intents) and
    # on every append of the transaction, in every journal.
    flags = [
        (a.journal, [get_flags(n.uuid) for n in decode(a.data) if n.uuid]) for a in svc.released
    ]
    assert flags == [
        ("a/two", [Flags.CONTINUE_TXN, Flags.CONTINUE_TXN]),
        ("a/one", [Flags.CONTINUE_TXN]),
        ("a/two", [Flags.ACK_TXN]),
        ("a/one", [Flags.ACK_TXN]),
    ]
    batches, acks = svc.released[:2], svc.released[2:]
    gate = acks[0].dependencies[0]
    assert isinstance(gate, asyncio.Future) and not gate.done()
    for ack in acks:
        assert ack.dependencies[0] is gate
        assert all(any(d is b for d in ack.dependencies) for b in batches)

    # A message published now lands behind the ACKs in its journal.
    later = Note()
    pub.publish_uncommitted(to("a/two"), later)
    assert pub.publish_ack_intents(intents) == acks  # type: ignore[comparison-overlap]
    assert gate.done() and gate.exception() is None
    pub.flush()
    assert svc.released[-1].journal == "a/two" and svc.released[-1] not in acks


async def test_release_into_a_closed_service(
    client: JournalClient, make_topic: MakeTopic, caplog: pytest.LogCaptureFixture
) -> None:
    topic = await make_topic(1)
    svc = AppendService(client)
    pub = Publisher(svc)
    aa = pub.publish_committed(to(topic.names[0]), Note())
    await svc.close()  # Forgot pub.flush() / barrier(): the open batch can't be sent.
    with caplog.at_level(logging.WARNING):
        await asyncio.sleep(0)
    assert "closed AppendService" in caplog.text
    with pytest.raises(RuntimeError):
        await aa.done()
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish_committed(to(topic.names[0]), Note())


async def read_all(
    client: JournalClient, journal: str, make: Callable[..., Any] = ReadUncommittedIter
) -> list[Envelope]:
    it = make(client, pb.ReadRequest(journal=journal, block=False), None, lambda spec: Note())
    out = []
    try:
        async for env in it:
            out.append(env)
    except OffsetNotYetAvailable:
        pass
    finally:
        it.close()
    return out


async def test_publish_committed_round_trip(client: JournalClient, make_topic: MakeTopic) -> None:
    topic = await make_topic(3)
    mapping = modulo_mapping(lambda n: f"{n.producer}/{n.i % 7}", topic.partitions)
    async with AppendService(client) as svc:
        async with Publisher(svc) as pub:
            for i in range(600):
                pub.publish_committed(mapping, Note(producer="p", i=i))
                if i % 100 == 99:
                    await asyncio.sleep(0)
            last = pub.publish_committed(mapping, Note(producer="p", i=600))
        resp = await last.done()
        assert resp.commit.journal in topic.names

    seen: list[int] = []
    for journal in topic.names:
        envs = await read_all(client, journal)
        offset = 0
        for env in envs:
            assert env.journal == journal and env.content_type == JSON
            assert env.begin == offset
            offset = env.end
            assert env.message.uuid is not None
            assert get_flags(env.message.uuid) == Flags.OUTSIDE_TXN
            assert mapping(env.message)[0] == journal
        clocks = [get_clock(e.message.uuid) for e in envs]
        assert clocks == sorted(set(clocks))  # Journal order is clock order.
        seen += [e.message.i for e in envs]
        committed = await read_all(client, journal, ReadCommittedIter)
        assert [e.message.i for e in committed] == [e.message.i for e in envs]
    assert sorted(seen) == list(range(601))
    assert len({mapping(Note(producer="p", i=k))[0] for k in range(7)}) > 1
