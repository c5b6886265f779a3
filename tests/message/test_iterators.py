"""ReadUncommittedIter: framing, desyncs, offset jumps, truncation and non-blocking reads."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gazette.broker.client import AppendService, JournalClient, OffsetNotYetAvailable, append
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.message import JSON_FRAMING
from gazette.message.envelope import Envelope
from gazette.message.iterators import MessageDecodeError, ReadUncommittedIter, TruncatedFrame
from gazette.message.mapping import MappingFunc
from gazette.message.publisher import Publisher
from tests.message.conftest import JSON, MakeTopic, Note


def frame(i: int) -> bytes:
    return JSON_FRAMING.marshal(Note(producer="p", i=i))


class FakeReader:
    """A RetryReader stand-in returning scripted (offset, bytes) reads."""

    def __init__(self, journal: str, reads: list[tuple[int, bytes]]) -> None:
        self.journal = journal
        self.reads = list(reads)
        self.offset = reads[0][0] if reads else 0
        self.closed = False

    async def read(self, n: int = -1) -> bytes:
        if not self.reads:
            return b""
        offset, data = self.reads.pop(0)
        self.offset = offset + len(data)
        return data

    def close(self) -> None:
        self.closed = True


def fake_iter(reads: list[tuple[int, bytes]]) -> ReadUncommittedIter:
    reader: Any = FakeReader("a/journal", reads)
    return ReadUncommittedIter(
        None,  # type: ignore[arg-type]
        "a/journal",
        JSON_FRAMING,
        lambda spec: Note(),
        reader=reader,
    )


async def collect(it: ReadUncommittedIter) -> list[Envelope]:
    return [env async for env in it]


async def test_frames_split_across_reads() -> None:
    data = b"".join(frame(i) for i in range(5))
    reads = [(100 + k, data[k : k + 7]) for k in range(0, len(data), 7)]
    envs = await collect(fake_iter(reads))
    assert [e.message.i for e in envs] == list(range(5))
    assert envs[0].begin == 100 and envs[-1].end == 100 + len(data)
    assert all(a.end == b.begin for a, b in zip(envs, envs[1:], strict=False))
    assert all(e.journal == "a/journal" and e.content_type == JSON for e in envs)


async def test_offset_jump_restarts_the_decoder() -> None:
    f0, f1, f2, f3 = (frame(i) for i in range(4))
    it = fake_iter([(0, f0 + f1[:10]), (5000, f2 + f3)])  # f1's tail is gone.
    envs = await collect(it)
    assert [(e.message.i, e.begin) for e in envs] == [(0, 0), (2, 5000), (3, 5000 + len(f2))]
    assert it.jumps == 1


async def test_desync_is_skipped() -> None:
    it = fake_iter([(0, frame(0) + b"not json\n" + frame(1))])
    envs = await collect(it)
    assert [e.message.i for e in envs] == [0, 1]
    assert it.desyncs == 1
    assert envs[1].begin == len(frame(0)) + len(b"not json\n")


async def test_truncated_frame_at_the_end() -> None:
    it = fake_iter([(0, frame(0) + frame(1)[:-3])])
    assert (await it.next()).message.i == 0
    with pytest.raises(TruncatedFrame) as info:
        await it.next()
    assert info.value.offset == len(frame(0))


async def test_undecodable_message() -> None:
    it = fake_iter([(0, b'{"i": "not an int"}\n')])
    with pytest.raises(MessageDecodeError) as info:
        await it.next()
    assert (info.value.begin, info.value.end) == (0, 20)


def to(journal: str) -> MappingFunc:
    return lambda msg: (journal, JSON)


async def test_non_blocking_reads_resume(client: JournalClient, make_topic: MakeTopic) -> None:
    topic = await make_topic(1)
    journal = topic.names[0]
    async with AppendService(client) as svc, Publisher(svc) as pub:
        for i in range(3):
            pub.publish_committed(to(journal), Note(i=i))

    # Spec fetched from the broker (framing None).
    it = ReadUncommittedIter(
        client, pb.ReadRequest(journal=journal, block=False), None, lambda spec: Note()
    )
    got = []
    with pytest.raises(OffsetNotYetAvailable):
        while True:
            got.append((await it.next()).message.i)
    assert got == [0, 1, 2] and it.spec is not None and it.spec.name == journal

    # Raw garbage, then more messages: the reader continues where it stopped.
    await append(client, pb.AppendRequest(journal=journal), b"garbage\n")
    async with AppendService(client) as svc, Publisher(svc) as pub:
        pub.publish_committed(to(journal), Note(i=3))
    assert (await it.next()).message.i == 3
    assert it.desyncs == 1
    it.close()

    # A blocking read with the spec given, waiting for a message published meanwhile.
    it = ReadUncommittedIter(client, journal, topic.journals[0].spec, lambda spec: Note())
    envs = [await it.next() for _ in range(4)]
    assert [e.message.i for e in envs] == [0, 1, 2, 3]
    waiting = asyncio.create_task(it.next())
    await asyncio.sleep(0.1)
    assert not waiting.done()
    async with AppendService(client) as svc, Publisher(svc) as pub:
        pub.publish_committed(to(journal), Note(i=4))
    assert (await asyncio.wait_for(waiting, 10)).message.i == 4
    it.close()

    # A read bounded by end_offset ends with StopAsyncIteration, or inside a frame.
    bounded = ReadUncommittedIter(
        client,
        pb.ReadRequest(journal=journal, offset=0, end_offset=envs[1].end),
        JSON_FRAMING,
        lambda spec: Note(),
    )
    assert [e.message.i for e in await collect(bounded)] == [0, 1]
    cut = ReadUncommittedIter(
        client,
        pb.ReadRequest(journal=journal, offset=0, end_offset=envs[0].end + 5),
        JSON_FRAMING,
        lambda spec: Note(),
    )
    assert (await cut.next()).message.i == 0
    with pytest.raises(TruncatedFrame):
        await cut.next()
