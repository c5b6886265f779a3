"""A real broker's answers to malformed requests: each names what is wrong, with the status
code a client can act on (never UNKNOWN or INTERNAL for the client's own mistake)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.broker.service import MAX_MESSAGE_SIZE
from gazette.testing.broker import BrokerProcess
from gazette.testing.cluster import BrokerCluster
from gazette.testing.etcd import EtcdServer
from tests.kit.eventually import eventually

from .conftest import MakeJournal, append, journal_spec, read_all


async def test_oversized_content_message_is_resource_exhausted_naming_the_limit(
    broker: BrokerProcess, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    # A client with no send limit of its own (gRPC's default), so the broker's limit decides.
    async with grpc.aio.insecure_channel(broker.endpoint) as channel:
        stub = pb_grpc.JournalStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await append(stub, spec.name, b"x" * (100 << 20))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(MAX_MESSAGE_SIZE) in (err.value.details() or "")

    # The broker still serves, and nothing of the refused append was committed.
    async with grpc.aio.insecure_channel(broker.endpoint) as channel:
        stub = pb_grpc.JournalStub(channel)
        r = await append(stub, spec.name, b"after\n")
        assert r.status == pb.OK and r.commit.begin == 0
        content, _ = await read_all(stub, spec.name)
    assert content == b"after\n"


async def test_append_with_empty_journal_is_invalid_like_read(stub: pb_grpc.JournalStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as read_err:
        await read_all(stub, "")
    with pytest.raises(grpc.aio.AioRpcError) as append_err:
        await append(stub, "", b"x")
    for err in (read_err, append_err):
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Journal" in (err.value.details() or "")


async def test_empty_first_append_message_is_invalid(stub: pb_grpc.JournalStub) -> None:
    async def requests() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest()

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Append(requests())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Journal" in (err.value.details() or "")


@pytest.mark.parametrize(
    "later, field",
    [
        (pb.AppendRequest(journal="tests/another-journal", content=b"other"), "journal"),
        (pb.AppendRequest(journal="tests/another-journal"), "journal"),
        (pb.AppendRequest(content=b"x", offset=3), "offset"),
        (pb.AppendRequest(content=b"x", check_registers=pb.LabelSelector()), "checkregisters"),
    ],
    ids=["other-journal-content", "other-journal-empty", "offset", "check-registers"],
)
async def test_later_append_message_with_parameters_is_rejected(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal, later: pb.AppendRequest, field: str
) -> None:
    spec = await make_journal()

    async def requests() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=spec.name)
        yield pb.AppendRequest(content=b"first ")
        yield later
        yield pb.AppendRequest()

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Append(requests())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = (err.value.details() or "").lower().replace("_", "")
    assert field in details and spec.name in details
    content, _ = await read_all(stub, spec.name)
    assert content == b""  # rolled back: nothing of the stream was committed


# Each of the service's methods, with its cardinality.
_METHODS = [
    ("List", "unary_stream"),
    ("Apply", "unary_unary"),
    ("Read", "unary_stream"),
    ("Append", "stream_unary"),
    ("Replicate", "stream_stream"),
    ("ListFragments", "unary_unary"),
    ("FragmentStoreHealth", "unary_unary"),
]
_NOT_A_PROTOBUF = b"\xff\xff\xff\xff"  # field 0x1fffffff... with no end: truncated


@pytest.mark.parametrize("method, kind", _METHODS, ids=[m for m, _ in _METHODS])
async def test_bytes_that_are_not_a_protobuf_are_invalid_argument(
    broker: BrokerProcess, method: str, kind: str
) -> None:
    async with grpc.aio.insecure_channel(broker.endpoint) as channel:
        path = f"/protocol.Journal/{method}"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            if kind == "unary_unary":
                await channel.unary_unary(path)(_NOT_A_PROTOBUF)
            elif kind == "unary_stream":
                async for _ in channel.unary_stream(path)(_NOT_A_PROTOBUF):
                    pass
            else:

                async def requests() -> AsyncIterator[bytes]:
                    yield _NOT_A_PROTOBUF

                if kind == "stream_unary":
                    await channel.stream_unary(path)(requests())
                else:
                    async for _ in channel.stream_stream(path)(requests()):
                        pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert "protocol." in (err.value.details() or "")  # names the message it expected


@pytest.fixture(scope="module")
def two_brokers(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    root = f"/test-bad-requests/{os.getpid()}"
    with BrokerCluster(
        etcd_server.endpoint, root=root, spool_root=tmp_path_factory.mktemp("two"), zones=["a", "b"]
    ) as c:
        yield c


async def test_bad_append_through_a_proxying_broker_gets_the_same_answers(
    two_brokers: BrokerCluster,
) -> None:
    async with (
        grpc.aio.insecure_channel(two_brokers.endpoints[0]) as ch0,
        grpc.aio.insecure_channel(two_brokers.endpoints[1]) as ch1,
    ):
        stubs = [pb_grpc.JournalStub(ch0), pb_grpc.JournalStub(ch1)]
        spec = journal_spec("tests/bad-proxied")
        resp = await stubs[0].Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
        assert resp.status == pb.OK

        async def appended() -> pb.AppendResponse | None:  # Once the journal has its primary.
            r = await append(stubs[0], spec.name)
            return r if r.status == pb.OK else None

        r = await eventually(appended, what="a primary of the journal", timeout=30, interval=0.1)
        primary = r.header.process_id.suffix
        via = next(stubs[i] for i, b in enumerate(two_brokers.brokers) if b.suffix != primary)

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await append(via, spec.name, b"x" * (MAX_MESSAGE_SIZE + 1))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert str(MAX_MESSAGE_SIZE) in (err.value.details() or "")

        async def naming_another() -> AsyncIterator[pb.AppendRequest]:
            yield pb.AppendRequest(journal=spec.name)
            yield pb.AppendRequest(journal="tests/another-journal", content=b"other")
            yield pb.AppendRequest()

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await via.Append(naming_another())
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "journal" in (err.value.details() or "").lower()

        r = await append(via, spec.name, b"after\n")
        assert r.status == pb.OK and r.commit.begin == 0
        assert r.header.process_id.suffix == primary  # proxied
