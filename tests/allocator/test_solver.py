"""The assignment solver: scenario tables, fixed points, and properties against a reference
maximum flow."""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gazette.allocator.model import Item, Member, MemberID
from gazette.allocator.solver import solve

Desired = dict[str, list[MemberID]]


def members(spec: str) -> list[Member]:
    """`"a/1:10 b/2:5!"` -> members a#1 (limit 10) and b#2 (limit 5, exiting)."""
    out = []
    for word in spec.split():
        exiting = word.endswith("!")
        name, limit = word.rstrip("!").split(":")
        zone, suffix = name.split("/")
        out.append(Member(MemberID(zone, suffix), int(limit), exiting))
    return out


def items(n: int, replication: int, prefix: str = "item") -> list[Item]:
    return [Item(f"{prefix}/{k:04d}", replication) for k in range(n)]


def loads(desired: Desired) -> Counter[MemberID]:
    return Counter(m for ms in desired.values() for m in ms)


def moves(before: Desired, after: Desired) -> int:
    """Replicas that are on a member now that they were not on before."""
    return sum(len(set(after[i]) - set(before.get(i, ()))) for i in after)


def zones_of(ms: Sequence[MemberID]) -> set[str]:
    return {m.zone for m in ms}


def check_valid(its: list[Item], ms: list[Member], desired: Desired) -> None:
    eligible = {m.id: m for m in ms if m.limit > 0 and not m.exiting}
    assert set(desired) == {i.id for i in its}
    for member, load in loads(desired).items():
        assert member in eligible, f"{member} is exiting, has limit 0 or is unknown"
        assert load <= eligible[member].limit, f"{member} over its limit"
    for item in its:
        got = desired[item.id]
        assert len(set(got)) == len(got), f"{item.id} has a member twice"
        assert len(got) <= min(item.replication, len(eligible))


def id_(m: str) -> MemberID:
    zone, suffix = m.split("/")
    return MemberID(zone, suffix)


# --- scenario tables ---------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """A cluster that converged on `before`, then changed to `after`."""

    name: str
    before: str
    after: str
    n_items: int
    replication: int
    moves: int  # replicas that land on a member they were not on
    after_load: tuple[int, int]  # min, max load of members with limit > 0, not exiting


CHANGES = [
    Change("scale up, new zone", "a/1:100 b/1:100 c/1:100", "+d/1:100", 60, 2, 30, (30, 30)),
    Change("scale up, same zone", "a/1:100 a/2:100 b/1:100", "+b/2:100", 40, 2, 20, (20, 20)),
    Change("scale up by two", "a/1:100 b/1:100", "+a/2:100 +b/2:100", 100, 2, 100, (50, 50)),
    # b#1 is left alone in zone b, so it takes b#2's replicas (every item keeps two zones).
    Change("scale down", "a/1:100 a/2:100 b/1:100 b/2:100", "-b/2", 60, 2, 30, (30, 60)),
    Change("exiting member", "a/1:100 a/2:100 b/1:100 b/2:100", "!a/2", 60, 2, 30, (30, 60)),
    # Load follows limits: 100:100:10 of 60 replicas is 28.6:28.6:2.9.
    Change("limit lowered", "a/1:100 b/1:100 c/1:100", "=c/1:10", 60, 1, 17, (3, 29)),
    Change("limit raised", "a/1:10 b/1:10 c/1:10", "=c/1:100", 30, 1, 15, (2, 25)),
]


def apply_change(before: list[Member], change: str) -> list[Member]:
    out = {m.id: m for m in before}
    for word in change.split():
        op, rest = word[0], word[1:]
        if op == "+":
            (m,) = members(rest)
            out[m.id] = m
        elif op == "-":
            del out[id_(rest)]
        elif op == "!":
            m = out[id_(rest)]
            out[m.id] = Member(m.id, m.limit, exiting=True)
        elif op == "=":
            (m,) = members(rest)
            out[m.id] = m
    return list(out.values())


@pytest.mark.parametrize("case", CHANGES, ids=lambda c: c.name)
def test_cluster_changes_move_only_what_balance_needs(case: Change) -> None:
    its = items(case.n_items, case.replication)
    ms = members(case.before)
    before = solve(its, ms, {})
    check_valid(its, ms, before)
    assert solve(its, ms, before) == before, "a solution solves to itself"

    ms2 = apply_change(ms, case.after)
    after = solve(its, ms2, before)
    check_valid(its, ms2, after)
    assert all(len(v) == case.replication for v in after.values())
    assert moves(before, after) == case.moves
    eligible = [m.id for m in ms2 if m.limit > 0 and not m.exiting]
    counts = loads(after)
    lo, hi = case.after_load
    assert lo <= min(counts[m] for m in eligible) and max(counts[m] for m in eligible) <= hi
    assert solve(its, ms2, after) == after, "and the new one too"


@dataclass(frozen=True)
class Shape:
    """A cluster solved from scratch, and what its solution must look like."""

    name: str
    members: str
    n_items: int
    replication: int
    per_item: int  # replicas each item gets
    zones_per_item: int  # at least
    load: tuple[int, int] = (0, 1 << 30)  # min, max load of eligible members


SHAPES = [
    Shape("R=2 over two zones", "a/1:50 a/2:50 b/1:50", 30, 2, 2, 2, (15, 30)),
    Shape("R=3 over two zones", "a/1:50 a/2:50 b/1:50 b/2:50", 20, 3, 3, 2, (15, 15)),
    Shape("R=3 over three zones", "a/1:50 b/1:50 c/1:50", 20, 3, 3, 3, (20, 20)),
    Shape("one zone only", "a/1:50 a/2:50 a/3:50", 30, 2, 2, 1, (20, 20)),
    Shape("more replicas than members", "a/1:50 b/1:50", 10, 3, 2, 2, (10, 10)),
    Shape("limits proportional", "a/1:10 a/2:20 b/1:30", 30, 1, 1, 1, (5, 15)),
    Shape("limit 0 gets nothing", "a/1:0 a/2:50 b/1:50", 20, 2, 2, 2, (20, 20)),
    Shape("exiting gets nothing", "a/1:50! a/2:50 b/1:50", 20, 2, 2, 2, (20, 20)),
    Shape("nobody to assign", "a/1:0 b/1:5!", 5, 2, 0, 0),
    Shape("replication 0", "a/1:5 b/1:5", 5, 0, 0, 0),
]


@pytest.mark.parametrize("case", SHAPES, ids=lambda c: c.name)
def test_shapes(case: Shape) -> None:
    its = items(case.n_items, case.replication)
    ms = members(case.members)
    desired = solve(its, ms, {})
    check_valid(its, ms, desired)
    for item_id, got in desired.items():
        assert len(got) == case.per_item, item_id
        assert len(zones_of(got)) >= case.zones_per_item, (item_id, got)
    counts = loads(desired)
    eligible = [m.id for m in ms if m.limit > 0 and not m.exiting]
    if eligible and case.per_item:
        lo, hi = case.load
        assert lo <= min(counts[m] for m in eligible) and max(counts[m] for m in eligible) <= hi
    if case.name == "limits proportional":
        assert [counts[id_(m)] for m in ("a/1", "a/2", "b/1")] == [5, 10, 15]


def test_insufficient_capacity_never_exceeds_limits() -> None:
    its = items(20, 2)
    ms = members("a/1:5 a/2:5 b/1:6")
    desired = solve(its, ms, {})
    check_valid(its, ms, desired)
    assert sum(len(v) for v in desired.values()) == 16, "every slot is used"
    assert all(loads(desired)[m.id] == m.limit for m in ms)


def test_zone_spread_gives_way_to_replication() -> None:
    # Zone b can hold only 4 replicas: 4 items span both zones, the other 6 are
    # replicated twice within zone a rather than once.
    its = items(10, 2)
    ms = members("a/1:10 a/2:10 b/1:4")
    desired = solve(its, ms, {})
    check_valid(its, ms, desired)
    assert all(len(v) == 2 for v in desired.values())
    assert sum(1 for v in desired.values() if zones_of(v) == {"a", "b"}) == 4


def test_an_item_gives_up_its_second_zone_for_another_items_replication() -> None:
    # i1 needs all three members; the only zone-a member can hold one replica, so i0 must
    # put both of its replicas in zone b for the total to be maximal.
    its = [Item("i0", 2), Item("i1", 3)]
    ms = members("a/m0:1 b/m1:2 b/m2:2")
    desired = solve(its, ms, {})
    check_valid(its, ms, desired)
    assert sorted(map(str, desired["i1"])) == ["a#m0", "b#m1", "b#m2"]
    assert zones_of(desired["i0"]) == {"b"} and len(desired["i0"]) == 2


def test_current_assignments_are_kept_in_order() -> None:
    its = items(3, 2)
    ms = members("a/1:10 a/2:10 b/1:10 b/2:10")
    current = {
        "item/0000": [id_("b/2"), id_("a/1")],
        "item/0001": [id_("a/2"), id_("gone/x"), id_("b/1")],  # unknown members are ignored
        "item/0002": [id_("a/1"), id_("a/2")],  # same zone: one replica moves to zone b
    }
    desired = solve(its, ms, current)
    assert desired["item/0000"] == [id_("b/2"), id_("a/1")], "the primary stays first"
    assert desired["item/0001"] == [id_("a/2"), id_("b/1")]
    assert desired["item/0002"][0] == id_("a/1") and zones_of(desired["item/0002"]) == {"a", "b"}


def test_deterministic_regardless_of_input_order() -> None:
    its = items(200, 3)
    ms = members("a/1:90 a/2:90 b/1:90 b/2:60 c/1:90 c/2:30")
    rng = random.Random(7)
    current = {i.id: rng.sample([m.id for m in ms], rng.randint(0, 3)) for i in its}
    first = solve(its, ms, current)
    for _ in range(3):
        its2, ms2 = its[:], ms[:]
        rng.shuffle(its2)
        rng.shuffle(ms2)
        assert solve(its2, ms2, dict(reversed(current.items()))) == first


def test_stable_solutions_from_arbitrary_current() -> None:
    rng = random.Random(11)
    for _ in range(20):
        ms = members(
            " ".join(
                f"{rng.choice('abc')}/{k}:{rng.randint(0, 12)}" for k in range(rng.randint(1, 8))
            )
        )
        its = [Item(f"i{k}", rng.randint(0, 4)) for k in range(rng.randint(0, 30))]
        current = {i.id: rng.sample([m.id for m in ms], rng.randint(0, len(ms))) for i in its}
        desired = solve(its, ms, current)
        assert solve(its, ms, desired) == desired


# --- properties ----------------------------------------------------------------------------


def reference_max_flow(its: Sequence[Item], ms: Sequence[Member]) -> int:
    """Most replicas placeable ignoring zones: Edmonds-Karp on the bipartite network."""
    eligible = [m for m in ms if m.limit > 0 and not m.exiting]
    source, sink = 0, 1
    item_node = {i.id: 2 + n for n, i in enumerate(its)}
    member_node = {m.id: 2 + len(its) + n for n, m in enumerate(eligible)}
    cap: Counter[tuple[int, int]] = Counter()
    adj: dict[int, set[int]] = {}

    def arc(u: int, v: int, c: int) -> None:
        cap[(u, v)] += c
        adj.setdefault(u, set()).add(v)
        adj.setdefault(v, set()).add(u)

    for i in its:
        arc(source, item_node[i.id], max(i.replication, 0))
        for m in eligible:
            arc(item_node[i.id], member_node[m.id], 1)
    for m in eligible:
        arc(member_node[m.id], sink, m.limit)
    flow = 0
    while True:
        parent = {source: source}
        queue = deque([source])
        while queue and sink not in parent:
            u = queue.popleft()
            for v in sorted(adj.get(u, ())):
                if v not in parent and cap[(u, v)] > 0:
                    parent[v] = u
                    queue.append(v)
        if sink not in parent:
            return flow
        v = sink
        while v != source:
            u = parent[v]
            cap[(u, v)] -= 1
            cap[(v, u)] += 1
            v = u
        flow += 1


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Item], list[Member], dict[str, list[MemberID]]]:
    specs = draw(
        st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 6), st.booleans()), max_size=8)
    )
    ms = [
        Member(MemberID(zone, f"m{k}"), limit, exiting and k % 3 == 0)
        for k, (zone, limit, exiting) in enumerate(specs)
    ]
    its = [Item(f"i{k}", r) for k, r in enumerate(draw(st.lists(st.integers(0, 4), max_size=12)))]
    ids = [m.id for m in ms] + [MemberID("x", "gone")]
    current = {i.id: draw(st.lists(st.sampled_from(ids), max_size=4, unique=True)) for i in its}
    return its, ms, current


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(clusters())
def test_properties(
    cluster: tuple[list[Item], list[Member], Mapping[str, list[MemberID]]],
) -> None:
    its, ms, current = cluster
    desired = solve(its, ms, current)
    check_valid(its, ms, desired)
    eligible = [m for m in ms if m.limit > 0 and not m.exiting]
    counts = loads(desired)
    full = {m.id for m in eligible if counts[m.id] >= m.limit}

    # As many replicas as any assignment could place, ignoring zones.
    assert sum(counts.values()) == reference_max_flow(its, ms)
    for item in its:
        got = desired[item.id]
        if len(got) < min(item.replication, len(eligible)):
            # Short only where every member that could take it is full.
            assert all(m.id in got or m.id in full for m in eligible), item.id
        if len(got) >= 2 and len(zones_of(got)) == 1:
            # All in one zone only if no other zone has room.
            (zone,) = zones_of(got)
            assert all(m.id in full for m in eligible if m.id.zone != zone), item.id

    assert solve(its, ms, desired) == desired, "a solution is a fixed point"


# --- scale -----------------------------------------------------------------------------------


def test_ten_thousand_items_over_a_hundred_members() -> None:
    """Measured, not asserted: printed with `pytest -s`."""
    its = items(10_000, 3, prefix="journal")
    ms = [Member(MemberID(f"zone-{k % 3}", f"m{k:03d}"), 1000) for k in range(100)]
    timing: dict[str, float] = {}

    start = time.perf_counter()
    desired = solve(its, ms, {})
    timing["from scratch"] = time.perf_counter() - start

    start = time.perf_counter()
    again = solve(its, ms, desired)
    timing["stable"] = time.perf_counter() - start
    assert again == desired

    grown = [*ms, Member(MemberID("zone-0", "new"), 1000)]
    start = time.perf_counter()
    after = solve(its, grown, desired)
    timing["one member added"] = time.perf_counter() - start

    counts = loads(after)
    assert moves(desired, after) == counts[MemberID("zone-0", "new")] == 297
    assert max(counts.values()) - min(counts.values()) <= 1
    print(
        "\nsolve 10k items x 100 members, R=3, 3 zones: "
        + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in timing.items())
    )
