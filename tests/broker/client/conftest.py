"""A real broker shared by the client tests of a session, and per-test journals on it."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gazette.broker.client import JournalClient, apply_journals
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.conftest import session_broker
from tests.kit import specs

_names = itertools.count()


@pytest.fixture(scope="session")
def client_broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    yield from session_broker(etcd_server, tmp_path_factory, "client")


@pytest.fixture
async def client(client_broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(client_broker.endpoint) as c:
        yield c


def journal_spec(name: str, store: str, **kw: Any) -> pb.JournalSpec:
    """`tests.kit.specs.journal_spec` with the client tests' defaults: the store refreshed
    every 10 seconds, the label app=client-test."""
    kw["labels"] = kw.get("labels") or {"app": "client-test"}
    return specs.journal_spec(name, store, **{"refresh": 10, **kw})


MakeJournal = Callable[..., Awaitable[pb.JournalSpec]]


@pytest.fixture
def make_journal(client: JournalClient, tmp_path: Path) -> MakeJournal:
    """Apply a journal with a unique name and a file:// store under tmp_path."""

    async def make(prefix: str = "c", **kw: object) -> pb.JournalSpec:
        name = f"client/{prefix}-{next(_names)}"
        (tmp_path / "store").mkdir(exist_ok=True)
        spec = journal_spec(name, f"file://{tmp_path}/store/", **kw)  # type: ignore[arg-type]
        await apply_journals(client, pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
        return spec

    return make
