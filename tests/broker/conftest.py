"""A real broker process per test module, plus helpers speaking the raw protocol."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.testing.broker import BrokerProcess
from gazette.testing.cluster import BrokerCluster
from gazette.testing.etcd import EtcdServer
from tests.kit import specs
from tests.kit.eventually import eventually

_names = itertools.count()


@pytest.fixture(scope="module")
def broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    root = f"/test/{os.getpid()}/{next(_names)}"
    proc = BrokerProcess(
        etcd_server.endpoint, root=root, spool_dir=tmp_path_factory.mktemp("spool")
    )
    with proc:
        yield proc


@pytest.fixture
async def stub(broker: BrokerProcess) -> AsyncIterator[pb_grpc.JournalStub]:
    async with grpc.aio.insecure_channel(broker.endpoint) as channel:
        yield pb_grpc.JournalStub(channel)


def journal_spec(name: str, store: str | None = None, **kw: Any) -> pb.JournalSpec:
    """`tests.kit.specs.journal_spec` with the broker tests' defaults: the store refreshed
    every second, the label app=test."""
    return specs.journal_spec(
        name, store or None, **{"refresh": 1, "labels": {"app": "test"}, **kw}
    )


MakeJournal = Callable[..., Awaitable[pb.JournalSpec]]


@pytest.fixture
def make_journal(stub: pb_grpc.JournalStub, tmp_path: Path) -> MakeJournal:
    """Apply a journal with a unique name (and a file:// store under tmp_path by default)."""

    async def make(prefix: str = "it", *, store: str | None = "", **kw: object) -> pb.JournalSpec:
        name = f"tests/{prefix}-{next(_names)}"
        if store == "":
            (tmp_path / "store").mkdir(exist_ok=True)
            store = f"file://{tmp_path}/store/"
        spec = journal_spec(name, store, **kw)  # type: ignore[arg-type]
        resp = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
        assert resp.status == pb.OK
        return spec

    return make


async def append(
    stub: pb_grpc.JournalStub, journal: str, *chunks: bytes, commit: bool = True, **params: object
) -> pb.AppendResponse:
    async def requests() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=journal, **params)  # type: ignore[arg-type]
        for c in chunks:
            yield pb.AppendRequest(content=c)
        if commit:
            yield pb.AppendRequest()

    return await stub.Append(requests())


async def read_all(
    stub: pb_grpc.JournalStub, journal: str, offset: int = 0, end_offset: int = 0, **kw: object
) -> tuple[bytes, list[pb.ReadResponse]]:
    """Content from offset until OFFSET_NOT_YET_AVAILABLE (non-blocking) or end_offset."""
    out = bytearray()
    metas = []
    async for resp in stub.Read(
        pb.ReadRequest(journal=journal, offset=offset, end_offset=end_offset, **kw)
    ):  # type: ignore[arg-type]
        if resp.content:
            out += resp.content
        else:
            metas.append(resp)
    return bytes(out), metas


async def persisted(
    stub: pb_grpc.JournalStub, journal: str, count: int, timeout: float = 20
) -> list[pb.FragmentsResponse._Fragment]:
    """The journal's fragments, once at least `count` of them are persisted to its store."""

    async def listed() -> list[pb.FragmentsResponse._Fragment] | None:
        resp = await stub.ListFragments(pb.FragmentsRequest(journal=journal))
        done = sum(1 for f in resp.fragments if f.spec.backing_store) >= count
        return list(resp.fragments) if done else None

    fragments: list[pb.FragmentsResponse._Fragment] = await eventually(
        listed, what=f"{count} persisted fragments of {journal}", timeout=timeout, interval=0.1
    )
    return fragments


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test of a broker cluster reports each broker's state, port and log tail:
    a rare failure must say which process stopped answering, and why."""
    report = yield
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(cluster, BrokerCluster):
        report.sections.append(("brokers at the failure", cluster.describe()))
    return report
