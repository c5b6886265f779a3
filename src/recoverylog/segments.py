"""Segments: contiguous spans of a recovery log written by one author.

A `Segment` (the generated `recoverylog.Segment` message) names the sequence
numbers [first_seq_no, last_seq_no] of a log that one author wrote, the journal
offsets bounding them (first_offset is a lower bound; last_offset is exclusive
and zero when not yet known), and the FSM checksum before the first op.

A `SegmentSet` folds many Segments (the segments of every live file of one or
more hints) into an ordered, non-overlapping set, checking that they describe
one consistent history. Players seek to the segments of a set to skip dead
portions of a log; pruning deletes fragments no segment overlaps.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from gazette.broker.protocol.errors import ValidationError, context
from gazette.broker.protocol.validation import validate_journal_name
from gazette.recoverylog import recoverylog_pb2 as rpb

__all__ = [
    "AuthorMismatch",
    "FirstChecksumMismatch",
    "InconsistentSegments",
    "InvalidHints",
    "LogMismatch",
    "MissingLastOffset",
    "NonMonotonicFirstOffset",
    "NonMonotonicLastOffset",
    "OpenSegmentLogChange",
    "SegmentSet",
    "copy_segment",
    "flatten_hints",
    "live_log_segments",
    "format_segment",
    "reduce_segments",
    "validate_segment",
]


class InconsistentSegments(ValueError):
    """Two Segments cannot both describe the same log history.

    `a` and `b` are the two segments, `a` being the one which starts first.
    """

    def __init__(self, message: str, a: rpb.Segment, b: rpb.Segment) -> None:
        super().__init__(f"{message}: {format_segment(a)} vs {format_segment(b)}")
        self.a = a
        self.b = b


class NonMonotonicFirstOffset(InconsistentSegments):
    """A later Segment of the same log starts at a smaller offset."""


class NonMonotonicLastOffset(InconsistentSegments):
    """Segments of the same log have last_offsets out of order with their seq_nos."""


class MissingLastOffset(InconsistentSegments):
    """A Segment with an unknown last_offset precedes one with a known last_offset.

    Only a suffix of a set may leave last_offset unknown (zero).
    """


class OpenSegmentLogChange(InconsistentSegments):
    """A Segment with an unknown last_offset is followed by one of another log."""


class FirstChecksumMismatch(InconsistentSegments):
    """Segments beginning at one seq_no disagree on the checksum before it."""


class AuthorMismatch(InconsistentSegments):
    """Overlapping Segments name different authors of the same seq_nos."""


class LogMismatch(InconsistentSegments):
    """Overlapping Segments name different logs for the same seq_nos."""


def format_segment(s: rpb.Segment) -> str:
    """A compact one-line rendering of `s` for error messages and logs."""
    return (
        f"Segment(author={s.author:#x}, seq_no={s.first_seq_no}..{s.last_seq_no}, "
        f"offset={s.first_offset}..{s.last_offset}, first_checksum={s.first_checksum:#010x}, "
        f"log={s.log!r})"
    )


def copy_segment(s: rpb.Segment) -> rpb.Segment:
    """A deep copy of `s`."""
    out = rpb.Segment()
    out.CopyFrom(s)
    return out


def validate_segment(s: rpb.Segment) -> None:
    """Raise `ValidationError` if `s` is not a well-formed Segment (log included)."""
    if s.author == 0:
        raise ValidationError("Author is zero")
    if s.first_seq_no <= 0:
        raise ValidationError(f"FirstSeqNo <= 0 ({s.first_seq_no})")
    if s.first_offset < 0:
        raise ValidationError(f"FirstOffset < 0 ({s.first_offset})")
    if s.last_seq_no < s.first_seq_no:
        raise ValidationError(
            f"LastSeqNo < segment.FirstSeqNo ({s.last_seq_no} < {s.first_seq_no})"
        )
    if s.last_offset != 0 and s.last_offset <= s.first_offset:
        raise ValidationError(
            f"LastOffset <= segment.FirstOffset ({s.last_offset} <= {s.first_offset})"
        )
    with context("Log"):
        validate_journal_name(s.log)


def _set_and_less(x: int, y: int) -> bool:
    # A zero last_offset is "unknown", and orders after everything.
    return x != 0 and x < y


def reduce_segments(a: rpb.Segment, b: rpb.Segment) -> rpb.Segment | None:
    """Fold two Segments into one covering both, if they overlap or abut.

    Returns a new Segment, or None if the two are disjoint, or adjacent but of
    different authors or logs (and so must stay separate entries of a set).
    Raises an `InconsistentSegments` subclass if they contradict each other.
    The result does not depend on the order of the arguments.
    """
    # Order so that `a` starts first, and of two starting together `a` is longer.
    if a.first_seq_no > b.first_seq_no or (
        a.first_seq_no == b.first_seq_no and a.last_seq_no < b.last_seq_no
    ):
        a, b = b, a
    same_log = a.log == b.log
    a_first = a.first_seq_no < b.first_seq_no

    if a_first and same_log and a.first_offset > b.first_offset:
        raise NonMonotonicFirstOffset("expected monotonic FirstOffset", a, b)
    if a_first and a.last_offset == 0 and b.last_offset != 0:
        raise MissingLastOffset("expected preceding Segment to also include LastOffset", a, b)
    if a.last_offset == 0 and not same_log:
        # Not needed for the set's invariants, but no intended use of log forks does this.
        raise OpenSegmentLogChange(
            "Segment cannot use a different log where preceding Segment.LastOffset is zero",
            a,
            b,
        )
    if same_log and (
        (a.last_seq_no <= b.last_seq_no and _set_and_less(b.last_offset, a.last_offset))
        or (a.last_seq_no >= b.last_seq_no and _set_and_less(a.last_offset, b.last_offset))
    ):
        raise NonMonotonicLastOffset("expected monotonic LastOffset", a, b)
    if a.first_seq_no == b.first_seq_no and a.first_checksum != b.first_checksum:
        raise FirstChecksumMismatch("expected FirstChecksum equality", a, b)

    gap = b.first_seq_no - a.last_seq_no
    if gap > 1:
        return None  # Disjoint.
    if gap == 1 and (a.author != b.author or not same_log):
        return None  # Adjacent, but a hand-off to another author or log.

    # From here the two overlap (or abut), so they must agree on who wrote it where.
    if a.author != b.author:
        raise AuthorMismatch("expected Segment Author equality", a, b)
    if not same_log:
        raise LogMismatch("expected Segment Log equality", a, b)

    out = copy_segment(a)
    if a.first_seq_no == b.first_seq_no and a.first_offset < b.first_offset:
        out.first_offset = b.first_offset  # A lower bound: keep the tighter one.
    if a.last_seq_no == b.last_seq_no and a.last_offset == 0:
        out.last_offset = b.last_offset  # Prefer a known bound.
    if a.last_seq_no < b.last_seq_no:
        out.last_seq_no = b.last_seq_no
        out.last_offset = b.last_offset
    return out


class SegmentSet(Sequence[rpb.Segment]):
    """An ordered set of Segments describing one consistent log history.

    Invariants, checked by `add`:

    - entries have strictly increasing, non-overlapping seq_no ranges (so each
      covered seq_no has exactly one author and log);
    - entries of one log have non-decreasing first_offset and last_offset, except
      that a suffix of the set may have an unknown (zero) last_offset.

    The set owns copies of what is added to it; treat its entries as read-only.
    """

    __slots__ = ("_segments",)

    def __init__(self, segments: Iterable[rpb.Segment] = ()) -> None:
        self._segments: list[rpb.Segment] = []
        for s in segments:
            self.add(s)

    def add(self, segment: rpb.Segment) -> None:
        """Add `segment`, merging it with the entries it overlaps or extends.

        Raises `ValidationError` for a malformed segment, or an
        `InconsistentSegments` subclass if it contradicts the set; the set is
        unchanged when an error is raised.
        """
        validate_segment(segment)
        segs = self._segments
        seg = copy_segment(segment)

        # Entries [begin, end) are replaced by the merged segment.
        begin = bisect.bisect_left(segs, seg.first_seq_no, key=lambda s: s.first_seq_no)
        # Only the entry just before the insertion point can reach into `seg`:
        # first_seq_nos are strictly increasing and entries don't overlap.
        if begin > 0:
            merged = reduce_segments(segs[begin - 1], seg)
            if merged is not None:
                seg, begin = merged, begin - 1
        end = begin
        while end < len(segs):
            merged = reduce_segments(segs[end], seg)
            if merged is None:
                break
            seg = merged
            end += 1
        segs[begin:end] = [seg]

    def intersect(self, log: str, first_offset: int, last_offset: int) -> list[rpb.Segment]:
        """The entries overlapping journal range [first_offset, last_offset) of `log`.

        Every entry must be of `log` (`ValueError` otherwise), as must be the
        range's order.
        """
        if last_offset < first_offset:
            raise ValueError(f"invalid range [{first_offset}, {last_offset})")
        segs = self._segments
        for s in segs:
            if s.log != log:
                raise ValueError(f"segment log {s.log!r} is not {log!r}")
        # End: the first entry starting at or beyond `last_offset`.
        j = bisect.bisect_left(segs, last_offset, key=lambda s: s.first_offset)
        # Walk back while entries may still reach past `first_offset`. Since last
        # offsets are monotonic and only a suffix may be unknown, no earlier
        # entry can overlap once one ends at or before it.
        i = j
        while i > 0 and (segs[i - 1].last_offset == 0 or segs[i - 1].last_offset > first_offset):
            i -= 1
        return segs[i:j]

    def copy(self) -> SegmentSet:
        out = SegmentSet()
        out._segments = [copy_segment(s) for s in self._segments]
        return out

    def __len__(self) -> int:
        return len(self._segments)

    @overload
    def __getitem__(self, index: int) -> rpb.Segment: ...

    @overload
    def __getitem__(self, index: slice) -> list[rpb.Segment]: ...

    def __getitem__(self, index: int | slice) -> rpb.Segment | list[rpb.Segment]:
        return self._segments[index]

    def __iter__(self) -> Iterator[rpb.Segment]:
        return iter(self._segments)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SegmentSet):
            return self._segments == other._segments
        if isinstance(other, list):
            return self._segments == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "SegmentSet([" + ", ".join(format_segment(s) for s in self._segments) + "])"


class InvalidHints(ValueError):
    """FSMHints which cannot describe a recovery log's history."""


def live_log_segments(hints: rpb.FSMHints) -> tuple[list[int], SegmentSet]:
    """The hinted live Fnodes in order, and the SegmentSet of all their Segments.

    Segments leaving `log` empty are of `hints.log`. Each Fnode's first segment
    must begin at the Fnode's creation (its seq_no), Fnodes must be strictly
    increasing, and the set's last segment must be of `hints.log` (reading ends
    in the hinted log). Raises `InvalidHints`, or the `ValidationError` /
    `InconsistentSegments` of a bad segment.
    """
    fnodes: list[int] = []
    out = SegmentSet()
    for node in hints.live_nodes:
        if not node.segments or node.segments[0].first_seq_no != node.fnode:
            raise InvalidHints(f"expected Fnode to match Segment FirstSeqNo: fnode {node.fnode}")
        if fnodes and fnodes[-1] >= node.fnode:
            raise InvalidHints(f"expected monotonic Fnode ordering: {fnodes[-1]} vs {node.fnode}")
        fnodes.append(node.fnode)
        for seg in node.segments:
            if not seg.log:
                seg = copy_segment(seg)
                seg.log = hints.log
            out.add(seg)
    if len(out) and out[-1].log != hints.log:
        raise InvalidHints(
            f"expected hints.Log {hints.log} to equal the last Segment Log {out[-1].log}"
        )
    return fnodes, out


def flatten_hints(hints: rpb.FSMHints) -> SegmentSet:
    """The SegmentSet of every live Fnode's Segments of `hints` (see `live_log_segments`)."""
    return live_log_segments(hints)[1]
