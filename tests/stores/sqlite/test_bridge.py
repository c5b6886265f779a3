"""RecorderBridge on the loop's side: hand-overs queued in one loop turn go as one append, in
that turn; hand-overs made on the loop's own thread (a store ``on_loop``) go at once."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from gazette.broker.client import AppendService, JournalClient
from gazette.stores.sqlite.bridge import RecorderBridge
from tests.kit.journals import read_to_head
from tests.recoverylog.recorder_support import replay
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

    # Three hand-overs queued before the loop runs any of them, from a busy SQLite thread
    # (the loop blocked in join meanwhile).
    def hand_over() -> None:
        for i in range(3):
            bridge.write("f", i * 4, b"%04d" % i)
            bridge.flush()

    thread = threading.Thread(target=hand_over)
    thread.start()
    thread.join()
    await asyncio.sleep(0)  # One turn: the three are applied...
    released = service.pending_except("")
    assert len(released) == 1  # ...and released as one append, in that turn.
    await rec.barrier()
    assert service.rpc_count - rpcs == 1
    assert replay(await read_to_head(client, log), log).files() == {"/f": b"000000010002"}


async def test_a_handover_on_the_loops_thread_is_released_at_once_and_never_waits(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "db", 0xB2)
    bridge = RecorderBridge(rec, asyncio.get_running_loop(), max_unsynced=8)
    bridge.create("f")
    bridge.write("f", 0, b"0123456789")  # Past max_unsynced: a thread would wait here.
    bridge.flush()
    # Applied and released before flush returned, without a turn of the loop.
    assert len(service.pending_except("")) == 1
    bridge.write("f", 10, b"abc")
    bridge.sync(wait=False)  # Recorded behind the append in flight; nothing waited.
    assert rec.write_head == 0  # (Nothing committed yet: nothing was waited for.)
    with pytest.raises(RuntimeError, match="would block the event loop"):
        bridge.sync()
    await rec.barrier()
    assert replay(await read_to_head(client, log), log).files() == {"/f": b"0123456789abc"}
