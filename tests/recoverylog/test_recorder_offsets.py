"""The Recorder places its ops exactly once they commit: hinted segments begin at the offset of
their first op, so hinted playback reads little more than the live bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from gazette.broker.client import AppendService, JournalClient
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.codec import DecodedOp, OpDecoder
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.player import Player
from gazette.recoverylog.recorder import MAX_WRITE_CHUNK, Recorder
from gazette.recoverylog.segments import flatten_hints
from tests.kit.journals import read_to_head
from tests.recoverylog.playback_support import (
    MakeLog,
    client,
    make_log,
    player_broker,
    read_tree,
)

__all__ = ["client", "make_log", "player_broker"]  # Fixtures used by this module.

import pytest

A, B = 0xA0FF5E7, 0xB0FF5E7
MiB = 1 << 20


@pytest.fixture
async def service(client: JournalClient) -> AsyncIterator[AppendService]:
    async with AppendService(client) as svc:
        yield svc


def op_extents(data: bytes, log: str) -> dict[tuple[int, int], tuple[int, int]]:
    """(author, seq_no) -> [begin, end) offsets of every op of a whole log."""
    dec = OpDecoder(0, log)
    dec.feed(data)
    out: dict[tuple[int, int], tuple[int, int]] = {}
    while (ev := dec.next_event()) is not None:
        if isinstance(ev, DecodedOp):
            out.setdefault((ev.op.author, ev.op.seq_no), (ev.op.first_offset, ev.op.last_offset))
    return out


def live_bytes(hints: rpb.FSMHints, extents: dict[tuple[int, int], tuple[int, int]]) -> int:
    """Bytes of the log spanned by the hinted segments, from first op to last op."""
    return sum(
        extents[(s.author, s.last_seq_no)][1] - extents[(s.author, s.first_seq_no)][0]
        for s in flatten_hints(hints)
    )


def record_file(rec: Recorder, root: Path, path: str, size: int, piece: int) -> None:
    """Create `path` with `size` bytes in writes of `piece` bytes, recording each."""
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    (root / path).write_bytes(data)
    fnode = rec.record_create(path)
    for offset in range(0, size, piece):
        rec.record_write(fnode, offset, data[offset : offset + piece])


async def test_hinted_segments_begin_at_their_first_op(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_log()
    rec = await Recorder.open(FSM(), A, tmp_path, service, log)
    # Nothing awaited between ops: many appends are in flight and batched into RPCs, and the
    # write head a Recorder knows lags far behind where its ops land.
    for i in range(300):
        record_file(rec, tmp_path, f"f{i}", 1 + (i * 7919) % 20_000, 4096)
        if i % 3 == 0:
            rec.record_link(rec.fnode(f"f{i}") or 0, f"l{i}")
        if i % 4 == 1:
            rec.record_unlink(f"f{i - 1}")
            (tmp_path / f"f{i - 1}").unlink()
        if i % 50 == 0:  # Ops spanning several appends (and write chunks).
            record_file(rec, tmp_path, f"big{i}", 3 * MiB + 5, MAX_WRITE_CHUNK)
    hints = await rec.build_hints()
    extents = op_extents(await read_to_head(client, log), log)

    segments = [s for node in hints.live_nodes for s in node.segments]
    assert len(segments) > 200
    for seg in segments:
        assert seg.first_offset == extents[(A, seg.first_seq_no)][0], seg
    for node in rec.fsm.live_nodes.values():  # The FSM's own segments too.
        for seg in node.segments:
            assert seg.first_offset == extents[(A, seg.first_seq_no)][0], seg
    await rec.close()


async def test_offsets_stay_lower_bounds_when_batched_with_another_writer(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    # Two unfenced Recorders of one log share an AppendService: their appends carry the same
    # request and may be batched into one RPC, so neither can tell where its ops landed.
    log = await make_log()
    recs = []
    for author, sub in ((A, "a"), (B, "b")):
        (tmp_path / sub).mkdir()
        rec = await Recorder.open(FSM(), author, tmp_path / sub, service, log, fence_log=False)
        recs.append(rec)
    for _ in range(5):
        for i in range(200):
            for rec in recs:
                record_file(rec, rec.directory, f"f{i}", 1 + (i * 104729) % 5000, 1000)
        await asyncio.sleep(0)
        for i in range(200):
            for rec in recs:
                rec.record_unlink(f"f{i}")
                (rec.directory / f"f{i}").unlink()
    for rec in recs:
        record_file(rec, rec.directory, "last", 100, 100)
    hints = [await rec.build_hints() for rec in recs]
    extents = op_extents(await read_to_head(client, log), log)
    for h in hints:
        for node in h.live_nodes:
            for seg in node.segments:
                assert seg.first_offset <= extents[(seg.author, seg.first_seq_no)][0]
    for rec, h in zip(recs, hints, strict=True):
        out = tmp_path / f"played-{rec.author:x}"
        player = Player(client, log, h, out)
        await asyncio.wait_for(player.play(), 60)
        assert read_tree(out) == read_tree(rec.directory)
        await rec.close()


async def test_hinted_playback_reads_little_more_than_the_live_bytes(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_log()
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(FSM(), A, src, service, log)
    # Live files, each preceded by twice its size of dead data: files written and removed
    # (compaction-like), all recorded without waiting for commits. The log ends with a live
    # file: whatever follows the last hinted segment is read through to the head.
    for i in range(6):
        for k in range(2):
            record_file(rec, src, f"dead-{i}-{k}", 3 * MiB, 256 << 10)
            rec.record_unlink(f"dead-{i}-{k}")
            (src / f"dead-{i}-{k}").unlink()
        record_file(rec, src, f"live-{i}", 3 * MiB, 256 << 10)
        await rec.throttle(8 * MiB)
    hints = await rec.build_hints()
    head = rec.write_head
    live = live_bytes(hints, op_extents(await read_to_head(client, log), log))

    player = Player(client, log, hints, tmp_path / "played")
    await asyncio.wait_for(player.play(), 60)
    assert read_tree(tmp_path / "played") == read_tree(src)
    read = player.progress.bytes_read
    print(f"\nlog {head} bytes, live {live}, hinted playback read {read} ({read / live:.3f}x)")
    assert head > 2.5 * live
    assert read <= 1.2 * live
    await rec.close()
