"""RecorderBridge on the loop's side: hand-overs queued in one loop turn go as one append, in
that turn."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker.client import AppendService, JournalClient
from stores.sqlite.bridge import RecorderBridge
from tests.recoverylog.recorder_support import read_log, replay
from tests.stores.sqlite.support import (
    MakeLog,
    client,
    make_log,
    new_recorder,
    service,
    store_broker,
)

__all__ = ["client", "make_log", "service", "store_broker"]


async def test_handovers_queued_together_are_released_together_in_their_turn(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "db", 0xB1)
    bridge = RecorderBridge(rec, asyncio.get_running_loop())
    bridge.create("f")
    bridge.flush()
    await asyncio.sleep(0)
    await rec.barrier()
    rpcs = service.rpc_count

    # Three hand-overs queued before the loop runs any of them, as from a busy SQLite thread.
    for i in range(3):
        bridge.write("f", i * 4, b"%04d" % i)
        bridge.flush()
    await asyncio.sleep(0)  # One turn: the three are applied...
    released = service.pending_except("")
    assert len(released) == 1  # ...and released as one append, in that turn.
    await rec.barrier()
    assert service.rpc_count - rpcs == 1
    assert replay(await read_log(client, log), log).files() == {"/f": b"000000010002"}
