"""AppendService: exactly-once landing, ordering, batching, dependencies, failures, retries."""

from __future__ import annotations

import array
import asyncio
import re

import grpc
import pytest

from gazette.broker.client import (
    AppendAborted,
    AppendRetriesExhausted,
    AppendService,
    AsyncAppend,
    BrokerError,
    DependencyFailed,
    FragmentStoreUnhealthy,
    JournalClient,
    RegisterMismatch,
)
from gazette.broker.client.appender import CHUNK_SIZE
from gazette.broker.protocol import protocol_pb2 as pb
from tests.kit.journals import read_to_head

from .conftest import MakeJournal
from .fake_broker import FakeBroker


async def test_concurrent_small_appends_land_once_in_order_and_batched(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    tasks, per_task = 20, 10
    async with AppendService(client) as svc:

        async def producer(t: int) -> list[pb.AppendResponse]:
            out = []
            for i in range(per_task):
                async with svc.start_append(pb.AppendRequest(journal=spec.name)) as a:
                    a.write(f"task={t:02d} seq={i:02d}\n".encode())
                out.append(a)
                if i % 3 == 0:
                    await asyncio.sleep(0)  # Interleave producers.
            return [await a.done() for a in out]

        responses = await asyncio.gather(*(producer(t) for t in range(tasks)))

    total = tasks * per_task
    assert svc.appends_committed == total
    assert svc.rpc_count < total, "concurrent appends must be batched"
    lines = (await read_to_head(client, spec.name)).decode().splitlines()
    assert sorted(lines) == sorted(
        f"task={t:02d} seq={i:02d}" for t in range(tasks) for i in range(per_task)
    )
    for t in range(tasks):
        seqs = [
            int(m.group(1)) for line in lines if (m := re.match(f"task={t:02d} seq=(\\d+)", line))
        ]
        assert seqs == list(range(per_task))
    # Each response covers the batch its append went in, which includes the append's line.
    for resps in responses:
        assert all(r.commit.end > r.commit.begin for r in resps)


async def test_batched_small_appends_travel_in_few_messages(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    """A batch's appends are coalesced into messages of up to CHUNK_SIZE (not one message per
    append); content crossing message boundaries lands intact and in order."""
    spec = await make_journal()
    count = 3000
    lines = [f"append {i:05d} ".encode() + b"x" * (i % 200) + b"\n" for i in range(count)]
    async with AppendService(client) as svc:
        appends = []
        for line in lines:
            a = svc.start_append(pb.AppendRequest(journal=spec.name))
            a.write(line)
            appends.append(a.release())
        big = svc.start_append(pb.AppendRequest(journal=spec.name))
        big.write(b"b" * (CHUNK_SIZE + 10) + b"\n")  # more than a message, after small ones
        big.release()
        resps = [await a.done() for a in appends]
        await big.done()
    assert svc.rpc_count == 1
    total = sum(map(len, lines)) + CHUNK_SIZE + 11
    # first message + ceil(total / CHUNK_SIZE)-ish content messages + the commit message
    assert resps[0].total_chunks <= 2 + total // CHUNK_SIZE + 2
    assert (
        await read_to_head(client, spec.name) == b"".join(lines) + b"b" * (CHUNK_SIZE + 10) + b"\n"
    )


async def test_dependencies_order_appends_across_journals(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    j1, j2 = await make_journal(), await make_journal()
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    async with AppendService(client) as svc:
        first = svc.start_append(pb.AppendRequest(journal=j1.name), [gate])
        first.write(b"first\n")
        first.release()
        second = svc.start_append(pb.AppendRequest(journal=j2.name), [first])
        second.write(b"second\n")
        second.release()
        assert svc.pending_except(j2.name) == [first]
        assert set(svc.pending_except("")) == {first, second}

        await asyncio.sleep(0.3)
        assert not first.is_done() and not second.is_done()
        assert (
            await read_to_head(client, j1.name) == b""
            and await read_to_head(client, j2.name) == b""
        )
        gate.set_result(None)
        r2 = await second.done()
        assert first.is_done() and first.response is not None
        assert r2.commit.end == 7
    assert await read_to_head(client, j2.name) == b"second\n"


async def test_failed_dependency_fails_dependents(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    j1 = await make_journal()
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    async with AppendService(client) as svc:
        a = svc.start_append(pb.AppendRequest(journal=j1.name), [gate])
        a.write(b"never\n")
        a.release()
        gate.set_exception(RuntimeError("upstream failed"))
        with pytest.raises(DependencyFailed) as exc:
            await a.done()
        assert isinstance(exc.value.__cause__, RuntimeError)
        assert isinstance(a.error(), DependencyFailed)
    assert await read_to_head(client, j1.name) == b""


async def test_a_chain_of_dependent_appends_goes_as_one_batch(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    """Appends each depending on the one before, queued together, go in one RPC: the batch
    commits or fails as one, so none lands without its dependency."""
    spec = await make_journal()
    async with AppendService(client) as svc:
        chain: list[AsyncAppend] = []
        for i in range(10):
            a = svc.start_append(pb.AppendRequest(journal=spec.name), chain[-1:])
            a.write(f"{i}\n".encode())
            chain.append(a.release())
        resps = [await a.done() for a in chain]
    assert svc.rpc_count == 1
    assert all(r is resps[0] for r in resps)
    assert await read_to_head(client, spec.name) == b"".join(f"{i}\n".encode() for i in range(10))


async def test_a_failed_batch_stops_the_rest_of_its_chain() -> None:
    """A chain longer than a batch: once the first batch fails, the appends after it (each
    depending on the one before) fail unsent."""
    failed = pb.AppendResponse(status=pb.FRAGMENT_STORE_UNHEALTHY)
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        fb.journal.script("Append", failed)
        async with AppendService(client, max_batch_bytes=4) as svc:
            chain: list[AsyncAppend] = []
            for i in range(6):
                a = svc.start_append(pb.AppendRequest(journal="fake/j"), chain[-1:])
                a.write(b"%d" % i)
                chain.append(a.release())
            for a in chain[:4]:
                with pytest.raises(FragmentStoreUnhealthy):
                    await a.done()
            for a in chain[4:]:
                with pytest.raises(DependencyFailed):
                    await a.done()
        assert svc.rpc_count == 1
        assert b"".join(m.content for m in fb.journal.calls["Append"][0]) == b"0123"


async def test_register_mismatch_fails_only_that_append(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    async with AppendService(client) as svc:
        fence = pb.AppendRequest(journal=spec.name)
        fence.union_registers.labels.add(name="author", value="a1")
        ok = svc.start_append(fence)
        ok.write(b"f")  # Registers change only with content.
        ok.release()

        bad_req = pb.AppendRequest(journal=spec.name)
        bad_req.check_registers.include.labels.add(name="author", value="someone-else")
        bad = svc.start_append(bad_req)
        bad.write(b"rejected\n")
        bad.release()
        after = svc.start_append(pb.AppendRequest(journal=spec.name))
        after.write(b"after\n")
        after.release()
        with pytest.raises(RegisterMismatch):
            await bad.done()
        assert (await after.done()).commit.end == 7
        assert list((await ok.done()).registers.labels) == [pb.Label(name="author", value="a1")]
    assert await read_to_head(client, spec.name) == b"fafter\n"


async def test_aborted_and_spilled_appends(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    spec = await make_journal(length=8 << 20)
    big = b"0123456789abcdef" * (160 * 1024)  # 2.5 MiB: spills to a temporary file.
    async with AppendService(client) as svc:
        with pytest.raises(KeyError):
            async with svc.start_append(pb.AppendRequest(journal=spec.name)) as dropped:
                dropped.write(b"dropped\n")
                raise KeyError
        with pytest.raises(AppendAborted):
            await dropped.done()
        async with svc.start_append(pb.AppendRequest(journal=spec.name)) as a:
            a.write(big[:100])
            a.write(big[100:])
        assert (await a.done()).commit.end == len(big)
        with pytest.raises(RuntimeError):
            a.write(b"late")
        reused = bytearray(b"x" * (600 << 10))  # In memory, in several chunks of a message.
        async with svc.start_append(pb.AppendRequest(journal=spec.name)) as m:
            m.write(reused)
            m.write(b"!")
            reused[:] = b"y" * len(reused)  # The caller reuses its buffer after the write.
            words = array.array("Q", range(1000))
            m.write(memoryview(words))  # len() of this view is 1000 items, 8000 bytes.
            assert m._file is None and m.size == (600 << 10) + 1 + 8000
        await m.done()
    want = big + b"x" * (600 << 10) + b"!" + words.tobytes()
    assert await read_to_head(client, spec.name) == want
    with pytest.raises(RuntimeError):
        svc.start_append(pb.AppendRequest(journal=spec.name))


async def test_service_retries_transient_failures() -> None:
    ok = pb.AppendResponse(status=pb.OK, commit=pb.Fragment(journal="fake/j", begin=0, end=2))
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        fb.journal.script(
            "Append",
            grpc.StatusCode.UNAVAILABLE,
            pb.AppendResponse(status=pb.NO_JOURNAL_PRIMARY_BROKER),
            ok,
        )
        async with AppendService(client, backoff_fn=lambda _: 0.01) as svc:
            a = svc.start_append(pb.AppendRequest(journal="fake/j"))
            a.write(b"hi")
            a.release()
            assert await a.done() == ok
        assert svc.rpc_count == 3
        assert [m.content for m in fb.journal.calls["Append"][-1]] == [b"", b"hi", b""]


async def test_retry_for_bounds_how_long_an_append_keeps_failing() -> None:
    """With `retry_for`, an append whose attempts keep failing with retryable errors fails
    once they have for that long (a last attempt at the window's end), naming the last error;
    the journal's next append is tried afresh and lands. Without it, retries go on."""
    no_primary = pb.AppendResponse(status=pb.NO_JOURNAL_PRIMARY_BROKER)
    ok = pb.AppendResponse(status=pb.OK, commit=pb.Fragment(journal="fake/j", begin=0, end=2))
    loop = asyncio.get_running_loop()
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        fb.journal.script("Append", *[no_primary] * 50)
        async with AppendService(client, backoff_fn=lambda _: 0.2, retry_for=0.5) as svc:
            t0 = loop.time()
            a = svc.start_append(pb.AppendRequest(journal="fake/j"))
            a.write(b"hi")
            a.release()
            with pytest.raises(AppendRetriesExhausted, match="fake/j kept failing") as info:
                await a.done()
            took = loop.time() - t0
            assert 0.5 <= took < 2.0, took
            assert isinstance(info.value.__cause__, BrokerError)
            assert "NO_JOURNAL_PRIMARY_BROKER" in str(info.value)
            # Attempts at 0, 0.2, 0.4, and a last one when the window ends at 0.5.
            assert svc.rpc_count == 4
            fb.journal.scripts["Append"].clear()
            fb.journal.script("Append", ok)
            b = svc.start_append(pb.AppendRequest(journal="fake/j"))
            b.write(b"hi")
            b.release()
            assert await b.done() == ok

        fb.journal.script("Append", *[grpc.StatusCode.UNAVAILABLE] * 50)
        async with AppendService(client, backoff_fn=lambda _: 0.05) as svc:
            c = svc.start_append(pb.AppendRequest(journal="fake/j"))
            c.write(b"hi")
            c.release()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.shield(c.done()), 1.0)
            assert svc.rpc_count > 5  # Still retrying.
            fb.journal.scripts["Append"].clear()
            fb.journal.script("Append", ok)
            assert await c.done() == ok

    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="retry_for"):
            AppendService(client, retry_for=bad)
