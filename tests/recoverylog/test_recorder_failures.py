"""Recorder failure handling against a scripted fake broker: a failed append stops every later
one (no gaps in the log), and a regressing write head breaks the Recorder."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from gazette.broker.client import (
    AppendAborted,
    AppendService,
    FragmentStoreUnhealthy,
    JournalClient,
)
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.recorder import (
    MAX_WRITE_CHUNK,
    Recorder,
    RecorderBroken,
    WriteHeadRegressed,
)

LOG = "fake/recovery-log"


class FakeJournal(pb_grpc.JournalServicer):
    """Answers each Append RPC with the next scripted response; records the requests."""

    def __init__(self, *responses: pb.AppendResponse) -> None:
        self.responses = deque(responses)
        self.calls: list[list[pb.AppendRequest]] = []

    async def Append(self, request_iterator: Any, context: Any) -> pb.AppendResponse:  # noqa: N802
        self.calls.append([m async for m in request_iterator])
        return self.responses.popleft()


class FakeBroker:
    def __init__(self, *responses: pb.AppendResponse) -> None:
        self.journal = FakeJournal(*responses)  # type: ignore[abstract]  # Append only.
        self.server = grpc.aio.server()
        pb_grpc.add_JournalServicer_to_server(self.journal, self.server)
        self.endpoint = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"

    async def __aenter__(self) -> FakeBroker:
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(None)


def ok(begin: int, end: int) -> pb.AppendResponse:
    return pb.AppendResponse(
        status=pb.OK,
        commit=pb.Fragment(journal=LOG, begin=begin, end=end, compression_codec=pb.NONE),
    )


async def test_a_failed_append_stops_later_ones(tmp_path: Path) -> None:
    failed = pb.AppendResponse(status=pb.FRAGMENT_STORE_UNHEALTHY)
    async with FakeBroker(failed, ok(0, 1 << 30)) as fb, JournalClient(fb.endpoint) as client:
        async with AppendService(client) as svc:
            rec = Recorder(FSM(LOG), 0xA1, tmp_path, svc, LOG)
            f = rec.record_create("f")
            chunk = b"x" * MAX_WRITE_CHUNK
            for i in range(40):  # 20 MiB: more than one batch (one Append RPC each).
                rec.record_write(f, i * len(chunk), chunk)
            with pytest.raises(RecorderBroken) as info:
                await rec.barrier()
            assert isinstance(info.value.__cause__, FragmentStoreUnhealthy)
            with pytest.raises(RecorderBroken):
                rec.record_write(f, 0, b"more")
        # Only the first batch was sent: the log can't hold later ops without the failed ones.
        assert len(fb.journal.calls) == 1
        sent = sum(len(m.content) for m in fb.journal.calls[0])
        assert 0 < sent < 20 << 20


async def test_no_batch_is_sent_after_a_failed_one(tmp_path: Path) -> None:
    # With a 1 MiB batch size, the ops span several RPCs: after the first failed, none of the
    # others is sent.
    failed = pb.AppendResponse(status=pb.FRAGMENT_STORE_UNHEALTHY)
    oks = [ok(i << 20, (i + 1) << 20) for i in range(20)]
    async with FakeBroker(failed, *oks) as fb, JournalClient(fb.endpoint) as client:
        async with AppendService(client, max_batch_bytes=1 << 20) as svc:
            rec = Recorder(FSM(LOG), 0xA1, tmp_path, svc, LOG)
            f = rec.record_create("f")
            chunk = b"x" * MAX_WRITE_CHUNK
            for i in range(8):
                rec.record_write(f, i * len(chunk), chunk)
            with pytest.raises(RecorderBroken) as info:
                await rec.barrier()
            assert isinstance(info.value.__cause__, FragmentStoreUnhealthy)
        assert len(fb.journal.calls) == 1


async def test_small_batches_commit_in_order(tmp_path: Path) -> None:
    oks = [ok(i << 20, (i + 1) << 20) for i in range(20)]
    async with FakeBroker(*oks) as fb, JournalClient(fb.endpoint) as client:
        async with AppendService(client, max_batch_bytes=1 << 20) as svc:
            rec = Recorder(FSM(LOG), 0xA1, tmp_path, svc, LOG)
            f = rec.record_create("f")
            chunk = b"x" * MAX_WRITE_CHUNK
            for i in range(8):
                rec.record_write(f, i * len(chunk), chunk)
            await rec.barrier()
        sizes = [sum(len(m.content) for m in call) for call in fb.journal.calls]
        assert sum(sizes) == rec.bytes_recorded
        assert all(0 < n <= 1 << 20 for n in sizes)


async def test_a_regressing_write_head_breaks_the_recorder(tmp_path: Path) -> None:
    async with FakeBroker(ok(100, 200), ok(50, 60)) as fb, JournalClient(fb.endpoint) as client:
        async with AppendService(client) as svc:
            rec = Recorder(FSM(LOG), 0xA1, tmp_path, svc, LOG)
            rec.record_create("a")
            assert (await rec.barrier()).commit.end == rec.write_head == 200
            rec.record_create("b")
            with pytest.raises(RecorderBroken) as info:
                await rec.barrier()
            assert isinstance(info.value.__cause__, WriteHeadRegressed)
            assert info.value.offset == 200


async def test_barrier_cancellation_cancels_only_the_wait(tmp_path: Path) -> None:
    # "a" and "b", released in one turn, go as one Append RPC.
    async with FakeBroker(ok(0, 20)) as fb, JournalClient(fb.endpoint) as client:
        async with AppendService(client) as svc:
            rec = Recorder(FSM(LOG), 0xA1, tmp_path, svc, LOG)
            rec.record_create("a")
            first = rec.barrier()
            first.cancel()
            rec.record_create("b")
            resp = await rec.barrier()
            assert resp.commit.end == rec.write_head == 20
            assert rec.error is None


async def test_an_unconfirmed_barrier_appends_only_what_is_uncommitted(tmp_path: Path) -> None:
    """`barrier(confirm=False)` resolves at once, with no append, once every op recorded is
    committed; a confirmed barrier issues an empty append then (it fails if fenced since)."""
    async with (
        FakeBroker(ok(0, 0), ok(0, 10), ok(10, 10), ok(10, 20)) as fb,
        JournalClient(fb.endpoint) as client,
    ):
        async with AppendService(client) as svc:
            rec = Recorder(FSM(LOG), 0xA1, tmp_path, svc, LOG)
            await rec.barrier(confirm=False)  # Nothing appended yet: one append learns.
            assert len(fb.journal.calls) == 1
            rec.record_create("a")
            first = await rec.barrier(confirm=False)
            assert len(fb.journal.calls) == 2 and first.commit.end == 10
            again = await rec.barrier(confirm=False)
            assert len(fb.journal.calls) == 2 and again == first
            confirmed = await rec.barrier()
            assert len(fb.journal.calls) == 3 and confirmed.commit.end == 10
            rec.record_create("b")
            resp = await rec.barrier(confirm=False)
            assert len(fb.journal.calls) == 4 and resp.commit.end == rec.write_head == 20


async def test_appends_unreleased_when_the_service_closes_are_aborted(tmp_path: Path) -> None:
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        svc = AppendService(client)
        rec = Recorder(FSM(LOG), 0xA1, tmp_path, svc, LOG)
        f = rec.record_create("f")
        chunk = b"x" * MAX_WRITE_CHUNK
        for i in range(24):  # 12 MiB: several appends, none released yet.
            rec.record_write(f, i * len(chunk), chunk)
        pending = list(rec._pending)
        assert len(pending) > 1
        await svc.close()
        with pytest.raises(RecorderBroken):
            await rec.barrier()
        # Every append ended: none is left unreleased with its content and its `done()`
        # waiting forever.
        assert all(g.is_done() for g in pending)
        for g in pending[1:]:
            with pytest.raises(AppendAborted):
                await g.done()
    assert fb.journal.calls == []
