"""Crash tests: a writer process is SIGKILLed at random points (while recovering, committing,
compacting...), and each time the log plays back into a database whose integrity check passes
and whose data is exactly that of a committed checkpoint at least as new as the last one the
writer acknowledged. Each trial's writer recovers from the previous trials' log."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from pathlib import Path

import pytest

from gazette.broker.client import JournalClient
from gazette.consumer.protocol import pb
from gazette.stores.sqlite.pagestore import is_wal_generation
from gazette.stores.sqlite.store import rebuild_played
from gazette.testing.broker import BrokerProcess
from tests.stores.sqlite.crash_writer import checkpoint, counter, model
from tests.stores.sqlite.support import (
    MakeLog,
    client,
    dump,
    integrity,
    make_log,
    play,
    store_broker,
)

__all__ = ["client", "make_log", "store_broker"]  # Fixtures used here.

ROOT = Path(__file__).resolve().parents[3]


async def _trial(
    endpoint: str, log: str, workdir: Path, mode: str, seed: int, rnd: random.Random
) -> tuple[int, int]:
    """Run a writer and SIGKILL it at a random point; return (recovered, last acked)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.stores.sqlite.crash_writer",
        endpoint,
        log,
        str(workdir),
        mode,
        str(seed),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    recovered, acked = -1, -1
    delay = rnd.uniform(0.0, 2.5)  # After recovery (sometimes during: see below).
    kill_in_recovery = rnd.random() < 0.2

    unexpected: list[str] = []

    async def read_lines() -> None:
        # Reads to the end whatever comes: a pipe left unread would stall `proc.wait()`.
        nonlocal recovered, acked
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            if not line.endswith(b"\n"):
                continue  # The last line, cut by the kill.
            match line.decode(errors="replace").split():
                case ["RECOVERED", n] if n.isdigit():
                    recovered = int(n)
                case ["ACK", n] if n.isdigit():
                    acked = int(n)
                case _:
                    unexpected.append(line.decode(errors="replace"))

    reader = asyncio.create_task(read_lines())
    try:
        if kill_in_recovery:
            await asyncio.sleep(rnd.uniform(0.3, 1.5))
        else:
            async with asyncio.timeout(60):
                while recovered < 0:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
        await reader
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert not unexpected, f"the writer printed {unexpected[:5]}"
    return recovered, acked


async def _crash_trials(
    client: JournalClient,
    broker: BrokerProcess,
    make_log: MakeLog,
    tmp_path: Path,
    mode: str,
    trials: int,
    seed: int,
) -> None:
    log = await make_log(f"crash-{mode}")
    rnd = random.Random(seed)
    newest_acked = 0
    wal_generations = 0  # Trials whose playback rebuilt the database from kept WALs.
    for trial in range(trials):
        recovered, acked = await _trial(
            broker.endpoint, log, tmp_path / f"writer-{trial}", mode, seed, rnd
        )
        if recovered >= 0:
            assert recovered >= newest_acked, "recovery lost an acknowledged commit"
        newest_acked = max(newest_acked, acked)

        target = tmp_path / f"verify-{trial}"
        _, fsm = await play(client, log, target)
        wal_generations += any(is_wal_generation(p) for p in fsm.links)
        if not rebuild_played(target, dict(fsm.links)):
            assert newest_acked == 0  # Killed before the database was first recorded.
            continue
        db = target / "primary.db"
        assert integrity(db) == "ok"
        rows = dump(db)
        checkpoints = [r[2] for r in rows if r[0] == "gazette_checkpoint"]
        assert len(checkpoints) <= 1  # None if killed while the store was first opened.
        cp = checkpoints[0] if checkpoints else b""
        assert isinstance(cp, bytes)
        message = pb.Checkpoint.FromString(cp)
        t = counter(message)
        assert message == (checkpoint(t) if t else pb.Checkpoint()), message
        assert t >= newest_acked, f"trial {trial}: checkpoint {t} < acknowledged {newest_acked}"
        kv = {r[1]: r[2] for r in rows if r[0] == "kv"}
        assert kv == model(seed, t), f"trial {trial}: data differs from checkpoint {t}"
        print(f"trial {trial}: recovered={recovered} acked={acked} checkpoint={t}")
    if mode.startswith("wal"):
        assert wal_generations > 0, "no trial played a database back from kept WALs"


@pytest.mark.parametrize("mode", ["wal", "delete", "wal-on_loop"])
async def test_sigkill_at_random_points(
    client: JournalClient, store_broker: BrokerProcess, make_log: MakeLog, tmp_path: Path, mode: str
) -> None:
    await _crash_trials(client, store_broker, make_log, tmp_path, mode, trials=5, seed=7)


@pytest.mark.chaos
@pytest.mark.parametrize(
    "mode", ["wal", "delete", "truncate", "persist", "wal-on_loop", "delete-on_loop"]
)
async def test_sigkill_at_random_points_chaos(
    client: JournalClient, store_broker: BrokerProcess, make_log: MakeLog, tmp_path: Path, mode: str
) -> None:
    await _crash_trials(client, store_broker, make_log, tmp_path, mode, trials=25, seed=1234)
