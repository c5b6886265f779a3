"""The check that acknowledged appends are readable at their offsets, on planted content."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from ack_check import Ack, JournalContent, longest_gap, lost_acks, parse_acks, record


def acks_at(ids: list[str], start: int = 0) -> tuple[list[Ack], bytes]:
    """Acks of `ids` appended one after another from `start`, and the content they make."""
    acks, content, offset = [], b"", start
    for id in ids:
        data = record(id)
        acks.append(Ack(id, offset, offset + len(data), 1.0))
        content += data
        offset += len(data)
    return acks, content


def test_log_round_trip_and_a_torn_last_line_is_skipped() -> None:
    acks, _ = acks_at(["a-1", "a-2"])
    text = "".join(a.to_json() + "\n" for a in acks)
    assert parse_acks(text) == acks
    assert parse_acks(text + '{"id": "a-3", "beg') == acks


def test_a_malformed_line_before_the_last_is_an_error() -> None:
    acks, _ = acks_at(["a-1"])
    with pytest.raises(ValueError, match="line 1"):
        parse_acks("not json\n" + acks[0].to_json() + "\n")


def test_every_ack_found_where_acknowledged() -> None:
    acks, content = acks_at(["a-1", "a-2", "a-3"])
    read = JournalContent()
    for i in range(0, len(content), 7):  # reads return arbitrary pieces
        read.add(i, content[i : i + 7])
    assert lost_acks(acks, read) == []


def test_a_duplicate_written_by_a_retry_is_not_a_loss() -> None:
    # "a-2" was written once before its acknowledged copy (an ambiguous failure, retried).
    content = record("a-1") + record("a-2") + record("a-2")
    acks = [Ack("a-1", 0, 8), Ack("a-2", 16, 24)]
    assert lost_acks(acks, JournalContent([(0, content)])) == []


@pytest.mark.parametrize(
    ("runs", "lost", "reason"),
    [
        # The read stopped short of the last ack.
        (lambda c: [(0, c[:-3])], ["a-3"], "beyond what was read"),
        # Content of the second ack is missing (a gap the read jumped over).
        (lambda c: [(0, c[:8]), (16, c[16:])], ["a-2"], "in a gap"),
        # Something else sits where the second ack was acknowledged.
        (lambda c: [(0, c[:8] + b"ack zz-9\n"[:8] + c[16:])], ["a-2"], "holds"),
    ],
)
def test_lost_acks_are_reported(
    runs: Callable[[bytes], list[tuple[int, bytes]]], lost: list[str], reason: str
) -> None:
    acks, content = acks_at(["a-1", "a-2", "a-3"])
    assert len(record("a-1")) == 8
    found = lost_acks(acks, JournalContent(runs(content)))
    assert [lo.ack.id for lo in found] == lost
    assert reason in str(found[0])


def test_content_runs_merge_and_may_not_overlap() -> None:
    read = JournalContent([(0, b"abc"), (3, b"def"), (10, b"xy")])
    assert read.at(1, 5) == b"bcde"
    assert read.at(5, 11) is None
    assert read.at(10, 12) == b"xy"
    assert read.end == 12
    with pytest.raises(ValueError, match="overlaps"):
        read.add(11, b"z")


def test_longest_gap_counts_from_the_trial_start_to_its_end() -> None:
    assert longest_gap([1.0, 2.0, 8.0, 9.0], 0.0, 10.0) == 6.0
    assert longest_gap([], 5.0, 7.5) == 2.5
    assert longest_gap([1.0, 20.0], 5.0, 9.0) == 4.0  # acks outside the trial ignored
