"""The page store alone: records, rolls, compactions, and rebuilds from any prefix."""

from __future__ import annotations

import random
import shutil
import struct
from pathlib import Path

import apsw
import pytest

from gazette.stores.sqlite.pagestore import (
    RECORD,
    CorruptPageFile,
    PageStore,
    encode_size,
    encode_write_header,
    generation_of,
    generation_path,
    is_wal_generation,
    rebuild,
)


class DirSink:
    """Writes page files into a directory, as playback would leave them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def create(self, path: str) -> None:
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).write_bytes(b"")

    def write(self, path: str, offset: int, data: bytes) -> None:
        with open(self.root / path, "r+b") as f:
            f.seek(offset)
            f.write(data)

    def unlink(self, path: str) -> None:
        (self.root / path).unlink()

    def rename(self, src: str, dst: str) -> None:
        (self.root / dst).parent.mkdir(parents=True, exist_ok=True)
        (self.root / src).rename(self.root / dst)


def _files(root: Path, db: str) -> list[Path]:
    return sorted((root / f"{db}.pages").iterdir())


def test_generation_paths() -> None:
    assert generation_path("a/b.db", 7) == "a/b.db.pages/0000000000000007"
    assert generation_of("a/b.db", "a/b.db.pages/0000000000000007") == 7
    assert generation_of("a/b.db", "a/c.db.pages/0000000000000007") is None
    assert generation_of("a/b.db", "a/b.db.pages/7") is None
    wal = generation_path("a/b.db", 8, wal=True)
    assert wal == "a/b.db.pages/0000000000000008.wal"
    assert generation_of("a/b.db", wal) == 8 and is_wal_generation(wal)
    assert not is_wal_generation(generation_path("a/b.db", 8))


def test_random_writes_rebuild_exactly_through_rolls_and_compactions(tmp_path: Path) -> None:
    rnd = random.Random(3)
    image = bytearray()
    store = PageStore(DirSink(tmp_path), "db", min_compaction_bytes=64 << 10, roll_bytes=16 << 10)

    def read(offset: int, n: int) -> bytes:
        return bytes(image[offset : offset + n])

    for step in range(400):
        if rnd.random() < 0.05 and image:
            size = rnd.randrange(len(image))
            del image[size:]
            store.truncate(size)
        else:
            offset = rnd.randrange(64) * 1024
            data = rnd.randbytes(1024)
            if len(image) < offset:
                image.extend(bytes(offset - len(image)))
            image[offset : offset + len(data)] = data
            store.write(offset, data)
        if step % 10 == 0:
            store.synced(len(image), read)
    assert store.compactions > 0 and len(store.generations) > 1
    stats = rebuild(_files(tmp_path, "db"), tmp_path / "out.db")
    assert (tmp_path / "out.db").read_bytes() == bytes(image)
    assert not stats.torn_tail


def test_torn_tail_of_the_last_file_is_dropped(tmp_path: Path) -> None:
    store = PageStore(DirSink(tmp_path), "db")
    store.write(0, b"a" * 100)
    store.write(50, b"b" * 100)
    [last] = _files(tmp_path, "db")
    whole = last.read_bytes()
    for cut in range(len(whole) - 1, RECORD.size + 100, -1):  # Within the second record.
        last.write_bytes(whole[:cut])
        stats = rebuild([last], tmp_path / "out.db")
        assert stats.torn_tail
        assert (tmp_path / "out.db").read_bytes() == b"a" * 100


def test_torn_tail_of_an_older_generation_rebuilds_as_first_recovered(tmp_path: Path) -> None:
    # A crash tore generation 2's tail; the recovery dropped that record and later writes went
    # to generation 3. The next recovery must rebuild the same state, not call it corruption.
    g1, g2, g3 = tmp_path / "1", tmp_path / "2", tmp_path / "3"
    g1.write_bytes(encode_write_header(0, 4) + b"AAAA")
    g2.write_bytes(encode_write_header(4, 4) + b"BB")  # torn by the crash
    first = rebuild([g1, g2], tmp_path / "first.db")
    assert first.torn_tail and (tmp_path / "first.db").read_bytes() == b"AAAA"
    g3.write_bytes(encode_write_header(4, 4) + b"CCCC")  # written after that recovery
    again = rebuild([g1, g2, g3], tmp_path / "again.db")
    assert again.torn_tail and (tmp_path / "again.db").read_bytes() == b"AAAACCCC"


def test_unknown_record_kind_is_corruption(tmp_path: Path) -> None:
    good = tmp_path / "1"
    good.write_bytes(encode_write_header(0, 4) + b"AAAA")
    bad = tmp_path / "2"
    bad.write_bytes(b"\xff" * RECORD.size + good.read_bytes())
    with pytest.raises(CorruptPageFile):
        rebuild([good, bad], tmp_path / "out.db")


def _wal_database(tmp: Path) -> tuple[Path, Path, Path]:
    """A WAL-mode database whose WAL holds committed transactions (one of which shrinks the
    database) and was never checkpointed: (database as before the WAL, its WAL, the
    database after a full checkpoint)."""
    db = tmp / "w.db"
    conn = apsw.Connection(str(db))
    conn.execute("PRAGMA journal_mode=WAL").fetchall()
    conn.execute("PRAGMA wal_autocheckpoint=0").fetchall()
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchall() == [(0,)]
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = tmp / "before.db"
    shutil.copy(db, before)
    rnd = random.Random(7)
    for i in range(30):
        rows = [(rnd.randrange(500), rnd.randbytes(rnd.randrange(10, 3000))) for _ in range(40)]
        conn.executemany("INSERT OR REPLACE INTO t VALUES (?, ?)", rows)
        if i == 20:
            conn.execute("DELETE FROM t WHERE k % 3 = 0")
    conn.execute("DELETE FROM t WHERE k > 100")
    conn.execute("VACUUM")  # The last commit shrinks the database.
    wal = tmp / "0000000000000002.wal"
    shutil.copy(tmp / "w.db-wal", wal)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return before, wal, db


def test_a_wal_generation_rebuilds_what_a_checkpoint_writes(tmp_path: Path) -> None:
    before, wal, after = _wal_database(tmp_path)
    base = tmp_path / "0000000000000001"
    data = before.read_bytes()
    base.write_bytes(encode_size(len(data)) + encode_write_header(0, len(data)) + data)
    stats = rebuild([base, wal], tmp_path / "out.db")
    assert (tmp_path / "out.db").read_bytes() == after.read_bytes()
    assert stats.size == after.stat().st_size < wal.stat().st_size
    assert stats.records > 1

    # Frames after the last commit frame (an uncommitted or rolled-back transaction), and
    # frames of another salt (an earlier use of the file), are not applied.
    header = wal.read_bytes()[:32]
    page_size = struct.unpack(">I", header[8:12])[0]
    salts = header[16:24]
    uncommitted = struct.pack(">II", 2, 0) + salts + b"\0" * 8 + b"\xee" * page_size
    stale = struct.pack(">II", 3, 9) + b"\x01" * 8 + b"\0" * 8 + b"\xdd" * page_size
    for tail in (uncommitted, stale + uncommitted):
        extended = tmp_path / "0000000000000003.wal"
        extended.write_bytes(wal.read_bytes() + tail)
        rebuild([base, extended], tmp_path / "again.db")
        assert (tmp_path / "again.db").read_bytes() == after.read_bytes()

    empty = tmp_path / "0000000000000004.wal"
    empty.write_bytes(b"")
    rebuild([base, wal, empty], tmp_path / "empty.db")
    assert (tmp_path / "empty.db").read_bytes() == after.read_bytes()

    not_a_wal = tmp_path / "0000000000000005.wal"
    not_a_wal.write_bytes(b"\x12" * 64)
    with pytest.raises(CorruptPageFile, match="not a WAL"):
        rebuild([base, not_a_wal], tmp_path / "bad.db")


def test_a_wal_is_kept_only_while_checkpoint_writes_went_unrecorded(tmp_path: Path) -> None:
    sink = DirSink(tmp_path)
    pages = PageStore(sink, "db", compaction_factor=1.5, min_compaction_bytes=0)
    pages.write(0, b"A" * 100)
    wal = "db-wal"
    sink.create(wal)
    sink.write(wal, 0, b"W" * 1000)

    # No checkpoint copy skipped: the WAL may die (its writes were recorded as pages).
    assert not pages.keep_wal(wal, 1000)
    pages.note_backfill()
    assert pages.keep_wal(wal, 1000)
    kept = generation_path("db", 2, wal=True)
    assert (tmp_path / kept).read_bytes() == b"W" * 1000 and not (tmp_path / wal).exists()
    # The next WAL is kept only if copies from it were skipped too (not after a checkpoint
    # of SQLite's own, whose copies were recorded).
    assert not pages.keep_wal(wal, 1000)
    assert pages.generations == [1, 2] and pages.delta_bytes > 1000
    # Later page records go to a later generation than the WAL.
    pages.write(0, b"B" * 100)
    assert pages.generations == [1, 2, 3]

    # A compaction (a base read after every write so far) removes WAL generations too, and
    # a WAL reset after it may die.
    pages.note_backfill()
    pages.wal_size = 500
    assert pages.synced(100, lambda offset, n: b"C" * n)
    assert pages.generations == [4] and not (tmp_path / kept).exists()
    assert not pages.keep_wal(wal, 500)

    # The WAL of a checkpoint whose copies were skipped counts toward the compaction
    # threshold before it is kept.
    pages.note_backfill()
    pages.wal_size = 10_000
    assert pages.synced(100, lambda offset, n: b"D" * n)
