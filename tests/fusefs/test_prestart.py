"""fusefs processes started ahead of need (`PrestartedServer`, `ServerPool`): a mount through
one records like any other and is ready sooner; unused ones end without a trace."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from gazette.broker.client import JournalClient
from gazette.fusefs import FuseMount, is_mounted, play_for_mount
from gazette.fusefs.mount import PrestartedServer, ServerPool
from gazette.recoverylog.player import Player
from gazette.testing.broker import BrokerProcess
from tests.fusefs.support import MakeLog, client, fuse_broker, make_log, no_stale_mounts, tree
from tests.kit.eventually import eventually
from tests.kit.processes import idle

__all__ = ["client", "fuse_broker", "make_log", "no_stale_mounts"]

AUTHOR = 0xA11CE


async def _start(
    client: JournalClient, endpoint: str, log: str, root: Path, prestarted: PrestartedServer | None
) -> tuple[FuseMount, float]:
    fsm = await play_for_mount(client, log, root / "backing", AUTHOR)
    t0 = time.monotonic()
    mount = await FuseMount.start(
        endpoint, log, fsm, AUTHOR, root / "backing", root / "mnt", prestarted=prestarted
    )
    return mount, time.monotonic() - t0


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


async def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_prestarted_server_mounts_sooner_and_records(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    root = no_stale_mounts
    cold, cold_s = await _start(client, fuse_broker.endpoint, await make_log(), root / "c", None)
    await cold.stop()

    log = await make_log()
    server = await PrestartedServer.start()
    await asyncio.sleep(1.5)  # Its imports are done by now.
    mount, warm_s = await _start(client, fuse_broker.endpoint, log, root / "w", server)
    try:
        assert mount.pid == server.proc.pid and not server.usable
        await asyncio.to_thread(_fsync_write, mount.mountpoint / "f", b"recorded")
        await Player(client, log, None, root / "play").play()
        assert tree(root / "play") == {"f": b"recorded"}
    finally:
        assert await mount.stop() is not None
    assert not is_mounted(root / "w" / "mnt")
    # The interpreter's start and imports (~0.35 s here) are not waited for.
    assert warm_s < cold_s, (warm_s, cold_s)


async def test_unused_servers_end(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    server = await PrestartedServer.start()
    # Its imports take seconds on a loaded machine; close() kills a server still busy after
    # 5 s. Here the clean path is under test: a server waiting on its pipe sees it close.
    await eventually(lambda: idle(server.proc.pid), what="the server's imports", timeout=60)
    await server.close()
    assert server.proc.returncode == 0  # It saw its control pipe close.

    # A server of another log level is not used for a mount: it is ended, a new one mounts.
    other = await PrestartedServer.start(log_level="DEBUG")
    root = no_stale_mounts
    mount, _ = await _start(client, fuse_broker.endpoint, await make_log(), root, other)
    try:
        assert mount.pid != other.proc.pid
        assert other.proc.returncode is not None
    finally:
        await mount.stop()

    # A server that died meanwhile is not used either.
    dead = await PrestartedServer.start()
    dead.proc.kill()
    await dead.proc.wait()
    assert not dead.usable and await dead.hand(root / "none.json") is None


async def test_the_pool_is_idle_until_reserved_and_refills(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    pool = ServerPool(size=1)
    assert pool.take() is None
    await asyncio.sleep(0.2)
    assert pool.take() is None  # Not reserved: nothing started.
    pool.reserve()
    first = await _ready(pool)
    assert first.usable
    second = await _ready(pool)  # Refilled after the take.
    assert second.proc.pid != first.proc.pid
    await first.close()
    pool.reserve()
    third = await _ready(pool)
    pending = await _ready_count(pool)
    kept = pool._ready[0].proc
    await eventually(lambda: idle(kept.pid), what="the kept server's imports", timeout=60)
    await pool.close()
    assert pending == 1
    assert kept.returncode == 0  # The one kept ready ended (its control pipe closed).
    for s in (second, third):
        assert s.usable
        await s.close()
    # Closed: the one kept ready has ended.
    assert pool.take() is None


async def _ready(pool: ServerPool, timeout: float = 20.0) -> PrestartedServer:
    deadline = time.monotonic() + timeout
    while (server := pool.take()) is None:
        assert time.monotonic() < deadline, "no server became ready"
        await asyncio.sleep(0.05)
    return server


async def _ready_count(pool: ServerPool, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while not pool._ready and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return len(pool._ready)


async def test_a_start_failing_before_the_hand_over_ends_the_server(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    root = no_stale_mounts
    log = await make_log()
    fsm = await play_for_mount(client, log, root / "backing", AUTHOR)
    (root / "file").write_bytes(b"")
    server = await PrestartedServer.start()
    with pytest.raises(OSError):  # The mountpoint cannot be made: under a file.
        await FuseMount.start(
            fuse_broker.endpoint,
            log,
            fsm,
            AUTHOR,
            root / "backing",
            root / "file" / "mnt",
            prestarted=server,
        )
    assert server.proc.returncode is not None  # Not left waiting for a mount.


def _children() -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            out.update(int(k) for k in (task / "children").read_text().split())
        except OSError:  # A thread that ended meanwhile.
            continue
    return out


async def test_the_refill_after_a_take_waits_and_a_close_does_not_wait_for_it() -> None:
    pool = ServerPool(size=1, refill_delay=0.5)
    pool.reserve()
    first = await _ready(pool)
    before = _children()
    await asyncio.sleep(0.2)
    # The store that took it mounts and opens meanwhile, with the cores to itself.
    assert _children() == before
    second = await _ready(pool)
    assert second.proc.pid not in before
    for s in (first, second):
        await s.close()

    # Closed while the refill waits: at once, and nothing is started.
    third = await _ready(pool)
    before = _children()
    t0 = time.monotonic()
    await pool.close()
    assert time.monotonic() - t0 < 0.3
    # Past the refill's delay (0.5 s): nothing may start.
    await asyncio.sleep(0.6)
    assert _children() <= before
    await third.close()
