"""The recorded page store of a SQLite main database file (see docs/sqlite-store.md).

A main database file is not recorded as a file: its whole write history would stay live in
the recovery log. Instead every write and truncation of it is recorded as a *page record*
appended to a recorded page file ``<db>.pages/<generation>``, and playback rebuilds the
database by applying the page files in generation order. Page files are append-only and are
closed ("rolled") at a database sync once they hold `roll_bytes`, so each spans a short
stretch of the log. Once the page files written since the last compaction hold more than
`compaction_factor` times the database size, a *compaction* records the whole database as a
new generation (the base) and unlinks every older page file: their log bytes become dead and
a Player with hints skips them.

Page files exist only in the log and in a played-back directory: the store reads the local
database file for everything, and removes the played page files once it has rebuilt the
database from them.

Record layout (little-endian): kind (u8), offset or size (u64), length (u32), then `length`
bytes for a write. Kinds: `WRITE` (bytes at offset) and `SIZE` (truncate or extend the file
to `offset` bytes). A log cut anywhere (a crash) leaves a prefix of the records: a torn
record can only end a page file, and is dropped, as a write which did not happen (also in an
older generation: the recovery after the crash dropped it, and later files build on that).

*WAL generations* (``<db>.pages/<generation>.wal``): in WAL mode the store's own checkpoints
copy WAL frames, already recorded in the WAL, into the database; those copies are not
recorded again (`PageStore.note_backfill`). The WAL's Fnode then stays live instead: when
SQLite resets or deletes the WAL it is renamed to a WAL generation (`PageStore.keep_wal`),
unless a base recorded since holds everything (no backfill skipped since the base). Rebuild
applies a WAL generation's committed frames in order (`_apply_wal`), as SQLite's checkpoint
did. Each page is thus recorded once (in the WAL) rather than twice.
"""

from __future__ import annotations

import os
import posixpath
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = [
    "PAGES_SUFFIX",
    "RECORD",
    "SIZE",
    "WAL_FRAME_HEADER",
    "WAL_SUFFIX",
    "WRITE",
    "CorruptPageFile",
    "FileSink",
    "PageStore",
    "RebuildStats",
    "encode_size",
    "encode_write_header",
    "generation_of",
    "generation_path",
    "is_wal_generation",
    "live_generations",
    "rebuild",
]

PAGES_SUFFIX = ".pages"
WAL_SUFFIX = ".wal"
"""Suffix of a WAL generation's name (a kept WAL, not page records)."""
RECORD = struct.Struct("<BQI")
WRITE = 1
SIZE = 2
_COPY_CHUNK = 256 << 10


class CorruptPageFile(Exception):
    """A page file which is not a sequence of page records (other than a torn last record)."""

    def __init__(self, path: Path, offset: int, why: str) -> None:
        super().__init__(f"page file {path} at offset {offset}: {why}")
        self.path = path
        self.offset = offset


def encode_write_header(offset: int, length: int) -> bytes:
    return RECORD.pack(WRITE, offset, length)


def encode_size(size: int) -> bytes:
    return RECORD.pack(SIZE, size, 0)


def generation_path(db: str, generation: int, wal: bool = False) -> str:
    """Recorded path (relative to the store directory) of `db`'s page file `generation`
    (`wal`: of its WAL generation)."""
    return f"{db}{PAGES_SUFFIX}/{generation:016d}{WAL_SUFFIX if wal else ''}"


def generation_of(db: str, path: str) -> int | None:
    """The generation of `path` if it is a page file or WAL generation of `db` (both
    relative), else None."""
    head, name = posixpath.split(path)
    if name.endswith(WAL_SUFFIX):
        name = name[: -len(WAL_SUFFIX)]
    if head != db + PAGES_SUFFIX or len(name) != 16 or not name.isdigit():
        return None
    return int(name)


def is_wal_generation(path: str | Path) -> bool:
    """Whether page-store file `path` is a WAL generation (else page records)."""
    return str(path).endswith(WAL_SUFFIX)


def live_generations(db: str, paths: Iterable[str]) -> list[int]:
    """Generations of `db`'s page files among `paths`, in order."""
    return sorted(g for p in paths if (g := generation_of(db, p)) is not None)


@dataclass(frozen=True)
class RebuildStats:
    files: int
    records: int
    bytes_read: int
    size: int
    torn_tail: bool


def _complete_length(path: Path) -> int:
    """Length of the longest prefix of page file `path` made of whole records."""
    size = path.stat().st_size
    pos = 0
    with open(path, "rb") as f:
        while pos + RECORD.size <= size:
            f.seek(pos)
            kind, _, length = RECORD.unpack(f.read(RECORD.size))
            end = pos + RECORD.size + (length if kind == WRITE else 0)
            if end > size:
                break
            pos = end
    return pos


def rebuild(sources: Sequence[Path], target: Path) -> RebuildStats:
    """Write `target` (replacing it) by applying the page files `sources` in order (WAL
    generations, named ``*.wal``, by their committed frames: `_apply_wal`).

    A torn record ending a file is dropped, in any file: a crash tears only the tail of the
    file being written, the recovery after it dropped that record, and generations written
    since were built on the database without it; dropping it again rebuilds the same state.
    Raises `CorruptPageFile` for an unknown record kind, or a WAL generation which is not a
    WAL.
    """
    records = bytes_read = 0
    torn = False
    fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for src in sources:
            if is_wal_generation(src):
                frames, n = _apply_wal(src, fd)
                records += frames
                bytes_read += n
                continue
            end = src.stat().st_size
            complete = _complete_length(src)
            if complete < end:
                torn, end = True, complete
            with open(src, "rb", buffering=1 << 20) as f:
                pos = 0
                while pos < end:
                    head = f.read(RECORD.size)
                    if len(head) < RECORD.size:
                        raise CorruptPageFile(src, pos, "torn record header")
                    kind, offset, length = RECORD.unpack(head)
                    if kind == SIZE:
                        os.ftruncate(fd, offset)
                        length = 0
                    elif kind == WRITE:
                        done = 0
                        while done < length:
                            chunk = f.read(min(length - done, _COPY_CHUNK))
                            if not chunk:
                                raise CorruptPageFile(src, pos, "torn write record")
                            os.pwrite(fd, chunk, offset + done)
                            done += len(chunk)
                    else:
                        raise CorruptPageFile(src, pos, f"unknown record kind {kind}")
                    records += 1
                    pos += RECORD.size + length
                bytes_read += pos
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return RebuildStats(len(sources), records, bytes_read, size, torn)


_WAL_HEADER = struct.Struct(">IIIIIIII")
_WAL_FRAME = struct.Struct(">IIIIII")
WAL_FRAME_HEADER = _WAL_FRAME.size
"""Bytes of a WAL frame's header, before its page."""
_WAL_MAGICS = (0x377F0682, 0x377F0683)


def _apply_wal(src: Path, fd: int) -> tuple[int, int]:
    """Apply the committed frames of WAL `src` to database file `fd`, in order, as a SQLite
    checkpoint does: each commit frame's transaction is written, and the file is then cut to
    its size in pages. Frames after the last commit frame (a transaction that was never
    committed, or rolled back) are ignored; reading stops at the first frame of another salt
    (left from an earlier use of the file, or zeroed: see below). Returns (frames applied,
    bytes read).

    Frame checksums are not verified (in Python they would cost ~20 s per GB). SQLite stops
    at the first frame whose checksum does not follow; stopping at the last commit frame
    instead gives the same result because frames past a break in the checksum chain are the
    uncommitted tail of a transaction a crash cut (a WAL kept after a recovery keeps that
    tail, overwritten from its start by later transactions), and such a tail holds no commit
    frame with this WAL's salts: a transaction's commit frame is its last frame, and frames
    SQLite overwrites in place carry zeroed salts until it rewrites their checksums at
    commit. The log's fragments carry SHA1 sums against corruption in transit or storage.
    """
    with open(src, "rb", buffering=1 << 20) as f:
        head = f.read(_WAL_HEADER.size)
        if len(head) < _WAL_HEADER.size:
            if not head:
                return 0, 0  # An empty WAL: nothing was written to it.
            raise CorruptPageFile(src, 0, "WAL generation shorter than a WAL header")
        magic, _version, page_size, _seq, salt1, salt2, _c1, _c2 = _WAL_HEADER.unpack(head)
        if magic not in _WAL_MAGICS:
            raise CorruptPageFile(src, 0, f"not a WAL (magic {magic:#x})")
        if page_size < 512 or page_size > 65536 or page_size & (page_size - 1):
            raise CorruptPageFile(src, 0, f"WAL page size {page_size}")
        frame = _WAL_FRAME.size + page_size

        def frames() -> Iterator[tuple[int, int, bytes]]:
            """(page number, commit size, page) of each frame of this WAL's salt, in order."""
            f.seek(_WAL_HEADER.size)
            while len(buf := f.read(frame)) == frame:
                pgno, commit, s1, s2, _, _ = _WAL_FRAME.unpack_from(buf)
                if (s1, s2) != (salt1, salt2) or pgno == 0:
                    return
                yield pgno, commit, buf[_WAL_FRAME.size :]

        # First the extent of the committed frames, then those frames: a transaction is
        # applied only once its commit frame is known to be there.
        committed = 0
        for n, (_, commit, _) in enumerate(frames(), 1):
            if commit:
                committed = n
        for _, (pgno, commit, page) in zip(range(committed), frames(), strict=False):
            os.pwrite(fd, page, (pgno - 1) * page_size)
            if commit:
                os.ftruncate(fd, commit * page_size)
    return committed, _WAL_HEADER.size + committed * frame


class FileSink(Protocol):
    """Where a PageStore records its page files (a `RecorderBridge`)."""

    def create(self, path: str) -> None: ...

    def write(self, path: str, offset: int, data: bytes) -> None: ...

    def unlink(self, path: str) -> None: ...

    def rename(self, src: str, dst: str) -> None: ...


class PageStore:
    """Records the writes of one main database file as page files (module docs).

    Driven synchronously by the VFS file of the database, from the thread running SQLite.
    `live` are the (generation, size) of page files already in the log (after playback), the
    first being treated as the base of the next compaction; `wal_generations` those of them
    which are WAL generations.
    """

    def __init__(
        self,
        sink: FileSink,
        db: str,
        live: Sequence[tuple[int, int]] = (),
        *,
        wal_generations: Iterable[int] = (),
        compaction_factor: float = 1.5,
        min_compaction_bytes: int = 1 << 20,
        roll_bytes: int = 64 << 10,
    ) -> None:
        self.sink = sink
        self.db = db
        self.compaction_factor = compaction_factor
        self.min_compaction_bytes = min_compaction_bytes
        self.roll_bytes = roll_bytes
        self.generations = [g for g, _ in live]
        self.wal_generations = set(wal_generations) & set(self.generations)
        self._next_gen = (self.generations[-1] + 1) if self.generations else 1
        self._cur: str | None = None
        self._cur_size = 0
        self.delta_bytes = sum(size for _, size in live[1:])
        """Bytes of page files recorded since the base (the first live generation)."""
        self.compactions = 0
        self.bytes_recorded = 0
        self.wal_bytes_kept = 0
        self.wal_size = 0
        """Recorded size of the database's WAL (kept up to date by the VFS)."""
        self.backfill_skipped = bool(live)
        """Whether database writes copied from the WAL were left unrecorded since the base
        (so the WAL must be kept when it is reset). After playback, assumed (one WAL kept
        for nothing at worst)."""

    def _path(self, generation: int) -> str:
        return generation_path(self.db, generation, generation in self.wal_generations)

    def _open(self) -> str:
        if self._cur is None:
            gen = self._next_gen
            self._next_gen += 1
            self._cur = generation_path(self.db, gen)
            self._cur_size = 0
            self.generations.append(gen)
            self.sink.create(self._cur)
        return self._cur

    def _append(self, data: bytes) -> None:
        path = self._open()
        self.sink.write(path, self._cur_size, data)
        self._cur_size += len(data)
        self.delta_bytes += len(data)
        self.bytes_recorded += len(data)

    def write(self, offset: int, data: bytes) -> None:
        """Record that `data` was written at `offset` of the database file."""
        self._append(encode_write_header(offset, len(data)))
        self._append(data)

    def truncate(self, size: int) -> None:
        """Record that the database file was truncated (or extended) to `size` bytes."""
        self._append(encode_size(size))

    def note_backfill(self) -> None:
        """A write of WAL frames into the database (a checkpoint of the store's) was left
        unrecorded: the WAL holds it, and must stay live until a base does (`keep_wal`)."""
        self.backfill_skipped = True

    def keep_wal(self, wal: str, size: int) -> bool:
        """SQLite resets or deletes WAL `wal` (recorded, `size` bytes), all of whose frames
        are in the database by then. If checkpoint copies of its frames were left unrecorded
        (since the base and the last WAL kept), rename it to a new WAL generation (the caller
        records the WAL's next Fnode) and return True; else return False (the base or page
        records hold its frames: it may die)."""
        if not self.backfill_skipped or size <= _WAL_HEADER.size:
            return False
        self._cur = None  # Later page records go to a later generation than this WAL.
        gen = self._next_gen
        self._next_gen += 1
        self.generations.append(gen)
        self.wal_generations.add(gen)
        self.sink.rename(wal, generation_path(self.db, gen, wal=True))
        self.delta_bytes += size
        self.wal_bytes_kept += size
        # The copies skipped so far are of frames in this WAL generation: the next WAL is
        # kept only if a checkpoint of the store's copies from it too.
        self.backfill_skipped = False
        return True

    @property
    def has_base(self) -> bool:
        return bool(self.generations)

    def synced(self, db_size: int, read: Callable[[int, int], bytes]) -> bool:
        """The database file was synced at `db_size` bytes: roll or compact as due. Returns
        whether it compacted.

        `read(offset, n)` reads the local database file (for a compaction).
        """
        threshold = max(self.min_compaction_bytes, self.compaction_factor * db_size)
        # A WAL whose checkpoint copies were skipped counts already: it is kept at its reset
        # (after this sync) unless this compacts.
        pending = self.wal_size if self.backfill_skipped else 0
        if self.delta_bytes + pending >= threshold:
            self.compact(db_size, read)
            return True
        if self._cur is not None and self._cur_size >= self.roll_bytes:
            self._cur = None
        return False

    def compact(self, db_size: int, read: Callable[[int, int], bytes]) -> None:
        """Record the whole database (`db_size` bytes, read with `read`) as a new base
        generation, then unlink every older page file."""
        old = [self._path(g) for g in self.generations]
        self._cur = None
        self._open()
        self._append(encode_size(db_size))
        offset = 0
        while offset < db_size:
            data = read(offset, min(_COPY_CHUNK, db_size - offset))
            if not data:
                raise OSError(f"short read of {self.db} at {offset} (size {db_size})")
            self.write(offset, data)
            offset += len(data)
        base = self.generations[-1]
        for path in old:
            self.sink.unlink(path)
        self.generations = [base]
        self.wal_generations.clear()
        self._cur = None  # The base is closed: later writes go to a new delta file.
        self.delta_bytes = 0
        self.backfill_skipped = False  # The base was read after every write so far.
        self.compactions += 1
