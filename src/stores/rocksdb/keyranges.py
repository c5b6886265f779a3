"""Split a RocksDB's key space into ranges of about equal numbers of entries.

Every task exporting a split of a shard plays the same snapshot of the store (the same log
offset), opens it read-only and calls `split_points` with the same SST metadata
(``Rdict.live_files()``): so all tasks compute the same points without talking to each other,
and their ranges are disjoint and cover every key. Balance is an estimate: entries are assumed
spread evenly between a file's first and last keys, read as numbers (the 8 bytes after the
keys' common prefix), and entries still in the memtable (the WAL, not yet flushed to an SST)
are not counted. Correctness never depends on it.
"""

from __future__ import annotations

import os.path
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SstFile", "clip", "key_position", "range_of", "split_points", "sst_files"]

_WIDTH = 8  # Bytes of a key read as a number after the common prefix.
_SAMPLES = 32  # Candidate points per file.


@dataclass(frozen=True)
class SstFile:
    """The metadata of one SST file that splitting uses."""

    start: bytes
    end: bytes
    entries: int


def sst_files(live_files: Sequence[Mapping[str, Any]]) -> list[SstFile]:
    """`SstFile`s of ``Rdict.live_files()``, in a deterministic order."""
    out = [
        SstFile(bytes(f["start_key"]), bytes(f["end_key"]), int(f["num_entries"]))
        for f in live_files
        if f.get("start_key") is not None and f.get("end_key") is not None
    ]
    out.sort(key=lambda f: (f.start, f.end, f.entries))
    return out


def clip(files: Sequence[SstFile], first: bytes, last: bytes) -> list[SstFile]:
    """`files` with their key ranges cut to [`first`, `last`], the first and last keys to
    export (found by seeking): a file that also holds keys outside them (the store's own 0x00
    keys, keys of another prefix) would otherwise spread its estimate over empty key space."""
    out = []
    for f in files:
        if f.end < first or f.start > last:
            continue
        out.append(SstFile(max(f.start, first), min(f.end, last), f.entries))
    return out


def _common_prefix(a: bytes, b: bytes) -> int:
    return len(os.path.commonprefix([a, b]))


def _number(key: bytes, at: int) -> int:
    return int.from_bytes(key[at : at + _WIDTH].ljust(_WIDTH, b"\0"), "big")


def key_position(f: SstFile, key: bytes) -> float:
    """Estimated fraction of `f`'s entries below `key`."""
    if key <= f.start:
        return 0.0
    if key > f.end:
        return 1.0
    at = _common_prefix(f.start, f.end)
    lo, hi, k = _number(f.start, at), _number(f.end, at), _number(key, at)
    if hi <= lo:
        return 0.5
    return min(1.0, max(0.0, (k - lo) / (hi - lo)))


def _interpolate(f: SstFile, frac: float) -> bytes:
    at = _common_prefix(f.start, f.end)
    lo, hi = _number(f.start, at), _number(f.end, at)
    value = lo + int((hi - lo) * frac)
    return f.start[:at] + value.to_bytes(_WIDTH, "big")


def _below(files: Sequence[SstFile], key: bytes) -> float:
    return sum(f.entries * key_position(f, key) for f in files)


def split_points(
    files: Sequence[SstFile], count: int, lo: bytes, hi: bytes | None = None
) -> list[bytes]:
    """`count - 1` increasing keys within (`lo`, `hi`) splitting the entries of `files` in
    [`lo`, `hi`) into `count` parts of about equal size (fewer points, so fewer non-empty
    ranges, when there is too little to tell keys apart; none for `count` 1)."""
    if count <= 1:
        return []
    candidates = {f.start for f in files} | {f.end for f in files}
    for f in files:
        candidates.update(_interpolate(f, i / _SAMPLES) for i in range(1, _SAMPLES))
    inside = sorted(c for c in candidates if c > lo and (hi is None or c < hi))
    if not inside:
        return []
    base = _below(files, lo)
    total = (sum(f.entries for f in files) if hi is None else _below(files, hi)) - base
    if total <= 0:
        return []
    # Entries below a key grow with the key: binary-search each target among the candidates.
    out: list[bytes] = []
    first = 0
    for i in range(1, count):
        target = base + total * i / count
        a, b = first, len(inside)
        while a < b:
            mid = (a + b) // 2
            if _below(files, inside[mid]) < target:
                a = mid + 1
            else:
                b = mid
        if a == len(inside):
            break
        if not out or inside[a] > out[-1]:
            out.append(inside[a])
        first = a
    return out


def range_of(points: Sequence[bytes], index: int, lo: bytes) -> tuple[bytes, bytes | None]:
    """The key range [begin, end) of split `index` given `split_points` (end None: no bound).
    Splits past ``len(points)`` are empty ranges."""
    bounds: list[bytes | None] = [lo, *points, None]
    if index + 1 >= len(bounds):
        return lo, lo  # Empty.
    begin = bounds[index]
    assert begin is not None
    return begin, bounds[index + 1]
