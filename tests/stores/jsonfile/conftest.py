"""Fixtures of the JSON file store tests: a real broker and recovery-log journals, and
`recover`, which plays a log into a directory and hands it off as the runtime does."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer import RecoveredLog
from gazette.consumer import recover as recover_log
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.conftest import session_broker
from tests.kit.specs import RECOVERY_LOG, apply_specs, journal_spec

_names = itertools.count()

MakeLog = Callable[[], Awaitable[str]]
Recover = Callable[[str, Path, int], Awaitable[RecoveredLog]]


@pytest.fixture(scope="session")
def json_broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    yield from session_broker(etcd_server, tmp_path_factory, "jsonfile")


@pytest.fixture
async def client(json_broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(json_broker.endpoint) as c:
        yield c


@pytest.fixture
async def service(client: JournalClient) -> AsyncIterator[AppendService]:
    async with AppendService(client) as svc:
        yield svc


@pytest.fixture
def make_log(client: JournalClient, tmp_path: Path) -> MakeLog:
    """Apply a recovery-log journal with a unique name; return its name."""

    async def make() -> str:
        name = f"stores/jsonfile-{os.getpid()}-{next(_names)}"
        store = tmp_path / "fragments"
        await apply_specs(
            client, [journal_spec(name, store, length=1 << 26, content_type=RECOVERY_LOG)]
        )
        return name

    return make


@pytest.fixture
def recover(client: JournalClient, service: AppendService, json_broker: BrokerProcess) -> Recover:
    """Play `log` into `directory` and hand it off to `author`: a RecoveredLog."""

    async def play(log: str, directory: Path, author: int) -> RecoveredLog:
        return await recover_log(
            client, service, log, directory, author=author, broker_endpoint=json_broker.endpoint
        )

    return play
