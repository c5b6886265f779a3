"""The Allocator, its convergence rules and MemberSession: pure planning tests, then
clusters of members against a real etcd, each with an Allocator and a fake member side
that writes assignment values the way brokers (routes) or consumers (statuses) do."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from gazette.allocator.allocator import (
    Allocator,
    Change,
    batch_changes,
    plan_changes,
    wait_until_no_assignments,
)
from gazette.allocator.model import (
    Assignment,
    Item,
    Member,
    MemberID,
    State,
    assignment_key,
    item_key,
    member_key,
    parse_assignment_key,
)
from gazette.allocator.session import LeaseLostError, MemberExistsError, MemberSession
from gazette.keyspace.etcd import Compare, Etcd, EtcdError, op_put
from gazette.keyspace.keyspace import KeySpace
from gazette.testing.etcd import EtcdServer

ROOT = "/r"

# --- consistency, the two flavours ----------------------------------------------------------


def route_of(assignments: Sequence[Assignment]) -> bytes:
    """A canonical encoding of an item's assignment set, as a broker's Route."""
    return ",".join(sorted(f"{a.member}#{a.slot}" for a in assignments)).encode()


def route_consistent(item: Item, a: Assignment, all_: list[Assignment]) -> bool:
    return bool(a.value == route_of(all_))


def status_consistent(item: Item, a: Assignment, all_: list[Assignment]) -> bool:
    return a.value in (b"standby", b"primary")


# --- pure planning ---------------------------------------------------------------------------


def mid(text: str) -> MemberID:
    return MemberID.parse(text)


def member(text: str, limit: int = 10, *, lease: int = 0, exiting: bool = False) -> Member:
    m = mid(text)
    return Member(m, limit, exiting, member_key(ROOT, m), 1, 1, lease or hash(text) & 0xFFFF)


def asn(item: str, who: str, slot: int, value: bytes = b"", rev: int = 5) -> Assignment:
    m = mid(who)
    key = assignment_key(ROOT, item, m, slot)
    return Assignment(item, m, slot, key, rev, rev, hash(who) & 0xFFFF, value, value)


def item(name: str, replication: int) -> Item:
    return Item(name, replication, item_key(ROOT, name), 3)


def plan(
    items: list[Item],
    members: list[Member],
    assignments: list[Assignment],
    desired: dict[str, list[str]],
    consistent: Callable[[Item, Assignment, list[Assignment]], bool] = status_consistent,
    is_failed: Callable[[Assignment], bool] | None = None,
) -> list[Change]:
    state = State.build(items, members, assignments, revision=10)
    want = {k: [mid(m) for m in v] for k, v in desired.items()}
    return plan_changes(state, want, ROOT, consistent, is_failed=is_failed)


def summary(changes: list[Change]) -> list[tuple[str, list[str], list[str]]]:
    """(kind, deleted keys, put keys) with the root stripped."""
    strip = len(ROOT) + len("/assign/")
    return [
        (c.kind, [k[strip:] for k in c.deletes], [k[strip:] for k, _, _ in c.puts]) for c in changes
    ]


MEMBERS = [member("a#1"), member("a#2"), member("b#1"), member("b#2")]


def test_plan_new_item_adds_replicas_then_promotes_one() -> None:
    changes = plan([item("j", 2)], MEMBERS, [], {"j": ["a#1", "b#1"]})
    assert summary(changes) == [("add", [], ["j#a#1#1"]), ("add", [], ["j#b#1#2"])]
    (_, value, lease) = changes[0].puts[0]
    assert value == b"" and lease == MEMBERS[0].lease, "empty, under the member's lease"
    assert Compare(changes[0].puts[0][0].encode(), "create", 0) in changes[0].compares

    # Next round: nothing is consistent yet, and nobody is primary: promote anyway.
    changes = plan(
        [item("j", 2)], MEMBERS, [asn("j", "a#1", 1), asn("j", "b#1", 2)], {"j": ["a#1", "b#1"]}
    )
    assert summary(changes) == [("promote", ["j#a#1#1"], ["j#a#1#0"])]


def test_plan_promotes_a_failed_replica_only_if_every_one_failed() -> None:
    """No replica is consistent and none is primary: the best live one is promoted anyway,
    but a failed one (it would stay failed as primary) only when all have failed."""
    failed = lambda a: a.value == b"failed"  # noqa: E731
    current = [asn("j", "a#1", 1, b"failed"), asn("j", "b#1", 2, b"backfill")]
    changes = plan([item("j", 2)], MEMBERS, current, {"j": ["a#1", "b#1"]}, is_failed=failed)
    assert summary(changes) == [("promote", ["j#b#1#2"], ["j#b#1#0"])]
    # Without is_failed, the lower slot wins.
    changes = plan([item("j", 2)], MEMBERS, current, {"j": ["a#1", "b#1"]})
    assert summary(changes) == [("promote", ["j#a#1#1"], ["j#a#1#0"])]
    current = [asn("j", "a#1", 1, b"failed"), asn("j", "b#1", 2, b"failed")]
    changes = plan([item("j", 2)], MEMBERS, current, {"j": ["a#1", "b#1"]}, is_failed=failed)
    assert summary(changes) == [("promote", ["j#a#1#1"], ["j#a#1#0"])]


def test_plan_lost_primary_promotes_a_consistent_desired_replica() -> None:
    current = [asn("j", "a#2", 1, b""), asn("j", "b#1", 2, b"standby"), asn("j", "b#2", 3)]
    changes = plan([item("j", 3)], MEMBERS, current, {"j": ["a#2", "b#1", "a#1"]})
    assert summary(changes) == [
        ("add", [], ["j#a#1#4"]),
        ("promote", ["j#b#1#2"], ["j#b#1#0"]),
    ]
    promote = changes[1]
    assert promote.puts[0][1] == b"standby", "the value moves with the replica"


def test_plan_moves_an_undesired_primary_only_to_a_consistent_desired_replica() -> None:
    current = [asn("j", "a#1", 0, b"primary"), asn("j", "b#1", 1, b"standby"), asn("j", "b#2", 2)]
    desired = {"j": ["b#1", "b#2"]}  # a#1 is exiting
    changes = plan([item("j", 2)], MEMBERS, current, desired)
    assert summary(changes) == [("promote", ["j#b#1#1", "j#a#1#0"], ["j#b#1#0", "j#a#1#3"])]
    assert changes[0].puts[1][1] == b"primary", "the old primary keeps its value as a replica"

    # Only the new replica is desired and it is not consistent yet: the primary stays put.
    current = [asn("j", "a#1", 0, b"primary"), asn("j", "b#2", 1, b"")]
    assert plan([item("j", 1)], MEMBERS, current, {"j": ["b#2"]}) == []


def test_plan_removal_waits_for_enough_consistent_replicas() -> None:
    its = [item("j", 2)]
    desired = {"j": ["a#1", "b#2"]}
    waiting = [
        asn("j", "a#1", 0, b"primary"),
        asn("j", "b#1", 1, b"standby"),  # undesired, but needed until b#2 catches up
        asn("j", "b#2", 2, b""),
    ]
    assert plan(its, MEMBERS, waiting, desired) == []

    caught_up = [*waiting[:2], asn("j", "b#2", 2, b"standby")]
    changes = plan(its, MEMBERS, caught_up, desired)
    assert summary(changes) == [("remove", ["j#b#1#1"], [])]
    guarded = {c.key.decode()[len(ROOT) :] for c in changes[0].compares}
    assert guarded == {"/items/j", "/assign/j#b#1#1", "/assign/j#a#1#0", "/assign/j#b#2#2"}


def test_plan_removes_inconsistent_undesired_replicas_at_once() -> None:
    current = [asn("j", "a#1", 0, b"primary"), asn("j", "b#1", 1, b"standby"), asn("j", "b#2", 2)]
    changes = plan([item("j", 2)], MEMBERS, current, {"j": ["a#1", "b#1"]})
    assert summary(changes) == [("remove", ["j#b#2#2"], [])]


def test_plan_cleans_up_deleted_items_and_departed_members() -> None:
    current = [
        asn("gone", "a#1", 0, b"primary"),
        asn("j", "a#1", 0, b"primary"),
        asn("j", "c#9", 1, b"standby"),  # no member key: not live, removed
    ]
    changes = plan([item("j", 1)], MEMBERS, current, {"j": ["a#1"]})
    assert summary(changes) == [("remove", ["gone#a#1#0"], []), ("remove", ["j#c#9#1"], [])]
    assert Compare(item_key(ROOT, "gone").encode(), "create", 0) in changes[0].compares


def test_plan_respects_member_limits_during_moves() -> None:
    full = [member("a#1", limit=1), member("b#1")]
    current = [asn("x", "a#1", 0, b"primary"), asn("y", "b#1", 0, b"primary")]
    # The solver moved x away from a#1 to make room for y there: y waits for x to go.
    changes = plan([item("x", 1), item("y", 2)], full, current, {"x": ["b#1"], "y": ["b#1", "a#1"]})
    assert [c.kind for c in changes] == ["add"]
    assert summary(changes)[0][2] == ["x#b#1#1"]


def test_batches_fit_the_txn_limit() -> None:
    roomy = [member("a#1", limit=100), member("b#1", limit=100)]
    names = [f"j{n:03d}" for n in range(100)]
    changes = plan([item(n, 2) for n in names], roomy, [], {n: ["a#1", "b#1"] for n in names})
    assert len(changes) == 200
    leader = Compare(b"leader", "create", 1)
    txns = batch_changes(changes, leader, 128)
    assert len(txns) > 1
    for txn in txns:
        assert txn.compares[0] == leader
        assert len(txn.ops()) <= 128 and len(txn.compares) <= 128
    assert sum(len(t.changes) for t in txns) == 200


# --- a cluster against real etcd ------------------------------------------------------------


def decode(key: str, raw: bytes) -> Any:
    if "/items/" in key:
        return int(raw)
    if "/members/" in key:
        return json.loads(raw)
    return bytes(raw)


def spec(limit: int, exiting: bool = False) -> bytes:
    return json.dumps({"limit": limit, "exiting": exiting}).encode()


class RecordingEtcd(Etcd):
    """Records the size of every transaction."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        self.txn_sizes: list[int] = []

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Any], failure: Sequence[Any] = ()
    ) -> Any:
        self.txn_sizes.append(len(success))
        return await super().txn(compare, success, failure)


def new_state(ks: KeySpace, root: str) -> State:
    return State.from_keyspace(
        ks,
        root,
        item_replication=lambda v: int(v),
        member_limit=lambda v: int(v["limit"]),
        member_exiting=lambda v: bool(v["exiting"]),
    )


class Node:
    """One member: session, keyspace mirror, allocator and fake member side."""

    def __init__(
        self,
        cluster: Cluster,
        name: str,
        limit: int,
        ttl: int,
    ) -> None:
        self.cluster = cluster
        self.id = MemberID.parse(name)
        self.limit = limit
        self.session = MemberSession(cluster.etcd, member_key(cluster.root, self.id), ttl)
        self.keyspace = KeySpace(cluster.root + "/", decode)
        self.allocator = Allocator(
            cluster.etcd,
            self.keyspace,
            cluster.root,
            self.id,
            item_replication=lambda v: int(v),
            member_limit=lambda v: int(v["limit"]),
            member_exiting=lambda v: bool(v["exiting"]),
            is_consistent=cluster.consistent,
        )
        self.tasks: list[asyncio.Task[None]] = []
        self.first_seen: dict[str, float] = {}

    async def start(self) -> None:
        await self.session.announce(spec(self.limit))
        await self.keyspace.load(self.cluster.etcd)
        for coro in (
            self.keyspace.watch(self.cluster.etcd),
            self.session.keep_alive(),
            self.allocator.serve(),
            self.member_side(),
        ):
            self.tasks.append(asyncio.create_task(coro))

    async def stop(self, *, release: bool = True) -> None:
        """Stop every task; with release=False the lease is left to expire (a crash)."""
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, LeaseLostError):
                await task
        self.tasks.clear()
        if release:
            await self.session.release()

    async def member_side(self) -> None:
        """Write our assignments' values, as brokers or consumers would (in batches, like
        a member reacting to a keyspace update; a batch whose guards fail is retried)."""
        while True:
            revision = self.keyspace.revision
            state = new_state(self.keyspace, self.cluster.root)
            writes = []
            for a in state.member_assignments(self.id):
                value = self.cluster.value_for(self, a, state.assignments.get(a.item, []))
                if value is not None and value != a.value:
                    writes.append((a, value))
            for n in range(0, len(writes), 50):
                batch = writes[n : n + 50]
                with contextlib.suppress(EtcdError):
                    await self.cluster.etcd.txn(
                        [Compare(a.key.encode(), "mod", a.mod_revision) for a, _ in batch],
                        [op_put(a.key.encode(), value, a.lease) for a, value in batch],
                    )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await self.keyspace.wait_for_change(revision)


class Cluster:
    """Members under a fresh root of the shared etcd, with an observing keyspace."""

    def __init__(self, etcd: RecordingEtcd, flavour: str = "route", delay: float = 0.0) -> None:
        self.etcd = etcd
        self.root = f"/allocator-test/{uuid.uuid4().hex[:12]}"
        self.flavour = flavour
        self.delay = delay
        self.consistent = route_consistent if flavour == "route" else status_consistent
        self.nodes: dict[MemberID, Node] = {}
        self.observer = KeySpace(self.root + "/", decode)
        self._watch: asyncio.Task[None] | None = None

    def value_for(self, node: Node, a: Assignment, all_: list[Assignment]) -> bytes | None:
        if self.flavour == "route":
            return route_of(all_)
        # Consumer-like: a new replica needs `delay` to recover before it is a standby.
        now = asyncio.get_running_loop().time()
        if a.value == b"":
            if now - node.first_seen.setdefault(a.key, now) < self.delay:
                return None
            return b"primary" if a.slot == 0 else b"standby"
        return b"primary" if a.slot == 0 else b"standby"

    async def __aenter__(self) -> Cluster:
        await self.observer.load(self.etcd)
        self._watch = asyncio.create_task(self.observer.watch(self.etcd))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for node in list(self.nodes.values()):
            await node.stop()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.etcd.delete(self.root.encode() + b"/", prefix=True)

    async def add(self, name: str, limit: int = 10, ttl: int = 5) -> Node:
        node = Node(self, name, limit, ttl)
        await node.start()
        self.nodes[node.id] = node
        return node

    async def put_items(self, replication: dict[str, int]) -> None:
        names = list(replication)
        for n in range(0, len(names), 100):
            ops = [
                op_put(item_key(self.root, k).encode(), str(replication[k]).encode())
                for k in names[n : n + 100]
            ]
            resp = await self.etcd.txn([], ops)
            await self.observer.wait_for_revision(int(resp.header.revision), timeout=5)

    def state(self) -> State:
        return new_state(self.observer, self.root)

    async def until(self, predicate: Callable[[State], bool], timeout: float = 15.0) -> State:
        async with asyncio.timeout(timeout):
            while True:
                revision = self.observer.revision
                state = self.state()
                if predicate(state):
                    return state
                await self.observer.wait_for_change(revision)

    def leader(self) -> Node:
        leader = self.state().leader()
        assert leader is not None
        return self.nodes[leader]


def problems(state: State, consistent: Callable[..., bool]) -> list[str]:
    """Why `state` is not converged (empty when it is)."""
    out = []
    eligible = [m for m in state.members.values() if m.limit > 0 and not m.exiting]
    capacity = sum(m.limit for m in eligible)
    zones = {m.id.zone for m in eligible}
    for item_id in state.assignments.keys() - state.items.keys():
        out.append(f"{item_id}: assignments of a deleted item")
    demand = sum(min(i.replication, len(eligible)) for i in state.items.values())
    for it in state.items.values():
        asns = state.assignments.get(it.id, [])
        live = [a for a in asns if state.is_live(a)]
        want = min(it.replication, len(eligible))
        if demand <= capacity and len(live) != want:
            out.append(f"{it.id}: {len(live)} of {want} replicas")
        if live and sum(a.slot == 0 for a in live) != 1:
            out.append(f"{it.id}: no single primary")
        if want >= 2 and len(zones) >= 2 and len({a.member.zone for a in live}) < 2:
            out.append(f"{it.id}: one zone")
        if any(not consistent(it, a, asns) for a in live):
            out.append(f"{it.id}: inconsistent")
        if any(state.members[a.member].exiting for a in live):
            out.append(f"{it.id}: on an exiting member")
    for m in state.members.values():
        if len(state.member_assignments(m.id)) > m.limit:
            out.append(f"{m.id}: over its limit")
    return out


async def converged(cluster: Cluster, timeout: float = 15.0) -> State:
    try:
        return await cluster.until(lambda s: not problems(s, cluster.consistent), timeout)
    except TimeoutError:
        pytest.fail(f"not converged: {problems(cluster.state(), cluster.consistent)[:10]}")


async def history(etcd: Etcd, root: str, start: int) -> list[tuple[int, dict[str, bytes]]]:
    """Every state of `root` from revision `start` to now, as {key: value} snapshots."""
    marker = f"{root}/~marker".encode()
    end = int((await etcd.put(marker, b"")).header.revision)
    prefix = f"{root}/".encode()
    resp = await etcd.get_prefix(prefix, revision=start)
    kvs = {kv.key.decode(): bytes(kv.value) for kv in resp.kvs}
    states = [(start, dict(kvs))]
    async with asyncio.timeout(10):
        async for watched in etcd.watch_prefix(prefix, start + 1):
            for ev in watched.events:
                revision = int(ev.kv.mod_revision)
                if states[-1][0] != revision:
                    states.append((revision, dict(kvs)))
                if ev.type == 0:
                    kvs[ev.kv.key.decode()] = bytes(ev.kv.value)
                else:
                    kvs.pop(ev.kv.key.decode(), None)
                states[-1] = (revision, dict(kvs))
            if states[-1][0] >= end:
                return states
    raise AssertionError("history did not reach its end")


def consistent_counts(root: str, kvs: dict[str, bytes]) -> dict[str, tuple[int, int]]:
    """Per item: (live replicas with a standby/primary status, live primaries)."""
    out: dict[str, tuple[int, int]] = {}
    for key, value in kvs.items():
        if not key.startswith(f"{root}/assign/"):
            continue
        it, m, slot = parse_assignment_key(root, key)
        if member_key(root, m) not in kvs:
            continue
        n, primaries = out.get(it, (0, 0))
        out[it] = (n + (value in (b"standby", b"primary")), primaries + (slot == 0))
    return out


@pytest.fixture
async def etcd(etcd_server: EtcdServer) -> AsyncIterator[RecordingEtcd]:
    client = RecordingEtcd(etcd_server.endpoint)
    yield client
    await client.close()


async def test_converges_spreading_zones_with_one_primary(etcd: RecordingEtcd) -> None:
    async with Cluster(etcd) as cluster:
        for name in ("a#1", "a#2", "b#1"):
            await cluster.add(name)
        await cluster.put_items({**{f"j/{n}": 2 for n in range(6)}, "k/0": 3, "k/1": 3})
        state = await converged(cluster)
        assert {len(state.assignments[f"j/{n}"]) for n in range(6)} == {2}
        assert len(state.assignments["k/0"]) == 3

        # Converged means quiet: no allocator writes anything more.
        txns = sum(node.allocator.txns for node in cluster.nodes.values())
        # A window for any further write to show.
        await asyncio.sleep(0.3)
        assert sum(node.allocator.txns for node in cluster.nodes.values()) == txns
        assert all(
            node.allocator.txns == 0
            for node in cluster.nodes.values()
            if node is not cluster.leader()
        ), "only the leader allocates"

        # Replication changes and deleted items.
        await cluster.put_items({"j/0": 1, "j/1": 3})
        resp = await etcd.delete(item_key(cluster.root, "k/1").encode())
        await cluster.observer.wait_for_revision(int(resp.header.revision), timeout=5)
        state = await converged(cluster)
        assert [len(state.assignments[j]) for j in ("j/0", "j/1")] == [1, 3]
        assert "k/1" not in state.assignments


async def test_leader_failover(etcd: RecordingEtcd) -> None:
    async with Cluster(etcd) as cluster:
        for name in ("a#1", "b#1", "b#2"):
            await cluster.add(name)
        await cluster.put_items({f"j/{n}": 2 for n in range(5)})
        await converged(cluster)
        old = cluster.leader()
        await old.stop()  # revokes its lease: its member key and assignments go at once
        del cluster.nodes[old.id]

        await cluster.put_items({f"late/{n}": 2 for n in range(3)})
        state = await converged(cluster)
        new = cluster.leader()
        assert new is not old and new.allocator.txns > 0
        assert all(len(v) == 2 for v in state.assignments.values())


async def test_expired_member_is_replaced_and_its_primaries_promoted(etcd: RecordingEtcd) -> None:
    async with Cluster(etcd) as cluster:
        await cluster.add("a#1")
        await cluster.add("b#1")
        victim = await cluster.add("b#2", ttl=2)
        await cluster.put_items({f"j/{n}": 2 for n in range(6)})
        state = await converged(cluster)
        assert state.member_assignments(victim.id), "the victim holds replicas"
        primaries = {a.item for a in state.member_assignments(victim.id) if a.slot == 0}

        await victim.stop(release=False)  # a crash: the lease runs out
        del cluster.nodes[victim.id]
        state = await cluster.until(lambda s: victim.id not in s.members, timeout=6)
        assert not state.member_assignments(victim.id), "they went with the lease"

        state = await converged(cluster)
        for it in primaries:
            assert [a.slot for a in state.assignments[it]].count(0) == 1


@pytest.mark.parametrize(
    ("flavour", "leaving"),
    [("status", "a#2"), ("route", "a#1")],
    ids=["consumer-like, a member", "broker-like, the leader"],
)
async def test_exiting_member_is_drained_without_losing_replicas(
    etcd: RecordingEtcd, flavour: str, leaving: str
) -> None:
    async with Cluster(etcd, flavour=flavour, delay=0.1) as cluster:
        for name in ("a#1", "a#2", "b#1", "b#2"):
            await cluster.add(name)
        await cluster.put_items({f"s/{n}": 2 for n in range(8)})
        state = await converged(cluster)
        start = state.revision
        node = cluster.nodes[mid(leaving)]
        assert state.member_assignments(node.id)

        await node.session.update(spec(node.limit, exiting=True))
        async with asyncio.timeout(15):
            await wait_until_no_assignments(cluster.observer, cluster.root, node.id)
        await converged(cluster)
        assert cluster.leader() is cluster.nodes[mid("a#1")], "an exiting leader still leads"
        if flavour == "route":
            return  # a broker replica is consistent only until the route next changes

        # Replay every revision since: each item always had 2 caught-up replicas and a primary.
        for revision, kvs in await history(etcd, cluster.root, start):
            for it, (n, primaries) in consistent_counts(cluster.root, kvs).items():
                assert n >= 2, f"{it} had {n} consistent replicas at revision {revision}"
                assert primaries == 1, f"{it} had {primaries} primaries at revision {revision}"


async def test_batches_beyond_the_txn_limit(etcd: RecordingEtcd) -> None:
    async with Cluster(etcd) as cluster:
        await cluster.add("a#1", limit=500)
        await cluster.add("b#1", limit=500)
        await cluster.put_items({f"j/{n:03d}": 2 for n in range(150)})  # 300 adds
        await converged(cluster, timeout=20)
        assert max(etcd.txn_sizes) <= 128
        assert cluster.leader().allocator.txns >= 3, "300 adds took several transactions"
        assert sum(1 for s in etcd.txn_sizes if s > 100) >= 2, "in full batches"


async def test_member_limits_are_never_exceeded(etcd: RecordingEtcd) -> None:
    async with Cluster(etcd) as cluster:
        a = await cluster.add("a#1", limit=2)
        await cluster.add("b#1", limit=3)
        start = cluster.observer.revision
        await cluster.put_items({f"j/{n}": 1 for n in range(10)})
        state = await cluster.until(lambda s: sum(map(len, s.assignments.values())) == 5)
        assert len(state.member_assignments(a.id)) == 2

        await a.session.update(spec(5))
        await cluster.until(lambda s: sum(map(len, s.assignments.values())) == 8)
        await converged(cluster)
        for revision, kvs in await history(etcd, cluster.root, start):
            held: dict[str, int] = {}
            for key in kvs:
                if key.startswith(f"{cluster.root}/assign/"):
                    holder = str(parse_assignment_key(cluster.root, key)[1])
                    held[holder] = held.get(holder, 0) + 1
            limits = {
                k.rsplit("/", 1)[1]: json.loads(v)["limit"]
                for k, v in kvs.items()
                if k.startswith(f"{cluster.root}/members/")
            }
            for holder, n in held.items():
                assert n <= limits[holder], f"{holder} held {n} at revision {revision}"


# --- MemberSession -------------------------------------------------------------------------


async def test_member_session_lifecycle(etcd: RecordingEtcd) -> None:
    key = f"/session-test/{uuid.uuid4().hex[:12]}/members/a#1"
    first = MemberSession(etcd, key, ttl=5)
    await first.announce(b"endpoint-1")
    assert first.lease_id and (await etcd.get(key.encode())).kvs[0].lease == first.lease_id

    other = MemberSession(etcd, key, ttl=5)
    with pytest.raises(MemberExistsError, match="another process"):
        await other.announce(b"endpoint-2", replace_if=lambda old: old == b"endpoint-2")
    assert other.lease_id == 0

    await first.update(b"endpoint-1 exiting")
    kv = (await etcd.get(key.encode())).kvs[0]
    assert kv.value == b"endpoint-1 exiting" and kv.lease == first.lease_id

    # Our own crashed predecessor: replaced at once rather than after its TTL.
    successor = MemberSession(etcd, key, ttl=5)
    await successor.announce(b"endpoint-1", replace_if=lambda old: old.startswith(b"endpoint-1"))
    kv = (await etcd.get(key.encode())).kvs[0]
    assert kv.lease == successor.lease_id

    with pytest.raises(LeaseLostError):
        await first.keep_alive()  # its lease was revoked by the successor
    with pytest.raises(LeaseLostError):
        await first.update(b"too late")

    await successor.release()
    await successor.release()  # idempotent
    assert not (await etcd.get(key.encode())).kvs


async def test_lease_validity_is_measured_from_the_last_confirmed_renewal(
    etcd: RecordingEtcd,
) -> None:
    """`lease_valid_for` counts down from when a renewal etcd confirmed was sent, so a
    process that did not renew for a TTL (paused, partitioned) sees its lease as possibly
    lost before any watch says so."""
    key = f"/session-test/{uuid.uuid4().hex[:12]}/members/a#1"
    session = MemberSession(etcd, key, ttl=2)
    assert session.lease_valid_for() <= 0  # not announced
    await session.announce(b"x")
    assert 1.0 < session.lease_valid_for() <= 2.0
    renewing = asyncio.create_task(session.keep_alive())
    await asyncio.sleep(2.5)  # renewed every ttl/3 meanwhile
    assert session.lease_valid_for() > 0.5
    renewing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await renewing
    await asyncio.sleep(2.1)  # no renewal for a whole TTL
    assert session.lease_valid_for() <= 0
    await session.release()
    assert session.lease_valid_for() <= 0
