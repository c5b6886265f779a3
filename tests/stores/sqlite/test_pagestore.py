"""The page store alone: records, rolls, compactions, and rebuilds from any prefix."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stores.sqlite.pagestore import (
    RECORD,
    CorruptPageFile,
    PageStore,
    encode_write_header,
    generation_of,
    generation_path,
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


def _files(root: Path, db: str) -> list[Path]:
    return sorted((root / f"{db}.pages").iterdir())


def test_generation_paths() -> None:
    assert generation_path("a/b.db", 7) == "a/b.db.pages/0000000000000007"
    assert generation_of("a/b.db", "a/b.db.pages/0000000000000007") == 7
    assert generation_of("a/b.db", "a/c.db.pages/0000000000000007") is None
    assert generation_of("a/b.db", "a/b.db.pages/7") is None


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
