"""Fixtures of the consumer tests that run real processes: a broker per test module (under
its own etcd root), a client of it, and `Setup`s of the counter application whose consumer
processes are killed at the end of the test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from gazette.broker.client import JournalClient
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.conftest import session_broker
from tests.consumer.support import COUNTER, Setup


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


@pytest.fixture
def new_setup(
    etcd_server: EtcdServer, broker: BrokerProcess, tmp_path: Path
) -> Iterator[Callable[..., Setup]]:
    """Make a `Setup` of `shards` shards (one by default) of counter application `app`."""
    made: list[Setup] = []

    def make(shards: int = 1, app: str = COUNTER) -> Setup:
        made.append(Setup(etcd_server, broker, tmp_path, shards, app))
        return made[-1]

    yield make
    for s in made:
        s.close()
