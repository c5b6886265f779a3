"""The RocksDB store's exporter (`gazette.consumer.export`): a played RocksDB read as (key,
value) rows with the checkpoint under `CHECKPOINT_KEY`.

Keys are read by the native scanner (`scan`) when it is built and can open the database, else
through rocksdict (~3x slower); option ``rocksdb_scan`` (``auto``, ``native``, ``rocksdict``)
chooses. A split (`ExportRequest.split`) is a key range, the same in every task that plays the same
snapshot: cut where RocksDB's estimates of key ranges' sizes say (the scanner's ``--split``)
with ``rocksdb_scan=native``, else from the SST files' metadata (`keyranges`).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
from collections.abc import Iterator, Sequence, Set
from typing import Any, TypeAlias

import pyarrow as pa

from gazette.consumer.export import (
    ExportedRows,
    ExportRequest,
    PlayedFiles,
    StoreExportError,
)
from gazette.consumer.protocol import pb
from gazette.stores.rocksdb import scan as native
from gazette.stores.rocksdb.keyranges import clip, range_of, split_points, sst_files
from gazette.stores.rocksdb.store import CHECKPOINT_KEY

__all__ = ["EXPORTER", "RocksDBExporter"]

log = logging.getLogger(__name__)

SCAN_OPTION = "rocksdb_scan"
"""The export option choosing how keys are read: ``auto``, ``native`` or ``rocksdict``."""

Column: TypeAlias = pa.Array | list[bytes]


class RocksDBExporter:
    """Reads a played RocksDB (module docs). `EXPORTER` is the one instance."""

    kind = "rocksdb"
    description = "a RocksDB"

    def recognizes(self, names: Set[str]) -> bool:
        return (
            "CURRENT" in names
            or "IDENTITY" in names
            or any(n.startswith("MANIFEST-") for n in names)
        )

    def columns(self, played: PlayedFiles, request: ExportRequest) -> list[tuple[str, str]]:
        return [("key", "binary"), ("value", "binary")]

    @contextlib.contextmanager
    def rows(self, played: PlayedFiles, request: ExportRequest) -> Iterator[ExportedRows]:
        """Application keys (not the store's 0x00 keys) under the request's key prefix, in
        key order, of its split."""
        rows = _Rows(played, request)
        try:
            rows.open()
            yield rows
        finally:
            rows.close()


EXPORTER = RocksDBExporter()


class _Rows:
    def __init__(self, played: PlayedFiles, request: ExportRequest) -> None:
        self.played = played
        self.request = request
        self.checkpoint = pb.Checkpoint()
        self._stream: native.ScanStream | None = None
        self._range: tuple[bytes, bytes | None] | None = None
        self._strict = False

    def open(self) -> None:
        played, request = self.played, self.request
        scan = request.options.get(SCAN_OPTION, "auto")
        scanner = None if scan == "rocksdict" else native.find()
        if scanner is None and scan == "native":
            raise StoreExportError(f"option {SCAN_OPTION}=native, but {native.not_found_reason()}")
        if scanner is None and scan == "auto":
            _note_no_scanner()
        self._strict = scan == "native"
        start = max(request.key_prefix, b"\x01")
        stop = _successor(request.key_prefix)
        index, count = request.split
        raw_checkpoint: bytes | None = None
        checkpoint_read = False
        # Every task of a shard must cut it at the same points. With `rocksdb_scan=native`
        # every task has the scanner (or fails), so it estimates them from RocksDB's own size
        # estimates; otherwise a task may read through rocksdict, so every task estimates them
        # from the SST files' metadata (`keyranges`), reading the checkpoint on the way.
        if count > 1 and self._strict:
            assert scanner is not None
            try:
                points = native.split_points(played.directory, start, stop, count, binary=scanner)
            except native.ScanError as err:
                raise StoreExportError(str(err)) from err
            start, stop = _range_of(played.shard, points, index, count, start, stop)
        elif scanner is None or count > 1:
            raw_checkpoint, bounds = _open_for_export(played, start, stop, request.split)
            checkpoint_read = True
            if bounds is None:
                self._set_checkpoint(raw_checkpoint)
                return
            start, stop = bounds
        self._range = (start, stop)
        if scanner is not None:
            try:
                # The scanner reads the checkpoint first, if still unread: one open of the database.
                self._stream = native.ScanStream(
                    played.directory,
                    start,
                    stop,
                    batch_rows=request.batch_size,
                    get=None if checkpoint_read else CHECKPOINT_KEY,
                    binary=scanner,
                )
            except native.ScanError as err:
                _scan_failed(played.shard, err, self._strict)
            if not checkpoint_read:
                if self._stream is not None:
                    raw_checkpoint = self._stream.got
                else:
                    raw_checkpoint, _ = _open_for_export(played, start, stop, (0, 1))
        self._set_checkpoint(raw_checkpoint)

    def _set_checkpoint(self, raw: bytes | None) -> None:
        if raw is not None:
            self.checkpoint.ParseFromString(raw)

    def __iter__(self) -> Iterator[Sequence[Column]]:
        if self._range is None:
            return  # The split has no keys.
        start, stop = self._range
        pairs: Iterator[tuple[Column, Column]]
        if self._stream is not None:
            pairs = _scanned_pairs(
                self.played,
                self._stream,
                start,
                stop,
                self.request.batch_size,
                strict=self._strict,
            )
        else:
            pairs = _rocksdict_pairs(self.played, start, stop, self.request.batch_size)
        yield from pairs

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()  # If it was not read to its end (an error, or a consumer stopped).


def _scan_failed(shard: str, err: Exception, strict: bool) -> None:
    """The native scanner could not read a shard: a `StoreExportError` if `strict`, else a
    warning (the caller reads through rocksdict)."""
    if strict:
        raise StoreExportError(str(err)) from err
    log.warning("shard=%s: reading through rocksdict: %s", shard, err)


_noted_no_scanner = False


def _note_no_scanner() -> None:
    """Logs once per process that RocksDB shards are read the slow way."""
    global _noted_no_scanner
    if not _noted_no_scanner:
        _noted_no_scanner = True
        log.info(
            "the native RocksDB scanner is not built: reading through rocksdict, ~3x slower "
            "(python -m gazette.stores.rocksdb.scan build)"
        )


def _range_of(
    shard: str, points: list[bytes], index: int, count: int, start: bytes, stop: bytes | None
) -> tuple[bytes, bytes | None]:
    """The [start, stop) key range of split `index` of `count` given its `points` within
    [`start`, `stop`) (an empty range: start == stop)."""
    lo, hi = range_of(points, index, start)
    log.info("split shard=%s index=%d of=%d from=%r to=%r", shard, index, count, lo, hi)
    if hi is not None:
        stop = hi if stop is None else min(stop, hi)
    return lo, stop


def _open_for_export(
    played: PlayedFiles, start: bytes, stop: bytes | None, split: tuple[int, int]
) -> tuple[bytes | None, tuple[bytes, bytes | None] | None]:
    """Through rocksdict: the store's checkpoint value, and the [start, stop) key range of
    `split` within [`start`, `stop`) (None: the split has no keys)."""
    from rocksdict import AccessType, Options, Rdict

    db = Rdict(str(played.directory), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        raw = db.get(CHECKPOINT_KEY)
        index, count = split
        if count > 1:
            points = _split_points(db, count, start, stop)
            start, stop = _range_of(played.shard, points, index, count, start, stop)
            if start == stop:
                return (None if raw is None else bytes(raw)), None
    finally:
        db.close()
    return (None if raw is None else bytes(raw)), (start, stop)


def _scanned_pairs(
    played: PlayedFiles,
    stream: native.ScanStream,
    start: bytes,
    stop: bytes | None,
    batch_size: int,
    *,
    strict: bool,
) -> Iterator[tuple[Column, Column]]:
    """[`start`, `stop`) from `stream` (a scan of that range); through rocksdict if the
    scanner fails before its first batch (unless `strict`)."""
    try:
        yield from stream
    except native.ScanUnavailable as err:
        _scan_failed(played.shard, err, strict)
        yield from _rocksdict_pairs(played, start, stop, batch_size)
    except native.ScanError as err:
        raise StoreExportError(str(err)) from err
    finally:
        stream.close()


def _rocksdict_pairs(
    played: PlayedFiles, start: bytes, stop: bytes | None, batch_size: int
) -> Iterator[tuple[Column, Column]]:
    """[`start`, `stop`) through rocksdict, as lists of keys and of values."""
    from rocksdict import AccessType, Options, Rdict

    db = Rdict(str(played.directory), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        items: Iterator[tuple[bytes, bytes]] = db.items(from_key=start)  # type: ignore[assignment]
        while True:
            # Two lists filled as the pairs come (not a list of the pairs, unzipped after):
            # a quarter less time per key, most of it not keeping a tuple per key alive.
            keys: list[bytes] = []
            values: list[bytes] = []
            add_key, add_value = keys.append, values.append
            for k, v in itertools.islice(items, batch_size):
                add_key(k)
                add_value(v)
            done = len(keys) < batch_size
            # Keys are ordered: those below `stop` come first.
            if stop is not None and keys and keys[-1] >= stop:
                n = bisect.bisect_left(keys, stop)
                del keys[n:], values[n:]
                done = True
            if keys:
                yield keys, values
            if done:
                break
        del items
    finally:
        db.close()


def _split_points(db: Any, count: int, lo: bytes, hi: bytes | None) -> list[bytes]:
    """`keyranges.split_points` of `db`'s SST files, cut to the first and last keys in
    [`lo`, `hi`) (no points if there are none)."""
    it = db.iter()
    try:
        it.seek(lo)
        if not it.valid():
            return []
        first = bytes(it.key())
        if hi is None:
            it.seek_to_last()
        else:
            it.seek_for_prev(hi)
            if it.valid() and bytes(it.key()) >= hi:
                it.prev()
        if not it.valid():
            return []
        last = bytes(it.key())
    finally:
        del it
    if last < first:
        return []
    return split_points(clip(sst_files(db.live_files()), first, last), count, lo, hi)


def _successor(prefix: bytes) -> bytes | None:
    """The least key greater than every key with `prefix` (None: there is none)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])
