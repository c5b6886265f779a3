"""ListFragments, direct (do_not_proxy) reads, offset jumps and FragmentStoreHealth."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.parse import urlparse

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from tests.kit.eventually import eventually

from .conftest import MakeJournal, append, persisted, read_all


async def test_list_fragments_paging_and_signed_urls(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal(length=1024)
    for i in range(6):
        await append(stub, spec.name, bytes([65 + i]) * 1100)  # each append rolls a fragment
    frags = await persisted(stub, spec.name, 5)
    assert [(f.spec.begin, f.spec.end) for f in frags][:5] == [
        (i * 1100, (i + 1) * 1100) for i in range(5)
    ]

    page1 = await stub.ListFragments(pb.FragmentsRequest(journal=spec.name, page_limit=2))
    assert len(page1.fragments) == 2 and page1.next_page_token == 2200
    page2 = await stub.ListFragments(
        pb.FragmentsRequest(journal=spec.name, page_limit=2, next_page_token=page1.next_page_token)
    )
    assert page2.fragments[0].spec.begin == 2200

    from google.protobuf.duration_pb2 import Duration

    signed = await stub.ListFragments(
        pb.FragmentsRequest(journal=spec.name, signatureTTL=Duration(seconds=60))
    )
    url = signed.fragments[0].signed_url
    assert url.startswith("file://")
    assert Path(urlparse(url).path).read_bytes() == b"A" * 1100

    now = int(time.time())
    recent = await stub.ListFragments(
        pb.FragmentsRequest(journal=spec.name, begin_mod_time=now - 60)
    )
    assert all(f.spec.backing_store for f in recent.fragments) and len(recent.fragments) >= 5
    future = await stub.ListFragments(
        pb.FragmentsRequest(journal=spec.name, begin_mod_time=now + 3600)
    )
    assert not future.fragments


async def test_do_not_proxy_read_returns_fragment_url(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal(length=1024)
    await append(stub, spec.name, b"x" * 1500)
    await append(stub, spec.name, b"y" * 10)
    await persisted(stub, spec.name, 1)
    content, metas = await read_all(stub, spec.name, do_not_proxy=True)
    assert content == b""
    (meta,) = metas
    assert meta.fragment.backing_store and meta.fragment_url.startswith("file://")
    assert (meta.fragment.begin, meta.fragment.end) == (0, 1500)


async def test_read_reports_offset_jump_when_history_is_deleted(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal, tmp_path: Path
) -> None:
    spec = await make_journal(length=1024)
    for c in b"abc":
        await append(stub, spec.name, bytes([c]) * 1100)
    await append(stub, spec.name, b"tail")
    await persisted(stub, spec.name, 3)
    # Remove the first persisted fragment from the store, as retention would.
    first = min((tmp_path / "store").rglob("0000000000000000-*"))
    first.unlink()

    async def forgotten() -> bool:  # By a refresh of the store (every second).
        resp = await stub.ListFragments(pb.FragmentsRequest(journal=spec.name))
        return all(f.spec.begin != 0 for f in resp.fragments)

    await eventually(
        forgotten, what="the index to drop the deleted fragment", timeout=10, interval=0.1
    )
    content, metas = await read_all(stub, spec.name, offset=0)
    assert metas[0].offset == 1100, "the read must report where it really starts"
    assert content == b"b" * 1100 + b"c" * 1100 + b"tail"


async def test_read_never_jumps_to_the_head_over_content_not_listed_yet(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal, tmp_path: Path
) -> None:
    """A gap of the index up to the write head, with nothing known to have skipped it, is
    content the primary or a store holds and this replica has not listed yet (here a
    fragment taken out of the store, then put back, as an upload that lands late): a read
    never jumps over it to the head. A non-blocking read says "not yet available" at its own
    offset; a blocking one gets the content once the store lists it."""
    spec = await make_journal(length=1024)  # each append is rolled and persisted in a second
    await append(stub, spec.name, b"a" * 1100)
    await persisted(stub, spec.name, 1)
    await append(stub, spec.name, b"b" * 1100)
    await persisted(stub, spec.name, 2)
    last = next((tmp_path / "store").rglob("000000000000044c-*"))
    held = tmp_path / "held"
    last.rename(held)

    async def forgotten() -> bool:  # By a refresh of the store (every second).
        resp = await stub.ListFragments(pb.FragmentsRequest(journal=spec.name))
        return [(f.spec.begin, f.spec.end) for f in resp.fragments] == [(0, 1100)]

    await eventually(forgotten, what="the index to lose [1100, 2200)", timeout=10, interval=0.1)
    content, metas = await read_all(stub, spec.name, offset=1100)
    assert content == b""
    assert [(m.status, m.offset, m.write_head) for m in metas] == [
        (pb.OFFSET_NOT_YET_AVAILABLE, 1100, 2200)
    ], "a non-blocking read must not jump over content that may still be listed"

    blocking = asyncio.create_task(
        read_all(stub, spec.name, offset=1100, end_offset=2200, block=True)
    )
    await asyncio.sleep(1.5)
    assert not blocking.done(), f"a blocking read must wait at the gap: {blocking.result()}"
    held.rename(last)  # The upload landed.
    content, metas = await asyncio.wait_for(blocking, 20)
    assert content == b"b" * 1100
    assert metas[0].offset == 1100


async def test_fragment_store_health(stub: pb_grpc.JournalStub, tmp_path: Path) -> None:
    ok = await stub.FragmentStoreHealth(
        pb.FragmentStoreHealthRequest(fragment_store=f"file://{tmp_path}/")
    )
    assert ok.status == pb.OK
    bad = await stub.FragmentStoreHealth(
        pb.FragmentStoreHealthRequest(fragment_store=f"file://{tmp_path}/missing/dir/")
    )
    assert bad.status == pb.FRAGMENT_STORE_UNHEALTHY and "missing" in bad.store_health_error
    unknown = await stub.FragmentStoreHealth(
        pb.FragmentStoreHealthRequest(fragment_store="ftp://x/")
    )
    assert unknown.status == pb.FRAGMENT_STORE_UNHEALTHY and "ftp" in unknown.store_health_error


async def test_path_postfix_template_partitions_persisted_fragments(
    stub: pb_grpc.JournalStub, tmp_path: Path
) -> None:
    from .conftest import journal_spec

    (tmp_path / "store").mkdir()
    spec = journal_spec("tests/postfix/daily", f"file://{tmp_path}/store/", length=1024)
    spec.fragment.path_postfix_template = 'date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}'
    r = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
    assert r.status == pb.OK
    await append(stub, spec.name, b"p" * 1100)
    await append(stub, spec.name, b"q")
    frags = await persisted(stub, spec.name, 1)
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert frags[0].spec.path_postfix == f"date={today}"
    (stored,) = (tmp_path / "store" / "tests/postfix/daily" / f"date={today}").iterdir()
    assert stored.name.startswith("0000000000000000-000000000000044c-")
    await asyncio.sleep(1.5)  # A refresh (every second) lists the store, postfix directories too.
    content, _ = await read_all(stub, spec.name)
    assert content == b"p" * 1100 + b"q"


async def test_apply_rejects_unsupported_postfix_template(stub: pb_grpc.JournalStub) -> None:
    import grpc
    import pytest

    from .conftest import journal_spec

    spec = journal_spec("tests/postfix/bad", "file:///tmp/")
    spec.fragment.path_postfix_template = "{{ .Spool.Nope }}"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "PathPostfixTemplate" in err.value.details()
