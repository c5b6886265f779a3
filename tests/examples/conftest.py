"""The examples' packages are not installed: put their directories on sys.path. A broker for
each example's test module (under its own etcd root), and a client of it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gazette.broker.client import JournalClient
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.conftest import session_broker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WORD_COUNT = EXAMPLES / "word-count"
STREAM_SUM = EXAMPLES / "stream-sum"
BIKE_SHARE = EXAMPLES / "bike-share"
for _example in (WORD_COUNT, STREAM_SUM, BIKE_SHARE):
    if str(_example) not in sys.path:
        sys.path.insert(0, str(_example))


@pytest.fixture(scope="module")
def broker(
    etcd_server: EtcdServer,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[BrokerProcess]:
    """A broker of the test module alone: its journals are listed by nothing else."""
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    yield from session_broker(etcd_server, tmp_path_factory, name)


@pytest.fixture
async def client(broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(broker.endpoint) as c:
        yield c
