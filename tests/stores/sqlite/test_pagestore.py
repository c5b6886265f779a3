"""The page store alone: records, rolls, compactions, and rebuilds from any prefix."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from stores.sqlite.pagestore import (
    RECORD,
    CorruptPageFile,
    PageStore,
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


def test_torn_record_before_the_last_file_is_corruption(tmp_path: Path) -> None:
    store = PageStore(DirSink(tmp_path), "db", roll_bytes=1)
    store.write(0, b"a" * 100)
    store.synced(100, lambda o, n: b"")  # Rolls: the next write opens generation 2.
    store.write(0, b"b" * 10)
    first, second = _files(tmp_path, "db")
    first.write_bytes(first.read_bytes()[:-1])
    with pytest.raises(CorruptPageFile):
        rebuild([first, second], tmp_path / "out.db")
    assert os.path.exists(second)
