"""Append and Read against a real broker process: round trips, atomicity, blocking, errors."""

from __future__ import annotations

import asyncio
import hashlib

import grpc
import pytest

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.broker.protocol.sha1sum import sha1sum_from_digest

from .conftest import MakeJournal, append, read_all


async def test_append_then_read_round_trip(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    r1 = await append(stub, spec.name, b"hello, ", b"world\n")
    assert r1.status == pb.OK
    assert (r1.commit.begin, r1.commit.end) == (0, 13)
    assert r1.commit.sum == sha1sum_from_digest(hashlib.sha1(b"hello, world\n").digest())
    assert r1.header.route.members[0].suffix == "broker-1"
    r2 = await append(stub, spec.name, b"second\n")
    assert (r2.commit.begin, r2.commit.end) == (13, 20)

    content, metas = await read_all(stub, spec.name)
    assert content == b"hello, world\nsecond\n"
    assert metas[0].header.process_id.suffix == "broker-1"
    assert metas[-1].status == pb.OFFSET_NOT_YET_AVAILABLE
    assert metas[-1].write_head == 20

    # Reading from the middle, and with an end offset.
    content, _ = await read_all(stub, spec.name, offset=7, end_offset=12)
    assert content == b"world"


async def test_zero_byte_append_commits_nothing(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    r = await append(stub, spec.name)
    assert r.status == pb.OK and r.commit.begin == r.commit.end == 0
    assert r.commit.sum == pb.SHA1Sum()


async def test_read_from_write_head_blocks_until_append(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    await append(stub, spec.name, b"before\n")
    got: list[pb.ReadResponse] = []

    async def reader() -> None:
        async for resp in stub.Read(pb.ReadRequest(journal=spec.name, offset=-1, block=True)):
            got.append(resp)
            if resp.content:
                return

    task = asyncio.create_task(reader())
    await asyncio.sleep(0.3)
    assert not task.done(), "a blocking read at the write head must wait"
    await append(stub, spec.name, b"after\n")
    await asyncio.wait_for(task, 5)
    assert got[-1].content == b"after\n"
    assert got[0].offset == 7


async def test_non_blocking_read_at_head_is_not_yet_available(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    content, metas = await read_all(stub, spec.name, offset=0)
    assert content == b""
    assert metas[0].status == pb.OFFSET_NOT_YET_AVAILABLE


async def test_a_forwarded_read_routed_by_a_newer_view_waits_for_it(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    """A read another broker forwarded carries that broker's header: its route of the
    journal and its etcd revision. A route other than ours, at a revision ahead of ours,
    says our view is behind the one the read was routed by (we may be a peer not yet
    synchronised, which would answer that the journal is empty): the read is served once
    our keyspace reached that revision, as upstream's brokers do. With the same route it is
    served at once: a revision ahead then may be one no event of the brokers' keyspace
    reaches (etcd's global revision, from a load or a progress notification)."""
    spec = await make_journal()
    r = await append(stub, spec.name, b"x\n")
    await asyncio.sleep(0.3)  # The broker's own writes (the route it advertises) are done.
    listed = await stub.ListFragments(pb.FragmentsRequest(journal=spec.name))
    ahead = listed.header.etcd.revision + 1
    forwarded = pb.Header()  # as a forwarding broker a revision ahead would send it
    forwarded.CopyFrom(r.header)
    forwarded.process_id.CopyFrom(pb.ProcessSpec.ID(zone="elsewhere", suffix="broker-9"))
    forwarded.etcd.revision = ahead

    same_route = await asyncio.wait_for(read_all(stub, spec.name, header=forwarded), 5)
    assert same_route[0] == b"x\n"

    forwarded.route.primary = -1  # The forwarder's view of the route differs from ours.
    task = asyncio.create_task(read_all(stub, spec.name, header=forwarded))
    await asyncio.sleep(0.5)
    assert not task.done(), "answered from a view older than the forwarding broker's"
    await make_journal()  # etcd's revision moves past the header's
    content, metas = await asyncio.wait_for(task, 10)
    assert content == b"x\n"
    assert metas[0].header.etcd.revision >= ahead


async def test_concurrent_appends_never_interleave(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal(length=64 << 10)
    writers, per_writer = 8, 12

    async def writer(w: int) -> list[tuple[int, int]]:
        spans = []
        for i in range(per_writer):
            # Several chunks per append, so interleaving would be visible if it happened.
            record = [f"<{w}:{i}:{c}>".encode() * 50 for c in range(4)]
            r = await append(stub, spec.name, *record)
            assert r.status == pb.OK
            spans.append((r.commit.begin, r.commit.end))
        return spans

    results = await asyncio.gather(*(writer(w) for w in range(writers)))
    content, _ = await read_all(stub, spec.name)
    for w, spans in enumerate(results):
        for i, (begin, end) in enumerate(spans):
            expect = b"".join(f"<{w}:{i}:{c}>".encode() * 50 for c in range(4))
            assert content[begin:end] == expect
    assert len(content) == sum(e - b for spans in results for b, e in spans)


async def test_append_without_commit_message_rolls_back(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    await append(stub, spec.name, b"kept\n")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await append(stub, spec.name, b"rolled back", commit=False)
    assert err.value.code() == grpc.StatusCode.ABORTED
    r = await append(stub, spec.name, b"next\n")
    assert r.commit.begin == 5
    content, _ = await read_all(stub, spec.name)
    assert content == b"kept\nnext\n"


async def test_cancelled_append_leaves_no_bytes(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    sent = asyncio.Event()

    async def requests():  # type: ignore[no-untyped-def]
        yield pb.AppendRequest(journal=spec.name)
        yield pb.AppendRequest(content=b"partial " * 1000)
        sent.set()
        # Stalls mid-append: the test cancels the call meanwhile.
        await asyncio.sleep(30)

    call = stub.Append(requests())
    await sent.wait()
    # Time for the partial content to reach the broker before the cancel.
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # Time for the broker to see the call cancelled before the next append.
    await asyncio.sleep(0.2)
    r = await append(stub, spec.name, b"whole\n")
    assert r.commit.begin == 0
    content, _ = await read_all(stub, spec.name)
    assert content == b"whole\n"


async def test_wrong_append_offset(stub: pb_grpc.JournalStub, make_journal: MakeJournal) -> None:
    spec = await make_journal()
    await append(stub, spec.name, b"12345")
    r = await append(stub, spec.name, b"x", offset=3)
    assert r.status == pb.WRONG_APPEND_OFFSET
    r = await append(stub, spec.name, b"x", offset=5)
    assert r.status == pb.OK and r.commit.begin == 5


async def test_unknown_journal(stub: pb_grpc.JournalStub) -> None:
    r = await append(stub, "tests/does-not-exist", b"x")
    assert r.status == pb.JOURNAL_NOT_FOUND
    _, metas = await read_all(stub, "tests/does-not-exist")
    assert metas[0].status == pb.JOURNAL_NOT_FOUND


@pytest.mark.parametrize(
    "request_kw, field",
    [
        ({"journal": "bad//name"}, "journal"),
        ({"journal": "a"}, "journal"),
        ({"journal": "tests/ok-name", "offset": -5}, "offset"),
    ],
)
async def test_invalid_read_requests_are_rejected(
    stub: pb_grpc.JournalStub, request_kw: dict, field: str
) -> None:  # type: ignore[type-arg]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.Read(pb.ReadRequest(**request_kw)):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details().lower()


async def test_invalid_append_request_is_rejected(stub: pb_grpc.JournalStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await append(stub, "/leading/slash", b"x")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "journal" in err.value.details().lower()


async def test_content_after_commit_message_is_a_protocol_error(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal()

    async def requests():  # type: ignore[no-untyped-def]
        yield pb.AppendRequest(journal=spec.name)
        yield pb.AppendRequest(content=b"a")
        yield pb.AppendRequest()
        yield pb.AppendRequest(content=b"b")

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Append(requests())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    content, _ = await read_all(stub, spec.name)
    assert content == b""


async def test_metadata_only_read(stub: pb_grpc.JournalStub, make_journal: MakeJournal) -> None:
    spec = await make_journal()
    await append(stub, spec.name, b"abcdef")
    content, metas = await read_all(stub, spec.name, metadata_only=True)
    assert content == b""
    assert len(metas) == 1
    assert (metas[0].fragment.begin, metas[0].fragment.end, metas[0].write_head) == (0, 6, 6)


async def test_blocked_read_ends_when_journal_is_deleted(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    responses: list[pb.ReadResponse] = []

    async def reader() -> None:
        async for resp in stub.Read(pb.ReadRequest(journal=spec.name, offset=0, block=True)):
            responses.append(resp)

    task = asyncio.create_task(reader())
    # Time for the read to reach the broker and block at the write head.
    await asyncio.sleep(0.3)
    listing = [r async for r in stub.List(pb.ListRequest())]
    rev = next(j.mod_revision for r in listing for j in r.journals if j.spec.name == spec.name)
    r = await stub.Apply(
        pb.ApplyRequest(changes=[pb.ApplyRequest.Change(delete=spec.name, expect_mod_revision=rev)])
    )
    assert r.status == pb.OK
    await asyncio.wait_for(task, 5)
    assert responses[-1].status == pb.JOURNAL_NOT_FOUND


async def test_storeless_journal_keeps_bytes_and_offsets_across_restarts(
    broker, make_journal: MakeJournal
) -> None:  # type: ignore[no-untyped-def]
    import grpc

    spec = await make_journal(store=None)
    async with grpc.aio.insecure_channel(broker.endpoint) as ch:
        s = pb_grpc.JournalStub(ch)
        assert (await append(s, spec.name, b"z" * 1000)).commit.end == 1000
    broker.kill()
    broker.start()
    async with grpc.aio.insecure_channel(broker.endpoint) as ch:
        s = pb_grpc.JournalStub(ch)
        content, _ = await read_all(s, spec.name)
        assert content == b"z" * 1000, "a crash must not drop committed bytes"
    broker.stop()
    broker.start()
    async with grpc.aio.insecure_channel(broker.endpoint) as ch:
        s = pb_grpc.JournalStub(ch)
        r = await append(s, spec.name, b"next")
        assert (r.commit.begin, r.commit.end) == (1000, 1004), "offsets are never reused"


async def test_max_append_rate_throttles_appends(stub: pb_grpc.JournalStub) -> None:
    import time

    from .conftest import journal_spec

    spec = journal_spec("tests/rate/limited", None)
    spec.max_append_rate = 100_000  # bytes/s; the bucket holds one second of burst
    r = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
    assert r.status == pb.OK
    t0 = time.monotonic()
    total_delayed = 0
    for _ in range(6):
        r = await append(stub, spec.name, *([b"r" * 10_000] * 5))  # 50 kB per append
        assert r.status == pb.OK
        total_delayed += r.delayed_chunks
    elapsed = time.monotonic() - t0
    # 300 kB at 100 kB/s with a 100 kB burst: at least ~2 s.
    assert elapsed >= 1.8, elapsed
    assert total_delayed > 0
    assert r.commit.end == 300_000
