"""Crash tests: a writer process (store + its fusefs process) applies transactions while the
writer, its fusefs process, or both are SIGKILLed at random moments (while recovering,
committing, flushing, compacting). Each time, the log plays back into a fresh directory
holding a RocksDB which opens and holds exactly the state of a committed checkpoint at least
as new as the last acknowledged one; a killed writer's fusefs process unmounts by itself."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from gazette.broker.client import JournalClient
from gazette.consumer.protocol import pb
from gazette.fusefs import force_unmount, is_mounted
from gazette.recoverylog.player import Player
from gazette.stores.rocksdb import CHECKPOINT_KEY
from gazette.testing.broker import BrokerProcess
from tests.fusefs.support import MakeLog, client, fuse_broker, make_log, no_stale_mounts
from tests.kit.eventually import eventually
from tests.stores.rocksdb.crash_writer import checkpoint, counter, model

__all__ = ["client", "fuse_broker", "make_log", "no_stale_mounts"]

ROOT = Path(__file__).resolve().parents[3]


async def _trial(
    endpoint: str, log: str, workdir: Path, seed: int, rnd: random.Random
) -> tuple[int, int, str]:
    """Run a writer and kill it (and/or its fusefs) at a random point; return (recovered,
    last acked, what was killed)."""
    workdir.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.stores.rocksdb.crash_writer",
        endpoint,
        log,
        str(workdir),
        str(seed),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        # Files the writer's mount leaves behind when both processes die go with `workdir`.
        env=dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", TMPDIR=str(workdir)),
    )
    assert proc.stdout is not None
    recovered, acked, fusefs_pid = -1, -1, 0

    async def read_lines() -> None:
        nonlocal recovered, acked, fusefs_pid
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            parts = line.decode().split()
            if len(parts) != 2:
                print("writer:", line)
                continue
            word, n = parts
            if word == "RECOVERED":
                recovered = int(n)
            elif word == "FUSEFS":
                fusefs_pid = int(n)
            else:
                acked = int(n)

    reader = asyncio.create_task(read_lines())
    what = rnd.choice(["writer", "fusefs", "both"])
    try:
        await eventually(
            lambda: recovered >= 0 or proc.returncode is not None,
            what="the writer to recover or exit",
            timeout=60,
        )
        assert recovered >= 0, "writer exited before recovering"
        await asyncio.sleep(rnd.uniform(0.0, 1.5))  # A random moment of the writes.
        if what in ("fusefs", "both"):
            os.kill(fusefs_pid, signal.SIGKILL)
            if what == "both":
                # The two kills a random moment apart.
                await asyncio.sleep(rnd.uniform(0.0, 0.05))
        if what in ("writer", "both"):
            os.kill(proc.pid, signal.SIGKILL)
        if what == "fusefs":
            # The writer's next fsync fails; let it die of it (or kill it after a while).
            try:
                async with asyncio.timeout(5):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
        await proc.wait()
        await reader
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # However the processes died, the mount goes away by itself: the fusefs process of a
    # killed writer unmounts, and a guardian process detaches the mount of a killed fusefs.
    mnt = workdir / "backing.mnt"
    deadline = time.monotonic() + 10
    while is_mounted(mnt) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if is_mounted(mnt):
        state = "gone"
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{fusefs_pid}/status").read_text().split("\n")[2]
            state += " wchan=" + Path(f"/proc/{fusefs_pid}/wchan").read_text()
        force_unmount(mnt)
        raise AssertionError(f"{what} killed: fusefs {fusefs_pid} left its mount: {state}")
    return recovered, acked, what


async def _verify(client: JournalClient, log: str, directory: Path) -> int:
    """Play `log` back into `directory`; open the database natively; check it holds exactly
    the model state of its checkpoint; return that checkpoint."""
    await Player(client, log, None, directory).play()
    db = Rdict(str(directory), Options(raw_mode=True))
    try:
        raw = db.get(CHECKPOINT_KEY)
        cp = pb.Checkpoint.FromString(raw or b"")
        n = counter(cp)
        assert cp == (checkpoint(n) if n else pb.Checkpoint()), cp
        got = {k: v for k, v in db.items(from_key=b"\x01")}
    finally:
        db.close()
    want = model(n)
    assert got == want, f"state of checkpoint {n} differs: {len(got)} vs {len(want)} keys"
    return n


async def _run(
    client: JournalClient, endpoint: str, log: str, root: Path, trials: int, seed: int
) -> None:
    rnd = random.Random(seed)
    best = 0
    for i in range(trials):
        recovered, acked, what = await _trial(endpoint, log, root / f"w{i}", seed + i, rnd)
        assert recovered >= best, f"trial {i}: recovered {recovered} < last verified {best}"
        n = await _verify(client, log, root / f"play{i}")
        assert n >= max(acked, recovered), f"trial {i} ({what}): checkpoint {n} < acked {acked}"
        print(f"trial {i}: killed {what} recovered={recovered} acked={acked} checkpoint={n}")
        best = n


@pytest.mark.timeout(120)
async def test_crash_trials(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log("rocks-crash")
    await _run(client, fuse_broker.endpoint, log, no_stale_mounts, 4, 1)


@pytest.mark.chaos
@pytest.mark.timeout(900)
async def test_crash_trials_chaos(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log("rocks-crash-chaos")
    await _run(client, fuse_broker.endpoint, log, no_stale_mounts, 25, 1000)
