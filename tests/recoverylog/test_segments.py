"""Segment validation, reduction, SegmentSet invariants and flattening of hints."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.broker.protocol.errors import ValidationError
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.segments import (
    AuthorMismatch,
    FirstChecksumMismatch,
    InconsistentSegments,
    InvalidHints,
    LogMismatch,
    MissingLastOffset,
    NonMonotonicFirstOffset,
    NonMonotonicLastOffset,
    OpenSegmentLogChange,
    SegmentSet,
    flatten_hints,
    live_log_segments,
    reduce_segments,
    validate_segment,
)

A = "log/A"
B = "log/B"


def seg(
    author: int,
    first_seq: int,
    last_seq: int,
    first_off: int,
    last_off: int = 0,
    crc: int = 0,
    log: str = A,
) -> rpb.Segment:
    return rpb.Segment(
        author=author,
        first_seq_no=first_seq,
        last_seq_no=last_seq,
        first_offset=first_off,
        last_offset=last_off,
        first_checksum=crc,
        log=log,
    )


def model() -> SegmentSet:
    return SegmentSet(
        [
            seg(0xA, 5, 10, 500, 1001),
            seg(0xB, 11, 11, 1100, 1101),
            seg(0xB, 13, 15, 1300, 1501),
        ]
    )


def test_validate_segment() -> None:
    good = seg(0xFEFE, 10, 10, 0, 1, crc=0xABAB)
    validate_segment(good)

    def mutate(fn: Callable[[rpb.Segment], None]) -> rpb.Segment:
        s = rpb.Segment()
        s.CopyFrom(good)
        fn(s)
        return s

    cases: list[tuple[Callable[[rpb.Segment], None], str]] = [
        (lambda s: setattr(s, "author", 0), "Author is zero"),
        (lambda s: setattr(s, "first_seq_no", 0), "FirstSeqNo <= 0"),
        (lambda s: setattr(s, "first_seq_no", -1), "FirstSeqNo <= 0"),
        (lambda s: setattr(s, "first_offset", -1), "FirstOffset < 0"),
        (lambda s: setattr(s, "last_seq_no", 9), "LastSeqNo < segment.FirstSeqNo"),
        (lambda s: s.MergeFrom(rpb.Segment(first_offset=100, last_offset=99)), "LastOffset <="),
        (lambda s: setattr(s, "log", ""), "Log: invalid length"),
    ]
    for fn, message in cases:
        with pytest.raises(ValidationError, match=message):
            validate_segment(mutate(fn))
    # An unknown last_offset is fine.
    validate_segment(mutate(lambda s: setattr(s, "last_offset", 0)))


REDUCTIONS: list[tuple[str, rpb.Segment, rpb.Segment, rpb.Segment | type[Exception] | None]] = [
    (
        "overlap",
        seg(1, 2, 7, 200, 700, 0x22),
        seg(1, 4, 9, 400, 901, 0x44),
        seg(1, 2, 9, 200, 901, 0x22),
    ),
    (
        "overlap, first offsets out of order",
        seg(1, 2, 7, 200, 701, 0x22),
        seg(1, 4, 9, 100, 901, 0x44),
        NonMonotonicFirstOffset,
    ),
    (
        "overlap, last offsets out of order",
        seg(1, 2, 7, 200, 701, 0x22),
        seg(1, 4, 9, 400, 700, 0x44),
        NonMonotonicLastOffset,
    ),
    (
        "overlap, earlier segment without last offset",
        seg(1, 2, 7, 200, 0, 0x22),
        seg(1, 4, 9, 400, 901, 0x44),
        MissingLastOffset,
    ),
    (
        "overlap, other author",
        seg(1, 2, 7, 200, 701, 0x22),
        seg(2, 4, 9, 400, 901, 0x44),
        AuthorMismatch,
    ),
    (
        "overlap, other log",
        seg(1, 2, 7, 200, 701, 0x22),
        seg(1, 4, 9, 400, 901, 0x44, log=B),
        LogMismatch,
    ),
    (
        "covered",
        seg(1, 2, 7, 200, 701, 0x22),
        seg(1, 3, 6, 300, 0, 0x33),
        seg(1, 2, 7, 200, 701, 0x22),
    ),
    ("disjoint", seg(1, 2, 4, 200, 401, 0x22), seg(1, 6, 7, 600, 0, 0x66), None),
    (
        "same end: a known last offset wins",
        seg(1, 2, 7, 200, 701, 0x22),
        seg(1, 4, 7, 400, 0, 0x44),
        seg(1, 2, 7, 200, 701, 0x22),
    ),
    (
        "same end, different last offsets",
        seg(1, 2, 7, 200, 701, 0x22),
        seg(1, 4, 7, 400, 702, 0x44),
        NonMonotonicLastOffset,
    ),
    (
        "same start: the larger first offset (a lower bound) wins",
        seg(1, 2, 7, 200, 701, 0x22),
        seg(1, 2, 9, 210, 901, 0x22),
        seg(1, 2, 9, 210, 901, 0x22),
    ),
    (
        "same start, different checksums",
        seg(1, 2, 7, 200, 701, 0x22),
        seg(1, 2, 9, 210, 901, 0xBAD),
        FirstChecksumMismatch,
    ),
    (
        "identity",
        seg(1, 2, 7, 190, 701, 0x22),
        seg(1, 2, 7, 200, 0, 0x22),
        seg(1, 2, 7, 200, 701, 0x22),
    ),
    (
        "adjacent",
        seg(1, 2, 4, 200, 401, 0x22),
        seg(1, 5, 7, 500, 701, 0x55),
        seg(1, 2, 7, 200, 701, 0x22),
    ),
    ("adjacent, other author", seg(1, 2, 4, 200, 401, 0x22), seg(2, 5, 7, 500, 701, 0x55), None),
    (
        "adjacent, other log",
        seg(1, 2, 4, 200, 401, 0x22),
        seg(1, 5, 7, 500, 701, 0x55, log=B),
        None,
    ),
    (
        "adjacent, other log after an open segment",
        seg(1, 2, 4, 200, 0, 0x22),
        seg(1, 5, 7, 500, 0, 0x55, log=B),
        OpenSegmentLogChange,
    ),
]


@pytest.mark.parametrize(
    ("a", "b", "expect"), [r[1:] for r in REDUCTIONS], ids=[r[0] for r in REDUCTIONS]
)
def test_reduce_segments_is_symmetric(
    a: rpb.Segment, b: rpb.Segment, expect: rpb.Segment | type[Exception] | None
) -> None:
    for x, y in ((a, b), (b, a)):
        if isinstance(expect, type):
            with pytest.raises(expect):
                reduce_segments(x, y)
        else:
            assert reduce_segments(x, y) == expect


def add_shuffled(to: SegmentSet, segments: list[rpb.Segment], rnd: random.Random) -> SegmentSet:
    order = list(segments)
    rnd.shuffle(order)
    for s in order:
        to.add(s)
    return to


@given(st.randoms(use_true_random=False))
def test_set_of_its_own_segments_is_itself(rnd: random.Random) -> None:
    assert add_shuffled(SegmentSet(), list(model()), rnd) == model()


@given(st.randoms(use_true_random=False))
def test_set_interleaves_disjoint_segments(rnd: random.Random) -> None:
    got = add_shuffled(
        model(),
        [
            seg(0xF, 1, 4, 100, 401),
            seg(0xF, 12, 12, 1200, 1201),
            seg(0xF, 16, 18, 1600, 1801),
            seg(0xF, 19, 20, 20, 21, log=B),
        ],
        rnd,
    )
    assert got == [
        seg(0xF, 1, 4, 100, 401),
        seg(0xA, 5, 10, 500, 1001),
        seg(0xB, 11, 11, 1100, 1101),
        seg(0xF, 12, 12, 1200, 1201),
        seg(0xB, 13, 15, 1300, 1501),
        seg(0xF, 16, 18, 1600, 1801),
        seg(0xF, 19, 20, 20, 21, log=B),
    ]


@given(st.randoms(use_true_random=False))
def test_set_merges_overlapping_segments(rnd: random.Random) -> None:
    got = add_shuffled(
        model(),
        [
            seg(0xA, 1, 4, 100, 401),
            seg(0xB, 12, 12, 1200, 1201),
            seg(0xB, 16, 18, 1600, 0),
        ],
        rnd,
    )
    assert got == [seg(0xA, 1, 10, 100, 1001), seg(0xB, 11, 18, 1100, 0)]


@given(st.randoms(use_true_random=False))
def test_set_ignores_covered_segments(rnd: random.Random) -> None:
    got = add_shuffled(
        model(),
        [
            seg(0xA, 5, 9, 500),
            seg(0xA, 6, 10, 600),
            seg(0xB, 11, 11, 1100),
            seg(0xB, 13, 14, 1300),
            seg(0xB, 14, 15, 1400),
        ],
        rnd,
    )
    assert got == model()


@given(st.randoms(use_true_random=False))
def test_set_extends_by_single_ops(rnd: random.Random) -> None:
    got = add_shuffled(
        model(),
        [
            seg(0xB, 16, 16, 1600, 1601),
            seg(0xB, 17, 17, 1700, 1701),
            seg(0xB, 18, 18, 1800, 1801),
            seg(0xC, 19, 19, 1900, 0),
            seg(0xC, 20, 20, 2000, 0),
        ],
        rnd,
    )
    assert got == [
        seg(0xA, 5, 10, 500, 1001),
        seg(0xB, 11, 11, 1100, 1101),
        seg(0xB, 13, 18, 1300, 1801),
        seg(0xC, 19, 20, 1900, 0),
    ]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (seg(0xC, 4, 5, 400, 501), AuthorMismatch),
        (seg(0xA, 10, 11, 1000, 1101), AuthorMismatch),
        (seg(0xB, 10, 11, 1000, 1101), AuthorMismatch),
        (seg(0xC, 15, 15, 1500, 1501), AuthorMismatch),
        (seg(0xA, 4, 5, 400, 501, log="wrong"), LogMismatch),
        (seg(0xB, 12, 12, 1200, 0), MissingLastOffset),
        (seg(0xB, 12, 12, 1050, 1200), NonMonotonicFirstOffset),
        (seg(0xA, 3, 3, 300, 1050), NonMonotonicLastOffset),
        (seg(0, 3, 3, 300, 301), ValidationError),
    ],
)
def test_set_rejects_inconsistent_segments(bad: rpb.Segment, error: type[Exception]) -> None:
    s = model()
    with pytest.raises(error):
        s.add(bad)
    assert s == model()  # Unchanged.


def test_set_owns_copies() -> None:
    s = SegmentSet()
    x = seg(1, 1, 2, 0, 10)
    s.add(x)
    x.last_seq_no = 99
    assert s[0].last_seq_no == 2


@pytest.mark.parametrize(
    ("first", "last", "expect"),
    [
        (0, 100000, (0, 3)),
        (0, 500, (0, 0)),
        (0, 501, (0, 1)),
        (1000, 1001, (0, 1)),
        (1000, 1100, (0, 1)),
        (1000, 1101, (0, 2)),
        (1000, 1300, (0, 2)),
        (1000, 1301, (0, 3)),
        (1000, 100000, (0, 3)),
        (1001, 1001, (1, 1)),
        (1001, 1100, (1, 1)),
        (1001, 1101, (1, 2)),
        (1100, 1101, (1, 2)),
        (1101, 1101, (2, 2)),
        (1101, 1300, (2, 2)),
        (1101, 1301, (2, 3)),
        (1300, 1301, (2, 3)),
        (1300, 100000, (2, 3)),
        (1500, 100000, (2, 3)),
        (1501, 100000, (3, 3)),
        (10000, 100000, (3, 3)),
    ],
)
def test_intersect(first: int, last: int, expect: tuple[int, int]) -> None:
    m = model()
    assert m.intersect(A, first, last) == list(m)[expect[0] : expect[1]]


def test_intersect_with_open_suffix() -> None:
    s = SegmentSet([seg(1, 1, 4, 0, 400), seg(2, 5, 9, 400, 0)])
    assert s.intersect(A, 1000, 2000) == [s[1]]
    assert s.intersect(A, 0, 10) == [s[0]]


def test_intersect_misuse() -> None:
    with pytest.raises(ValueError, match="invalid range"):
        model().intersect(A, 10, 5)
    with pytest.raises(ValueError, match="is not"):
        model().intersect(B, 0, 5)


def test_flatten_hints() -> None:
    hints = rpb.FSMHints(
        log="other/log",
        live_nodes=[
            rpb.FnodeSegments(fnode=2, segments=[seg(1, 2, 7, 200, 700, 0x22)]),
            rpb.FnodeSegments(fnode=4, segments=[seg(1, 4, 9, 400, 901, 0x44)]),
            rpb.FnodeSegments(fnode=10, segments=[seg(2, 10, 10, 1000, 1001, 0x10, log="")]),
        ],
    )
    fnodes, flat = live_log_segments(hints)
    assert fnodes == [2, 4, 10]
    expect = [seg(1, 2, 9, 200, 901, 0x22), seg(2, 10, 10, 1000, 1001, 0x10, log="other/log")]
    assert flat == expect
    assert flatten_hints(hints) == expect
    assert hints.live_nodes[2].segments[0].log == ""  # Input untouched.

    # The last segment must be of the hinted log.
    hints.live_nodes[2].segments[0].log = "whoops"
    with pytest.raises(InvalidHints, match="to equal the last Segment Log whoops"):
        flatten_hints(hints)

    # Each Fnode's first segment begins at its creation.
    hints.live_nodes.append(rpb.FnodeSegments(fnode=13, segments=[rpb.Segment(first_seq_no=14)]))
    with pytest.raises(InvalidHints, match="expected Fnode to match Segment FirstSeqNo"):
        flatten_hints(hints)
    hints.live_nodes.append(rpb.FnodeSegments(fnode=15))
    with pytest.raises(InvalidHints, match="expected Fnode to match Segment FirstSeqNo"):
        flatten_hints(rpb.FSMHints(log=A, live_nodes=[hints.live_nodes[-1]]))

    # Segments must be consistent.
    hints.live_nodes[1].segments[0].author = 3
    with pytest.raises(InconsistentSegments):
        flatten_hints(hints)

    # Fnodes are strictly increasing.
    a, b = rpb.FnodeSegments(), rpb.FnodeSegments()
    a.CopyFrom(hints.live_nodes[0])
    b.CopyFrom(hints.live_nodes[1])
    del hints.live_nodes[:2]
    hints.live_nodes.insert(0, a)
    hints.live_nodes.insert(0, b)
    with pytest.raises(InvalidHints, match="expected monotonic Fnode ordering"):
        flatten_hints(hints)
