"""Listing, watching, applying journals; listing fragments; store health."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc.aio
import pytest

from gazette.broker.client import (
    EtcdTransactionFailed,
    FragmentStoreUnhealthy,
    JournalClient,
    JournalNotFound,
    PolledList,
    append,
    apply_journals,
    apply_journals_in_batches,
    fragment_store_health,
    get_journal,
    get_journal_entry,
    list_all_fragments,
    list_all_journals,
    watch_journals,
)
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.selector import parse_label_selector
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import free_port
from tests.kit.eventually import eventually

from .conftest import MakeJournal, journal_spec
from .fake_broker import FakeBroker


async def test_list_get_and_apply(
    client: JournalClient, make_journal: MakeJournal, tmp_path: Path
) -> None:
    spec = await make_journal("lst", labels={"app": "list-test", "color": "red"})
    await make_journal("lst", labels={"app": "list-test", "color": "blue"})
    red_sel = parse_label_selector("app=list-test, color=red")
    red = await list_all_journals(client, red_sel)
    assert [j.spec.name for j in red] == [spec.name] and red[0].mod_revision > 0

    async def routed() -> bool:  # Once the broker has taken the assignment.
        nonlocal red
        red = await list_all_journals(client, red_sel)
        return bool(red[0].route.members)

    await eventually(routed, what="the route", timeout=5, interval=0.05)
    assert red[0].route.members[0].suffix == "broker-1"
    assert client.routes.get(spec.name) is not None  # Listing primes the route cache.
    both = await list_all_journals(client, parse_label_selector("app=list-test"))
    assert len(both) == 2

    assert await get_journal(client, spec.name) == spec
    entry = await get_journal_entry(client, spec.name)
    with pytest.raises(JournalNotFound):
        await get_journal(client, "client/no-such-journal")

    # A stale expected revision fails the whole transaction.
    updated = pb.JournalSpec()
    updated.CopyFrom(spec)
    updated.max_append_rate = 1 << 20
    stale = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=updated, expect_mod_revision=1)])
    with pytest.raises(EtcdTransactionFailed) as exc:
        await apply_journals(client, stale)
    assert exc.value.journal == spec.name
    good = pb.ApplyRequest(
        changes=[pb.ApplyRequest.Change(upsert=updated, expect_mod_revision=entry.mod_revision)]
    )
    resp = await apply_journals(client, good)
    assert resp.header.etcd.revision > entry.mod_revision
    assert (await get_journal(client, spec.name)).max_append_rate == 1 << 20

    # Batches: create five, then delete them.
    names = [f"client/batch-{i}" for i in range(5)]
    store = f"file://{tmp_path}/store/"
    await apply_journals_in_batches(
        client,
        pb.ApplyRequest(
            changes=[pb.ApplyRequest.Change(upsert=journal_spec(n, store)) for n in names]
        ),
        2,
    )
    listed = await list_all_journals(client, parse_label_selector("name:prefix=client/batch-"))
    assert [j.spec.name for j in listed] == names
    await apply_journals_in_batches(
        client,
        pb.ApplyRequest(
            changes=[
                pb.ApplyRequest.Change(delete=j.spec.name, expect_mod_revision=j.mod_revision)
                for j in listed
            ]
        ),
        3,
    )
    assert await list_all_journals(client, parse_label_selector("name:prefix=client/batch-")) == []


async def test_watch_and_polled_list(client: JournalClient, make_journal: MakeJournal) -> None:
    sel = parse_label_selector("app=watch-test")
    watch = watch_journals(client, sel)
    assert await anext(watch) == []
    async with PolledList(client, sel, interval=0.2) as pl:
        assert pl.journals == []
        spec = await make_journal("w", labels={"app": "watch-test"})

        async def next_nonempty() -> list[pb.ListResponse.Journal]:
            # Other changes of the keyspace may produce snapshots before ours.
            while not (snap := await anext(watch)):
                pass
            return snap

        snap = await asyncio.wait_for(next_nonempty(), 10)
        assert [j.spec.name for j in snap] == [spec.name]
        polled = await asyncio.wait_for(pl.updated(), 5)
        assert [j.spec.name for j in polled] == [spec.name]
    await watch.aclose()


async def test_list_fragments_and_store_health(
    client: JournalClient, make_journal: MakeJournal, tmp_path: Path
) -> None:
    spec = await make_journal(length=1024)
    for _ in range(3):
        await append(client, pb.AppendRequest(journal=spec.name), b"z" * 1500)
    frags = await list_all_fragments(client, pb.FragmentsRequest(journal=spec.name, page_limit=1))
    assert frags[0].spec.begin == 0 and frags[-1].spec.end == 4500
    assert all(a.spec.end == b.spec.begin for a, b in zip(frags, frags[1:], strict=False))
    with pytest.raises(JournalNotFound):
        await list_all_fragments(client, pb.FragmentsRequest(journal="client/missing"))

    (tmp_path / "healthy").mkdir()
    resp = await fragment_store_health(client, f"file://{tmp_path}/healthy/")
    assert resp.status == pb.OK
    with pytest.raises(FragmentStoreUnhealthy) as exc:
        await fragment_store_health(client, f"file://{tmp_path}/missing/")
    assert "does not exist" in exc.value.detail


async def test_list_fragments_follows_page_tokens() -> None:
    def page(begin: int, token: int) -> pb.FragmentsResponse:
        r = pb.FragmentsResponse(status=pb.OK, next_page_token=token)
        r.fragments.add(spec=pb.Fragment(journal="fake/j", begin=begin, end=begin + 10))
        return r

    async with FakeBroker() as fb, JournalClient(fb.endpoint) as client:
        fb.journal.script("ListFragments", page(0, 10), page(10, 20), page(20, 0))
        frags = await list_all_fragments(client, pb.FragmentsRequest(journal="fake/j"))
        assert [f.spec.begin for f in frags] == [0, 10, 20]
        assert [r.next_page_token for r in fb.journal.calls["ListFragments"]] == [0, 10, 20]


async def test_listing_passes_over_a_broker_that_does_not_answer(
    client_broker: BrokerProcess, make_journal: MakeJournal
) -> None:
    """A consumer reading a journal lists it first: a client configured with several brokers
    must not fail that (and so the shard) because the first one is down."""
    spec = await make_journal("lst-failover")
    dead = f"127.0.0.1:{free_port()}"
    async with JournalClient([dead, client_broker.endpoint]) as c:
        assert (await get_journal(c, spec.name)).name == spec.name
        assert c.default_endpoint == client_broker.endpoint  # it stays with the live one
    async with JournalClient([dead]) as c:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await get_journal(c, spec.name)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
