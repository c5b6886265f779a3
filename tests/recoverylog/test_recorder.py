"""Recorder against a real broker: ops land in order and replay to the recorded files,
barriers, fencing, renames, truncation, batching, hints, offsets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from gazette.broker.client import AppendService, JournalClient, RegisterMismatch, append
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.author import author_fence
from gazette.recoverylog.codec import HEADER_LENGTH, DecodedOp, OpDecoder, PayloadChunk, encode_op
from gazette.recoverylog.fsm import FSM, FnodeNotTracked, WrongSeqNo
from gazette.recoverylog.hints import hints_from_bytes, hints_to_json, validate_hints
from gazette.recoverylog.recorder import (
    MAX_WRITE_CHUNK,
    InvalidPath,
    PathExists,
    PropertyPathError,
    Recorder,
    RecorderBroken,
    RecorderFenced,
    UnknownFnode,
    UnknownPath,
)
from tests.kit.journals import read_to_head
from tests.recoverylog.recorder_support import (
    MakeLog,
    make_rec_log,
    rec_client,
    rec_service,
    recorder_broker,
    replay,
)

__all__ = ["make_rec_log", "rec_client", "rec_service", "recorder_broker"]  # Fixtures used here.

A, B = 0xA1, 0xB2


async def new_recorder(svc: AppendService, log: str, tmp_path: Path, author: int = A) -> Recorder:
    return await Recorder.open(FSM(), author, tmp_path / "db", svc, log)


def ops_kinds(ops: list[rpb.RecordedOp]) -> list[str]:
    out = []
    for op in ops:
        for kind in ("create", "link", "unlink", "write", "property"):
            if op.HasField(kind):
                out.append(kind)
                break
        else:
            out.append("noop")
    return out


async def test_ops_land_in_order_and_replay_to_the_recorded_files(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await new_recorder(rec_service, log, tmp_path)
    expect: dict[str, bytes] = {}

    a = rec.record_create("a")
    rec.record_write(a, 0, b"hello, ")
    rec.record_write(a, 7, b"world")
    expect["/a"] = b"hello, world"
    b = rec.record_create(tmp_path / "db" / "dir" / "b")  # Absolute, within the directory.
    rec.record_write(b, 0, bytearray(b"bee"))
    rec.record_link(b, "dir/b2")
    expect["/dir/b"] = expect["/dir/b2"] = b"bee"
    c = rec.record_create("c")
    rec.record_write(c, 0, b"doomed")
    rec.record_unlink("c")
    rec.record_rename("dir/b2", "d")
    expect["/d"] = expect.pop("/dir/b2")
    rec.record_write(a, 5, memoryview(b"!!"))
    expect["/a"] = b"hello!!world"
    await rec.barrier()

    r = replay(await read_to_head(rec_client, log), log)
    assert r.files() == expect
    assert [op.seq_no for op in r.ops] == list(range(1, len(r.ops) + 1))
    assert {op.author for op in r.ops} == {A}
    assert ops_kinds(r.ops) == [
        "noop",  # The fence of a new log.
        "create", "write", "write",
        "create", "write", "link",
        "create", "write", "unlink",
        "link", "unlink",
        "write",
    ]  # fmt: skip
    # The replayed FSM is the recorder's.
    assert (r.fsm.next_seq_no, r.fsm.next_checksum) == (
        rec.fsm.next_seq_no,
        rec.fsm.next_checksum,
    )
    assert r.fsm.links == rec.fsm.links
    await rec.close()


async def test_close_commits_ops_recorded_while_it_waits(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await new_recorder(rec_service, log, tmp_path)
    f = rec.record_create("f")
    rec.record_write(f, 0, b"first")
    closing = asyncio.create_task(rec.close())
    await asyncio.sleep(0)  # close() now waits for a barrier behind "first" only.
    assert not closing.done()
    rec.record_write(f, 5, b" and second")  # Recorded while close() waits.
    await closing
    assert rec.uncommitted_bytes == 0
    r = replay(await read_to_head(rec_client, log), log)
    assert r.files() == {"/f": b"first and second"}
    with pytest.raises(RuntimeError, match="closed"):
        rec.record_write(f, 16, b"late")


async def test_flush_releases_at_once_unless_an_append_is_in_flight(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await new_recorder(rec_service, log, tmp_path)
    f = rec.record_create("f")
    await rec.barrier()
    rec.record_write(f, 0, b"x")
    assert rec_service.pending_except("") == []  # Buffered until the loop's next turn...
    rec.flush()
    assert len(rec_service.pending_except("")) == 1  # ...or released now.
    rec.record_write(f, 1, b"y")
    rec.flush()  # In flight already: "y" waits, to go with whatever follows it.
    assert len(rec_service.pending_except("")) == 1
    await rec.barrier()
    assert replay(await read_to_head(rec_client, log), log).files() == {"/f": b"xy"}


async def test_an_error_while_observing_a_commit_fails_its_barrier(
    rec_service: AppendService,
    make_rec_log: MakeLog,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = await make_rec_log()
    rec = await new_recorder(rec_service, log, tmp_path)
    f = rec.record_create("f")

    def broken_observe(*args: object) -> None:
        raise RuntimeError("a bug while observing")

    monkeypatch.setattr(rec, "_observe", broken_observe)
    rec.record_write(f, 0, b"x")
    with pytest.raises(RecorderBroken, match="a bug while observing"):
        await asyncio.wait_for(rec.barrier(), 30)  # Fails; does not hang.
    with pytest.raises(RecorderBroken):
        rec.record_write(f, 1, b"y")


async def test_open_fences_a_new_log_and_every_append_checks_the_fence(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await new_recorder(rec_service, log, tmp_path)
    rec.record_create("x")
    resp = await rec.barrier()
    assert list(resp.registers.labels) == list(author_fence(A).labels)
    assert rec.write_head == resp.commit.end > 0

    # An FSM recovered from this log (last_log == log) is not fenced again (the Player's
    # hand-off does that), unless asked.
    fsm = FSM(log)
    before = rec.write_head
    other = await Recorder.open(fsm, A, tmp_path / "db", rec_service, log)
    assert other.write_head == before and fsm.next_seq_no == 1


async def test_barrier_resolves_once_every_recorded_op_is_readable(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await new_recorder(rec_service, log, tmp_path)
    f = rec.record_create("f")
    for i in range(300):
        rec.record_write(f, i, b"x")
        if i % 7 == 0:
            await asyncio.sleep(0)  # Let some appends go while recording continues.
    barrier = rec.barrier()
    await barrier
    r = replay(await read_to_head(rec_client, log), log)
    assert (r.fsm.next_seq_no, r.fsm.next_checksum) == (
        rec.fsm.next_seq_no,
        rec.fsm.next_checksum,
    )
    assert r.files() == {"/f": b"x" * 300}
    assert barrier.result().commit.end == rec.write_head == len(await read_to_head(rec_client, log))
    assert rec.uncommitted_bytes == 0

    # A barrier with nothing pending is an empty append, which learns the write head.
    await append(rec_client, pb.AppendRequest(journal=log), b"junk from another writer")
    resp = await rec.barrier()
    assert resp.commit.begin == resp.commit.end == rec.write_head
    assert rec.write_head == len(await read_to_head(rec_client, log))


async def test_fenced_recorder_fails_with_register_mismatch_and_stays_broken(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await new_recorder(rec_service, log, tmp_path)
    f = rec.record_create("f")
    rec.record_write(f, 0, b"committed")
    await rec.barrier()

    # Author B hands off: a no-op sequenced after A's ops, unioning B's fence.
    noop = rpb.RecordedOp(seq_no=rec.fsm.next_seq_no, checksum=rec.fsm.next_checksum, author=B)
    await append(
        rec_client,
        pb.AppendRequest(journal=log, union_registers=author_fence(B)),
        encode_op(noop),
    )
    head = len(await read_to_head(rec_client, log))

    rec.record_write(f, 9, b" zombie")
    with pytest.raises(RecorderFenced) as info:
        await rec.barrier()
    assert isinstance(info.value.__cause__, RegisterMismatch)
    assert info.value.log == log and info.value.offset <= head
    assert log in str(info.value)
    assert rec.error is not None

    # Every later call raises, naming the cause.
    for call in (
        lambda: rec.record_create("g"),
        lambda: rec.record_write(f, 0, b"z"),
        lambda: rec.record_unlink("f"),
        rec.barrier,
    ):
        with pytest.raises(RecorderFenced) as again:
            call()
        assert isinstance(again.value.__cause__, RegisterMismatch)
    with pytest.raises(RecorderFenced):
        await rec.build_hints()

    # Nothing of the zombie's reached the log.
    data = await read_to_head(rec_client, log)
    assert len(data) == head and b"zombie" not in data


async def test_failed_append_breaks_the_recorder(
    rec_service: AppendService, tmp_path: Path
) -> None:
    with pytest.raises(RecorderBroken) as info:
        await new_recorder(rec_service, "recorder/does-not-exist", tmp_path)
    assert not isinstance(info.value, RecorderFenced)
    assert "JOURNAL_NOT_FOUND" in str(info.value.__cause__)


async def test_rename_over_an_existing_file(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await new_recorder(rec_service, log, tmp_path)
    target = rec.record_create("target/path")
    rec.record_write(target, 0, b"old")
    src = rec.record_create("source/path")
    rec.record_write(src, 0, b"new")
    rec.record_rename("source//path", "target/path")
    # Renames between links of one file change nothing, as POSIX rename.
    rec.record_link(src, "alias")
    rec.record_rename("alias", "target/path")
    hints = await rec.build_hints()

    r = replay(await read_to_head(rec_client, log), log)
    assert r.files() == {"/target/path": b"new", "/alias": b"new"}
    tail = r.ops[-4:]
    assert ops_kinds(tail) == ["unlink", "link", "unlink", "link"]
    assert (tail[0].unlink.fnode, tail[0].unlink.path) == (target, "/target/path")
    assert (tail[1].link.fnode, tail[1].link.path) == (src, "/target/path")
    assert (tail[2].unlink.fnode, tail[2].unlink.path) == (src, "/source/path")
    assert [n.fnode for n in hints.live_nodes] == [src]

    with pytest.raises(UnknownPath):
        rec.record_rename("nope", "target/path")
    with pytest.raises(RecorderBroken):
        rec.record_create("after")


async def test_truncation_is_unlink_and_create(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await new_recorder(rec_service, log, tmp_path)
    f1 = rec.record_create("f")
    rec.record_write(f1, 0, b"long old content")
    f2 = rec.record_truncate("f")
    rec.record_write(f2, 0, b"short")
    f3 = rec.record_create("f")  # O_CREAT|O_TRUNC of an existing path truncates too.
    rec.record_write(f3, 0, b"new")
    assert rec.record_open("f") == f3  # No truncation: nothing recorded.
    assert len({f1, f2, f3}) == 3 and rec.links(f1) == frozenset()
    await rec.barrier()

    r = replay(await read_to_head(rec_client, log), log)
    assert r.files() == {"/f": b"new"}
    assert ops_kinds(r.ops)[1:] == [
        "create", "write", "unlink", "create", "write", "unlink", "create", "write"
    ]  # fmt: skip
    with pytest.raises(UnknownPath):
        rec.record_truncate("missing")


async def test_many_small_ops_are_batched_into_few_appends(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await new_recorder(rec_service, log, tmp_path)
    rpcs = rec_service.rpc_count

    # A burst without awaits, then ops trickling in one per event-loop turn.
    f = rec.record_create("f")
    for i in range(2000):
        rec.record_write(f, i * 4, b"%04d" % (i % 10000))
    for i in range(2000, 2500):
        rec.record_write(f, i * 4, b"%04d" % i)
        await asyncio.sleep(0)
    await rec.barrier()

    ops = 2501
    assert rec_service.rpc_count - rpcs < ops // 10, rec_service.rpc_count - rpcs
    r = replay(await read_to_head(rec_client, log), log)
    assert len(r.ops) == ops + 1
    assert r.files()["/f"] == b"".join(b"%04d" % i for i in range(2500))


async def test_large_writes_are_chunked(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await new_recorder(rec_service, log, tmp_path)
    f = rec.record_create("big")
    data = bytes(range(256)) * (5 * MAX_WRITE_CHUNK // 2 // 256)  # 2.5 chunks.
    rec.record_write(f, 10, data)
    await rec.barrier()
    r = replay(await read_to_head(rec_client, log), log)
    writes = [op.write for op in r.ops if op.HasField("write")]
    assert [(w.offset, w.length) for w in writes] == [
        (10, MAX_WRITE_CHUNK),
        (10 + MAX_WRITE_CHUNK, MAX_WRITE_CHUNK),
        (10 + 2 * MAX_WRITE_CHUNK, MAX_WRITE_CHUNK // 2),
    ]
    assert r.files()["/big"] == bytes(10) + data


async def test_hints_reference_only_committed_ops(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await new_recorder(rec_service, log, tmp_path)
    gone = rec.record_create("gone")
    rec.record_write(gone, 0, b"deleted later")
    await rec.barrier()
    keep = rec.record_create("keep")
    rec.record_write(keep, 0, b"kept")
    rec.record_unlink("gone")

    hints_call = asyncio.ensure_future(rec.build_hints())
    await asyncio.sleep(0)  # build_hints has snapshotted the FSM.
    later = rec.record_create("later")
    hints = await hints_call
    validate_hints(hints)
    assert hints_from_bytes(hints_to_json(hints)) == hints
    # Every hinted op is in the log once hints are returned; later ops are not hinted.
    r = replay(await read_to_head(rec_client, log), log)
    hinted_last = max(s.last_seq_no for n in hints.live_nodes for s in n.segments)
    assert hinted_last < r.fsm.next_seq_no
    assert [n.fnode for n in hints.live_nodes] == [keep]
    assert later not in {n.fnode for n in hints.live_nodes}
    seg = hints.live_nodes[0].segments[0]
    assert (seg.author, seg.first_seq_no, seg.last_seq_no) == (A, keep, keep + 1)
    assert seg.last_offset == 0  # Unknown to a Recorder.
    assert seg.log == ""  # Implied by hints.log.

    # first_offset is a lower bound of the op's offset: the write head when it was recorded.
    actual = next(op for op in r.ops if op.seq_no == keep)
    assert 0 < seg.first_offset <= actual.first_offset

    await rec.barrier()
    data = await read_to_head(rec_client, log)
    # Played from the hints, the log gives back the files (with the later file, which was
    # committed by the time it was read).
    fsm = FSM.from_hints(hints)
    dec = OpDecoder(seg.first_offset, log)
    dec.feed(data[seg.first_offset :])
    content = bytearray()
    while (ev := dec.next_event()) is not None:
        if isinstance(ev, DecodedOp):
            try:
                fsm.apply(ev.op, ev.frame)
            except (WrongSeqNo, FnodeNotTracked):
                pass  # Before the hinted segment, or of the deleted file.
        elif isinstance(ev, PayloadChunk) and ev.fnode == keep:
            content[ev.offset : ev.offset + len(ev.data)] = ev.data
    assert fsm.links == {"/keep": keep, "/later": later}
    assert content == b"kept"


async def test_op_offsets_are_lower_bounds_from_observed_commits(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    await append(rec_client, pb.AppendRequest(journal=log), b"x" * 1000)  # Dead log.
    rec = await new_recorder(rec_service, log, tmp_path)
    assert rec.write_head >= 1000
    f = rec.record_create("f")
    resp = await rec.barrier()
    g = rec.record_create("g")
    hints = await rec.build_hints()
    segs = {n.fnode: n.segments[0] for n in hints.live_nodes}
    assert segs[f].first_offset >= 1000
    assert segs[g].first_offset == resp.commit.end
    data = await read_to_head(rec_client, log, 1000)
    assert data[resp.commit.end - 1000 :].startswith(b"\x66\x33\x93\x36")


async def test_property_rename_and_misuse(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    root = tmp_path / "db"
    root.mkdir()
    rec = await new_recorder(rec_service, log, tmp_path)
    rec.record_create("000001.dbtmp")
    (root / "IDENTITY").write_text("a-guid")  # As if renamed on disk.
    rec.record_rename("000001.dbtmp", "IDENTITY")
    hints = await rec.build_hints()
    assert [(p.path, p.content) for p in hints.properties] == [("/IDENTITY", "a-guid")]
    r = replay(await read_to_head(rec_client, log), log)
    assert ops_kinds(r.ops)[-2:] == ["property", "unlink"]
    assert r.fsm.properties == {"/IDENTITY": "a-guid"}

    with pytest.raises(PropertyPathError):
        rec.record_create("IDENTITY")
    with pytest.raises(RecorderBroken) as info:
        rec.record_create("x")
    assert isinstance(info.value.__cause__, PropertyPathError)


async def test_paths_are_recorded_relative_to_the_directory(
    rec_service: AppendService, tmp_path: Path
) -> None:
    rec = Recorder(FSM("l"), A, tmp_path / "db", rec_service, "l")
    root = tmp_path / "db"
    assert rec.directory == root
    assert rec.recorded_path("a/b") == "/a/b"
    assert rec.recorded_path("a//b/./c") == "/a/b/c"
    assert rec.recorded_path(root / "a" / "b") == "/a/b"
    assert rec.recorded_path(f"{root}//x") == "/x"
    for bad in ("../x", "a/../../x", str(tmp_path / "elsewhere"), str(root), ".", ""):
        with pytest.raises(InvalidPath):
            rec.recorded_path(bad)
    with pytest.raises(ValueError):
        Recorder(FSM("l"), 0, root, rec_service, "l")


async def test_inconsistent_ops_break_the_recorder(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    bad_calls: list[Callable[[Recorder, int], object]] = [
        lambda r, f: r.record_unlink("missing"),
        lambda r, f: r.record_write(f + 100, 0, b"x"),
        lambda r, f: r.record_link(f, "f"),
        lambda r, f: r.record_open("f", create=True, exclusive=True),
        lambda r, f: r.record_open("missing"),
    ]
    for bad in bad_calls:
        rec = await Recorder.open(FSM(), A, tmp_path, rec_service, log)
        f = rec.record_create("f")
        with pytest.raises((UnknownPath, UnknownFnode, PathExists)):
            bad(rec, f)
        with pytest.raises(RecorderBroken):
            rec.record_create("g")
        with pytest.raises(RecorderBroken):
            await rec.build_hints()
    # A bad path is rejected without breaking anything.
    rec = await Recorder.open(FSM(), A, tmp_path, rec_service, log)
    with pytest.raises(InvalidPath):
        rec.record_create("../escape")
    rec.record_create("fine")
    await rec.close()
    with pytest.raises(RuntimeError):
        rec.record_create("closed")


async def test_recorder_constructed_at_a_known_write_head(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    # As after a Player's hand-off: the fence is in place and the write head known.
    log = await make_rec_log()
    noop = rpb.RecordedOp(seq_no=1, checksum=0, author=B)
    frame = encode_op(noop)
    resp = await append(
        rec_client, pb.AppendRequest(journal=log, union_registers=author_fence(B)), frame
    )
    fsm = FSM(log)
    fsm.apply(noop, frame[HEADER_LENGTH:])
    rec = Recorder(fsm, B, tmp_path, rec_service, log, write_head=resp.commit.end)
    f = rec.record_create("f")
    hints = await rec.build_hints()
    assert hints.live_nodes[0].segments[0].first_offset == resp.commit.end
    assert f == 2

    # A zombie with the fence check disabled still appends; the FSM chain tells readers.
    zombie = Recorder(FSM(log), A, tmp_path, rec_service, log, check_fence=False)
    zombie.record_create("z")
    await zombie.barrier()
    fenced = Recorder(FSM(log), A, tmp_path, rec_service, log)
    fenced.record_create("z")
    with pytest.raises(RecorderFenced):
        await fenced.barrier()
