"""The Player's progress estimate (`ProgressTracker`), without a log."""

from __future__ import annotations

from gazette.recoverylog.progress import PlayerState, ProgressTracker

LOG = "recovery/a"


def test_remaining_sums_the_intervals_ahead() -> None:
    tracker = ProgressTracker(LOG, None, 1.0)
    tracker.intervals = [(LOG, 0, 100), (LOG, 200, 300), (LOG, 400, None)]
    tracker.advance_head(450)
    assert tracker.snapshot(PlayerState.BACKFILL, LOG, 0).bytes_to_read == 250
    assert tracker.snapshot(PlayerState.BACKFILL, LOG, 250).bytes_to_read == 50 + 50
    assert tracker.snapshot(PlayerState.BACKFILL, LOG, 450).bytes_to_read == 0


def test_a_snapshot_before_playback_does_not_skip_the_first_interval() -> None:
    tracker = ProgressTracker(LOG, None, 1.0)
    # Read before playback knows its intervals: the placeholder, with no head known yet.
    assert tracker.snapshot(PlayerState.BACKFILL, LOG, 0).bytes_to_read == 0
    tracker.intervals = [(LOG, 0, 100), (LOG, 200, 300)]
    assert tracker.snapshot(PlayerState.BACKFILL, LOG, 0).bytes_to_read == 200
