"""Why playback cannot complete: the Player's errors.

`PlaybackError` is the base. `DataLoss` and its subclasses mean the log no longer holds what
its hints say is live, so that a tree played from it would be wrong; each names the log, the
offsets and the hinted segment that show it.
"""

from __future__ import annotations

from gazette.broker.client.errors import OffsetJump
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.segments import format_segment

__all__ = [
    "DataLoss",
    "HintedSegmentBeyondHead",
    "OffsetJumpOverHints",
    "PlaybackError",
    "UnsafeDirectory",
    "UnsafePath",
    "UnusedHints",
]


class PlaybackError(Exception):
    """Playback cannot complete."""


class UnsafeDirectory(PlaybackError):
    """The playback directory is one which a Player refuses to wipe (``/``, a home...)."""


class UnsafePath(PlaybackError):
    """A path of the log would place a file outside the playback directory."""


class DataLoss(PlaybackError):
    """The log no longer holds content which the hints say is live: playback would be wrong."""


class UnusedHints(DataLoss):
    """A write head (or the end of a hinted range) was read through with hints unused."""

    def __init__(self, log_name: str, offset: int, head: int, remaining: rpb.Segment | None):
        nxt = format_segment(remaining) if remaining is not None else "hinted Fnodes"
        super().__init__(
            f"read {log_name} through offset {offset} (write head {head}) but the FSM has "
            f"unused hints (next: {nxt}); possible data loss"
        )
        self.log = log_name
        self.offset = offset
        self.head = head
        self.remaining = remaining


class HintedSegmentBeyondHead(DataLoss):
    """A hinted segment lies beyond its log's write head."""

    def __init__(self, segment: rpb.Segment, head: int) -> None:
        super().__init__(
            f"write head of {segment.log} is {head}, vs hinted {format_segment(segment)}; "
            "possible data loss"
        )
        self.segment = segment
        self.head = head


class OffsetJumpOverHints(DataLoss):
    """The log's content jumped over a range holding hinted ops (its fragments are gone)."""

    def __init__(self, jump: OffsetJump, segment: rpb.Segment) -> None:
        super().__init__(
            f"offset jump of {jump.journal} from {jump.from_offset} to {jump.to_offset} skips "
            f"hinted {format_segment(segment)}; possible data loss"
        )
        self.jump = jump
        self.segment = segment
