"""Support for fusefs tests: a real broker, recovery logs, mounts that never outlive a test."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from gazette.broker.client import JournalClient
from gazette.fusefs import force_unmount, is_mounted, mounts_under
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.conftest import session_broker
from tests.stores.sqlite.support import apply_log

_names = itertools.count()

MakeLog = Callable[..., Awaitable[str]]


@pytest.fixture(scope="session")
def fuse_broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    yield from session_broker(etcd_server, tmp_path_factory, f"fusefs-{next(_names)}")


@pytest.fixture
async def client(fuse_broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(fuse_broker.endpoint) as c:
        yield c


@pytest.fixture
def make_log(client: JournalClient, tmp_path: Path) -> MakeLog:
    async def make(prefix: str = "fusefs") -> str:
        name = f"stores/{prefix}-{os.getpid()}-{next(_names)}"
        return await apply_log(client, name, tmp_path / "fragments")

    return make


@pytest.fixture
def no_stale_mounts(tmp_path: Path) -> Iterator[Path]:
    """tmp_path; the test fails if a mount under it outlives the test (then detached)."""
    yield tmp_path
    stale = mounts_under(tmp_path)
    for m in stale:
        force_unmount(m)
    assert not stale, f"stale mounts: {stale}"
    assert not any(is_mounted(m) for m in stale)


def tree(root: Path) -> dict[str, bytes]:
    """path -> content of every regular file under `root` (skipping the Player's staging)."""
    out: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".fnodes"]
        for n in filenames:
            p = Path(dirpath, n)
            out[str(p.relative_to(root))] = p.read_bytes()
    return out
