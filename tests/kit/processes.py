"""Looking at a child process from outside: `idle` tells a process that finished starting
(it blocks, using no CPU) from one still importing."""

from __future__ import annotations

import asyncio
from pathlib import Path

__all__ = ["idle"]


def _state_and_cpu(pid: int) -> tuple[str, int]:
    """Process `pid`'s state letter and CPU ticks used (utime + stime), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[11]) + int(fields[12])


async def idle(pid: int, quiet: float = 0.3) -> bool:
    """Whether process `pid` sleeps and used no CPU for `quiet` seconds (e.g. done importing,
    it blocks reading a pipe). Use it in `eventually`."""
    state, before = _state_and_cpu(pid)
    await asyncio.sleep(quiet)
    state_after, after = _state_and_cpu(pid)
    return state == state_after == "S" and before == after
