"""RecordedFS against a real broker: after each scenario, the files replayed from the log equal
the files on disk."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from gazette.broker.client import AppendService, JournalClient, append
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.author import author_fence
from gazette.recoverylog.codec import encode_op
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.recorded_files import WRITE_BUFFER_SIZE, NotRecorded, RecordedFS
from gazette.recoverylog.recorder import InvalidPath, Recorder, RecorderFenced
from tests.kit.journals import read_to_head
from tests.recoverylog.recorder_support import (
    MakeLog,
    Replay,
    disk_files,
    make_rec_log,
    rec_client,
    rec_service,
    recorder_broker,
    replay,
)

__all__ = ["make_rec_log", "rec_client", "rec_service", "recorder_broker"]  # Fixtures used here.

A, B = 0xA1, 0xB2


async def recorded_fs(svc: AppendService, log: str, tmp_path: Path) -> RecordedFS:
    root = tmp_path / "files"
    root.mkdir()
    return RecordedFS(await Recorder.open(FSM(), A, root, svc, log))


async def check_log_matches_disk(client: JournalClient, fs: RecordedFS) -> Replay:
    await fs.sync()
    r = replay(await read_to_head(client, fs.recorder.log), fs.recorder.log)
    assert r.files() == disk_files(fs.root)
    return r


def writes(r: Replay) -> list[rpb.RecordedOp.Write]:
    return [op.write for op in r.ops if op.HasField("write")]


async def test_json_store_pattern_write_fsync_rename(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    fs = await recorded_fs(rec_service, log, tmp_path)
    fs.makedirs("store")
    for i in range(3):
        state = {"offsets": {"a/journal": 1000 * i}, "counts": list(range(i * 50))}
        with fs.open("store/next.json", "wb") as f:
            f.write(json.dumps(state, indent=1).encode())
            await fs.fsync(f)
        fs.rename("store/next.json", "store/state.json")
        await fs.sync()
        # Once synced, the log alone has the state.
        r = replay(await read_to_head(rec_client, log), log)
        assert json.loads(r.files()["/store/state.json"]) == state
        assert "/store/next.json" not in r.files()
    await check_log_matches_disk(rec_client, fs)


async def test_modes(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    fs = await recorded_fs(rec_service, log, tmp_path)

    with fs.open("w", "wb") as f:
        f.write(b"first version, long")
    with fs.open("w", "wb") as f:  # Truncates.
        f.write(b"second")
    with fs.open("a", "ab") as f:
        f.write(b"one ")
    with fs.open("a", "ab") as f:
        f.seek(0)  # Appends go to the end regardless.
        f.write(b"two")
    with fs.open("u", "xb") as f:
        f.write(b"0123456789")
    with fs.open("u", "r+b") as f:
        f.seek(3)
        f.write(b"abc")
        assert f.read(2) == b"67"
        f.seek(-1, io.SEEK_END)
        f.write(b"XYZ")
        f.seek(0)
        assert f.read() == b"012abc678XYZ"
    with fs.open("rw", "w+b") as f:
        f.write(b"hello")
        f.seek(0)
        assert f.read() == b"hello"

    with pytest.raises(FileExistsError):
        fs.open("u", "xb")
    with pytest.raises(FileNotFoundError):
        fs.open("missing", "r+b")
    with pytest.raises(ValueError):
        fs.open("w", "w")  # Text modes are not supported.
    with pytest.raises(InvalidPath):
        fs.open("../outside", "wb")
    ops = fs.recorder.fsm.next_seq_no
    with fs.open("u", "rb") as f:  # Not recorded.
        assert f.read() == b"012abc678XYZ"
        with pytest.raises(io.UnsupportedOperation):
            f.write(b"no")
    assert fs.recorder.fsm.next_seq_no == ops

    r = await check_log_matches_disk(rec_client, fs)
    assert r.files() == {
        "/w": b"second",
        "/a": b"one two",
        "/u": b"012abc678XYZ",
        "/rw": b"hello",
    }


async def test_small_writes_are_buffered_into_few_ops(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    fs = await recorded_fs(rec_service, log, tmp_path)
    doc = {f"key-{i}": [i, str(i), {"nested": i}] for i in range(5000)}
    with fs.open("doc.json", "wb") as f:
        for chunk in json.JSONEncoder(indent=2).iterencode(doc):  # Many tiny writes.
            f.write(chunk.encode())
        f.seek(0)
        f.write(b"{")  # Not contiguous with the buffer: flushes it first.
    r = await check_log_matches_disk(rec_client, fs)
    size = (fs.root / "doc.json").stat().st_size
    assert len(writes(r)) <= size // WRITE_BUFFER_SIZE + 3
    assert json.loads(r.files()["/doc.json"]) == doc


async def test_truncate(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    fs = await recorded_fs(rec_service, log, tmp_path)
    with fs.open("t", "wb") as f:
        f.write(b"0123456789")
        first = f.fnode
        assert f.truncate(4) == 4  # Shrink: recorded afresh with the kept prefix.
        assert f.fnode != first
        f.write(b"abc")  # At the position (10): a hole of zeros, as on disk.
        f.truncate(20)  # Grow: zeros.
        f.seek(0)
        f.truncate()  # To the position: empty.
        f.write(b"end")
    r = await check_log_matches_disk(rec_client, fs)
    assert r.files() == {"/t": b"end"}

    with fs.open("l", "wb") as f:
        f.write(b"linked")
        fs.link("l", "l2")
        with pytest.raises(io.UnsupportedOperation):
            f.truncate(1)
    await check_log_matches_disk(rec_client, fs)


async def test_rename_remove_link_and_directories(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    fs = await recorded_fs(rec_service, log, tmp_path)
    fs.makedirs("d/sub")
    for name in ("d/x", "d/sub/y", "z"):
        with fs.open(name, "wb") as f:
            f.write(name.encode())
    fs.link("z", "d/z-link")
    fs.rename("d", "e")  # A directory: each file under it is renamed.
    assert not fs.exists("d") and fs.exists("e/sub/y")
    fs.rename("z", "e/x")  # Replaces e/x.
    fs.remove("e/z-link")
    fs.makedirs(tmp_path / "files" / "empty")
    fs.rmdir("empty")
    with fs.open("IDENTITY.tmp", "wb") as f:
        f.write(b"a-guid")
    fs.rename("IDENTITY.tmp", "IDENTITY")  # A property, as upstream.

    with pytest.raises(FileNotFoundError):
        fs.remove("nope")
    r = replay(await read_to_head(rec_client, log), log)
    await fs.sync()
    r = replay(await read_to_head(rec_client, log), log)
    assert r.files() == {"/e/x": b"z", "/e/sub/y": b"d/sub/y"}
    assert r.fsm.properties == {"/IDENTITY": "a-guid"}
    on_disk = disk_files(fs.root)
    assert on_disk.pop("/IDENTITY") == b"a-guid"
    assert r.files() == on_disk


async def test_unrecorded_files_are_refused_untouched(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    fs = await recorded_fs(rec_service, log, tmp_path)
    (fs.root / "old").write_bytes(b"predates the recorder")
    for call in (
        lambda: fs.open("old", "ab"),
        lambda: fs.open("old", "r+b"),
        lambda: fs.remove("old"),
        lambda: fs.rename("old", "new"),
        lambda: fs.link("old", "new"),
    ):
        with pytest.raises(NotRecorded):
            call()
    assert (fs.root / "old").read_bytes() == b"predates the recorder"
    assert fs.recorder.error is None
    with fs.open("old", "wb") as f:  # Truncation makes it a recorded (new) file.
        f.write(b"now recorded")
    await check_log_matches_disk(rec_client, fs)


async def test_sync_flushes_open_files_and_fails_once_fenced(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    fs = await recorded_fs(rec_service, log, tmp_path)
    f = fs.open("open", "wb")
    f.write(b"buffered, not yet flushed")
    await fs.sync()
    r = replay(await read_to_head(rec_client, log), log)
    assert r.files() == {"/open": b"buffered, not yet flushed"}

    fsm = fs.recorder.fsm
    noop = rpb.RecordedOp(seq_no=fsm.next_seq_no, checksum=fsm.next_checksum, author=B)
    await append(
        rec_client, pb.AppendRequest(journal=log, union_registers=author_fence(B)), encode_op(noop)
    )
    f.write(b" more")
    with pytest.raises(RecorderFenced):
        await fs.fsync(f)
    # Once broken, nothing more is done on disk either.
    with pytest.raises(RecorderFenced):
        fs.remove("open")
    with pytest.raises(RecorderFenced):
        fs.open("new", "wb")
    assert fs.exists("open") and not fs.exists("new")
    with pytest.raises(RecorderFenced):
        f.write(b"x")
    f.close()


async def test_remove_a_file_while_open(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    fs = await recorded_fs(rec_service, log, tmp_path)
    f = fs.open("a", "wb")
    f.write(b"hello")  # Buffered.
    fs.remove("a")  # Legal with the file open: later writes go to an unreachable file.
    f.write(b" world")
    f.truncate(100)
    f.close()

    g = fs.open("b", "wb")
    g.write(b"kept ")
    fs.link("b", "c")
    fs.remove("b")  # Still linked at c.
    g.write(b"by c")
    g.close()
    assert fs.recorder.error is None
    r = await check_log_matches_disk(rec_client, fs)
    assert r.files() == {"/c": b"kept by c"}


async def test_truncating_open_while_open(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    fs = await recorded_fs(rec_service, log, tmp_path)
    f1 = fs.open("a", "wb")
    f1.write(b"one")  # Buffered: written before the truncation below.
    f2 = fs.open("a", "wb")  # Truncates the same file (recorded as a new Fnode).
    f2.write(b"two")
    f1.write(b"X")  # At f1's position, 3, of the same (truncated) file.
    f1.close()
    f2.close()
    assert fs.recorder.error is None
    r = await check_log_matches_disk(rec_client, fs)
    assert r.files() == {"/a": b"twoX"}


async def test_truncate_while_another_handle_is_open(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    fs = await recorded_fs(rec_service, log, tmp_path)
    f1 = fs.open("a", "wb")
    f1.write(b"0123456789")
    f1.flush()
    f2 = fs.open("a", "r+b")
    f2.write(b"ab")  # Buffered: written before the truncation.
    f1.truncate(4)
    f2.write(b"Z")  # At 2, in the truncated file.
    f2.close()
    f1.close()
    assert fs.recorder.error is None
    r = await check_log_matches_disk(rec_client, fs)
    assert r.files() == {"/a": b"abZ3"}


async def test_rename_over_an_open_file(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    fs = await recorded_fs(rec_service, log, tmp_path)
    old = fs.open("dst", "wb")
    old.write(b"old")
    with fs.open("src", "wb") as f:
        f.write(b"new")
    fs.rename("src", "dst")  # Replaces the open file, which becomes unreachable.
    old.write(b" and more")
    old.close()
    assert fs.recorder.error is None
    r = await check_log_matches_disk(rec_client, fs)
    assert r.files() == {"/dst": b"new"}


async def test_two_append_handles(
    rec_client: JournalClient, rec_service: AppendService, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    fs = await recorded_fs(rec_service, log, tmp_path)
    h1, h2 = fs.open("a", "ab"), fs.open("a", "ab")
    h1.write(b"AAAAA")
    h1.flush()
    h2.write(b"BBB")  # Lands at the end as of its flush: after h1's bytes.
    h2.flush()
    h1.write(b"11")
    h2.write(b"22")
    h2.flush()  # Flushed first, so written first.
    h1.close()
    h2.close()
    r = await check_log_matches_disk(rec_client, fs)
    assert r.files() == {"/a": b"AAAAABBB2211"}
