"""CoverSet: the fragments of one journal that together cover its offsets, best first.

A CoverSet holds fragment entries ordered by (begin, end) with the invariant that no entry's
range is covered by another entry's range (entries may overlap partially, and a span may be
covered by a combination of entries). Consequently begins and ends both strictly increase
through the set: the first entry has the lowest begin and the last the greatest end. Adding a
larger fragment evicts the smaller fragments it covers, so reads prefer large fragments.

This module is sans-I/O: entries only describe where content lives.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gazette.broker.protocol import protocol_pb2 as pb


@dataclass(frozen=True)
class FragmentEntry:
    """A fragment known to the index.

    `spec` is shared, never mutated: build a new entry (with a copied spec) to change it.
    `local_path` is a local spool file of the uncompressed content, or None for a fragment
    that is only in a store. Entries are not hashable (protobuf messages are not).
    """

    spec: pb.Fragment
    local_path: Path | None = None

    @property
    def begin(self) -> int:
        return self.spec.begin

    @property
    def end(self) -> int:
        return self.spec.end

    @property
    def journal(self) -> str:
        return self.spec.journal

    @property
    def content_length(self) -> int:
        return self.spec.end - self.spec.begin


class CoverSet:
    """An ordered set of `FragmentEntry`s of a single journal; see the module docstring.

    Lookups are O(log n). Insertions and removals are a bisect plus a list splice.
    """

    __slots__ = ("_begins", "_ends", "_entries")

    def __init__(self, entries: Iterable[FragmentEntry] = ()) -> None:
        self._entries: list[FragmentEntry] = []
        self._begins: list[int] = []
        self._ends: list[int] = []
        for e in entries:
            self.add(e)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[FragmentEntry]:
        return iter(list(self._entries))

    def __getitem__(self, index: int) -> FragmentEntry:
        return self._entries[index]

    def __repr__(self) -> str:
        spans = ", ".join(f"[{e.begin}, {e.end})" for e in self._entries)
        return f"CoverSet({spans})"

    def begin_offset(self) -> int:
        """The lowest begin offset of any entry, or 0 if the set is empty."""
        return self._begins[0] if self._begins else 0

    def end_offset(self) -> int:
        """The greatest end offset of any entry, or 0 if the set is empty."""
        return self._ends[-1] if self._ends else 0

    def add(self, entry: FragmentEntry) -> bool:
        """Add `entry` unless an existing entry already covers its range.

        Returns False, leaving the set unchanged, if `entry` is empty (begin == end) or an
        existing entry's range contains [begin, end) (an equal range counts as contained; use
        `replace` to swap an equal entry). Otherwise inserts `entry`, drops every entry whose
        range it contains, and returns True. Raises ValueError if `entry` is of another
        journal than the set's entries.
        """
        begin, end = entry.begin, entry.end
        if end <= begin:
            return False
        n = len(self._entries)
        if n and entry.journal != self._entries[0].journal:
            raise ValueError(
                f"journal mismatch: adding {entry.journal!r} to a CoverSet of "
                f"{self._entries[0].journal!r}"
            )

        # Fast path: appending after, or replacing, the last entry (the common case).
        if n == 0 or self._ends[-1] < end:
            self._splice(bisect.bisect_left(self._begins, begin), n, entry)
            return True

        # First entry whose range extends beyond `begin`.
        lo = bisect.bisect_right(self._ends, begin)
        while lo < n:
            if self._begins[lo] <= begin and self._ends[lo] >= end:
                return False  # Already covered.
            if self._begins[lo] >= begin:
                break
            lo += 1
        # One past the last entry which `entry` covers.
        hi = bisect.bisect_right(self._ends, end, lo)
        self._splice(lo, hi, entry)
        return True

    def _splice(self, lo: int, hi: int, entry: FragmentEntry) -> None:
        self._entries[lo:hi] = [entry]
        self._begins[lo:hi] = [entry.begin]
        self._ends[lo:hi] = [entry.end]

    def _index_of(self, begin: int, end: int) -> int:
        i = bisect.bisect_left(self._begins, begin)
        if i < len(self._entries) and self._begins[i] == begin and self._ends[i] == end:
            return i
        return -1

    def replace(self, entry: FragmentEntry) -> None:
        """Swap the entry having `entry`'s exact begin, end and SHA1 sum for `entry`.

        Used when a local fragment becomes persisted (or a persisted one is cached locally).
        Raises KeyError if there is no such entry.
        """
        i = self._index_of(entry.begin, entry.end)
        if i < 0 or self._entries[i].spec.sum != entry.spec.sum:
            raise KeyError(f"no fragment [{entry.begin}, {entry.end}) with that sum to replace")
        self._entries[i] = entry

    def remove(self, entry: FragmentEntry) -> None:
        """Remove the entry having `entry`'s exact begin and end. Raises KeyError if absent."""
        i = self._index_of(entry.begin, entry.end)
        if i < 0:
            raise KeyError(f"no fragment [{entry.begin}, {entry.end}) to remove")
        del self._entries[i]
        del self._begins[i]
        del self._ends[i]

    def find(self, offset: int) -> tuple[FragmentEntry | None, bool]:
        """The entry to read `offset` from.

        Returns (entry, True) for the entry covering `offset` that extends furthest beyond it.
        If none covers `offset`, returns (first entry beginning after offset, False): an offset
        jump. Returns (None, False) if no entry ends after `offset`.
        """
        n = len(self._entries)
        i = bisect.bisect_right(self._ends, offset)
        if i == n:
            return None, False
        if self._begins[i] > offset:
            return self._entries[i], False
        # Entries i.. all end after `offset`; take the last that begins at or before it.
        j = bisect.bisect_right(self._begins, offset) - 1
        return self._entries[max(i, j)], True

    def union(self, other: Iterable[FragmentEntry]) -> CoverSet:
        """A new CoverSet of this set's entries with `other`'s added."""
        out = CoverSet()
        out._entries = list(self._entries)
        out._begins = list(self._begins)
        out._ends = list(self._ends)
        for e in other:
            out.add(e)
        return out

    def difference(self, other: CoverSet) -> list[FragmentEntry]:
        """Entries of this set that cover some offset not covered by `other`'s entries
        (taken together: contiguous or overlapping entries of `other` combine)."""
        out: list[FragmentEntry] = []
        for e in self._entries:
            i = bisect.bisect_right(other._ends, e.begin)
            j = bisect.bisect_right(other._begins, e.begin) - 1
            start = max(i, j)
            if start >= len(other) or other._begins[start] > e.begin:
                out.append(e)
                continue
            reach = other._ends[start]
            k = start
            while reach < e.end and k + 1 < len(other) and other._begins[k + 1] <= reach:
                k += 1
                reach = other._ends[k]
            if reach < e.end:
                out.append(e)
        return out


__all__ = ["CoverSet", "FragmentEntry"]
