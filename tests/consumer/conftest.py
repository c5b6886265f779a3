"""Fixtures of the consumer tests that run real processes: a broker per test module (under
its own etcd root), and a client of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from gazette.broker.client import JournalClient
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.conftest import session_broker


@pytest.fixture(scope="module")
def broker(
    request: pytest.FixtureRequest,
    etcd_server: EtcdServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[BrokerProcess]:
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    yield from session_broker(etcd_server, tmp_path_factory, f"consumer-{name}")


@pytest.fixture
async def client(broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.endpoint) as c:
        yield c
