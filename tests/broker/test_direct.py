"""Direct appends: the Append RPC over a plain TCP stream, against a real broker process.

Each direct append must be answered as the same append over gRPC would be (the broker runs
the same handler), roll back whenever its stream does not end with the commit message, and
leave its connection ready for the next append.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from gazette.broker.client import Appender, JournalClient
from gazette.broker.client.direct_calls import DirectAppends
from gazette.broker.client.errors import JournalNotFound, WrongAppendOffset
from gazette.broker.direct_listener import READ_AHEAD, DirectAppendServer, _Frames, content_only
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.broker.protocol.direct_framing import (
    END,
    ERROR,
    HEADER,
    MAGIC,
    REQUEST,
    RESPONSE,
)
from gazette.broker.protocol.sha1sum import sha1sum_from_digest
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.broker.conftest import MakeJournal, append, read_all
from tests.broker.raw_direct import Raw, committed, direct_port
from tests.kit.eventually import eventually


async def test_client_appends_go_direct_and_reuse_the_connection(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal("direct")
    body = os.urandom(700_000)  # Three content messages.
    async with JournalClient(broker.endpoint) as client:
        assert client.direct is not None
        for i in range(2):
            async with Appender(client, pb.AppendRequest(journal=spec.name)) as app:
                await app.write(body)
            assert app.response is not None
            assert app.response.commit.begin == i * len(body)
            assert app.response.commit.end == (i + 1) * len(body)
            assert app.response.commit.sum == sha1sum_from_digest(hashlib.sha1(body).digest())
            target = client.endpoint_for(spec.name)
            assert client.direct.answered == i + 1
            assert client.direct.idle(target) == 1  # One connection, kept for the next append.
    content, _ = await read_all(stub, spec.name)
    assert content == body + body


def _owner(value: str) -> pb.LabelSet:
    return pb.LabelSet(labels=[pb.Label(name="owner", value=value)])


async def test_direct_answers_are_grpc_answers(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal("same")
    cases: list[tuple[dict[str, object], int]] = [
        ({}, pb.OK),
        ({"offset": 1}, pb.WRONG_APPEND_OFFSET),
        (
            {
                "check_registers": pb.LabelSelector(include=_owner("me")),
                "union_registers": _owner("me"),
            },
            pb.OK,
        ),
        ({"check_registers": pb.LabelSelector(include=_owner("other"))}, pb.REGISTER_MISMATCH),
        ({"journal": "tests/no-such-journal"}, pb.JOURNAL_NOT_FOUND),
    ]
    raw = await Raw.open(broker)
    try:
        for params, status in cases:
            request = pb.AppendRequest(journal=spec.name)
            for name, value in params.items():
                if isinstance(value, str | int):
                    setattr(request, name, value)
                else:
                    getattr(request, name).CopyFrom(value)
            kind, got = await raw.append(
                request, pb.AppendRequest(content=b"abc"), pb.AppendRequest()
            )
            assert kind == RESPONSE and isinstance(got, pb.AppendResponse)
            want = await append(stub, request.journal, b"abc", **_fields(request))  # type: ignore[arg-type]
            assert (got.status, want.status) == (status, status), params
            assert got.registers == want.registers
            assert got.header.process_id == want.header.process_id
            if status == pb.OK:  # The same append twice, one after the other.
                assert got.commit.end - got.commit.begin == 3
                assert want.commit.begin == got.commit.end
                assert got.commit.sum == sha1sum_from_digest(hashlib.sha1(b"abc").digest())
    finally:
        raw.close()
    assert (await read_all(stub, spec.name))[0] == b"abc" * 4


def _fields(request: pb.AppendRequest) -> dict[str, object]:
    """The parameters of `request` other than its journal, for the gRPC helper."""
    return {f.name: v for f, v in request.ListFields() if f.name != "journal"}


async def test_invalid_request_fails_as_over_grpc(
    broker: BrokerProcess, stub: pb_grpc.JournalStub
) -> None:
    msgs = committed("tests//bad name", b"x")
    raw = await Raw.open(broker)
    try:
        kind, got = await raw.append(*msgs)
        with pytest.raises(grpc.aio.AioRpcError) as want:
            await append(stub, "tests//bad name", b"x")
        assert kind == ERROR
        assert got == (want.value.code(), want.value.details())
        assert want.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # The connection carries the next append.
        kind, resp = await raw.append(pb.AppendRequest(journal="tests/none-such"))
        assert kind == RESPONSE and isinstance(resp, pb.AppendResponse)
        assert resp.status == pb.JOURNAL_NOT_FOUND
    finally:
        raw.close()


async def test_stream_ended_without_commit_rolls_back(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal("abort")
    raw = await Raw.open(broker)
    try:
        kind, got = await raw.append(
            pb.AppendRequest(journal=spec.name), pb.AppendRequest(content=b"never")
        )
        assert kind == ERROR
        assert got[0] == grpc.StatusCode.ABORTED  # type: ignore[index]
        assert "without the empty commit message" in got[1]  # type: ignore[index]
        kind, resp = await raw.append(*committed(spec.name, b"kept"))
        assert kind == RESPONSE
        assert isinstance(resp, pb.AppendResponse)
        assert (resp.status, resp.commit.begin, resp.commit.end) == (pb.OK, 0, 4)
    finally:
        raw.close()
    assert (await read_all(stub, spec.name))[0] == b"kept"


async def test_lost_connection_rolls_back(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal("lost")
    raw = await Raw.open(broker)
    raw.send(
        pb.AppendRequest(journal=spec.name), pb.AppendRequest(content=b"x" * 100_000), end=False
    )
    await raw.writer.drain()
    await asyncio.sleep(0.2)  # The broker is inside the append.
    raw.writer.transport.abort()
    resp = await asyncio.wait_for(append(stub, spec.name, b"after"), 5)
    assert (resp.status, resp.commit.begin, resp.commit.end) == (pb.OK, 0, 5)
    assert (await read_all(stub, spec.name))[0] == b"after"


async def test_refusal_before_the_content_keeps_the_connection(
    broker: BrokerProcess, make_journal: MakeJournal
) -> None:
    spec = await make_journal("refused")
    async with JournalClient(broker.endpoint) as client:
        assert client.direct is not None
        app = Appender(client, pb.AppendRequest(journal="tests/no-such-journal"))
        with pytest.raises(JournalNotFound):
            for _ in range(20):  # The broker answers after the first message.
                await app.write(b"c" * 300_000)
            await app.close()
        target = client.endpoint_for(spec.name)
        assert client.direct.idle(target) == 1  # The refused append's connection, kept.
        kept = client.direct._idle[target][0]
        async with Appender(client, pb.AppendRequest(journal=spec.name)) as ok:
            await ok.write(b"fine")
        assert ok.response is not None and ok.response.commit.end == 4
        assert client.direct.answered == 2
        assert client.direct._idle[target] == [kept]


async def test_not_a_direct_client_is_refused(broker: BrokerProcess) -> None:
    raw = await Raw.open(broker, magic=b"GET / HTTP/1.1\r\n")
    try:
        kind, got = await raw.answer()
        assert kind == ERROR
        assert got[0] == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[index]
        assert "not a direct-append client" in got[1]  # type: ignore[index]
        assert await raw.reader.read() == b""  # Then closed.
    finally:
        raw.close()


async def test_unknown_frame_is_refused(broker: BrokerProcess) -> None:
    raw = await Raw.open(broker)
    try:
        raw.writer.write(HEADER.pack(b"Q", 3) + b"abc")
        kind, got = await raw.answer()
        assert kind == ERROR
        assert got[0] == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[index]
        assert await raw.reader.read() == b""
    finally:
        raw.close()


@pytest.fixture(scope="module")
def grpc_only_broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(
        etcd_server.endpoint,
        root=f"/test/{os.getpid()}/grpc-only",
        spool_dir=tmp_path_factory.mktemp("spool-grpc-only"),
        extra_args=["--direct-port", "-1"],
    )
    with proc:
        yield proc


async def test_broker_without_direct_appends_is_appended_to_over_grpc(
    grpc_only_broker: BrokerProcess, tmp_path: Path
) -> None:
    from tests.broker.conftest import journal_spec

    spec = journal_spec("tests/grpc-only", f"file://{tmp_path}/")
    async with JournalClient(grpc_only_broker.endpoint) as client:
        resp = await client.stub().Apply(
            pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)])
        )
        assert resp.status == pb.OK
        for _ in range(2):
            async with Appender(client, pb.AppendRequest(journal=spec.name)) as app:
                await app.write(b"over grpc")
        assert app.response is not None and app.response.commit.end == 18
        assert client.direct is not None and client.direct.answered == 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await direct_port(grpc_only_broker)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_direct_appends_can_be_turned_off(
    broker: BrokerProcess, make_journal: MakeJournal
) -> None:
    spec = await make_journal("off")
    async with JournalClient(broker.endpoint, direct_appends=False) as client:
        assert client.direct is None
        request = pb.AppendRequest(journal=spec.name)
        assert await Appender.append_once(client, request, [b"x"]) is None  # Use an Appender.
        async with Appender(client, request) as app:
            await app.write(b"grpc")
        assert app.response is not None and app.response.commit.end == 4


async def test_closing_the_client_cancels_appends_in_flight(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal("closed")
    client = JournalClient(broker.endpoint)
    app = Appender(client, pb.AppendRequest(journal=spec.name))
    await app.write(b"never committed")
    assert client.direct is not None and len(client.direct.active) == 1
    await client.close()
    assert not client.direct.active
    with pytest.raises(asyncio.CancelledError):  # As a call of a closed gRPC channel.
        await app.close()
    resp = await asyncio.wait_for(append(stub, spec.name, b"next"), 5)
    assert (resp.status, resp.commit.begin) == (pb.OK, 0)  # Rolled back.


async def test_a_client_gone_before_its_answer_is_rolled_back(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    """As over gRPC, an append whose client left is cancelled, even if its whole stream had
    arrived: here it waits for the journal, which another append holds."""
    spec = await make_journal("gone")
    holder = await Raw.open(broker)
    quitter = await Raw.open(broker)
    try:
        holder.send(
            pb.AppendRequest(journal=spec.name), pb.AppendRequest(content=b"first"), end=False
        )
        await asyncio.sleep(0.3)  # The holder's append has the journal.
        quitter.send(*committed(spec.name, b"quitter"))
        await quitter.writer.drain()
        await asyncio.sleep(0.3)  # The quitter's append waits for the journal...
        quitter.writer.transport.abort()  # ...when its client leaves.
        await asyncio.sleep(0.3)  # The broker sees it leave.
        kind, resp = await holder.append(pb.AppendRequest())
        assert kind == RESPONSE and isinstance(resp, pb.AppendResponse)
        assert (resp.status, resp.commit.begin, resp.commit.end) == (pb.OK, 0, 5)
        last = await asyncio.wait_for(append(stub, spec.name, b"!"), 5)
        assert (last.commit.begin, last.commit.end) == (5, 6)
    finally:
        holder.close()
        quitter.close()
    assert (await read_all(stub, spec.name))[0] == b"first!"


async def test_an_error_answer_does_not_keep_the_connection(
    broker: BrokerProcess, make_journal: MakeJournal
) -> None:
    spec = await make_journal("err")
    async with JournalClient(broker.endpoint) as client:
        assert client.direct is not None
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async with Appender(client, pb.AppendRequest(journal="tests//bad name")) as app:
                await app.write(b"x")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert client.direct.idle(client.default_endpoint) == 0  # The broker may close it.
        async with Appender(client, pb.AppendRequest(journal=spec.name)) as ok:
            await ok.write(b"fine")
        assert ok.response is not None and ok.response.commit.end == 4


class _HeldService:
    """A stand-in for `JournalService`: each append waits for `release`."""

    def __init__(self) -> None:
        self.b = SimpleNamespace(cfg=SimpleNamespace(chunk_timeout=30.0))
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = 0

    async def Append(self, requests: Any, _context: Any) -> pb.AppendResponse:  # noqa: N802
        first = await anext(requests)
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return pb.AppendResponse(status=pb.OK, commit=pb.Fragment(journal=first.journal))


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _held_listener() -> tuple[_HeldService, DirectAppendServer, Conn, Conn]:
    """A listener over a `_HeldService`, an idle connection and one whose append is held."""
    service = _HeldService()
    server = DirectAppendServer(service, "127.0.0.1")  # type: ignore[arg-type]
    await server.start()
    idle = await asyncio.open_connection("127.0.0.1", server.port)
    busy = await asyncio.open_connection("127.0.0.1", server.port)
    idle[1].write(MAGIC)
    payload = pb.AppendRequest(journal="a/b").SerializeToString()
    busy[1].write(MAGIC + HEADER.pack(REQUEST, len(payload)) + payload)
    await asyncio.wait_for(service.started.wait(), 5)
    return service, server, idle, busy


async def test_closing_the_listener_ends_every_connection_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service, server, (idle_r, idle_w), (busy_r, busy_w) = await _held_listener()
    with caplog.at_level(logging.DEBUG):
        await asyncio.wait_for(server.close(), 5)
        await asyncio.sleep(0.1)  # Asyncio would log a cancelled callback by now.
    assert service.cancelled == 1  # The append in progress was cancelled (rolled back).
    assert await asyncio.wait_for(idle_r.read(), 5) == b""
    assert await asyncio.wait_for(busy_r.read(), 5) == b""
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    idle_w.close()
    busy_w.close()


async def test_closing_with_grace_lets_an_append_in_progress_finish() -> None:
    service, server, (idle_r, idle_w), (busy_r, busy_w) = await _held_listener()
    closing = asyncio.ensure_future(server.close(grace=5))
    # The idle connection ends at once; the append in progress goes on.
    assert await asyncio.wait_for(idle_r.read(), 5) == b""
    await asyncio.sleep(0.1)  # The close would be done by now, were it not waiting.
    assert not closing.done()
    with pytest.raises(OSError):  # No new connections.
        await asyncio.open_connection("127.0.0.1", server.port)
    service.release.set()
    kind, n = HEADER.unpack(await asyncio.wait_for(busy_r.readexactly(HEADER.size), 5))
    assert kind == RESPONSE
    assert pb.AppendResponse.FromString(await busy_r.readexactly(n)).commit.journal == "a/b"
    # Answered: the connection stays open until the stream's END is read (closing with
    # unread bytes would reset it, and could lose the answer).
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(busy_r.read(1), 0.2)
    assert not closing.done()
    busy_w.write(HEADER.pack(END, 0))
    await asyncio.wait_for(closing, 5)
    assert await asyncio.wait_for(busy_r.read(), 5) == b""
    assert service.cancelled == 0
    idle_w.close()
    busy_w.close()


async def test_an_append_outlasting_the_grace_is_rolled_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service, server, (idle_r, idle_w), (busy_r, busy_w) = await _held_listener()
    with caplog.at_level(logging.WARNING):
        await asyncio.wait_for(server.close(grace=0.3), 5)
    assert service.cancelled == 1
    assert await asyncio.wait_for(idle_r.read(), 5) == b""
    assert await asyncio.wait_for(busy_r.read(), 5) == b""
    rolled_back = [r.getMessage() for r in caplog.records if "still in progress" in r.getMessage()]
    assert len(rolled_back) == 1 and "count=1" in rolled_back[0]  # Not the idle one.
    idle_w.close()
    busy_w.close()


# -- Whole appends written at once (`Appender.append_once`, as `AppendService` sends) --------


async def test_a_whole_append_is_answered_as_an_appenders(
    broker: BrokerProcess, stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal("once")
    parts = [b"alpha-", os.urandom(100_000), b"-omega"]
    body = b"".join(parts)
    async with JournalClient(broker.endpoint) as client:
        assert client.direct is not None
        for i in range(2):
            resp = await Appender.append_once(client, pb.AppendRequest(journal=spec.name), parts)
            assert resp is not None
            assert (resp.status, resp.commit.begin, resp.commit.end) == (
                pb.OK,
                i * len(body),
                (i + 1) * len(body),
            )
            assert resp.commit.sum == sha1sum_from_digest(hashlib.sha1(body).digest())
            assert client.direct.answered == i + 1
            assert client.direct.idle(client.endpoint_for(spec.name)) == 1  # Kept.
        # A refusal is raised as `Appender.close` raises it, and the connection kept.
        with pytest.raises(WrongAppendOffset):
            await Appender.append_once(
                client, pb.AppendRequest(journal=spec.name, offset=1), [b"x"]
            )
        assert client.direct.idle(client.endpoint_for(spec.name)) == 1
        # An error answer: as the gRPC status, and the connection is not kept.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await Appender.append_once(client, pb.AppendRequest(journal="tests//bad"), [b"x"])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert client.direct.idle(client.default_endpoint) == 0
    assert (await read_all(stub, spec.name))[0] == body + body


async def test_a_whole_append_in_flight_fails_if_cancelled_or_its_client_closes() -> None:
    service = _HeldService()
    server = DirectAppendServer(service, "127.0.0.1")  # type: ignore[arg-type]
    await server.start()
    direct = DirectAppends(lambda _target: None)  # type: ignore[arg-type,return-value]
    target = "127.0.0.1:1"  # Its gRPC port is never asked: its direct port is known.
    direct._ports[target] = server.port
    request = pb.AppendRequest(journal="a/b")
    try:
        # Cancelled while awaiting its answer: the connection is closed (the broker then
        # cancels the append, as for a gRPC client gone), not kept for another append.
        task = asyncio.ensure_future(direct.append(target, request, [b"x"]))
        await asyncio.wait_for(service.started.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert direct.idle(target) == 0
        await eventually(
            lambda: service.cancelled, what="the append's cancel", timeout=5, interval=0.1
        )
        assert service.cancelled == 1
        # The client closed while an append awaits its answer: cancelled, as a call of a
        # closed gRPC channel (and as a `DirectAppendCall`).
        service.started.clear()
        task = asyncio.ensure_future(direct.append(target, request, [b"x"]))
        await asyncio.wait_for(service.started.wait(), 5)
        direct.close()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
        assert await direct.append(target, request, [b"x"]) is None  # Closed: over gRPC.
    finally:
        direct.close()
        await server.close()


async def test_a_client_that_sent_a_whole_append_and_left_is_not_appended_for() -> None:
    service = _HeldService()
    server = DirectAppendServer(service, "127.0.0.1")  # type: ignore[arg-type]
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        request = pb.AppendRequest(journal="a/b").SerializeToString()
        whole = b"".join(
            [MAGIC, HEADER.pack(REQUEST, len(request)), request, HEADER.pack(REQUEST, 0)]
        )
        writer.write(whole + HEADER.pack(END, 0))
        writer.close()  # Gone at once: the broker reads the append and the end together.
        await asyncio.sleep(0.5)  # Time to begin the append, were it begun, and cancel it.
        # Not begun, or begun and cancelled: never left waiting to commit.
        assert not service.started.is_set() or service.cancelled == 1
        assert await asyncio.wait_for(reader.read(), 5) == b""  # No answer.
    finally:
        await server.close()


class _Socket(asyncio.Transport):
    """A transport that only records whether it is reading."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def _feed(frames: _Frames, socket: _Socket, data: bytes, piece: int = 256 << 10) -> int:
    """Hand `data` to `frames` in pieces as a socket transport reads it, while it reads;
    the bytes handed over."""
    fed = 0
    while fed < len(data) and socket.reading:
        frames.data_received(data[fed : fed + piece])
        fed += min(piece, len(data) - fed)
    return fed


async def test_a_connection_reads_ahead_a_bounded_number_of_bytes() -> None:
    frames, socket = _Frames(), _Socket()
    frames.connection_made(socket)
    frames.data_received(MAGIC)
    big = bytes(600 << 10)
    stream = (HEADER.pack(REQUEST, len(big)) + big) * 3
    fed = _feed(frames, socket, stream)
    assert not socket.reading and len(frames._queue) == 2  # 1.2 MiB: over READ_AHEAD.
    assert fed < len(stream)
    assert (await frames.get())[1] == big
    assert socket.reading  # Room again: the third is read.
    _feed(frames, socket, stream[fed:])
    assert len(frames._queue) == 2 and frames.get_ready() == (REQUEST, big)
    # Frames without payload count too: a flood of them is bounded, however they arrive.
    while frames.get_ready() is not None:
        pass
    _feed(frames, socket, HEADER.pack(END, 0) * 5000)
    assert not socket.reading
    assert 0 < len(frames._queue) <= READ_AHEAD // 1024 + 1  # Not 5,000.


async def test_a_connection_ending_gives_its_frames_first_then_the_end() -> None:
    frames, socket = _Frames(), _Socket()
    frames.connection_made(socket)
    big = bytes(600 << 10)
    frames.data_received(MAGIC + (HEADER.pack(REQUEST, len(big)) + big) * 3)
    frames.eof_received()  # Read with the frames, while they wait unsplit.
    for _ in range(3):
        assert await frames.get() == (REQUEST, big)
    for _ in range(2):  # Again at every call.
        with pytest.raises(asyncio.IncompleteReadError) as err:
            await frames.get()
        assert err.value.partial == b""


@pytest.mark.parametrize(
    "request_",
    [
        pb.AppendRequest(),
        pb.AppendRequest(content=b"x"),
        pb.AppendRequest(content=bytes(127)),
        pb.AppendRequest(content=bytes(128)),
        pb.AppendRequest(content=os.urandom(300_000)),
    ],
)
def test_a_content_only_request_is_read_without_parsing(request_: pb.AppendRequest) -> None:
    chunk = content_only(request_.SerializeToString())
    assert chunk is not None and bytes(chunk.content) == request_.content


@pytest.mark.parametrize(
    "request_",
    [
        pb.AppendRequest(journal="a/b"),
        pb.AppendRequest(content=b"x", offset=3),  # Content first, then another field.
        pb.AppendRequest(offset=5, content=b"yy"),
        pb.AppendRequest(do_not_proxy=True),
    ],
)
def test_any_other_request_is_left_to_protobuf(request_: pb.AppendRequest) -> None:
    assert content_only(request_.SerializeToString()) is None


def test_content_then_the_same_field_again_is_left_to_protobuf() -> None:
    twice = pb.AppendRequest(content=b"a").SerializeToString() * 2  # Protobuf: the last wins.
    assert content_only(twice) is None
    assert content_only(b"\x22\x05ab") is None  # Cut short.
