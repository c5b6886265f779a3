"""Where a Player is (`PlayerState`) and how far it got (`PlaybackProgress`).

A `ProgressTracker` counts what a Player read and applied, estimates what it has still to
read, and hands snapshots to an optional callback at a bounded rate. The estimate follows the
byte intervals playback is expected to read (`expected_intervals`): the extents of the hinted
segments, then the played log from the end of the last one through its write head, which
grows while a Player tails the log.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gazette.recoverylog import recoverylog_pb2 as rpb

__all__ = [
    "Interval",
    "PlaybackProgress",
    "PlayerState",
    "ProgressTracker",
    "expected_intervals",
]


class PlayerState(enum.Enum):
    """Where a Player is in playback (see `gazette.recoverylog.player`)."""

    BACKFILL = "backfill"
    """Reading the log up to the write head learnt when playback began."""
    TAIL = "tail"
    """At the head, following new ops as they are appended (a hot standby)."""
    EXIT_AT_HEAD = "exit_at_head"
    """Asked to finish: reading to the current write head, then completing."""
    INJECT_HANDOFF_AT_HEAD = "inject_handoff_at_head"
    """Asked to hand off: appending the hand-off no-op at the head."""
    READ_HANDOFF_BARRIER = "read_handoff_barrier"
    """Reading up to the injected no-op, to learn whether it was sequenced."""
    COMPLETE = "complete"
    """Playback completed: the tree is live and `Player.fsm` may be recorded onwards."""


@dataclass(frozen=True, slots=True)
class PlaybackProgress:
    """A snapshot of a Player's progress.

    `bytes_to_read` is the length of the hinted ranges still to be read plus the distance from
    the start of the final (unhinted) portion of the log to its write head; it grows while
    tailing. `bytes_read` counts log bytes received (dead bytes read through included).
    """

    state: PlayerState
    log: str
    offset: int
    bytes_read: int
    bytes_to_read: int
    ops_applied: int
    ops_rejected: int
    desync_bytes: int
    elapsed: float

    @property
    def rate(self) -> float:
        """Bytes read per second since playback began."""
        return self.bytes_read / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Estimated seconds until the write head is reached (None before any rate is known)."""
        remaining = max(0, self.bytes_to_read - self.bytes_read)
        if remaining == 0:
            return 0.0
        rate = self.rate
        return remaining / rate if rate > 0 else None


Interval = tuple[str, int, int | None]
"""Bytes playback expects to read: (log, begin, end), an end of None being `log`'s write head."""


def expected_intervals(
    segments: Sequence[rpb.Segment], log: str, heads: dict[str, int]
) -> list[Interval]:
    """What playback of `log` is expected to read, in order: the extents of hinted
    `segments` (those of unknown extent reaching to the next segment of their log, or its
    head in `heads`), then `log` from the end of the last one through its write head."""
    out: list[Interval] = []
    for i, seg in enumerate(segments):
        end: int | None = seg.last_offset
        if not end:
            nxt = segments[i + 1] if i + 1 < len(segments) else None
            if nxt is not None and nxt.log == seg.log:
                end = max(seg.first_offset, nxt.first_offset)
            else:
                end = None if seg.log == log else heads[seg.log]
        begin = seg.first_offset
        if out and out[-1][0] == seg.log:
            last_end = out[-1][2]
            if last_end is None or begin <= last_end:
                end = None if last_end is None or end is None else max(last_end, end)
                out[-1] = (seg.log, out[-1][1], end)
                continue
        out.append((seg.log, begin, end))
    if not out:
        return [(log, 0, None)]
    if out[-1][2] is not None:
        out.append((log, out[-1][2], None))
    return out


class ProgressTracker:
    """A Player's counters, its estimate of what remains to read, and its reporting.

    `on_progress`, if given, is called with a snapshot at most every `interval` seconds by
    `report`, and at once by ``report(force=True)``.
    """

    def __init__(
        self,
        log: str,
        on_progress: Callable[[PlaybackProgress], None] | None,
        interval: float,
    ) -> None:
        self.on_progress = on_progress
        self.interval = interval
        self._intervals: list[Interval] = [(log, 0, None)]
        self._cursor = 0  # The first interval not yet read through.
        self.log_head = 0
        """Latest known write head of the played log."""
        self.bytes_read = 0
        self.ops_applied = 0
        self.ops_rejected = 0
        self.desync_bytes = 0
        self._started = 0.0
        self._last = 0.0

    @property
    def intervals(self) -> list[Interval]:
        """The portions of the log playback expects to read, in order."""
        return self._intervals

    @intervals.setter
    def intervals(self, intervals: list[Interval]) -> None:
        self._intervals = intervals
        self._cursor = 0  # A snapshot of the placeholder may have passed its only interval.

    def start(self) -> None:
        """Playback begins reading now (the rate counts from here)."""
        self._started = self._last = time.monotonic()

    def advance_head(self, offset: int) -> None:
        """The played log's write head is at least `offset`."""
        if offset > self.log_head:
            self.log_head = offset

    def snapshot(self, state: PlayerState, log: str, offset: int) -> PlaybackProgress:
        """Progress as of now, the reader being at `offset` of `log`."""
        return PlaybackProgress(
            state=state,
            log=log,
            offset=offset,
            bytes_read=self.bytes_read,
            bytes_to_read=self.bytes_read + self._remaining(log, offset),
            ops_applied=self.ops_applied,
            ops_rejected=self.ops_rejected,
            desync_bytes=self.desync_bytes,
            elapsed=time.monotonic() - self._started if self._started else 0.0,
        )

    def report(self, state: PlayerState, log: str, offset: int, *, force: bool = False) -> None:
        """Call `on_progress` with a snapshot if `interval` passed since the last (or `force`)."""
        if self.on_progress is None:
            return
        now = time.monotonic()
        if force or now - self._last >= self.interval:
            self._last = now
            self.on_progress(self.snapshot(state, log, offset))

    def _remaining(self, log: str, offset: int) -> int:
        intervals = self._intervals

        def end_of(i: int) -> int:
            end = intervals[i][2]
            return self.log_head if end is None else end

        i = self._cursor
        while i < len(intervals) and not (intervals[i][0] == log and end_of(i) > offset):
            i += 1
        self._cursor = i
        if i == len(intervals):
            return 0
        out = end_of(i) - max(intervals[i][1], offset)
        for j in range(i + 1, len(intervals)):
            out += max(0, end_of(j) - intervals[j][1])
        return out
