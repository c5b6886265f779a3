"""Player against a real etcd and broker, on logs written op by op."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest

from gazette.broker.client import JournalClient, RegisterMismatch, append
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog import player as player_module
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.author import author_fence
from gazette.recoverylog.codec import MAGIC, encode_op
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.hints import hints_from_bytes, hints_to_json
from gazette.recoverylog.player import (
    EXIT_AT_HEAD,
    FNODE_STAGING_DIR,
    TAIL,
    DataLoss,
    HintedSegmentBeyondHead,
    PlaybackError,
    PlaybackProgress,
    Player,
    PlayerState,
    UnsafeDirectory,
    UnsafePath,
    UnusedHints,
    check_playback_directory,
)
from gazette.recoverylog.segments import InvalidHints
from gazette.recoverylog.staging import relative_path
from tests.recoverylog.playback_support import (
    LogWriter,
    MakeLog,
    SharedLog,
    client,
    inode_groups,
    make_log,
    player_broker,
    read_tree,
)

__all__ = ["client", "make_log", "player_broker"]  # Fixtures used by this module.

A, B, C = 0xA11CE, 0xB0B, 0xC4A1


def copy_hints(writer: LogWriter) -> rpb.FSMHints:
    """The writer's hints, through their JSON encoding (as stored in etcd)."""
    return hints_from_bytes(hints_to_json(writer.fsm.build_hints(writer.log.name)))


async def play(
    client: JournalClient,
    name: str,
    directory: Path,
    hints: rpb.FSMHints | None = None,
    **kw: object,
) -> Player:
    player = Player(client, name, hints, directory, **kw)  # type: ignore[arg-type]
    await asyncio.wait_for(player.play(), 30)
    return player


def assert_played(player: Player, directory: Path, writer: LogWriter) -> None:
    assert player.state is PlayerState.COMPLETE
    assert read_tree(directory) == writer.model.tree()
    assert not (directory / FNODE_STAGING_DIR).exists()
    fsm = player.fsm
    assert (fsm.next_seq_no, fsm.next_checksum) == (
        writer.fsm.next_seq_no,
        writer.fsm.next_checksum,
    )
    assert fsm.links == writer.fsm.links
    assert fsm.properties == writer.fsm.properties


async def write_sample(w: LogWriter) -> None:
    """Creates, writes at offsets (with a hole), links, unlinks, renames and a property."""
    a = w.create("/a.txt")
    w.write(a, 0, b"hello ")
    w.write(a, 6, b"world")
    b = w.create("/dir/sub/b.bin")
    w.write(b, 100, b"tail")  # A hole of 100 zero bytes, then content.
    w.write(b, 0, b"head")
    w.link(a, "/links/a-again.txt")
    await w.flush()

    t = w.create("/tmp")
    w.write(t, 0, b"temporary" * 100)
    w.unlink("/tmp")  # Gone entirely.
    c = w.create("/c.log")
    w.write(c, 0, b"c-content")
    w.rename("/c.log", "/a.txt")  # Over an existing file: a.txt now is c's content.
    w.rename("/dir/sub/b.bin", "/dir/b2.bin")
    w.prop("/IDENTITY", "shard-1")
    w.write(a, 0, b"HELLO")  # Still linked at /links/a-again.txt.
    await w.flush()


async def test_play_empty_log(client: JournalClient, make_log: MakeLog, tmp_path: Path) -> None:
    name = await make_log()
    directory = tmp_path / "play"
    directory.mkdir()
    (directory / "stale").write_text("wiped by play")
    player = await play(client, name, directory)
    assert player.state is PlayerState.COMPLETE
    assert player.tailing.is_set()
    assert read_tree(directory) == {}
    assert list(directory.iterdir()) == []
    assert (player.fsm.next_seq_no, player.fsm.next_checksum) == (1, 0)
    assert player.progress.bytes_read == 0


async def test_play_hand_written_log(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    w = LogWriter(log, A)
    await write_sample(w)

    directory = tmp_path / "play"
    recovered = player_module.recovered_bytes
    player = await play(client, log.name, directory)
    assert_played(player, directory, w)
    # gazette_recoverylog_recovered_bytes_total: the payload bytes written to local files.
    assert 0 < player_module.recovered_bytes - recovered < player.progress.bytes_read
    assert read_tree(directory)["/a.txt"] == b"c-content"
    assert read_tree(directory)["/links/a-again.txt"] == b"HELLO world"
    assert read_tree(directory)["/dir/b2.bin"] == b"head" + bytes(96) + b"tail"
    assert read_tree(directory)["/IDENTITY"] == b"shard-1"
    assert inode_groups(directory) == []  # a.txt was renamed over: no shared links remain.
    assert player.progress.bytes_read == log.head
    assert player.ops_rejected == 0

    # Hard links of one Fnode share an inode once played.
    w.link(w.model.links["/a.txt"], "/a-link.txt")
    await w.flush()
    player = await play(client, log.name, directory)
    assert_played(player, directory, w)
    assert inode_groups(directory) == [{"/a.txt", "/a-link.txt"}]

    # The played FSM continues: its hints rebuild it.
    assert player.fsm.build_hints(log.name) == w.fsm.build_hints(log.name)


async def test_hints_read_only_live_segments(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    w = LogWriter(log, A)
    early = w.create("/early")
    w.write(early, 0, b"e" * 1000)
    await w.flush()
    # A large dead region: a file written and deleted, and a file truncated by re-creation.
    dead = w.create("/dead")
    for i in range(16):
        w.write(dead, i << 18, bytes([i]) * (1 << 18))
        await w.flush()
    w.unlink("/dead")
    old = w.create("/data")
    w.write(old, 0, b"x" * (1 << 20))
    w.unlink("/data")
    await w.flush()
    dead_end = log.head
    new = w.create("/data")
    w.write(new, 0, b"new data")
    w.prop("/IDENTITY", "id")
    await w.flush()

    hints = copy_hints(w)
    live = [(s.first_offset, s.last_offset) for n in hints.live_nodes for s in n.segments]
    live_bytes = sum(end - begin for begin, end in live)
    assert live_bytes < 2000

    reports: list[PlaybackProgress] = []
    directory = tmp_path / "hinted"
    player = await play(client, log.name, directory, hints, on_progress=reports.append)
    assert_played(player, directory, w)
    progress = player.progress
    # Only the live segments were read: none of the 5 MiB dead region.
    assert progress.bytes_read == live_bytes + (log.head - max(e for _, e in live))
    assert progress.bytes_read < 4000 < dead_end
    assert progress.bytes_to_read == progress.bytes_read
    assert progress.eta == 0.0
    assert reports and reports[-1].state is PlayerState.COMPLETE
    assert [r.state for r in reports][-2:] == [PlayerState.EXIT_AT_HEAD, PlayerState.COMPLETE]

    # Without hints, the whole log is read, to the same tree and FSM.
    directory = tmp_path / "unhinted"
    player = await play(client, log.name, directory)
    assert_played(player, directory, w)
    assert player.progress.bytes_read == log.head
    assert player.fsm.build_hints(log.name) == w.fsm.build_hints(log.name)


async def test_desync_garbage_is_skipped(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    w = LogWriter(log, A)
    f = w.create("/f")
    w.write(f, 0, b"one ")
    await w.flush()
    garbage = b"\x00garbage without a frame\xff" * 10 + MAGIC[:2] + b"!!"
    await log.append(garbage)
    w.write(f, 4, b"two")
    await w.flush()
    await log.append(MAGIC + b"\xff\xff")  # A header claiming a frame of 65535 bytes...
    w.write(f, 7, b" three")  # ...which is not resynchronized until its bytes are read.
    await w.flush()
    await log.append(b"trailing junk")
    # The writer's own FSM took no note of the garbage; the op offsets it recorded are right
    # because SharedLog tracks the head across both.

    directory = tmp_path / "play"
    player = await play(client, log.name, directory)
    assert read_tree(directory) == {"/f": b"one two three"}
    assert player.desync_bytes >= len(garbage) + len(b"trailing junk")
    assert player.ops_applied == 4

    # With hints, the garbage inside the hinted segment is skipped just the same.
    directory = tmp_path / "hinted"
    player = await play(client, log.name, directory, copy_hints(w))
    assert read_tree(directory) == {"/f": b"one two three"}


async def test_zombie_author_is_ignored(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    a = LogWriter(log, A)
    f = a.create("/f")
    a.write(f, 0, b"from A;")
    await a.flush()

    # B takes over with a sequenced no-op; A doesn't notice and keeps writing (a zombie).
    b = a.fork(B)
    b.noop()
    await b.flush()
    zombie = a
    zombie.write(f, 0, b"ZOMBIE!")
    z = zombie.create("/zombie-file")
    zombie.write(z, 0, b"should never appear")
    await zombie.flush(check=False)
    b.write(f, 7, b"from B")
    g = b.create("/g")
    await b.flush()
    zombie.unlink("/f")
    await zombie.flush(check=False)
    b.write(g, 0, b"g")
    await b.flush()

    directory = tmp_path / "play"
    player = await play(client, log.name, directory)
    assert_played(player, directory, b)
    assert read_tree(directory) == {"/f": b"from A;from B", "/g": b"g"}
    assert player.ops_rejected == 4

    directory = tmp_path / "hinted"
    player = await play(client, log.name, directory, copy_hints(b))
    assert_played(player, directory, b)


async def test_unused_hints_are_data_loss(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    w = LogWriter(log, A)
    f = w.create("/f")
    w.write(f, 0, b"x" * 100)
    await w.flush()
    written = log.head
    w.write(f, 100, b"y" * 100)
    g = w.create("/g")
    w.write(g, 0, b"gg")
    hints = copy_hints(w)  # Built over ops which never reach the log.

    # A hinted segment beyond the write head is refused up front.
    with pytest.raises(HintedSegmentBeyondHead):
        await play(client, log.name, tmp_path / "a", hints)

    # The same ops, but the open (unknown) extent of the last segment reaches the head.
    for node in hints.live_nodes:
        for seg in node.segments:
            seg.last_offset = 0
    del hints.live_nodes[1:]
    with pytest.raises(UnusedHints) as info:
        await play(client, log.name, tmp_path / "b", hints)
    assert info.value.offset == written
    assert isinstance(info.value, DataLoss)

    # Closed segments whose bytes are not the hinted ops: read through, still unused.
    log2 = SharedLog(client, await make_log())
    w2 = LogWriter(log2, A)
    f = w2.create("/f")
    w2.write(f, 0, b"x" * 100)
    hints = copy_hints(w2)
    await log2.append(b"\x00" * len(w2.pending))
    with pytest.raises(UnusedHints):
        await play(client, log2.name, tmp_path / "c", hints)


async def test_hints_validation(client: JournalClient, make_log: MakeLog, tmp_path: Path) -> None:
    name = await make_log()
    with pytest.raises(InvalidHints):
        await play(client, name, tmp_path / "a", rpb.FSMHints(log="another/log"))
    bad = rpb.FSMHints(log=name)
    bad.live_nodes.add(fnode=3).segments.add(author=0, first_seq_no=3, last_seq_no=3)
    with pytest.raises(ValueError):
        await play(client, name, tmp_path / "b", bad)
    # Empty hints play the whole log.
    player = await play(client, name, tmp_path / "c", rpb.FSMHints(log=name))
    assert player.state is PlayerState.COMPLETE


async def test_hot_standby_then_handoff(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    a = LogWriter(log, A)
    await write_sample(a)

    directory = tmp_path / "standby"
    player = Player(client, log.name, copy_hints(a), directory)
    task = asyncio.create_task(player.play(until=TAIL))
    try:
        await asyncio.wait_for(player.tailing.wait(), 30)
        assert player.state is PlayerState.TAIL
        # The primary keeps recording while the standby tails.
        for i in range(20):
            f = a.create(f"/live/{i}")
            a.write(f, 0, f"content {i}".encode() * (i + 1))
            if i % 3 == 0:
                a.unlink(f"/live/{i}")
            await a.flush()
            await asyncio.sleep(0.01)
        async with asyncio.timeout(30):
            while player.progress.offset < log.head:
                await asyncio.sleep(0.01)
        assert player.state is PlayerState.TAIL
        assert not task.done()
        # Nothing is linked while tailing.
        assert [p.name for p in directory.iterdir()] == [FNODE_STAGING_DIR]

        player.inject_handoff(B)
        fsm = await asyncio.wait_for(task, 30)
    finally:
        task.cancel()

    assert fsm is player.fsm
    assert player.progress.state is PlayerState.COMPLETE
    assert read_tree(directory) == a.model.tree()
    assert not (directory / FNODE_STAGING_DIR).exists()
    # The hand-off no-op is sequenced after A's last op, authored by B.
    assert fsm.next_seq_no == a.fsm.next_seq_no + 1

    # A is fenced: its next append fails.
    b = LogWriter(log, B, fsm)
    b.model = copy.deepcopy(a.model)
    a.write(a.model.links["/a.txt"], 0, b"zombie")
    with pytest.raises(RegisterMismatch):
        await a.flush()
    a.pending.clear()

    # B records onwards from the handed-over FSM, and a player rebuilds everything.
    b.fenced = True
    log.head = (await append(client, pb.AppendRequest(journal=log.name))).commit.end
    g = b.create("/from-b")
    b.write(g, 0, b"B was here")
    await b.flush()
    for hints in (None, copy_hints(b)):
        directory = tmp_path / f"after-{hints is None}"
        player = await play(client, log.name, directory, hints)
        assert read_tree(directory) == b.model.tree()
        assert read_tree(directory)["/from-b"] == b"B was here"


class RacedPlayer(Player):
    """A Player whose first hand-off no-op is raced by the recorder it takes over from."""

    racer: LogWriter
    injections = 0

    async def _inject(self, fsm: FSM, author: int) -> tuple[int, int]:
        self.injections += 1
        if self.injections == 1:
            f = self.racer.create("/raced")
            self.racer.write(f, 0, b"appended during the hand-off")
            await self.racer.flush()
        return await super()._inject(fsm, author)


async def test_handoff_retries_when_raced(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    a = LogWriter(log, A)
    await write_sample(a)

    directory = tmp_path / "play"
    player = RacedPlayer(client, log.name, None, directory)
    player.racer = a
    player.inject_handoff(C)
    fsm = await asyncio.wait_for(player.play(until=TAIL), 30)
    assert player.injections == 2
    assert read_tree(directory)["/raced"] == b"appended during the hand-off"
    assert read_tree(directory) == a.model.tree()
    # The racing op, then the failed no-op (rejected), then the successful one.
    assert fsm.next_seq_no == a.fsm.next_seq_no + 1
    assert player.ops_rejected == 1

    # A's fence was replaced by C's.
    a.noop()
    with pytest.raises(RegisterMismatch):
        await a.flush()
    resp = await append(
        client,
        pb.AppendRequest(
            journal=log.name, check_registers=pb.LabelSelector(include=author_fence(C))
        ),
        b"",
    )
    assert resp.status == pb.OK


async def test_finish_at_head_while_tailing(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    a = LogWriter(log, A)
    await write_sample(a)
    player = Player(client, log.name, None, tmp_path / "play")
    task = asyncio.create_task(player.play(until=TAIL))
    try:
        await asyncio.wait_for(player.tailing.wait(), 30)
        f = a.create("/late")
        a.write(f, 0, b"written while tailing")
        await a.flush()
        player.finish_at_head()  # Completes at the head as of now: /late is included.
        await asyncio.wait_for(task, 30)
    finally:
        task.cancel()
    assert_played(player, tmp_path / "play", a)
    with pytest.raises(RuntimeError):
        player.inject_handoff(B)


async def test_cancellation_leaves_no_tree(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    a = LogWriter(log, A)
    await write_sample(a)
    directory = tmp_path / "play"
    player = Player(client, log.name, None, directory)
    task = asyncio.create_task(player.play(until=TAIL))
    await asyncio.wait_for(player.tailing.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [p.name for p in directory.iterdir()] == [FNODE_STAGING_DIR]
    with pytest.raises(RuntimeError):
        _ = player.fsm

    # The next play wipes the staged files and plays again.
    player = await play(client, log.name, directory)
    assert_played(player, directory, a)


async def test_play_once_and_until(client: JournalClient, tmp_path: Path) -> None:
    player = Player(client, "some/log", None, tmp_path / "x")
    with pytest.raises(ValueError):
        await player.play(until=PlayerState.COMPLETE)
    with pytest.raises(RuntimeError):
        await player.play(until=EXIT_AT_HEAD)
    with pytest.raises(ValueError):
        player.inject_handoff(0)


def test_unsafe_directories(tmp_path: Path) -> None:
    for bad in ("/", "/tmp", Path.home(), Path.cwd(), Path.cwd().parent):
        with pytest.raises(UnsafeDirectory):
            check_playback_directory(Path(bad))
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(UnsafeDirectory):
        check_playback_directory(tmp_path / "file")
    (tmp_path / "root-link").symlink_to("/")
    with pytest.raises(UnsafeDirectory):
        check_playback_directory(tmp_path / "root-link")
    assert check_playback_directory(tmp_path / "new") == (tmp_path / "new").resolve()


def test_log_paths_stay_in_the_directory() -> None:
    assert str(relative_path("/a/b")) == "a/b"
    assert str(relative_path("c")) == "c"
    for bad in ("/", "", "/../etc/passwd", "/a/../../b", "/.fnodes/1", "/./x"):
        with pytest.raises(UnsafePath):
            relative_path(bad)


async def test_unsafe_log_path_is_refused(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    a = LogWriter(log, A)
    f = a.create("/ok")
    a.link(f, "/../escape")
    await a.flush()
    directory = tmp_path / "play"
    with pytest.raises(UnsafePath):
        await play(client, log.name, directory)
    assert not (tmp_path / "escape").exists()
    assert [p.name for p in directory.iterdir()] == [FNODE_STAGING_DIR]


async def test_encode_op_noop_is_a_frame() -> None:
    # The hand-off no-op is an op with none of create..property set.
    frame = encode_op(rpb.RecordedOp(seq_no=3, checksum=7, author=B))
    assert frame.startswith(MAGIC)


async def test_hints_across_logs(client: JournalClient, make_log: MakeLog, tmp_path: Path) -> None:
    # A store recorded to one log, then (same FSM) onwards to another: hints of the second log
    # name segments of the first, and playback reads both.
    first = SharedLog(client, await make_log("first"))
    second = SharedLog(client, await make_log("second"))
    w = LogWriter(first, A)
    f = w.create("/f")
    w.write(f, 0, b"written to the first log;")
    dead = w.create("/dead")
    w.write(dead, 0, bytes(200_000))
    w.unlink("/dead")
    await w.flush()
    w.log, w.fenced = second, False
    w.write(f, 25, b" then the second")
    g = w.create("/g")
    w.write(g, 0, b"g")
    await w.flush()

    hints = copy_hints(w)
    assert {s.log for n in hints.live_nodes for s in n.segments} == {first.name, ""}
    directory = tmp_path / "play"
    player = await play(client, second.name, directory, hints)
    assert read_tree(directory) == {"/f": b"written to the first log; then the second", "/g": b"g"}
    assert player.progress.bytes_read < 1000  # The dead write in the first log is skipped.
    assert player.fsm.last_log == second.name


class StaleBarrierPlayer(Player):
    """A Player whose barriers return `stale` once it is set: the write head as of just before
    another append landed (the log grew after the barrier)."""

    stale: int | None = None

    async def _barrier(self, name: str) -> int:
        if self.stale is not None:
            return self.stale
        return await super()._barrier(name)


BIG = 4 << 20  # A payload larger than one read chunk.


async def test_exit_at_head_reads_a_write_through(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    a = LogWriter(log, A)
    f = a.create("/a")
    a.write(f, 0, b"x" * 10)
    await a.flush()
    head = log.head
    a.write(f, 0, b"y" * BIG)  # Appended after the (stale) barrier.
    await a.flush()

    directory = tmp_path / "play"
    player = StaleBarrierPlayer(client, log.name, None, directory)
    player.stale = head
    await asyncio.wait_for(player.play(EXIT_AT_HEAD), 30)
    # Not a torn write: the op applied by the FSM is whole in the tree, and the write head
    # is after it (not within its payload).
    assert_played(player, directory, a)
    assert player.write_head == log.head


async def test_finish_at_head_reads_a_write_through(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    a = LogWriter(log, A)
    f = a.create("/a")
    a.write(f, 0, b"x" * 10)
    await a.flush()

    directory = tmp_path / "play"
    player = StaleBarrierPlayer(client, log.name, None, directory)
    task = asyncio.create_task(player.play(until=TAIL))
    try:
        await asyncio.wait_for(player.tailing.wait(), 30)
        player.stale = log.head
        a.write(f, 0, b"y" * BIG)
        await a.flush()
        async with asyncio.timeout(30):
            while player.progress.offset == player.stale:  # Until it has read some of it.
                await asyncio.sleep(0.001)
        player.finish_at_head()
        await asyncio.wait_for(task, 30)
    finally:
        task.cancel()
    assert_played(player, directory, a)
    assert player.write_head == log.head


class SwallowedHandoffPlayer(Player):
    """A Player whose first hand-off no-op is swallowed by the corrupt write before it, and is
    followed in the same append by `after` (the bytes another writer appended right after it,
    arriving in the same read)."""

    after = b""
    injections = 0

    async def _inject(self, fsm: FSM, author: int) -> tuple[int, int]:
        self.injections += 1
        if self.injections > 1:
            return await super()._inject(fsm, author)
        noop = encode_op(
            rpb.RecordedOp(seq_no=fsm.next_seq_no, checksum=fsm.next_checksum, author=author)
        )
        req = pb.AppendRequest(journal=self.log, union_registers=author_fence(author))
        resp = await append(self.client, req, noop + self.after)
        return resp.commit.begin, resp.commit.begin + len(noop)


@pytest.mark.parametrize("overrun", [0, 4])
async def test_handoff_after_a_swallowed_noop(
    client: JournalClient, make_log: MakeLog, tmp_path: Path, overrun: int
) -> None:
    log = SharedLog(client, await make_log())
    a = LogWriter(log, A)
    f = a.create("/a")
    a.write(f, 0, b"ok")
    await a.flush()

    # A corrupt write claiming 8 payload bytes more than it has, and as many as the no-op
    # the Player will inject after it (plus `overrun` bytes of what follows the no-op).
    for n in range(8, 40):
        w = a.fork(A)
        corrupt = rpb.RecordedOp.Write(fnode=f, offset=0, length=8 + n)
        w.op(rpb.RecordedOp(write=corrupt), b"8 bytes!")
        noop = rpb.RecordedOp(seq_no=w.fsm.next_seq_no, checksum=w.fsm.next_checksum, author=B)
        if len(encode_op(noop)) + overrun == n:
            break
    else:
        raise AssertionError("no fixed point")
    await w.flush(check=False)
    # A large write sequenced after the corrupt one, appended right after the no-op.
    w.write(f, 0, b"y" * BIG)
    after, w.pending = bytes(w.pending), bytearray()

    directory = tmp_path / "play"
    player = SwallowedHandoffPlayer(client, log.name, None, directory)
    player.after = after
    player.inject_handoff(B)
    fsm = await asyncio.wait_for(player.play(until=TAIL), 30)
    assert player.injections >= 2
    # The write appended after the swallowed no-op is applied, whole.
    assert read_tree(directory) == {"/a": b"y" * BIG}
    assert fsm.links == w.fsm.links
    assert fsm.next_seq_no == w.fsm.next_seq_no + 1  # Then the no-op which landed.


async def test_end_offset_plays_the_same_tree_however_the_log_grew(
    client: JournalClient, make_log: MakeLog, tmp_path: Path
) -> None:
    log = SharedLog(client, await make_log())
    w = LogWriter(log, A)
    await write_sample(w)
    hints = copy_hints(w)
    a = w.create("/after-hints")
    w.write(a, 0, b"written after the hints")
    await w.flush()
    end, tree_at_end = log.head, w.model.tree()
    seq_at_end = w.fsm.next_seq_no

    # The log grows after `end` (new files, rewrites, a large write).
    w.write(a, 0, b"REWRITTEN")
    w.unlink("/a.txt")
    big = w.create("/big")
    w.write(big, 0, b"z" * BIG)
    await w.flush()
    assert log.head > end + BIG

    for name, start in (("hinted", hints), ("unhinted", None)):
        directory = tmp_path / name
        player = Player(client, log.name, start, directory, end_offset=end)
        await asyncio.wait_for(player.play(), 30)
        assert read_tree(directory) == tree_at_end, name
        assert player.write_head == end
        assert player.fsm.next_seq_no == seq_at_end
        assert player.progress.bytes_read <= end

    # Played without end_offset: everything.
    player = await play(client, log.name, tmp_path / "all", hints)
    assert_played(player, tmp_path / "all", w)


async def test_end_offset_errors(client: JournalClient, make_log: MakeLog, tmp_path: Path) -> None:
    log = SharedLog(client, await make_log())
    w = LogWriter(log, A)
    f = w.create("/f")
    w.write(f, 0, b"x" * 1000)
    await w.flush()
    head = log.head

    with pytest.raises(ValueError, match="end_offset"):
        Player(client, log.name, None, tmp_path / "p", end_offset=-1)
    with pytest.raises(ValueError, match="EXIT_AT_HEAD"):
        await Player(client, log.name, None, tmp_path / "p", end_offset=head).play(until=TAIL)
    with pytest.raises(PlaybackError, match="beyond the write head"):
        await Player(client, log.name, None, tmp_path / "p", end_offset=head + 1).play()
    # Within the write's payload: not an op boundary.
    with pytest.raises(PlaybackError, match="within a recorded op"):
        await asyncio.wait_for(
            Player(client, log.name, None, tmp_path / "p", end_offset=head - 10).play(), 30
        )
    # Within a frame of an op without payload (a create).
    w.create("/g")
    await w.flush()
    with pytest.raises(PlaybackError, match="within a recorded op"):
        await asyncio.wait_for(
            Player(client, log.name, None, tmp_path / "p", end_offset=log.head - 3).play(), 30
        )
    # Hints of content past end_offset cannot be played to it.
    hints = copy_hints(w)
    with pytest.raises(HintedSegmentBeyondHead):
        await asyncio.wait_for(
            Player(client, log.name, hints, tmp_path / "p", end_offset=1).play(), 30
        )
