"""CoverSet: table tests of add/find/difference semantics, and scale."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from gazette.broker.fragment.coverset import CoverSet, FragmentEntry
from gazette.broker.protocol import protocol_pb2 as pb

Span = tuple[int, int]


def entry(begin: int, end: int, journal: str = "a/journal", sum_: int = 0) -> FragmentEntry:
    spec = pb.Fragment(journal=journal, begin=begin, end=end, compression_codec=pb.NONE)
    spec.sum.part3 = sum_
    return FragmentEntry(spec=spec)


def spans(s: CoverSet) -> list[Span]:
    return [(e.begin, e.end) for e in s]


# Each case: fragments added in order with the expected result of each add, then the set.
ADD_CASES: list[tuple[str, list[tuple[int, int, bool]], list[Span]]] = [
    (
        "insert at end",
        [(100, 200, True), (200, 300, True), (201, 301, True)],
        [(100, 200), (200, 300), (201, 301)],
    ),
    (
        "replace range at end",
        [(100, 200, True), (200, 300, True), (300, 400, True), (400, 500, True), (150, 500, True)],
        [(100, 200), (150, 500)],
    ),
    (
        "replace one at end, earlier begin",
        [(100, 200, True), (200, 300, True), (199, 300, True)],
        [(100, 200), (199, 300)],
    ),
    (
        "replace one at end, later end",
        [(100, 200, True), (200, 300, True), (200, 301, True)],
        [(100, 200), (200, 301)],
    ),
    (
        "replace range in middle",
        [(100, 200, True), (200, 300, True), (300, 400, True), (400, 500, True), (150, 450, True)],
        [(100, 200), (150, 450), (400, 500)],
    ),
    (
        "replace one in middle",
        [(100, 200, True), (200, 300, True), (300, 400, True), (150, 350, True)],
        [(100, 200), (150, 350), (300, 400)],
    ),
    (
        "insert in middle, exact boundaries",
        [(100, 200, True), (300, 400, True), (200, 300, True)],
        [(100, 200), (200, 300), (300, 400)],
    ),
    (
        "insert in middle, gaps",
        [(100, 200, True), (300, 400, True), (201, 299, True)],
        [(100, 200), (201, 299), (300, 400)],
    ),
    (
        "replace range at beginning",
        [(100, 200, True), (200, 300, True), (300, 400, True), (100, 300, True)],
        [(100, 300), (300, 400)],
    ),
    (
        "replace one at beginning",
        [(100, 200, True), (200, 300, True), (300, 400, True), (99, 200, True)],
        [(99, 200), (200, 300), (300, 400)],
    ),
    (
        "insert at beginning",
        [(200, 300, True), (300, 400, True), (199, 200, True)],
        [(199, 200), (200, 300), (300, 400)],
    ),
    (
        "overlapping ranges",
        [
            (100, 150, True),
            (149, 201, True),
            (200, 250, True),
            (250, 300, True),
            (299, 351, True),
            (350, 400, True),
            (200, 300, True),
            (300, 400, True),
            (100, 200, True),
        ],
        [(100, 200), (149, 201), (200, 300), (299, 351), (300, 400)],
    ),
    (
        "covered and equal ranges are no-ops",
        [
            (100, 200, True),
            (200, 300, True),
            (300, 400, True),
            (101, 200, False),
            (100, 199, False),
            (100, 200, False),
            (201, 300, False),
            (200, 299, False),
            (200, 300, False),
            (301, 400, False),
            (300, 400, False),
            (150, 160, False),
        ],
        [(100, 200), (200, 300), (300, 400)],
    ),
    (
        "covered by a partially overlapping neighbour",
        [(0, 10, True), (5, 15, True), (8, 12, False), (6, 15, False), (5, 14, False)],
        [(0, 10), (5, 15)],
    ),
    (
        "empty fragments are ignored",
        [(100, 200, True), (150, 150, False), (300, 300, False)],
        [(100, 200)],
    ),
    (
        "multiple overlaps (upstream regression)",
        [
            (0, 0x400A8D41, True),
            (0x400A8D41, 0x595722D7, True),
            (0x400A8D41, 0x7A3FB5EE, True),
            (0x400A8D41, 0x7AF92E59, True),
            (0x595722D7, 0x7AF92FB4, True),
            (0x7A3FB5EE, 0x7AF92FB4, False),
            (0x7AF92E59, 0x7AF92E59, False),
        ],
        [(0, 0x400A8D41), (0x400A8D41, 0x7AF92E59), (0x595722D7, 0x7AF92FB4)],
    ),
]


@pytest.mark.parametrize(
    ("steps", "want"), [c[1:] for c in ADD_CASES], ids=[c[0] for c in ADD_CASES]
)
def test_add(steps: list[tuple[int, int, bool]], want: list[Span]) -> None:
    s = CoverSet()
    for begin, end, added in steps:
        assert s.add(entry(begin, end)) is added, (begin, end)
    assert spans(s) == want
    assert len(s) == len(want)


def test_add_rejects_other_journal() -> None:
    s = CoverSet([entry(0, 10)])
    with pytest.raises(ValueError, match="journal mismatch"):
        s.add(entry(10, 20, journal="other/journal"))


def test_offsets() -> None:
    s = CoverSet()
    assert (s.begin_offset(), s.end_offset()) == (0, 0)
    s.add(entry(100, 150))
    assert (s.begin_offset(), s.end_offset()) == (100, 150)
    s.add(entry(140, 250))
    assert (s.begin_offset(), s.end_offset()) == (100, 250)
    s.add(entry(50, 100))
    assert (s.begin_offset(), s.end_offset()) == (50, 250)


FIND_SET = [(100, 200), (149, 201), (200, 300), (299, 351), (300, 400), (500, 600)]
FIND_CASES: list[tuple[int, Span | None, bool]] = [
    (0, (100, 200), False),  # Offset jump to the first fragment.
    (100, (100, 200), True),
    (148, (100, 200), True),
    (149, (149, 201), True),  # Both cover 149; (149, 201) extends further.
    (199, (149, 201), True),
    (200, (200, 300), True),
    (298, (200, 300), True),
    (299, (299, 351), True),
    (300, (300, 400), True),
    (350, (300, 400), True),
    (399, (300, 400), True),
    (400, (500, 600), False),  # Gap: jump ahead.
    (499, (500, 600), False),
    (500, (500, 600), True),
    (599, (500, 600), True),
    (600, None, False),  # Beyond the end.
    (10**12, None, False),
]


@pytest.mark.parametrize(("offset", "want", "found"), FIND_CASES)
def test_find(offset: int, want: Span | None, found: bool) -> None:
    s = CoverSet(entry(b, e) for b, e in FIND_SET)
    got, ok = s.find(offset)
    assert ok is found
    assert (None if got is None else (got.begin, got.end)) == want


def test_find_empty() -> None:
    assert CoverSet().find(0) == (None, False)


def test_difference() -> None:
    b = CoverSet(
        entry(x, y) for x, y in [(100, 200), (150, 225), (225, 250), (250, 300), (301, 400)]
    )
    a = CoverSet()
    for x, y in [
        (99, 105),  # Begins before b's first fragment.
        (100, 110),  # Covered by one fragment of b.
        (110, 120),
        (130, 210),  # Covered by two of b's fragments.
        (150, 225),  # Exactly matched.
        (151, 300),  # Covered by three.
        (152, 301),  # Not covered: b has a one-byte gap at 300.
        (300, 350),  # Not covered, same gap.
        (301, 360),  # Covered.
        (360, 401),  # Extends past b.
        (400, 450),  # Outside b.
    ]:
        assert a.add(entry(x, y))
    got = [(e.begin, e.end) for e in a.difference(b)]
    assert got == [(99, 105), (152, 301), (300, 350), (360, 401), (400, 450)]


def test_replace_and_remove() -> None:
    s = CoverSet([entry(0, 10, sum_=1), entry(10, 20, sum_=2)])
    persisted = pb.Fragment()
    persisted.CopyFrom(s[0].spec)
    persisted.backing_store = "file:///store/"
    s.replace(FragmentEntry(spec=persisted, local_path=None))
    assert s[0].spec.backing_store == "file:///store/"
    assert spans(s) == [(0, 10), (10, 20)]

    with pytest.raises(KeyError):
        s.replace(entry(0, 10, sum_=99))  # Same range, different content.
    with pytest.raises(KeyError):
        s.replace(entry(0, 11, sum_=1))

    s.remove(entry(0, 10))
    assert spans(s) == [(10, 20)]
    with pytest.raises(KeyError):
        s.remove(entry(0, 10))


def test_entry_is_frozen_and_keeps_local_path() -> None:
    e = FragmentEntry(spec=pb.Fragment(journal="a/j", begin=5, end=9), local_path=Path("/x"))
    assert (e.begin, e.end, e.content_length, e.local_path) == (5, 9, 4, Path("/x"))
    with pytest.raises(AttributeError):
        e.local_path = None  # type: ignore[misc]


def test_union() -> None:
    a = CoverSet([entry(0, 10), entry(10, 20)])
    b = CoverSet([entry(5, 20), entry(20, 30)])
    u = a.union(b)
    assert spans(u) == [(0, 10), (5, 20), (20, 30)]
    assert spans(a) == [(0, 10), (10, 20)]  # Unchanged.


def _check_invariants(s: CoverSet) -> None:
    es = list(s)
    for x, y in zip(es, es[1:], strict=False):
        assert x.begin < y.begin and x.end < y.end


def test_random_against_model() -> None:
    rng = random.Random(42)
    for _ in range(200):
        s = CoverSet()
        added: list[Span] = []
        for _ in range(30):
            b = rng.randrange(0, 100)
            e = b + rng.randrange(1, 30)
            covered = any(x <= b and e <= y for x, y in spans(s))
            assert s.add(entry(b, e)) is (not covered)
            added.append((b, e))
            _check_invariants(s)
        # Every offset covered by something added is covered by the set.
        for off in range(0, 130):
            want = any(x <= off < y for x, y in added)
            got, found = s.find(off)
            assert found is want
            if found:
                assert got is not None
                best = max(y for x, y in spans(s) if x <= off < y)
                assert got.end == best


def test_scale_thousands_of_fragments() -> None:
    n = 20_000
    t0 = time.perf_counter()
    s = CoverSet()
    order = list(range(n))
    random.Random(1).shuffle(order)
    for i in order:
        s.add(entry(i * 100, (i + 1) * 100))
    for i in range(0, n * 100, 37):
        got, found = s.find(i)
        assert found and got is not None and got.begin <= i < got.end
    assert len(s) == n
    assert time.perf_counter() - t0 < 5.0
