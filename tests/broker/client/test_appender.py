"""Appender and the append() helper: commit, abort/rollback, errors, retries."""

from __future__ import annotations

import array
import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from gazette.broker.client import (
    Appender,
    AppendRetriesExhausted,
    JournalClient,
    RegisterMismatch,
    WrongAppendOffset,
    append,
)
from gazette.broker.client.appender import CHUNK_SIZE
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.testing.broker import BrokerProcess
from tests.kit.journals import read_to_head

from .conftest import MakeJournal
from .fake_broker import FakeBroker


async def test_appender_commits_on_close(client: JournalClient, make_journal: MakeJournal) -> None:
    spec = await make_journal()
    a = Appender(client, pb.AppendRequest(journal=spec.name))
    await a.write(b"hello, ")
    await a.write(b"world\n")
    resp = await a.close()
    assert (resp.commit.begin, resp.commit.end) == (0, 13)
    assert a.response is resp and a.written == 13
    async with Appender(client, pb.AppendRequest(journal=spec.name)) as b:
        await b.write(b"more\n")
    assert b.response is not None and b.response.commit.end == 18
    assert await read_to_head(client, spec.name) == b"hello, world\nmore\n"


async def test_aborted_appender_leaves_no_bytes(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    a = Appender(client, pb.AppendRequest(journal=spec.name))
    await a.write(b"x" * 300_000)
    await a.abort()
    await a.abort()  # Idempotent.
    with pytest.raises(RuntimeError):
        await a.write(b"y")

    with pytest.raises(ZeroDivisionError):
        async with Appender(client, pb.AppendRequest(journal=spec.name)) as b:
            await b.write(b"partial")
            raise ZeroDivisionError

    assert await read_to_head(client, spec.name) == b""
    resp = await append(client, pb.AppendRequest(journal=spec.name), b"kept\n")
    assert (resp.commit.begin, resp.commit.end) == (0, 5)
    assert await read_to_head(client, spec.name) == b"kept\n"


@pytest.mark.parametrize("direct", [True, False])
async def test_a_message_of_parts_of_any_buffer_kind(
    client_broker: BrokerProcess, make_journal: MakeJournal, direct: bool
) -> None:
    spec = await make_journal()
    words = array.array("I", range(5000))  # A memoryview of it counts 4-byte items.
    reused = bytearray(b"r" * 20_000)
    parts = [b"head|", b"", memoryview(words), reused, bytes(30_000)]
    expect = b"".join(bytes(p) for p in parts)
    async with JournalClient(client_broker.endpoint, direct_appends=direct) as c:
        assert (c.direct is not None) == direct
        a = Appender(c, pb.AppendRequest(journal=spec.name))
        await a.write_message(parts)
        reused[:] = b"x" * len(reused)  # The caller reuses its buffer once the call returns.
        resp = await a.close()
        assert a.written == len(expect) == resp.commit.end
        assert await read_to_head(c, spec.name) == expect
        with pytest.raises(ValueError, match="at most"):
            await Appender(c, pb.AppendRequest(journal=spec.name)).write_message(
                [bytes(CHUNK_SIZE), b"1"]
            )


async def test_large_append_is_chunked(client: JournalClient, make_journal: MakeJournal) -> None:
    spec = await make_journal(length=4 << 20)
    data = bytes(range(251)) * (3 * 4200)  # ~3.1 MiB: four chunks.
    resp = await append(client, pb.AppendRequest(journal=spec.name), data)
    assert resp.commit.end == len(data)
    assert await read_to_head(client, spec.name) == data


async def test_append_from_async_iterable(client: JournalClient, make_journal: MakeJournal) -> None:
    spec = await make_journal()

    async def parts() -> AsyncIterator[bytes]:
        for i in range(5):
            yield f"part {i}\n".encode()

    resp = await append(client, pb.AppendRequest(journal=spec.name), parts())
    assert resp.commit.end == 35
    assert await read_to_head(client, spec.name) == b"".join(
        f"part {i}\n".encode() for i in range(5)
    )


async def test_wrong_offset_and_register_mismatch(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    await append(client, pb.AppendRequest(journal=spec.name), b"abc")
    with pytest.raises(WrongAppendOffset) as wrong:
        await append(client, pb.AppendRequest(journal=spec.name, offset=1), b"x")
    assert wrong.value.journal == spec.name and wrong.value.offset == 1
    ok = await append(client, pb.AppendRequest(journal=spec.name, offset=3), b"def")
    assert ok.commit.end == 6

    fenced = pb.AppendRequest(journal=spec.name)
    fenced.union_registers.labels.add(name="author", value="a1")
    await append(client, fenced, b"g")
    check = pb.AppendRequest(journal=spec.name)
    check.check_registers.include.labels.add(name="author", value="zz")
    with pytest.raises(RegisterMismatch) as mismatch:
        await append(client, check, b"h")
    assert "author=a1" in str(mismatch.value)
    assert await read_to_head(client, spec.name) == b"abcdefg"


async def test_append_retries_routing_and_transport_errors() -> None:
    ok = pb.AppendResponse(status=pb.OK, commit=pb.Fragment(journal="fake/j", begin=0, end=3))
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        fb.journal.script(
            "Append",
            pb.AppendResponse(status=pb.NOT_JOURNAL_PRIMARY_BROKER),
            grpc.StatusCode.UNAVAILABLE,
            ok,
        )
        resp = await append(
            client, pb.AppendRequest(journal="fake/j"), b"abc", backoff_fn=lambda _: 0.01
        )
        assert resp == ok
        calls = fb.journal.calls["Append"]
        assert len(calls) == 3
        # Parameters first, then content, then the empty commit message.
        assert [m.journal for m in calls[-1]] == ["fake/j", "", ""]
        assert [m.content for m in calls[-1]] == [b"", b"abc", b""]


async def test_append_retry_for_gives_up_with_the_last_error() -> None:
    loop = asyncio.get_running_loop()
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        fb.journal.script("Append", *[grpc.StatusCode.UNAVAILABLE] * 20)
        t0 = loop.time()
        with pytest.raises(AppendRetriesExhausted) as exc:
            await append(
                client,
                pb.AppendRequest(journal="fake/j"),
                b"abc",
                backoff_fn=lambda _: 1.0,
                retry_for=0.3,
            )
        # The second attempt is made when the window ends (not after the full backoff), and
        # fails it.
        assert len(fb.journal.calls["Append"]) == 2
        assert 0.3 <= loop.time() - t0 < 0.9
        assert isinstance(exc.value.__cause__, grpc.aio.AioRpcError)
        # One line: the status and its details, not the error's multi-line repr.
        assert "UNAVAILABLE: scripted UNAVAILABLE" in str(exc.value)
        assert "\n" not in str(exc.value)


async def test_append_does_not_retry_other_statuses() -> None:
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        fb.journal.script("Append", pb.AppendResponse(status=pb.NOT_ALLOWED))
        with pytest.raises(Exception) as exc:
            await append(client, pb.AppendRequest(journal="fake/j"), b"abc")
        assert type(exc.value).__name__ == "NotAllowed"
        assert len(fb.journal.calls["Append"]) == 1


def test_appender_rejects_bad_requests() -> None:
    with pytest.raises(ValueError):
        Appender(JournalClient("x:1"), pb.AppendRequest())
    with pytest.raises(ValueError):
        Appender(JournalClient("x:1"), pb.AppendRequest(journal="j", content=b"x"))


async def test_refusal_while_writing_reports_the_status(client: JournalClient) -> None:
    """The broker answers JOURNAL_NOT_FOUND at the first message while the client is still
    streaming megabytes: the Appender reports that status, not gRPC's failed write."""
    from gazette.broker.client import JournalNotFound

    a = Appender(client, pb.AppendRequest(journal="tests/no/such-journal"))
    with pytest.raises(JournalNotFound):
        for _ in range(64):
            await a.write(b"z" * (1 << 20))
        await a.close()
