"""Support for the SQLite store tests: a real broker, recovery-log journals, and helpers to
open, play back and read stores."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from gazette.broker.client import AppendService, JournalClient
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.player import Player
from gazette.recoverylog.recorder import Recorder
from gazette.stores.sqlite import SQLiteStore
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.conftest import session_broker
from tests.kit.specs import RECOVERY_LOG, apply_specs, journal_spec
from tests.stores.checkpoints import rich

_names = itertools.count()

MakeLog = Callable[..., Awaitable[str]]


@pytest.fixture(scope="session")
def store_broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    yield from session_broker(etcd_server, tmp_path_factory, f"sqlite-{next(_names)}")


@pytest.fixture
async def client(store_broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(store_broker.endpoint) as c:
        yield c


@pytest.fixture
async def service(client: JournalClient) -> AsyncIterator[AppendService]:
    async with AppendService(client) as svc:
        yield svc


async def apply_log(client: JournalClient, name: str, store_dir: Path) -> str:
    """Apply recovery log `name` (64 MiB fragments in `store_dir`); return its name."""
    spec = journal_spec(name, store_dir, length=1 << 26, content_type=RECOVERY_LOG)
    await apply_specs(client, [spec])
    return name


@pytest.fixture
def make_log(client: JournalClient, tmp_path: Path) -> MakeLog:
    """Apply a recovery-log journal with a unique name; return its name."""

    async def make(prefix: str = "sqlite") -> str:
        name = f"stores/{prefix}-{os.getpid()}-{next(_names)}"
        return await apply_log(client, name, tmp_path / "fragments")

    return make


async def new_recorder(service: AppendService, log: str, directory: Path, author: int) -> Recorder:
    directory.mkdir(parents=True, exist_ok=True)
    return await Recorder.open(FSM(log), author, directory, service, log)


async def play(
    client: JournalClient, log: str, directory: Path, hints: object = None
) -> tuple[Player, FSM]:
    player = Player(client, log, hints, directory)  # type: ignore[arg-type]
    fsm = await player.play()
    return player, fsm


def dump(path: Path) -> list[tuple[object, ...]]:
    """Every row of every user table of the database at `path`, opened natively."""
    conn = apsw.Connection(str(path))
    try:
        out: list[tuple[object, ...]] = []
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        for t in tables:
            out.extend((t, *row) for row in conn.execute(f"SELECT * FROM {t} ORDER BY 1"))
        return out
    finally:
        conn.close()


def integrity(path: Path) -> str:
    conn = apsw.Connection(str(path))
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchall()[0][0])
    finally:
        conn.close()


Op = tuple[Any, ...]


class OpLog:
    """A RecorderBridge stand-in which keeps the operations in order; ``fail[method]`` makes
    `write` or `sync` raise that error."""

    discarded = False  # As a bridge of a store still recording.
    deferring = False  # Set by the VFS's WAL hook while it checkpoints.

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.fail: dict[str, BaseException] = {}

    def _check(self, method: str) -> None:
        err = self.fail.get(method)
        if err is not None:
            raise err

    def create(self, path: str) -> None:
        self.ops.append(("create", path))

    def truncate(self, path: str) -> None:
        self.ops.append(("truncate", path))

    def unlink(self, path: str) -> None:
        self.ops.append(("unlink", path))

    def rename(self, src: str, dst: str) -> None:
        self.ops.append(("rename", src, dst))

    def write(self, path: str, offset: int, data: bytes) -> None:
        self._check("write")
        if data:
            self.ops.append(("write", path, offset, bytes(data)))

    def sync(self, wait: bool = True) -> None:
        self._check("sync")

    def flush(self) -> None:
        pass

    def defer(self) -> None:
        pass


async def assert_commits_resolve_in_log_order(
    store: SQLiteStore, rec: Recorder, keys: range, value: bytes
) -> None:
    """Start a commit per key (its transaction upserts `value` at it into table ``kv``)
    without awaiting any, and check that they resolve in log order."""
    heads: list[int] = []
    commits = []
    for k in keys:
        await store.transact(
            lambda c, k=k: c.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", (k, value))
        )
        commit = store.start_commit(None, rich(k), [])
        commit.add_done_callback(lambda _: heads.append(rec.write_head))
        commits.append(commit)
    await asyncio.gather(*commits)
    assert heads == sorted(heads) and heads[0] > 0
