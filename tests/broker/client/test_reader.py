"""Reader and RetryReader against a real broker, and edge cases against a scripted fake."""

from __future__ import annotations

import asyncio
import hashlib
import io
from pathlib import Path

import grpc
import pytest

from gazette.broker.client import (
    JournalClient,
    JournalNotFound,
    OffsetJump,
    OffsetNotYetAvailable,
    Reader,
    RetryReader,
    append,
)
from gazette.broker.fragment.codecs import new_compressor
from gazette.broker.fragment.store import FragmentCorrupted
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.sha1sum import sha1sum_from_digest

from .conftest import MakeJournal
from .fake_broker import FakeBroker


def no_backoff(attempt: int) -> float:
    return 0.01


async def test_reader_reads_until_write_head(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    await append(client, pb.AppendRequest(journal=spec.name), b"one\ntwo\n")
    await append(client, pb.AppendRequest(journal=spec.name), b"three\n")

    r = Reader(client, pb.ReadRequest(journal=spec.name, offset=0))
    got = bytearray()
    with pytest.raises(OffsetNotYetAvailable) as exc:
        while True:
            got += await r.read(3)  # Small reads split broker chunks.
    assert bytes(got) == b"one\ntwo\nthree\n"
    assert exc.value.journal == spec.name and exc.value.offset == 14
    assert r.offset == 14 and r.write_head == 14
    assert r.fragment is not None and r.fragment.begin == 0 and r.fragment_url == ""
    assert r.ended and await r.read() == b""
    assert r.jumps == []


async def test_client_counters_count_bytes_appended_and_read_by_journal(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    """gazette_append_bytes_total / gazette_read_bytes_total (upstream's client metrics): a
    failed append adds nothing; bytes read count each time they are read."""
    from gazette.broker.client.errors import WrongAppendOffset
    from gazette.broker.client.metrics import CLIENT, client_families
    from gazette.mainboilerplate.prometheus import render
    from tests.prometheus_text import parse

    spec = await make_journal()
    await append(client, pb.AppendRequest(journal=spec.name), b"one\ntwo\n")
    await append(client, pb.AppendRequest(journal=spec.name), b"three\n")
    with pytest.raises(WrongAppendOffset):
        await append(client, pb.AppendRequest(journal=spec.name, offset=3), b"nope")
    for _ in range(2):
        r = Reader(client, pb.ReadRequest(journal=spec.name, offset=4, end_offset=14))
        assert b"".join([chunk async for chunk in r]) == b"two\nthree\n"
    assert CLIENT.append_bytes[spec.name] == 14
    assert CLIENT.read_bytes[spec.name] == 20
    got = parse(render(client_families()))
    assert got[("gazette_append_bytes_total", (("journal", spec.name),))] == 14
    assert got[("gazette_read_bytes_total", (("journal", spec.name),))] == 20


async def test_reader_end_offset_and_iteration(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    await append(client, pb.AppendRequest(journal=spec.name), b"0123456789")
    async with Reader(client, pb.ReadRequest(journal=spec.name, offset=2, end_offset=7)) as r:
        chunks = [c async for c in r]
    assert b"".join(chunks) == b"23456"
    assert r.offset == 7


async def test_reader_blocks_at_head_and_records_head_jump(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    await append(client, pb.AppendRequest(journal=spec.name), b"before\n")
    r = Reader(client, pb.ReadRequest(journal=spec.name, offset=-1, block=True))
    task = asyncio.create_task(r.read())
    await asyncio.sleep(0.3)
    assert not task.done()
    await append(client, pb.AppendRequest(journal=spec.name), b"after\n")
    assert await asyncio.wait_for(task, 5) == b"after\n"
    assert r.jumps == [OffsetJump(spec.name, -1, 7)]
    assert r.offset == 13
    r.close()


async def test_reader_journal_not_found(client: JournalClient) -> None:
    with pytest.raises(JournalNotFound):
        await Reader(client, pb.ReadRequest(journal="client/does-not-exist")).read()
    rr = RetryReader(client, pb.ReadRequest(journal="client/does-not-exist"), backoff_fn=no_backoff)
    with pytest.raises(JournalNotFound):
        await rr.read()


async def test_retry_reader_lines_seek_and_resume_after_head(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    await append(client, pb.AppendRequest(journal=spec.name), b"alpha\nbeta\ngam")
    rr = RetryReader(client, pb.ReadRequest(journal=spec.name))
    assert await rr.readline() == b"alpha\n"
    assert rr.offset == 6
    assert await rr.readline() == b"beta\n"
    with pytest.raises(OffsetNotYetAvailable):
        await rr.readline()  # "gam" stays buffered.
    assert rr.offset == 11
    await append(client, pb.AppendRequest(journal=spec.name), b"ma\ndelta\n")
    assert await rr.readline() == b"gamma\n"
    assert await rr.read() == b"delta\n"
    assert rr.seek(6) == 6
    assert await rr.read(4) == b"beta"
    assert rr.offset == 10
    rr.close()


async def test_retry_reader_end_offset_returns_empty(
    client: JournalClient, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    await append(client, pb.AppendRequest(journal=spec.name), b"a\nb\nc\n")
    rr = RetryReader(client, pb.ReadRequest(journal=spec.name, offset=2, end_offset=5))
    assert [line async for line in _lines(rr)] == [b"b\n", b"c"]
    assert await rr.read() == b""


async def _lines(rr: RetryReader):  # type: ignore[no-untyped-def]
    while line := await rr.readline():
        yield line


# --- Scripted edge cases ------------------------------------------------------------------


def _fragment_file(
    tmp_path: Path, content: bytes, begin: int, codec: int, *, corrupt: bool = False
) -> tuple[pb.Fragment, str]:
    buf = io.BytesIO()
    c = new_compressor(codec, buf)
    c.write(content)
    c.close()
    path = tmp_path / f"frag-{begin}-{codec}"
    path.write_bytes(buf.getvalue())
    digest = hashlib.sha1(content + (b"!" if corrupt else b"")).digest()
    frag = pb.Fragment(
        journal="fake/journal",
        begin=begin,
        end=begin + len(content),
        sum=sha1sum_from_digest(digest),
        compression_codec=codec,
        backing_store=f"file://{tmp_path}/",
    )
    return frag, f"file://{path}"


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP, pb.ZSTANDARD, pb.SNAPPY])
async def test_direct_fragment_read_is_verified_and_served_from_offset(
    tmp_path: Path, codec: int
) -> None:
    content = bytes(range(256)) * 40
    frag, url = _fragment_file(tmp_path, content, 1000, codec)
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        fb.journal.script(
            "Read",
            [pb.ReadResponse(offset=1100, write_head=99999, fragment=frag, fragment_url=url)],
        )
        req = pb.ReadRequest(journal="fake/journal", offset=1100, do_not_proxy=True)
        r = Reader(client, req)
        got = bytearray()
        while chunk := await r.read(4096):
            got += chunk
        assert bytes(got) == content[100:]
        assert r.offset == frag.end and r.fragment_url == url
        assert r.ended


async def test_direct_fragment_read_rejects_corrupt_content(tmp_path: Path) -> None:
    frag, url = _fragment_file(tmp_path, b"x" * 5000, 0, pb.GZIP, corrupt=True)
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        fb.journal.script("Read", [pb.ReadResponse(offset=0, fragment=frag, fragment_url=url)])
        fb.journal.script("Read", [pb.ReadResponse(offset=0, fragment=frag, fragment_url=url)])
        r = Reader(client, pb.ReadRequest(journal="fake/journal", do_not_proxy=True))
        with pytest.raises(FragmentCorrupted):
            await r.read()
        assert r.offset == 0
        rr = RetryReader(client, pb.ReadRequest(journal="fake/journal", do_not_proxy=True))
        with pytest.raises(FragmentCorrupted):
            await rr.read()
        assert rr.offset == 0


async def test_offset_jump_over_missing_content_is_surfaced() -> None:
    frag = pb.Fragment(journal="fake/journal", begin=500, end=503)
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        fb.journal.script(
            "Read",
            [
                pb.ReadResponse(offset=500, write_head=503, fragment=frag),
                pb.ReadResponse(offset=500, content=b"abc"),
                pb.ReadResponse(status=pb.OFFSET_NOT_YET_AVAILABLE, offset=503, write_head=503),
            ],
        )
        seen: list[OffsetJump] = []
        rr = RetryReader(
            client, pb.ReadRequest(journal="fake/journal", offset=100), on_jump=seen.append
        )
        assert await rr.read() == b"abc"
        assert seen == [OffsetJump("fake/journal", 100, 500)] and rr.jump_count == 1
        assert rr.offset == 503
        with pytest.raises(OffsetNotYetAvailable):
            await rr.read()


async def test_retry_reader_retries_routing_statuses_and_transport_errors() -> None:
    frag = pb.Fragment(journal="fake/journal", begin=0, end=4)
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        fb.journal.script(
            "Read",
            [pb.ReadResponse(status=pb.NOT_JOURNAL_BROKER)],
            grpc.StatusCode.UNAVAILABLE,
            [pb.ReadResponse(status=pb.NO_JOURNAL_PRIMARY_BROKER)],
            # A stream closed by the broker after some content: resumes where it stopped.
            [pb.ReadResponse(offset=0, fragment=frag), pb.ReadResponse(offset=0, content=b"ab")],
            [pb.ReadResponse(offset=2, fragment=frag), pb.ReadResponse(offset=2, content=b"cd")],
        )
        rr = RetryReader(
            client, pb.ReadRequest(journal="fake/journal", block=True), backoff_fn=no_backoff
        )
        assert await rr.read() == b"ab"
        assert await rr.read() == b"cd"
        offsets = [req.offset for req in fb.journal.calls["Read"]]
        assert offsets == [0, 0, 0, 0, 2]
        assert rr.jump_count == 0
        rr.close()


async def test_retry_reader_surfaces_non_transient_errors() -> None:
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        fb.journal.script(
            "Read", grpc.StatusCode.INVALID_ARGUMENT, [pb.ReadResponse(status=pb.SUSPENDED)]
        )
        rr = RetryReader(client, pb.ReadRequest(journal="fake/journal"), backoff_fn=no_backoff)
        with pytest.raises(grpc.aio.AioRpcError):
            await rr.read()
        with pytest.raises(Exception) as exc:
            await rr.read()
        assert type(exc.value).__name__ == "Suspended"


async def test_cancelled_read_resumes_without_loss() -> None:
    frag = pb.Fragment(journal="fake/journal", begin=0, end=2)
    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        hang = asyncio.Event()
        fb.journal.script("Read", [pb.ReadResponse(offset=0, fragment=frag), hang])
        fb.journal.script(
            "Read",
            [pb.ReadResponse(offset=0, fragment=frag), pb.ReadResponse(offset=0, content=b"hi")],
        )
        rr = RetryReader(client, pb.ReadRequest(journal="fake/journal", block=True))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(rr.read(), 0.3)  # First stream sends no content.
        assert rr.offset == 0
        assert await asyncio.wait_for(rr.read(), 5) == b"hi"
        hang.set()
