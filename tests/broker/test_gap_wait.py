"""Which gaps of a replication-1 journal a blocking read waits at (`awaits_content`).

A gap with a marker ahead (where a fresh primary started, beyond an old primary's
reservation) and none at the reader's offset (the old primary has not said that its content
ends there) may still be filled: readers wait there, for a bounded time. Pruned history, a
closed gap, and journals of other replication factors are not waited at.
tests/broker/test_replication_one.py runs it on real brokers, across a hand-off.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.replica import JournalReplica, Listing

from .conftest import journal_spec

NEW_START = 4 << 20  # where the new primary started: the old one's reservation


def fragment(begin: int, end: int) -> pb.Fragment:
    return pb.Fragment(journal="r1/gaps", begin=begin, end=end, compression_codec=pb.NONE)


def replica_with(
    tmp_path: Path, fragments: list[tuple[int, int]], markers: list[int], replication: int = 1
) -> JournalReplica:
    spec = journal_spec("r1/gaps", f"file://{tmp_path}/", replication=replication)
    replica = JournalReplica(spec, 1, tmp_path / "spool")
    frags = [fragment(b, e) for b, e in fragments]
    replica.apply_listing(Listing(frags, [], replica.index_epoch, max(markers, default=0)))
    replica.reservations.markers.update(markers)
    return replica


@pytest.mark.parametrize(
    ("fragments", "markers", "offset", "waits"),
    [
        # The old primary's content [100, ...) is not published yet: wait.
        ([(0, 100), (NEW_START, NEW_START + 10)], [NEW_START], 100, True),
        # Published up to 150 and closed there: the rest of the gap is skipped.
        ([(0, 150), (NEW_START, NEW_START + 10)], [150, NEW_START], 150, False),
        # A gap no marker ends: history removed from the store (or never reserved).
        ([(500, 600)], [], 0, False),
        ([(0, 100), (NEW_START, NEW_START + 10)], [], 100, False),
        # The journal's only content is the new primary's: the old one's is all missing.
        ([(NEW_START, NEW_START + 10)], [NEW_START], 0, True),
    ],
    ids=["pending", "closed", "pruned", "no-marker", "all-missing"],
)
def test_which_gaps_a_blocking_read_waits_at(
    tmp_path: Path,
    fragments: list[tuple[int, int]],
    markers: list[int],
    offset: int,
    waits: bool,
) -> None:
    replica = replica_with(tmp_path, fragments, markers)
    entry, found = replica.index.find(offset)
    assert not found and entry is not None
    assert replica.awaits_content(offset, entry.begin, 30.0) is waits


def test_a_gap_up_to_the_write_head_is_waited_at(tmp_path: Path) -> None:
    """The new primary's own content is not listed here yet (it persisted it after our
    listing): the gap reaches the write head, beyond the marker where that primary started."""
    replica = replica_with(tmp_path, [], [NEW_START])
    replica.write_head = NEW_START + 26
    assert replica.index.find(0) == (None, False)
    assert replica.awaits_content(0, replica.write_head, 30.0)


def test_the_wait_is_bounded_from_the_first_wait_at_the_gap(tmp_path: Path) -> None:
    replica = replica_with(tmp_path, [(0, 100), (NEW_START, NEW_START + 10)], [NEW_START])
    assert replica.awaits_content(100, NEW_START, 0.2)
    time.sleep(0.25)
    assert not replica.awaits_content(100, NEW_START, 0.2)
    assert not replica.awaits_content(100, NEW_START, 30.0)  # bounded once, not per read


def test_other_replication_factors_do_not_wait(tmp_path: Path) -> None:
    replica = replica_with(
        tmp_path, [(0, 100), (NEW_START, NEW_START + 10)], [NEW_START], replication=2
    )
    assert not replica.awaits_content(100, NEW_START, 30.0)


def test_markers_at_the_edges_of_content_are_kept(tmp_path: Path) -> None:
    """The closing marker (at the end of published content) and the one where the new
    primary started are kept by the primary that replaces them; others go."""
    replica = replica_with(tmp_path, [(0, 150), (NEW_START, NEW_START + 10)], [150, NEW_START])
    assert replica.at_content_edge(150) and replica.at_content_edge(NEW_START)
    assert not replica.at_content_edge(NEW_START - 7)


@pytest.mark.parametrize(
    ("markers", "rolled_over", "offset", "gone"),
    [
        # Nothing known skipped [100, 600): a peer rolled to its primary's head, or a
        # listing has not caught up.
        ([], [], 100, False),
        # An earlier replication-1 primary's reservation ends in the gap: its wait is over.
        ([NEW_START], [], 100, True),
        # The old primary's closing marker at the reader's offset: its content ends there.
        ([100], [], 100, True),
        # This primary rolled forward over a failed append there.
        ([], [(100, 600)], 100, True),
        ([], [(50, 90)], 100, False),
    ],
    ids=["unknown", "reserved", "closed", "rolled-over", "rolled-over-elsewhere"],
)
def test_which_gaps_up_to_the_head_a_read_jumps_over(
    tmp_path: Path,
    markers: list[int],
    rolled_over: list[tuple[int, int]],
    offset: int,
    gone: bool,
) -> None:
    replica = replica_with(tmp_path, [(0, 100)], markers)
    replica.write_head = max([600, *markers])
    replica.rolled_over = rolled_over
    assert replica.index.find(offset) == (None, False)
    assert replica.gap_is_gone(offset) is gone


def test_a_gap_no_store_can_fill_is_jumped_over(tmp_path: Path) -> None:
    spec = journal_spec("r1/gaps", None, replication=2)
    replica = JournalReplica(spec, 1, tmp_path / "spool")
    replica.write_head = 600
    assert replica.gap_is_gone(0)


def test_rolling_over_a_failed_append_marks_its_range(tmp_path: Path) -> None:
    replica = replica_with(tmp_path, [(0, 100)], [])
    replica.write_head = 100
    replica.roll_over(130)
    assert replica.write_head == 130 and replica.rolled_over == [(100, 130)]
    assert replica.gap_is_gone(100) and replica.gap_is_gone(129)
