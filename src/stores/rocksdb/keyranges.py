"""Split a RocksDB's key space into ranges of about equal numbers of entries.

Every task exporting a split of a shard plays the same snapshot of the store (the same log
offset), opens it read-only and calls `split_points` with the same SST metadata
(``Rdict.live_files()``): so all tasks compute the same points without talking to each other,
and their ranges are disjoint and cover every key. Balance is an estimate: entries are assumed
spread evenly between a file's first and last keys, read as numbers, and entries still in the
memtable (the WAL, not yet flushed to an SST) are not counted. Correctness never depends on it.

A key reads as a number of `_WIDTH` digits after the common prefix of its file's first and
last keys, each byte a digit in the radix of its class as those two keys show it: decimal
digits, lower-case or upper-case letters (their union where they mix), else all 256 byte
values. Read in base 256, decimal keys crowd the bottom of a file that spans a change of
leading digit ("n0650000" sat at 2% of "n0000000".."n1299999", and two splits of a 5M-key
word-count store held 1M and 4M keys).
"""

from __future__ import annotations

import dataclasses
import functools
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


_CLASSES = ((0x30, 0x39), (0x61, 0x7A), (0x41, 0x5A))  # Decimal digits, a-z, A-Z.


def _class_of(byte: int) -> tuple[int, int]:
    for low, high in _CLASSES:
        if low <= byte <= high:
            return low, high
    return 0, 255


@dataclass(frozen=True)
class _Digits:
    """How the keys of one file read as numbers: the bytes at `at`, `at` + 1, ... are digits
    of the given lowest byte values and radixes (module docs)."""

    at: int
    lows: tuple[int, ...]
    radixes: tuple[int, ...]
    first: int = 0
    """The number of the file's first key."""
    last: int = 0
    """The number of the file's last key."""

    @classmethod
    @functools.lru_cache(maxsize=4096)  # Split points read each file's keys many times.
    def of(cls, f: SstFile) -> _Digits:
        at = len(os.path.commonprefix([f.start, f.end]))
        lows, radixes = [], []
        for i in range(at, at + _WIDTH):
            seen = [_class_of(k[i]) for k in (f.start, f.end) if i < len(k)] or [(0, 255)]
            low, high = min(c[0] for c in seen), max(c[1] for c in seen)
            lows.append(low)
            radixes.append(high - low + 1)
        digits = cls(at, tuple(lows), tuple(radixes))
        return dataclasses.replace(digits, first=digits.number(f.start), last=digits.number(f.end))

    def number(self, key: bytes) -> int:
        """`key` as a number; keys in order give numbers in order (a byte outside its digit's
        range reads as that digit's least or greatest value, and the bytes after it too)."""
        n = 0
        for i, (low, radix) in enumerate(zip(self.lows, self.radixes, strict=True)):
            at = self.at + i
            digit = key[at] - low if at < len(key) else 0
            if digit < 0 or digit >= radix:
                rest = 1
                for r in self.radixes[i + 1 :]:
                    rest *= r
                n = n * radix * rest
                return n if digit < 0 else n + radix * rest - 1
            n = n * radix + digit
        return n

    def key(self, prefix: bytes, n: int) -> bytes:
        """The key of number `n` after `prefix`."""
        out = bytearray(len(self.lows))
        for i in range(len(self.lows) - 1, -1, -1):
            n, digit = divmod(n, self.radixes[i])
            out[i] = self.lows[i] + digit
        return prefix[: self.at] + bytes(out)


def key_position(f: SstFile, key: bytes) -> float:
    """Estimated fraction of `f`'s entries below `key`."""
    if key <= f.start:
        return 0.0
    if key > f.end:
        return 1.0
    digits = _Digits.of(f)
    lo, hi, k = digits.first, digits.last, digits.number(key)
    if hi <= lo:
        return 0.5
    return min(1.0, max(0.0, (k - lo) / (hi - lo)))


def _interpolate(f: SstFile, frac: float) -> bytes:
    digits = _Digits.of(f)
    lo, hi = digits.first, digits.last
    return digits.key(f.start, lo + int((hi - lo) * frac))


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
