"""The RocksDB store kind's hook (`stores.rocksdb.prestart`): a consumer process keeps a fusefs
process started ahead from its own start, not from a standby's first RocksDB file."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gazette.stores.rocksdb.prestart import FusefsPrestart, PrestartOptions
from tests.kit.eventually import eventually
from tests.kit.processes import idle


def _children() -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            out += [int(k) for k in (task / "children").read_text().split()]
        except OSError:  # A thread that ended meanwhile.
            continue
    return out


async def test_the_hook_starts_a_fusefs_process_at_once() -> None:
    before = _children()
    hook = FusefsPrestart(PrestartOptions(prestart=1))
    try:
        assert hook.pool is not None
        # Spawned at the first step of the pool's task, before any standby asked: the
        # runtime yields once after starting its hooks (`start_store_hooks`).
        await asyncio.sleep(0)
        (spawned,) = set(_children()) - set(before)
        server = await eventually(
            hook.pool.take, what="a pre-started fusefs process to take", timeout=5
        )
        assert server is not None and server.usable and server.proc.pid == spawned
        # Its imports take seconds on a loaded machine; close() kills a server still busy
        # after 5 s. The clean path is under test: a server waiting on its pipe sees it close.
        await eventually(lambda: idle(spawned), what="the server's imports", timeout=60)
        await server.close()
        assert server.proc.returncode == 0  # It saw its control pipe close.
    finally:
        await hook.close()


async def test_none_with_prestart_0() -> None:
    hook = FusefsPrestart(PrestartOptions(prestart=0))
    assert hook.pool is None
    assert hook.standby(lambda _path: True)
    await hook.close()


def test_made_outside_an_event_loop_the_pool_waits_for_a_standby() -> None:
    hook = FusefsPrestart(PrestartOptions(prestart=1))
    assert hook.pool is not None and hook.pool._starting is None
