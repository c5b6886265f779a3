"""Recorder -> Player end to end: a randomized workload on real files is recorded, then
played back into fresh directories (with and without hints), byte for byte; and a hot standby
takes over from a live Recorder."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gazette.broker.client import AppendService, JournalClient, RetryReader
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.player import TAIL, Player, PlayerState
from gazette.recoverylog.recorder import Recorder, RecorderFenced
from tests.recoverylog.playback_support import (
    MakeLog,
    client,
    inode_groups,
    make_log,
    player_broker,
    read_tree,
)
from tests.recoverylog.workload_support import Workload, run_workload

__all__ = ["client", "make_log", "player_broker"]  # Fixtures used by this module.

A, B, C = 0xA11CE, 0xB0B, 0xC4A1


@pytest.fixture
async def service(client: JournalClient) -> AsyncIterator[AppendService]:
    async with AppendService(client) as svc:
        yield svc


async def read_plainly(client: JournalClient, log: str, end: int) -> float:
    """Seconds to read [0, end) of `log` with a plain RetryReader."""
    begin = time.perf_counter()
    rr = RetryReader(client, pb.ReadRequest(journal=log, offset=0, end_offset=end, block=True))
    n = 0
    while chunk := await rr.read():
        n += len(chunk)
    rr.close()
    assert n == end
    return time.perf_counter() - begin


def assert_same_history(played: FSM, recorded: FSM) -> None:
    """The FSMs agree but for offsets (a Recorder knows lower bounds; a Player exact ones)."""
    assert (played.next_seq_no, played.next_checksum) == (
        recorded.next_seq_no,
        recorded.next_checksum,
    )
    assert played.links == recorded.links
    assert played.properties == recorded.properties

    def seq_ranges(fsm: FSM) -> dict[int, list[tuple[int, int, int]]]:
        return {
            fnode: [(s.author, s.first_seq_no, s.last_seq_no) for s in node.segments]
            for fnode, node in fsm.live_nodes.items()
        }

    assert seq_ranges(played) == seq_ranges(recorded)


async def play(client: JournalClient, log: str, directory: Path, hints: object = None) -> Player:
    player = Player(client, log, hints, directory)  # type: ignore[arg-type]
    await asyncio.wait_for(player.play(), 120)
    return player


async def test_randomized_workload_plays_back_byte_identical(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_log()
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(FSM(), A, src, service, log)
    w = Workload(rec, src, seed=20240601)
    w.set_identity("shard-identity-1")
    await run_workload(w, 10_000)
    hints = await rec.build_hints()
    head = rec.write_head
    expected = read_tree(src)
    assert len(expected) > 1000
    assert "/IDENTITY" in expected and "/IDENTITY.tmp" not in expected

    # Without hints: the whole log.
    t0 = time.perf_counter()
    plain = await play(client, log, tmp_path / "plain")
    t_unhinted = time.perf_counter() - t0
    assert read_tree(tmp_path / "plain") == expected
    assert inode_groups(tmp_path / "plain") == inode_groups(src)
    assert plain.progress.bytes_read == head
    assert_same_history(plain.fsm, rec.fsm)

    # With the Recorder's hints: the same tree, reading less.
    t0 = time.perf_counter()
    hinted = await play(client, log, tmp_path / "hinted", hints)
    t_hinted = time.perf_counter() - t0
    assert read_tree(tmp_path / "hinted") == expected
    assert inode_groups(tmp_path / "hinted") == inode_groups(src)
    assert hinted.progress.bytes_read < head
    assert_same_history(hinted.fsm, rec.fsm)

    t_read = await read_plainly(client, log, head)
    mb = head / 1e6
    print(
        f"\nlog {mb:.1f} MB, {rec.ops_recorded} ops, {len(expected)} files: "
        f"plain RetryReader {mb / t_read:.1f} MB/s; playback {mb / t_unhinted:.1f} MB/s "
        f"({t_unhinted / t_read:.2f}x the plain read); hinted playback read "
        f"{hinted.progress.bytes_read / 1e6:.1f} MB in {t_hinted:.2f}s"
    )
    await rec.close()


async def test_hinted_playback_skips_dead_data_of_a_recorder(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_log()
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(FSM(), A, src, service, log)
    w = Workload(rec, src, seed=7)
    keep = w.create("keep")
    w.write(keep)
    await rec.barrier()
    # 8 MiB of dead data: compaction-like rewrites of one file.
    for i in range(8):
        path = w.create(f"sst-{i}")
        fnode = rec.fnode(path)
        assert fnode is not None
        rec.record_write(fnode, 0, bytes(1 << 20))
        await rec.barrier()
        rec.record_unlink(path)
        w.paths.remove(path)
        os.unlink(src / path)
    w.write(w.create("late"))
    hints = await rec.build_hints()
    head = rec.write_head

    player = await play(client, log, tmp_path / "hinted", hints)
    assert read_tree(tmp_path / "hinted") == read_tree(src)
    # The dead region is skipped (a read chunk of overrun at most, where a segment ends).
    assert player.progress.bytes_read < (1 << 20)
    assert head > 8 << 20
    assert player.progress.bytes_to_read == player.progress.bytes_read
    await rec.close()


async def test_hot_standby_takes_over_from_a_live_recorder(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_log()
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(FSM(), A, src, service, log)
    w = Workload(rec, src, seed=99)
    await run_workload(w, 500)
    hints = await rec.build_hints()
    await run_workload(w, 200)  # Ops beyond the hints.
    await rec.barrier()

    standby = tmp_path / "standby"
    player = Player(client, log, hints, standby)
    task = asyncio.create_task(player.play(until=TAIL))
    try:
        await asyncio.wait_for(player.tailing.wait(), 60)
        # The primary keeps recording while the standby tails it.
        for _ in range(5):
            await run_workload(w, 100)
            await rec.barrier()
            await asyncio.sleep(0.01)
        async with asyncio.timeout(30):
            while player.progress.offset < rec.write_head:
                await asyncio.sleep(0.01)
        assert player.state is PlayerState.TAIL

        # The primary stops (its last ops committed); the standby takes over.
        expected = read_tree(src)
        t0 = time.perf_counter()
        player.inject_handoff(B)
        fsm = await asyncio.wait_for(task, 30)
        handoff_s = time.perf_counter() - t0
    finally:
        task.cancel()
    assert read_tree(standby) == expected
    assert inode_groups(standby) == inode_groups(src)
    print(f"\nhand-off of a tailing standby completed in {handoff_s * 1000:.1f} ms")

    # The old primary is fenced: its next append fails.
    w.write(w.create("zombie-write"))
    with pytest.raises(RecorderFenced):
        await rec.barrier()

    # The new primary records onwards from the handed-over FSM, in the standby's directory.
    new = Recorder(fsm, B, standby, service, log, write_head=player.write_head)
    w2 = Workload(new, standby, seed=5)
    w2.paths = [p[1:] for p in expected if p != "/IDENTITY"]
    await run_workload(w2, 300)
    hints2 = await new.build_hints()
    final = read_tree(standby)

    for name, h in (("cold", None), ("cold-hinted", hints2)):
        player = await play(client, log, tmp_path / name, h)
        assert read_tree(tmp_path / name) == final, name
        assert inode_groups(tmp_path / name) == inode_groups(standby)
    await new.close()
