"""List (selectors, paging, watch) and Apply (guarded by mod revisions) on a real broker."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.broker.protocol.selector import parse_label_selector
from tests.kit.eventually import eventually

from .conftest import journal_spec


def change(spec: pb.JournalSpec, expect: int = 0) -> pb.ApplyRequest.Change:
    return pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=expect)


async def list_journals(stub: pb_grpc.JournalStub, selector: str = "") -> list[pb.ListResponse]:
    req = pb.ListRequest(selector=parse_label_selector(selector) if selector else None)
    return [r async for r in stub.List(req)]


async def test_apply_create_update_delete_with_revisions(stub: pb_grpc.JournalStub) -> None:
    spec = journal_spec("tests/apply/one")
    r = await stub.Apply(pb.ApplyRequest(changes=[change(spec)]))
    assert r.status == pb.OK
    # Creating again (expect 0) fails: the journal exists.
    r = await stub.Apply(pb.ApplyRequest(changes=[change(spec)]))
    assert r.status == pb.ETCD_TRANSACTION_FAILED

    (page,) = await list_journals(stub, "name=tests/apply/one")
    (j,) = page.journals
    assert j.spec == spec and j.mod_revision > 0 and j.create_revision == j.mod_revision

    spec.fragment.length = 2 << 20
    r = await stub.Apply(pb.ApplyRequest(changes=[change(spec, expect=j.mod_revision - 1)]))
    assert r.status == pb.ETCD_TRANSACTION_FAILED
    r = await stub.Apply(pb.ApplyRequest(changes=[change(spec, expect=j.mod_revision)]))
    assert r.status == pb.OK
    (page,) = await list_journals(stub, "name=tests/apply/one")
    assert page.journals[0].spec.fragment.length == 2 << 20
    rev = page.journals[0].mod_revision

    r = await stub.Apply(
        pb.ApplyRequest(
            changes=[pb.ApplyRequest.Change(delete="tests/apply/one", expect_mod_revision=rev)]
        )
    )
    assert r.status == pb.OK
    (page,) = await list_journals(stub, "name=tests/apply/one")
    assert not page.journals


async def test_apply_is_atomic_across_changes(stub: pb_grpc.JournalStub) -> None:
    a, b = journal_spec("tests/atomic/a"), journal_spec("tests/atomic/b")
    assert (await stub.Apply(pb.ApplyRequest(changes=[change(a)]))).status == pb.OK
    # b would succeed alone, but a's guard fails: neither applies.
    r = await stub.Apply(pb.ApplyRequest(changes=[change(b), change(a)]))
    assert r.status == pb.ETCD_TRANSACTION_FAILED
    (page,) = await list_journals(stub, "prefix=tests/atomic/")
    assert [j.spec.name for j in page.journals] == ["tests/atomic/a"]


@pytest.mark.parametrize(
    "spec_kw, field",
    [
        ({"replication": 0}, "replication"),
        ({"replication": 6}, "replication"),
    ],
)
async def test_apply_rejects_invalid_specs(
    stub: pb_grpc.JournalStub, spec_kw: dict, field: str
) -> None:  # type: ignore[type-arg]
    spec = journal_spec("tests/invalid/spec")
    for k, v in spec_kw.items():
        setattr(spec, k, v)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Apply(pb.ApplyRequest(changes=[change(spec)]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details().lower()


async def test_apply_rejects_bad_fragment_length(stub: pb_grpc.JournalStub) -> None:
    spec = journal_spec("tests/invalid/length", length=100)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Apply(pb.ApplyRequest(changes=[change(spec)]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "length" in err.value.details().lower()


async def test_list_selectors_and_paging(stub: pb_grpc.JournalStub) -> None:
    specs = []
    for i in range(30):
        s = journal_spec(f"tests/paging/j{i:02d}")
        s.labels.labels.append(pb.Label(name="parity", value="even" if i % 2 == 0 else "odd"))
        s.labels.labels.sort(key=lambda lb: (lb.name, lb.value))
        specs.append(s)
    r = await stub.Apply(pb.ApplyRequest(changes=[change(s) for s in specs]))
    assert r.status == pb.OK

    pages = await list_journals(stub, "prefix=tests/paging/")
    assert [len(p.journals) for p in pages] == [25, 5]
    assert pages[0].header.etcd.revision > 0 and not pages[1].HasField("header")
    names = [j.spec.name for p in pages for j in p.journals]
    assert names == sorted(s.name for s in specs)
    # Routes are assigned asynchronously after Apply, as upstream; they appear promptly.

    async def routed() -> list[pb.ListResponse] | None:
        pages = await list_journals(stub, "prefix=tests/paging/")
        return None if any(j.route.primary != 0 for p in pages for j in p.journals) else pages

    pages = await eventually(routed, what="the routes", timeout=10, interval=0.05)
    route = pages[0].journals[0].route
    assert route.primary == 0 and route.members[0].suffix == "broker-1" and route.endpoints

    pages = await list_journals(stub, "prefix=tests/paging/, parity=odd")
    assert len([j for p in pages for j in p.journals]) == 15
    pages = await list_journals(stub, "prefix=tests/paging/, parity!=odd")
    assert all(j.spec.name.endswith(("0", "2", "4", "6", "8")) for p in pages for j in p.journals)
    pages = await list_journals(stub, "name:prefix=tests/paging/j2")
    assert [j.spec.name for p in pages for j in p.journals] == [
        f"tests/paging/j2{i}" for i in range(10)
    ]


async def test_list_watch_sends_new_snapshots(stub: pb_grpc.JournalStub) -> None:
    req = pb.ListRequest(selector=parse_label_selector("prefix=tests/watch/"), watch=True)
    call = stub.List(req)
    it = call.__aiter__()
    first = await anext(it)
    assert first.status == pb.OK and not first.journals
    assert (await anext(it)) == pb.ListResponse()  # end of the first snapshot
    await stub.Apply(pb.ApplyRequest(changes=[change(journal_spec("tests/watch/a"))]))
    snap = await asyncio.wait_for(anext(it), 5)
    assert [j.spec.name for j in snap.journals] == ["tests/watch/a"]
    assert snap.header.etcd.revision > first.header.etcd.revision
    call.cancel()
