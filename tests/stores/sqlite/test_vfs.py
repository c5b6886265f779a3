"""The recording VFS's C half: what reaches the recorder, in which pieces, and its errors."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from gazette.recoverylog.recorder import RecordingFailed
from gazette.stores.sqlite import native
from gazette.stores.sqlite.vfs import TRUNCATE_FACTOR, RecordingVFS, native_vfs
from tests.stores.sqlite.support import Op, OpLog

_names = itertools.count()


class Sink(OpLog):
    """An OpLog that knows the VFS recording into it (set by `connect`)."""

    vfs: RecordingVFS | None = None


@pytest.fixture
def connect(tmp_path: Path) -> Iterator[Any]:
    """connect(sink) -> a WAL-mode connection to tmp_path/db recorded into `sink`."""
    opened: list[tuple[apsw.Connection, RecordingVFS]] = []

    def connect(sink: Sink) -> apsw.Connection:
        vfs = RecordingVFS(
            f"test-vfs-{next(_names)}",
            tmp_path,
            sink,  # type: ignore[arg-type]
            recorded=set(),
            page_files={},
            sequential=True,  # As the store in WAL mode: no sync between header and frames.
        )
        conn = apsw.Connection(str(tmp_path / "db"), vfs=vfs.name)
        opened.append((conn, vfs))
        sink.vfs = vfs
        conn.execute("PRAGMA synchronous=FULL").fetchall()
        assert conn.execute("PRAGMA journal_mode=WAL").fetchall() == [("wal",)]
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        return conn

    yield connect
    for conn, vfs in opened:
        conn.close()
        vfs.unregister()


def _wal_writes(ops: list[Op]) -> list[Op]:
    return [op for op in ops if op[0] == "write" and op[1] == "db-wal"]


def test_a_commits_wal_frames_reach_the_recorder_as_one_write(connect: Any, tmp_path: Path) -> None:
    sink = Sink()
    conn = connect(sink)
    before = len(sink.ops)
    with conn:
        for k in range(200):
            conn.execute("INSERT INTO t VALUES (?, randomblob(1000))", (k,))
    writes = _wal_writes(sink.ops[before:])
    # SQLite writes each frame's header and page apart: ~60 pages, ~120 writes, gathered.
    assert len(writes) == 1, [op[:3] for op in writes]
    frames = len(writes[0][3]) // (24 + 4096)
    assert frames > 50 and len(writes[0][3]) == frames * (24 + 4096)
    # What was recorded is the WAL as it is on disk.
    wal = bytearray()
    for op in _wal_writes(sink.ops):
        _, _, offset, data = op
        wal[offset : offset + len(data)] = data
    assert bytes(wal) == (tmp_path / "db-wal").read_bytes()


def _commit_after_checkpoint(connect: Any, mode: str) -> tuple[list[Op], list[Op]]:
    """One commit, a ``wal_checkpoint(mode)``, one more commit: the operations recorded up
    to the checkpoint's end, and those of the last commit."""
    sink = Sink()
    conn = connect(sink)
    with conn:
        conn.execute("INSERT INTO t VALUES (1, randomblob(3000))")
    conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()
    mark = len(sink.ops)
    with conn:
        conn.execute("INSERT INTO t VALUES (2, randomblob(3000))")
    return sink.ops[:mark], sink.ops[mark:]


def test_a_write_at_offset_0_reaches_the_recorder_alone(connect: Any) -> None:
    """Python sees a WAL's restart by its header: never gathered with the frames after it."""
    before, ops = _commit_after_checkpoint(connect, "TRUNCATE")
    assert ("truncate", "db-wal") in before  # The checkpoint reset the WAL.
    wal = _wal_writes(ops)
    assert wal[0][2] == 0 and len(wal[0][3]) == 32, [op[:3] for op in wal]
    assert wal[1][2] == 32 and len(wal) == 2, [op[:3] for op in wal]


def test_a_restarted_wal_is_a_new_fnode_before_its_header(connect: Any) -> None:
    """A WAL checkpointed but not truncated (RESTART) starts over at its header: recorded
    as a new Fnode right before the header, the old frames left dead."""
    _, ops = _commit_after_checkpoint(connect, "RESTART")
    header = ops.index(next(op for op in ops if op[:3] == ("write", "db-wal", 0)))
    assert ops[header - 1] == ("truncate", "db-wal"), [op[:3] for op in ops]
    assert len(ops[header][3]) == 32


def _with_store_checkpoints(connect: Any, pages: int) -> tuple[Sink, apsw.Connection]:
    """A sink and its connection, checkpointed by the store's WAL hook past `pages` pages."""
    sink = Sink()
    conn = connect(sink)
    assert sink.vfs is not None
    conn.set_wal_hook(sink.vfs.wal_hook(pages))
    return sink, conn


def test_the_stores_checkpoint_copies_are_not_recorded(connect: Any, tmp_path: Path) -> None:
    """While the store's own checkpoint runs, the database's writes copy WAL frames: none is
    recorded, and the page store learns the WAL must be kept."""
    sink, conn = _with_store_checkpoints(connect, 10)
    mark = len(sink.ops)
    with conn:
        for k in range(40):
            conn.execute("INSERT INTO t VALUES (?, randomblob(1000))", (k,))
    assert conn.execute("SELECT count(*) FROM t").fetchall() == [(40,)]
    wal_size = (tmp_path / "db-wal").stat().st_size
    assert wal_size > 0  # PASSIVE: the checkpoint copied the WAL, and left the file.
    with conn:  # Starts the wholly copied WAL over, at its header.
        conn.execute("INSERT INTO t VALUES (40, randomblob(10))")
    assert (tmp_path / "db-wal").stat().st_size == wal_size  # Rewritten in place.
    ops = sink.ops[mark:]
    assert [op for op in ops if op[0] == "write" and ".pages/" in op[1]] == []
    # Noted instead: the WAL holding the copies is kept, as a WAL generation, at its reset,
    # right before the new WAL's header.
    renames = [i for i, op in enumerate(ops) if op[0] == "rename"]
    assert len(renames) == 1, [op[:3] for op in ops]
    at = renames[0]
    assert ops[at][1] == "db-wal" and ops[at][2].endswith(".wal")
    assert ops[at + 1] == ("create", "db-wal")
    assert ops[at + 2][:3] == ("write", "db-wal", 0)


def test_a_large_transactions_wal_is_truncated_by_the_stores_checkpoint(
    connect: Any, tmp_path: Path
) -> None:
    """A WAL past `TRUNCATE_FACTOR` times the checkpoint threshold (one large transaction)
    is truncated, its disk space not kept; it is kept in the log as a WAL generation."""
    sink, conn = _with_store_checkpoints(connect, 10)
    mark = len(sink.ops)
    with conn:
        for k in range(TRUNCATE_FACTOR * 10 * 2):  # ~2 pages a row.
            conn.execute("INSERT INTO t VALUES (?, randomblob(5000))", (k,))
    assert (tmp_path / "db-wal").stat().st_size == 0
    ops = sink.ops[mark:]
    assert [op for op in ops if op[0] == "write" and ".pages/" in op[1]] == []
    renames = [op for op in ops if op[0] == "rename"]
    assert len(renames) == 1 and renames[0][1] == "db-wal" and renames[0][2].endswith(".wal")


def test_a_wal_grown_by_a_rolled_back_transaction_is_truncated_at_the_next_checkpoint(
    connect: Any, tmp_path: Path
) -> None:
    """The WAL file's size decides, not the pages the last commit left: a large
    transaction rolled back after spilling to the WAL leaves a large file, which the next
    checkpoint of the store's truncates."""
    sink, conn = _with_store_checkpoints(connect, 10)
    conn.execute("PRAGMA cache_size = 5")  # Spills dirty pages to the WAL before commit.
    conn.execute("BEGIN")
    for k in range(100):
        conn.execute("INSERT INTO t VALUES (?, randomblob(5000))", (k,))
    conn.execute("ROLLBACK")
    grown = (tmp_path / "db-wal").stat().st_size
    assert grown > TRUNCATE_FACTOR * 10 * 4096
    k = 0
    while (tmp_path / "db-wal").stat().st_size >= grown and k < 50:
        with conn:  # Small commits, until the store's checkpoint runs.
            conn.execute("INSERT INTO t VALUES (?, randomblob(3000))", (k,))
        k += 1
    assert (tmp_path / "db-wal").stat().st_size == 0, k
    assert conn.execute("SELECT count(*) FROM t").fetchall() == [(k,)]


def test_a_wal_cut_above_its_recorded_size_records_nothing(connect: Any, tmp_path: Path) -> None:
    """With ``journal_size_limit``, SQLite cuts a WAL started over in place to the limit:
    the bytes past its recorded size are stale frames, not recorded (as zeros or else)."""
    sink, conn = _with_store_checkpoints(connect, 10)
    conn.execute("PRAGMA journal_size_limit = 20000").fetchall()
    cuts = 0
    for k in range(12):  # ~2 pages a commit: the store's checkpoint runs (PASSIVE).
        mark = len(sink.ops)
        with conn:
            conn.execute("INSERT INTO t VALUES (?, randomblob(5000))", (k,))
        wal = _wal_writes(sink.ops[mark:])
        if wal and wal[0][2] == 0 and (tmp_path / "db-wal").stat().st_size == 20000:
            cuts += 1  # Started over, then cut to the limit, above what it recorded.
            assert max(offset + len(data) for _, _, offset, data in wal) < 20000
    assert cuts >= 1
    zeros = [op[:3] for op in _wal_writes(sink.ops) if not any(op[3])]
    assert zeros == []


# (Closing a broken VFS's files reports it too, as unraisable: SQLite ignores close errors.)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_hooks_error_is_what_the_statement_raises(connect: Any) -> None:
    sink = Sink()
    conn = connect(sink)
    sink.fail["sync"] = RecordingFailed("the recorder was fenced")
    conn.execute("BEGIN; INSERT INTO t VALUES (1, 'x')")
    with pytest.raises(apsw.IOError, match="the recorder was fenced"):
        conn.execute("COMMIT")
    # (`with conn:` raises SQLite's error instead, with the hook's as its __context__.)
    assert not conn.in_transaction  # SQLite rolled back; nothing is left pending.
    assert conn.execute("SELECT count(*) FROM t").fetchall() == [(0,)]
    # A gathered write that cannot be handed over fails the sync that hands it over.
    del sink.fail["sync"]
    sink.fail["write"] = RuntimeError("the bridge broke")
    conn.execute("BEGIN; INSERT INTO t VALUES (2, 'y')")
    with pytest.raises(RuntimeError, match="the bridge broke"):
        conn.execute("COMMIT")
    # SQLite made those writes: nothing later may be recorded without them.
    del sink.fail["write"]
    recorded = len(sink.ops)
    conn.execute("BEGIN; INSERT INTO t VALUES (3, 'z')")
    with pytest.raises(RuntimeError, match="was not recorded"):
        conn.execute("COMMIT")
    with pytest.raises(RuntimeError, match="was not recorded"):
        conn.close()
    assert len(sink.ops) == recorded


def test_a_database_outside_the_directory_is_refused(tmp_path: Path) -> None:
    vfs = RecordingVFS(
        f"test-vfs-{next(_names)}",
        tmp_path / "store",
        Sink(),  # type: ignore[arg-type]
        recorded=set(),
        page_files={},
    )
    try:
        with pytest.raises(apsw.CantOpenError, match="is outside"):
            apsw.Connection(str(tmp_path / "elsewhere.db"), vfs=vfs.name)
        assert not (tmp_path / "elsewhere.db").exists()  # Refused, and not left behind.
    finally:
        vfs.unregister()


def test_a_vfs_in_use_is_not_unregistered(tmp_path: Path) -> None:
    vfs = RecordingVFS(f"test-vfs-{next(_names)}", tmp_path, Sink(), recorded=set(), page_files={})  # type: ignore[arg-type]
    conn = apsw.Connection(str(tmp_path / "db"), vfs=vfs.name)
    conn.execute("CREATE TABLE t (k)")
    with pytest.raises(RuntimeError, match="files open"):
        vfs.unregister()
    conn.execute("INSERT INTO t VALUES (1)")  # Still usable.
    conn.close()
    vfs.unregister()
    assert vfs.name not in apsw.vfs_names()


def test_a_vfs_name_is_registered_once(tmp_path: Path) -> None:
    name = f"test-vfs-{next(_names)}"
    vfs = RecordingVFS(name, tmp_path, Sink(), recorded=set(), page_files={})  # type: ignore[arg-type]
    try:
        with pytest.raises(ValueError, match="registered already"):
            RecordingVFS(name, tmp_path, Sink(), recorded=set(), page_files={})  # type: ignore[arg-type]
    finally:
        vfs.unregister()
    vfs.unregister()  # Idempotent.
    assert name not in apsw.vfs_names()


def test_an_unbuilt_module_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a pip user (reinstall with the extra, which needs a C compiler) and in a checkout."""
    monkeypatch.setitem(sys.modules, "gazette.stores.sqlite._recvfs", None)
    with pytest.raises(ImportError) as err:
        native_vfs()
    message = str(err.value)
    assert "was not built" in message
    assert "C compiler" in message
    assert "pip install --force-reinstall --no-cache-dir 'gazette-py[sqlite]'" in message
    assert "`make deps`" in message


def test_build_compiles_the_module_and_reports_a_failed_compile(tmp_path: Path) -> None:
    out = native.build(tmp_path / "_recvfs.so")
    assert out.stat().st_size > 0
    with pytest.raises(RuntimeError, match="building the SQLite VFS failed"):
        native.build(tmp_path / "broken.so", compiler=f"cc -include {tmp_path}/missing.h")
    assert not (tmp_path / "broken.so").exists()
