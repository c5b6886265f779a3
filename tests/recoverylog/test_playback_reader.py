"""`jump_over_hints`: which offset jumps of a recovery log lose hinted ops for certain."""

from __future__ import annotations

import pytest

from gazette.broker.client.errors import OffsetJump
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.playback_reader import jump_over_hints

LOG = "recoverylog/a"


def seg(first: int, last: int, log: str = LOG) -> rpb.Segment:
    return rpb.Segment(author=1, first_seq_no=1, first_offset=first, last_offset=last, log=log)


@pytest.mark.parametrize(
    ("jump", "segments", "skipped"),
    [
        # Within a segment: a failed append the recorder retried further on. Not fatal here;
        # ops truly lost there leave the segment unused when its end is read.
        ((150, 170), [seg(100, 300)], None),
        # Into a segment's first op, or from before it to within it.
        ((50, 120), [seg(100, 300)], None),
        # Past the end of a segment: its last ops are gone.
        ((250, 400), [seg(100, 300)], 0),
        ((250, 300), [seg(100, 300)], 0),
        # Over a whole segment, the second of two.
        ((350, 700), [seg(100, 300), seg(400, 600)], 1),
        # A segment of open extent (last_offset 0): only the head can tell.
        ((150, 900), [seg(100, 0)], None),
        # Before or after every segment, or in another log.
        ((10, 90), [seg(100, 300)], None),
        ((300, 400), [seg(100, 300)], None),
        ((250, 400), [seg(100, 300, log="recoverylog/b")], None),
    ],
)
def test_a_jump_is_fatal_only_past_the_end_of_a_hinted_segment(
    jump: tuple[int, int], segments: list[rpb.Segment], skipped: int | None
) -> None:
    got = jump_over_hints(OffsetJump(LOG, *jump), segments)
    assert got == (None if skipped is None else segments[skipped])
