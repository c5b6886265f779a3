"""Pruning recovery logs: the plan (table tests), and pruning a real broker's log recorded by a
Recorder, after which hinted playback still rebuilds the identical tree."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gazette.broker.client import AppendService, JournalClient, list_all_fragments
from gazette.broker.fragment.store import store_for_url
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.gazctl.prune import prune_log
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.codec import DecodedOp, OpDecoder
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.player import Player
from gazette.recoverylog.prune import (
    HintsWithoutLiveFiles,
    LogNotHinted,
    ShardNotHinted,
    live_ranges,
    plan_prune,
)
from gazette.recoverylog.recorder import Recorder
from gazette.recoverylog.segments import InvalidHints, flatten_hints
from tests.kit.eventually import eventually
from tests.kit.journals import read_to_head
from tests.recoverylog.playback_support import (
    MakeLog,
    client,
    make_log,
    player_broker,
    read_tree,
)
from tests.recoverylog.workload_support import Workload, run_workload

__all__ = ["client", "make_log", "player_broker"]  # Fixtures used by this module.

LOG = "recovery/log"
A = 0xA11CE
HEAD = _UNBOUNDED = 1 << 63


def seg(
    first: int, last: int, first_offset: int, last_offset: int = 0, log: str = ""
) -> rpb.Segment:
    return rpb.Segment(
        author=A,
        first_seq_no=first,
        last_seq_no=last,
        first_offset=first_offset,
        last_offset=last_offset,
        log=log,
    )


def hints(*nodes: tuple[int, list[rpb.Segment]], log: str = LOG) -> rpb.FSMHints:
    h = rpb.FSMHints(log=log)
    for fnode, segments in nodes:
        h.live_nodes.add(fnode=fnode, segments=segments)
    return h


def frag(begin: int, end: int, store: str = "file:///s/", journal: str = LOG) -> pb.Fragment:
    return pb.Fragment(journal=journal, begin=begin, end=end, backing_store=store)


# --- The plan -----------------------------------------------------------------------------


def test_live_ranges_of_recorder_hints_extend_to_the_head() -> None:
    # A Recorder's segments have unknown last offsets: each reaches the head.
    h = hints((3, [seg(3, 4, 1000)]), (5, [seg(5, 9, 2000)]))
    assert live_ranges({"s": [h]}) == {LOG: [(1000, HEAD)]}


def test_live_ranges_of_played_hints_and_the_tail() -> None:
    # Known last offsets bound all but the final segment, from which playback reads on.
    h = hints((3, [seg(3, 4, 1000, 1100)]), (7, [seg(7, 9, 5000, 5100)]))
    assert live_ranges({"s": [h]}) == {LOG: [(1000, 1100), (5000, HEAD)]}
    # Of several sets, ranges are unioned per log (a forked log: segments of a parent log).
    parent = hints((2, [seg(2, 2, 10, 20, log="parent/log")]), (3, [seg(3, 3, 40)]))
    assert live_ranges({"s": [h, None], "t": [parent]}) == {
        LOG: [(40, HEAD)],
        "parent/log": [(10, 20)],
    }


@pytest.mark.parametrize(
    ("fragment", "doomed"),
    [
        (frag(0, 1000), True),  # Ends where the first segment begins.
        (frag(0, 1001), False),
        (frag(1100, 5000), True),  # Between two segments: from a last_offset (exclusive).
        (frag(1099, 1200), False),
        (frag(4999, 5000), True),
        (frag(5000, 6000), False),  # The tail.
        (frag(0, 500, store=""), False),  # Not persisted: a local spool.
        (frag(9000, 10_000), False),  # Ends at the head (the latest fragment).
    ],
)
def test_plan_table(fragment: pb.Fragment, doomed: bool) -> None:
    h = hints((3, [seg(3, 4, 1000, 1100)]), (7, [seg(7, 9, 5000, 5100)]))
    head = frag(9000, 10_000)
    delete, keep = plan_prune([fragment, head], {"s": [h]})
    assert (fragment in delete) is doomed
    assert head in keep and len(delete) + len(keep) == 2


def test_plan_keeps_fragments_any_set_needs() -> None:
    old = hints((3, [seg(3, 4, 1000, 1100)]), (7, [seg(7, 9, 5000, 5100)]))
    new = hints((7, [seg(7, 9, 5000, 5100)]), (12, [seg(12, 12, 8000)]))
    frags = [frag(0, 1000), frag(1000, 2000), frag(2000, 5000), frag(5000, 8000), frag(8000, 9000)]
    assert plan_prune(frags, {"s": [new]})[0] == frags[:3]
    assert plan_prune(frags, {"s": [new, old]})[0] == [frags[0], frags[2]]
    assert plan_prune(frags, {"s": [new], "t": [old]})[0] == [frags[0], frags[2]]
    assert plan_prune([], {"s": [new]}) == ([], [])


def test_plan_refusals() -> None:
    h = hints((3, [seg(3, 4, 1000)]))
    with pytest.raises(ShardNotHinted, match="shard t has no hints"):
        plan_prune([frag(0, 10)], {"s": [h], "t": [None, None]})
    with pytest.raises(ShardNotHinted):
        plan_prune([frag(0, 10)], {"t": []})
    with pytest.raises(HintsWithoutLiveFiles, match="hints #1 of shard s"):
        plan_prune([frag(0, 10)], {"s": [h, rpb.FSMHints(log=LOG)]})
    with pytest.raises(LogNotHinted, match="other/log"):
        plan_prune([frag(0, 10, journal="other/log")], {"s": [h]})
    with pytest.raises(InvalidHints):
        plan_prune([frag(0, 10)], {"s": [hints((4, [seg(3, 4, 1000)]))]})


# --- A real log ---------------------------------------------------------------------------


@pytest.fixture
async def service(client: JournalClient) -> AsyncIterator[AppendService]:
    async with AppendService(client) as svc:
        yield svc


class Compactor:
    """A RocksDB-like workload: each round writes new table files and a new manifest, and
    deletes the tables of an older round, so that most of the log is soon dead."""

    def __init__(self, rec: Recorder, root: Path, seed: int) -> None:
        self.rec = rec
        self.root = root
        self.rnd = random.Random(seed)
        self.rounds: list[list[str]] = []

    def write_file(self, path: str, size: int) -> None:
        data = self.rnd.randbytes(size)
        (self.root / path).write_bytes(data)
        fnode = self.rec.record_create(path)
        for offset in range(0, size, 3000):
            self.rec.record_write(fnode, offset, data[offset : offset + 3000])

    async def round(self, keep_rounds: int = 2) -> None:
        n = len(self.rounds)
        tables = [f"{n:04d}-{k}.sst" for k in range(self.rnd.randrange(2, 6))]
        for t in tables:
            self.write_file(t, self.rnd.randrange(1000, 20_000))
        self.rounds.append(tables)
        self.write_file("MANIFEST.tmp", 500)
        (self.root / "MANIFEST.tmp").rename(self.root / "MANIFEST")
        self.rec.record_rename("MANIFEST.tmp", "MANIFEST")
        if len(self.rounds) > keep_rounds:
            for t in self.rounds[-keep_rounds - 1]:
                (self.root / t).unlink()
                self.rec.record_unlink(t)
        await self.rec.barrier()  # One append (so about one 4 KiB-rolled fragment) per round.


async def persisted_fragments(client: JournalClient, log: str) -> list[pb.Fragment]:
    """The log's fragments once every rolled spool is persisted."""

    async def persisted() -> list[pb.Fragment]:
        frags = [f.spec for f in await list_all_fragments(client, pb.FragmentsRequest(journal=log))]
        assert sum(1 for f in frags if not f.backing_store) <= 1, f"not persisted: {frags}"
        return frags

    return await eventually(persisted, what="the fragments persisted", timeout=15, interval=0.05)


def needed_extents(data: bytes, log: str, h: rpb.FSMHints) -> list[tuple[int, int]]:
    """[begin, end) of every op a Player of `h` applies: those of the hinted segments, and
    every op after the last of them."""
    segments = flatten_hints(h)
    last = segments[-1].last_seq_no
    dec = OpDecoder(0, log)
    dec.feed(data)
    out = []
    while (ev := dec.next_event()) is not None:
        if isinstance(ev, DecodedOp):
            op = ev.op
            if op.seq_no > last or any(
                s.author == op.author and s.first_seq_no <= op.seq_no <= s.last_seq_no
                for s in segments
            ):
                out.append((op.first_offset, op.last_offset))
    return out


async def play(client: JournalClient, log: str, h: rpb.FSMHints, out: Path) -> dict[str, bytes]:
    player = Player(client, log, h, out)
    await asyncio.wait_for(player.play(), 60)
    return read_tree(out)


async def test_prune_then_play_gives_the_identical_tree(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    (tmp_path / "store").mkdir()  # The journal's file:// store.
    log = await make_log(fragment_length=4096)
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(FSM(), A, src, service, log)
    work = Compactor(rec, src, seed=11)
    for _ in range(10):
        await work.round()
    backup = await rec.build_hints()  # Hints an earlier recovery left as a backup.
    for _ in range(30):
        await work.round()
    primary = await rec.build_hints()
    data = await read_to_head(client, log)
    frags = await persisted_fragments(client, log)
    assert len(frags) > 30

    # A dry run deletes nothing.
    dry = await prune_log(client, log, {"shard-a": [primary, backup]}, dry_run=True)
    assert dry.deleted and all(
        [await store_for_url(f.backing_store).exists(f) for f in dry.deleted]
    )
    only_primary = await prune_log(client, log, {"shard-a": [primary]}, dry_run=True)
    # Most of the log is dead to the primary hints; the backup pins older content.
    assert only_primary.bytes_deleted > 0.8 * len(data)
    assert 0.1 * len(data) < dry.bytes_deleted < only_primary.bytes_deleted

    seen: list[int] = []
    result = await prune_log(
        client, log, {"shard-a": [primary, backup]}, progress=lambda i, n, f: seen.append(i)
    )
    assert [f.begin for f in result.deleted] == [f.begin for f in dry.deleted]
    assert seen == list(range(1, len(result.deleted) + 1))
    for f in result.deleted:
        assert not await store_for_url(f.backing_store).exists(f)

    # Nothing which either set of hints plays was deleted.
    for h in (primary, backup):
        for begin, end in needed_extents(data, log, h):
            for f in result.deleted:
                assert end <= f.begin or begin >= f.end, (begin, end, f)

    expected = read_tree(src)
    assert await play(client, log, primary, tmp_path / "primary") == expected
    assert await play(client, log, backup, tmp_path / "backup") == expected

    # Recording goes on; pruning again with fresh hints deletes more, and playback holds.
    for _ in range(10):
        await work.round()
    later = await rec.build_hints()
    await persisted_fragments(client, log)
    again = await prune_log(client, log, {"shard-a": [later, primary]})
    assert again.deleted
    assert await play(client, log, later, tmp_path / "later") == read_tree(src)
    await rec.close()


async def test_prune_keeps_everything_a_randomized_workload_plays(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    (tmp_path / "store").mkdir()  # The journal's file:// store.
    log = await make_log(fragment_length=4096)
    src = tmp_path / "src"
    src.mkdir()
    rec = await Recorder.open(FSM(), A, src, service, log)
    w = Workload(rec, src, seed=3)
    for _ in range(20):
        await run_workload(w, 50)
        await rec.barrier()
        # Remove most files, so that the oldest live segment moves on.
        for path in list(w.paths)[: max(0, len(w.paths) - 5)]:
            (src / path).unlink()
            rec.record_unlink(path)
            w.paths.remove(path)
    h = await rec.build_hints()
    data = await read_to_head(client, log)
    await persisted_fragments(client, log)
    result = await prune_log(client, log, {"s": [h]})
    assert result.deleted
    for begin, end in needed_extents(data, log, h):
        for f in result.deleted:
            assert end <= f.begin or begin >= f.end, (begin, end, f)
    assert await play(client, log, h, tmp_path / "played") == read_tree(src)
    await rec.close()
