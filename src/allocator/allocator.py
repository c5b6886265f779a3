"""The Allocator: the leader's loop that converges etcd's assignments towards the solver's.

Every member runs `Allocator.serve()`; only the current leader (the member with the
lowest member-key create revision) acts. On each change of the keyspace it reads a
`State`, takes the desired replica sets from `solve()` (re-solving only when items or
members changed), plans the allowed steps towards them (`plan_changes`) and applies
them in guarded etcd transactions of at most `max_txn_ops` operations.

The steps never lower an item below its replication in consistent replicas, where
consistency is the member side's notion (`is_consistent`): a broker replica is consistent
once it advertises the item's current route, a consumer replica once it is STANDBY or
PRIMARY. So a replica is added first and an old one removed only once enough others are
consistent, and a primary moves only to a consistent replica. See docs/allocator.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gazette.allocator.model import (
    Assignment,
    Item,
    MemberID,
    State,
    assignment_key,
    assignments_prefix,
    item_key,
    parse_assignment_key,
)
from gazette.allocator.solver import solve
from gazette.keyspace.etcd import Compare, Etcd, EtcdError, op_delete, op_put
from gazette.keyspace.keyspace import KeySpace

log = logging.getLogger(__name__)

ConsistencyFn = Callable[[Item, Assignment, list[Assignment]], bool]
"""`is_consistent(item, assignment, all assignments of the item)`: whether the member has
caught up with the item, so that the assignment may count towards its replication."""


@dataclass(frozen=True)
class Change:
    """One atomic step of convergence: its guards and its writes.

    `puts` are (key, value, lease). A change touches keys no other change of the same plan
    touches, so the changes of a plan may be applied in any grouping.
    """

    kind: Literal["add", "promote", "remove"]
    item: str
    compares: tuple[Compare, ...]
    deletes: tuple[str, ...] = ()
    puts: tuple[tuple[str, bytes, int], ...] = ()

    @property
    def n_ops(self) -> int:
        return len(self.deletes) + len(self.puts)

    def ops(self) -> list[Any]:
        return [op_delete(k.encode()) for k in self.deletes] + [
            op_put(k.encode(), v, lease) for k, v, lease in self.puts
        ]


@dataclass(frozen=True)
class Txn:
    """A batch of changes for one etcd transaction, guarded by the leader's member key."""

    compares: tuple[Compare, ...]
    changes: tuple[Change, ...]

    def ops(self) -> list[Any]:
        return [op for change in self.changes for op in change.ops()]


def plan_changes(
    state: State,
    desired: Mapping[str, Sequence[MemberID]],
    root: str,
    is_consistent: ConsistencyFn,
    *,
    max_txn_ops: int = 128,
    is_failed: Callable[[Assignment], bool] | None = None,
) -> list[Change]:
    """The steps that may be taken now to move `state` towards `desired`.

    Per item (see docs/allocator.md for the reasoning):

    - assignments of a deleted item, of a member without member key, or a member's second
      assignment of the same item are removed;
    - a desired member without assignment gets one at the lowest free slot >= 1, unless
      that would take it over its item limit (it waits for its removals);
    - an item without primary gets one: its consistent replica (desired ones and members
      with fewer primaries per limit first), or, if no replica is consistent, the best
      live one anyway, as waiting would leave the item unavailable for nothing (one that
      `is_failed` says has failed only if every one has: it would stay failed as primary);
    - a primary on a member that is no longer desired moves to a consistent desired
      replica (and waits while there is none); the old primary stays as a replica;
    - an undesired replica (never a primary) is removed while the item keeps at least
      min(replication, len(desired)) consistent replicas; inconsistent ones go first.

    An item whose primary moves this round has its removals planned next round.
    """
    planner = _Planner(state, root, is_consistent, max_txn_ops, is_failed)
    for item_id in sorted(state.items.keys() | state.assignments.keys()):
        planner.plan_item(item_id, desired.get(item_id, ()))
    return planner.changes


class _Planner:
    """`plan_changes` state: the changes so far and member counts as they would become."""

    def __init__(
        self,
        state: State,
        root: str,
        is_consistent: ConsistencyFn,
        max_txn_ops: int,
        is_failed: Callable[[Assignment], bool] | None = None,
    ) -> None:
        self.state = state
        self.root = root
        self.is_consistent = is_consistent
        self.is_failed = is_failed
        self.max_txn_ops = max_txn_ops
        self.changes: list[Change] = []
        self.total: Counter[MemberID] = Counter()
        self.primaries: Counter[MemberID] = Counter()
        for assignments in state.assignments.values():
            for a in assignments:
                if state.is_live(a):
                    self.total[a.member] += 1
                    self.primaries[a.member] += a.slot == 0

    def load_ratio(self, counts: Counter[MemberID], member: MemberID) -> float:
        m = self.state.members.get(member)
        return counts[member] / m.limit if m is not None and m.limit > 0 else float("inf")

    def remove(self, a: Assignment, *guards: Compare) -> None:
        self.changes.append(
            Change(
                "remove", a.item, (*guards, _cmp(a.key, "mod", a.mod_revision)), deletes=(a.key,)
            )
        )
        if self.state.is_live(a):
            self.total[a.member] -= 1

    def plan_item(self, item_id: str, desired: Sequence[MemberID]) -> None:
        state = self.state
        assignments = state.assignments.get(item_id, [])
        item = state.items.get(item_id)
        if item is None:
            for a in assignments:
                self.remove(a, _cmp(item_key(self.root, item_id), "create", 0))
            return

        if _settled(state, assignments, desired):
            return

        live: list[Assignment] = []
        for a in assignments:
            if state.is_live(a) and all(b.member != a.member for b in live):
                live.append(a)
            else:
                self.remove(a)  # its member is gone, or it is the member's second one

        want = set(desired)
        consistent = {a.key for a in live if self.is_consistent(item, a, assignments)}
        slots = _Slots(a.slot for a in assignments)

        # Adds.
        holders = {a.member for a in live}
        for member_id in desired:
            member = state.members.get(member_id)
            if member_id in holders or member is None or member.exiting:
                continue
            if self.total[member_id] >= member.limit:
                continue  # it sheds other items first
            key = assignment_key(self.root, item_id, member_id, slots.take())
            self.changes.append(
                Change(
                    "add",
                    item_id,
                    (_cmp(key, "create", 0), _cmp(member.key, "mod", member.mod_revision)),
                    puts=((key, b"", member.lease),),
                )
            )
            self.total[member_id] += 1

        # Primary.
        primary = next((a for a in live if a.slot == 0), None)
        if primary is None or primary.member not in want:
            others = [a for a in live if a is not primary]

            def rank(a: Assignment) -> tuple[bool, float, int, MemberID]:
                return (
                    a.member not in want,
                    self.load_ratio(self.primaries, a.member),
                    a.slot,
                    a.member,
                )

            ready = [
                a for a in others if a.key in consistent and (primary is None or a.member in want)
            ]
            target: Assignment | None = None
            if ready:
                target = min(ready, key=rank)
            elif primary is None and others:
                # Nothing is consistent: promote anyway, a failed replica last.
                failed = self.is_failed or (lambda _a: False)
                target = min(others, key=lambda a: (failed(a), *rank(a)))
            if target is not None:
                self.changes.append(_promotion(self.root, target, primary, slots))
                self.primaries[target.member] += 1
                if primary is not None:
                    self.primaries[primary.member] -= 1
                return

        # Removals.
        need = min(item.replication, len(want))
        count = len(consistent)
        candidates = [a for a in live if a.member not in want and a.slot != 0]
        candidates.sort(
            key=lambda a: (
                a.key in consistent,
                -self.load_ratio(self.total, a.member),
                a.slot,
                a.member,
            )
        )
        removed: list[Assignment] = []
        for a in candidates:
            if a.key not in consistent:
                # An inconsistent replica may still hold content the others lack (a broker
                # replica turns inconsistent at every route change): it goes only once
                # enough others are consistent.
                if count >= need:
                    removed.append(a)
            elif count - 1 >= need:
                removed.append(a)
                count -= 1
        if not removed:
            return
        # Guard the item (its replication may have grown), the removed keys, and `need`
        # of the consistent replicas that stay (their values justify the removal).
        gone = {a.key for a in removed}
        kept = [a for a in live if a.key in consistent and a.key not in gone][:need]
        room = self.max_txn_ops - 2 - len(kept)  # less the leader's and the item's guards
        if room <= 0:
            log.warning("allocator: item=%s replication too large to guard removals", item_id)
            return
        removed = removed[:room]
        self.changes.append(
            Change(
                "remove",
                item_id,
                (
                    _cmp(item.key, "mod", item.mod_revision),
                    *(_cmp(a.key, "mod", a.mod_revision) for a in removed),
                    *(_cmp(a.key, "mod", a.mod_revision) for a in kept),
                ),
                deletes=tuple(a.key for a in removed),
            )
        )
        for a in removed:
            self.total[a.member] -= 1


def _settled(state: State, assignments: list[Assignment], desired: Sequence[MemberID]) -> bool:
    """Whether an item's assignments are exactly its desired members, with a primary: the
    common case, which needs no consistency checks."""
    if len(assignments) != len(desired) or not assignments or assignments[0].slot != 0:
        return False
    members = {a.member for a in assignments}
    return (
        len(members) == len(desired)
        and members.issuperset(desired)
        and all(m in state.members for m in members)
    )


class _Slots:
    """The slots in use by an item's assignments; hands out the lowest free one >= 1."""

    def __init__(self, used: Iterable[int]) -> None:
        self.used = set(used)

    def take(self) -> int:
        slot = 1
        while slot in self.used:
            slot += 1
        self.used.add(slot)
        return slot


def _cmp(key: str, target: str, value: int) -> Compare:
    return Compare(key.encode(), target, value)


def _promotion(root: str, target: Assignment, primary: Assignment | None, slots: _Slots) -> Change:
    """Move `target` to slot 0 and, if there is one, `primary` to a free slot."""
    key = assignment_key(root, target.item, target.member, 0)
    compares = [_cmp(target.key, "mod", target.mod_revision), _cmp(key, "create", 0)]
    deletes = [target.key]
    puts = [(key, target.raw, target.lease)]
    if primary is not None:
        demoted = assignment_key(root, primary.item, primary.member, slots.take())
        compares += [_cmp(primary.key, "mod", primary.mod_revision), _cmp(demoted, "create", 0)]
        deletes.append(primary.key)
        puts.append((demoted, primary.raw, primary.lease))
    return Change("promote", target.item, tuple(compares), tuple(deletes), tuple(puts))


def batch_changes(changes: Sequence[Change], leader: Compare, max_txn_ops: int) -> list[Txn]:
    """Pack changes, in order, into transactions of at most `max_txn_ops` operations and
    as many comparisons (etcd's limit applies to each), each guarded by `leader`."""
    txns: list[Txn] = []
    compares: dict[tuple[bytes, str], Compare] = {}
    batch: list[Change] = []
    n_ops = 0

    def flush() -> None:
        nonlocal n_ops
        if batch:
            txns.append(Txn((leader, *compares.values()), tuple(batch)))
        compares.clear()
        batch.clear()
        n_ops = 0

    for change in changes:
        new = [c for c in change.compares if (c.key, c.target) not in compares]
        if batch and (
            n_ops + change.n_ops > max_txn_ops or 1 + len(compares) + len(new) > max_txn_ops
        ):
            flush()
            new = list(change.compares)
        for c in new:
            compares[(c.key, c.target)] = c
        batch.append(change)
        n_ops += change.n_ops
    flush()
    return txns


class Allocator:
    """Converges the assignments under `root` while `local` is the leader.

    `keyspace` must mirror `{root}/` and be kept current by its owner (`KeySpace.watch`);
    the allocator only reads it. `item_replication`, `member_limit` and `member_exiting`
    read the decoded specs; `is_consistent` is the member side's notion of a caught-up
    replica. These callables run on every round and must be cheap and must not raise (an
    exception ends `serve()`). The decoder of the keyspace must accept an empty assignment
    value, which is how the allocator creates assignments: an undecodable assignment key is
    missing from the mirror, and the allocator would try to create it again and again.
    """

    def __init__(
        self,
        etcd: Etcd,
        keyspace: KeySpace,
        root: str,
        local: MemberID,
        *,
        item_replication: Callable[[Any], int],
        member_limit: Callable[[Any], int],
        member_exiting: Callable[[Any], bool],
        is_consistent: ConsistencyFn,
        max_txn_ops: int = 128,
        sync_timeout: float = 10.0,
        is_failed: Callable[[Assignment], bool] | None = None,
    ) -> None:
        if max_txn_ops < 8:
            raise ValueError(f"max_txn_ops must be at least 8, not {max_txn_ops}")
        self.etcd = etcd
        self.keyspace = keyspace
        self.root = root
        self.local = local
        self.item_replication = item_replication
        self.member_limit = member_limit
        self.member_exiting = member_exiting
        self.is_consistent = is_consistent
        self.is_failed = is_failed
        self.max_txn_ops = max_txn_ops
        self.sync_timeout = sync_timeout
        self._solved_for: tuple[Any, ...] | None = None
        self._desired: dict[str, list[MemberID]] = {}
        self.txns = 0  # transactions applied; for logs and tests
        self.conflicts = 0  # transactions whose guards failed

    def state(self) -> State:
        """The current State of the keyspace."""
        return State.from_keyspace(
            self.keyspace,
            self.root,
            item_replication=self.item_replication,
            member_limit=self.member_limit,
            member_exiting=self.member_exiting,
        )

    def movable(self, member: MemberID, items: Iterable[str]) -> list[str]:
        """Of `items` (assigned to `member`), those the allocator can still move away: all
        of them until `member`'s exiting flag is in the keyspace; then those the solver
        places on some member (an exiting member is given nothing). A member draining for
        exit waits for these only: an item no other member can take (all others exiting,
        or none with room) stays until the member is gone."""
        items = sorted(items)
        state = self.state()
        me = state.members.get(member)
        if me is None or not me.exiting:
            return items
        desired = self.desired(state)
        return [item for item in items if desired.get(item)]

    def desired(self, state: State) -> dict[str, list[MemberID]]:
        """The solver's replica sets for `state`.

        Solved again only when items or members (ids, replication, limits, exit flags)
        change; in between, convergence keeps aiming at the same solution rather than
        re-solving from each intermediate state.
        """
        key = (
            tuple((i.id, i.replication) for i in state.items.values()),
            tuple((m.id, m.limit, m.exiting) for m in state.members.values()),
        )
        if key != self._solved_for:
            self._desired = solve(state.items.values(), state.members.values(), state.current())
            self._solved_for = key
            eligible = sum(1 for m in state.members.values() if m.limit > 0 and not m.exiting)
            short = sum(
                min(i.replication, eligible) - len(self._desired.get(i.id, ()))
                for i in state.items.values()
            )
            log.info(
                "allocator: solved items=%d members=%d revision=%d unplaced_replicas=%d",
                len(state.items),
                len(state.members),
                state.revision,
                short,
            )
        return self._desired

    async def serve(self) -> None:
        """Allocate whenever the keyspace changes and `local` leads, until cancelled.

        A transaction whose guards fail means our view was stale: we plan again from the
        next revision. An EtcdError is logged and retried with backoff. Cancellation may
        land between transactions; every transaction is a consistent step on its own.
        """
        seen = -1
        backoff = 0.1
        while True:
            if self.keyspace.revision <= seen:
                await self.keyspace.wait_for_change(seen)
            seen = self.keyspace.revision
            if State.leader_in(self.keyspace, self.root) != self.local:
                continue
            state = self.state()
            try:
                await self.converge(state)
            except EtcdError as err:
                log.warning(
                    "allocator: etcd failed member=%s revision=%d err=%s; retrying in %.1fs",
                    self.local,
                    state.revision,
                    err,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                seen = -1
            else:
                backoff = 0.1

    async def converge(self, state: State) -> bool:
        """Apply one round of changes planned from `state` (in which `local` must lead).

        Returns False if there was nothing to do. After applied transactions, returns once
        the keyspace reflects them; after a failed guard, at once.
        """
        leader = state.members[self.local]
        changes = plan_changes(
            state,
            self.desired(state),
            self.root,
            self.is_consistent,
            max_txn_ops=self.max_txn_ops,
            is_failed=self.is_failed,
        )
        if not changes:
            return False
        guard = _cmp(leader.key, "create", leader.create_revision)
        applied = 0
        for txn in batch_changes(changes, guard, self.max_txn_ops):
            resp = await self.etcd.txn(txn.compares, txn.ops())
            if not resp.succeeded:
                self.conflicts += 1
                log.info("allocator: guards failed revision=%d; planning again", state.revision)
                break
            self.txns += 1
            applied = int(resp.header.revision)
            kinds = Counter(c.kind for c in txn.changes)
            log.info(
                "allocator: applied revision=%d add=%d promote=%d remove=%d",
                applied,
                kinds["add"],
                kinds["promote"],
                kinds["remove"],
            )
        if applied:
            try:
                await self.keyspace.wait_for_revision(applied, timeout=self.sync_timeout)
            except TimeoutError:
                log.warning(
                    "allocator: keyspace did not reach revision=%d in %.0fs",
                    applied,
                    self.sync_timeout,
                )
        return True


async def wait_until_no_assignments(keyspace: KeySpace, root: str, member: MemberID) -> None:
    """Return once `keyspace` holds no assignment of `member` under `root`.

    For a graceful exit: set the member's exiting flag, then wait here until the
    allocator has moved every item away. Runs until cancelled if that never happens
    (e.g. no other member can take the items).
    """
    prefix = assignments_prefix(root)
    tail = f"#{member.zone}#{member.suffix}#"
    while True:
        revision = keyspace.revision
        if not any(_is_of(kv.key, root, tail, member) for kv in keyspace.prefixed(prefix)):
            return
        await keyspace.wait_for_change(revision)


def _is_of(key: str, root: str, tail: str, member: MemberID) -> bool:
    if tail not in key:
        return False
    try:
        return parse_assignment_key(root, key)[1] == member
    except ValueError:
        return False
