"""Offset reservations (broker.reservation): where a fresh primary starts, and when an
append needs a new reservation."""

from __future__ import annotations

from pathlib import Path

import pytest

from gazette.broker.reservation import MIN_SPAN, Reservations, is_marker, marker, span_for


@pytest.mark.parametrize(
    ("listed", "own", "head", "start"),
    [
        (0, 0, 0, 0),  # a new journal starts at 0
        (4096, 0, 100, 4096),  # another primary reserved up to 4096: start beyond it
        (4096, 4096, 100, 100),  # our own reservation: our spools hold all we acknowledged
        (9000, 4096, 100, 9000),  # someone reserved beyond ours since: start beyond theirs
        (50, 0, 100, 100),  # persisted content already beyond every reservation
    ],
)
def test_fresh_start(tmp_path: Path, listed: int, own: int, head: int, start: int) -> None:
    r = Reservations(tmp_path / "reserved", own=own)
    r.saw(listed)
    assert r.fresh_start(head) == start


def test_own_reservation_survives_a_restart(tmp_path: Path) -> None:
    r = Reservations(tmp_path / "j" / "reserved")
    assert not r.covers(1)
    r.wrote(5000, sync=True)
    assert r.covers(5000) and not r.covers(5001)
    again = Reservations(tmp_path / "j" / "reserved")
    again.load()
    assert (again.own, again.listed, again.known) == (5000, 5000, False)
    again.saw(5000)
    assert again.fresh_start(10) == 10


def test_markers_are_empty_fragments_named_like_any() -> None:
    m = marker("a/journal", 1 << 20)
    assert is_marker(m) and (m.begin, m.end) == (1 << 20, 1 << 20)
    assert span_for(128 << 10) == MIN_SPAN
    assert span_for(512 << 20) == 1 << 30


def test_replaced_markers_are_handed_out_once(tmp_path: Path) -> None:
    r = Reservations(tmp_path / "reserved")
    r.markers.update({100, 300})  # listed: another primary's, and an older one
    r.saw(300)
    r.wrote(900, sync=False)
    assert r.replaced() == [100, 300]
    assert r.replaced() == []
    r.wrote(2000, sync=False)
    assert r.replaced() == [900]


def test_only_a_marker_of_this_tenure_covers_an_append(tmp_path: Path) -> None:
    """A primary that took over gracefully below the previous primary's marker still writes
    its own before acknowledging: else, were it to crash, the previous primary could come
    back, find its own marker the furthest, and continue below this one's content."""
    r = Reservations(tmp_path / "reserved")
    r.saw(10_000)  # the previous primary's
    assert not r.covers(100)
    at = r.next_marker(100, MIN_SPAN)
    assert at == 10_000 + MIN_SPAN  # beyond every marker: the furthest is the newest's
    r.wrote(at, sync=False)
    assert r.covers(100) and r.covers(at) and not r.covers(at + 1)
    r.tenure = 0  # a new tenure (the pipeline was opened again)
    assert not r.covers(100)
