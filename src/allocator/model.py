"""The allocator's view of a cluster: items, members and assignments, as read from etcd.

Keys (upstream's layout), under a root such as `/gazette/cluster`:

- `{root}/items/{item}`: the item's spec (a JournalSpec or ShardSpec).
- `{root}/members/{zone}#{suffix}`: a member's spec, under the member's lease.
- `{root}/assign/{item}#{zone}#{suffix}#{slot}`: an assignment of the item to the member,
  under the member's lease; slot 0 is the primary. Item ids may contain '/' but never '#'.

`State` is an immutable snapshot of those keys, decoded through callables that the
application supplies (how a spec spells its replication, item limit and exit flag).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gazette.keyspace.keyspace import KeySpace

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class MemberID:
    """A member's identity: its zone and a suffix unique within the zone."""

    zone: str
    suffix: str
    # The allocator hashes and compares member ids in its inner loops: keep the hash.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.zone, self.suffix)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, MemberID):
            return NotImplemented
        return self._hash == other._hash and self.zone == other.zone and self.suffix == other.suffix

    def __str__(self) -> str:
        return f"{self.zone}#{self.suffix}"

    @classmethod
    def parse(cls, text: str) -> MemberID:
        """`zone#suffix` -> MemberID. Raises ValueError if there is no '#'."""
        zone, sep, suffix = text.partition("#")
        if not sep:
            raise ValueError(f"member id {text!r} is not of the form zone#suffix")
        return cls(zone, suffix)


@dataclass(frozen=True)
class Member:
    """A live member: its member key and the allocation parameters read from its spec."""

    id: MemberID
    limit: int
    exiting: bool = False
    key: str = ""
    create_revision: int = 0
    mod_revision: int = 0
    lease: int = 0
    value: Any = None


@dataclass(frozen=True)
class Item:
    """An item to replicate `replication` times (a journal or a shard)."""

    id: str
    replication: int
    key: str = ""
    mod_revision: int = 0
    value: Any = None


@dataclass(frozen=True)
class Assignment:
    """An assignment key: `member` serves `item` in `slot` (0 = primary).

    `value` is the decoded value the member wrote (empty until it does); `raw` its bytes,
    which the allocator carries over when it moves the assignment to another slot.
    """

    item: str
    member: MemberID
    slot: int
    key: str = ""
    create_revision: int = 0
    mod_revision: int = 0
    lease: int = 0
    value: Any = None
    raw: bytes = b""


def items_prefix(root: str) -> str:
    return f"{root}/items/"


def members_prefix(root: str) -> str:
    return f"{root}/members/"


def assignments_prefix(root: str) -> str:
    return f"{root}/assign/"


def item_key(root: str, item: str) -> str:
    return f"{items_prefix(root)}{item}"


def member_key(root: str, member: MemberID) -> str:
    return f"{members_prefix(root)}{member.zone}#{member.suffix}"


def assignment_key(root: str, item: str, member: MemberID, slot: int) -> str:
    return f"{assignments_prefix(root)}{item}#{member.zone}#{member.suffix}#{slot}"


def parse_assignment_key(root: str, key: str) -> tuple[str, MemberID, int]:
    """`{root}/assign/{item}#{zone}#{suffix}#{slot}` -> (item, member, slot).

    Raises ValueError for a key outside the assignments prefix or of another shape.
    """
    prefix = assignments_prefix(root)
    if not key.startswith(prefix):
        raise ValueError(f"{key!r} is not an assignment key under {root!r}")
    parts = key[len(prefix) :].rsplit("#", 3)
    if len(parts) != 4 or not parts[0]:
        raise ValueError(f"{key!r} is not of the form {prefix}item#zone#suffix#slot")
    item, zone, suffix, slot = parts
    if not slot.isdigit():
        raise ValueError(f"assignment key {key!r} has a non-numeric slot")
    return item, MemberID(zone, suffix), int(slot)


@dataclass(frozen=True)
class State:
    """A snapshot of items, members and assignments at one etcd revision.

    `assignments` lists every assignment key, grouped by item (including items that no
    longer exist) and sorted by (slot, member). An assignment whose member key is absent
    is still listed, for the moment until its lease takes it away, but it is never live
    (`is_live`), so it never counts towards an item's replication.
    """

    items: dict[str, Item]
    members: dict[MemberID, Member]
    assignments: dict[str, list[Assignment]]
    revision: int = 0
    _by_member: dict[MemberID, list[Assignment]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def from_keyspace(
        cls,
        keyspace: KeySpace,
        root: str,
        *,
        item_replication: Callable[[Any], int],
        member_limit: Callable[[Any], int],
        member_exiting: Callable[[Any], bool],
    ) -> State:
        """Read the state under `root` from `keyspace` (whose prefix must cover `root`).

        The callables read a decoded item spec's replication and a decoded member spec's
        item limit and exit flag. Keys of an unexpected shape are logged and skipped.
        """
        items: dict[str, Item] = {}
        prefix = items_prefix(root)
        for kv in keyspace.prefixed(prefix):
            item_id = kv.key[len(prefix) :]
            items[item_id] = Item(
                item_id, int(item_replication(kv.value)), kv.key, kv.mod_revision, kv.value
            )
        members: dict[MemberID, Member] = {}
        prefix = members_prefix(root)
        for kv in keyspace.prefixed(prefix):
            try:
                member_id = MemberID.parse(kv.key[len(prefix) :])
            except ValueError as err:
                log.warning("allocator: skipping member key=%s err=%s", kv.key, err)
                continue
            members[member_id] = Member(
                member_id,
                int(member_limit(kv.value)),
                bool(member_exiting(kv.value)),
                kv.key,
                kv.create_revision,
                kv.mod_revision,
                kv.lease,
                kv.value,
            )
        assignments: list[Assignment] = []
        # One MemberID per member, shared by its assignments (equal ids are then identical).
        ids = {(m.zone, m.suffix): m for m in members}
        prefix = assignments_prefix(root)
        for kv in keyspace.prefixed(prefix):
            parts = kv.key[len(prefix) :].rsplit("#", 3)
            if len(parts) != 4 or not parts[0] or not parts[3].isdigit():
                log.warning("allocator: skipping assignment key=%s", kv.key)
                continue
            item_id, zone, suffix, slot = parts
            holder = ids.get((zone, suffix))
            if holder is None:
                holder = ids[(zone, suffix)] = MemberID(zone, suffix)
            assignments.append(
                Assignment(
                    item_id,
                    holder,
                    int(slot),
                    kv.key,
                    kv.create_revision,
                    kv.mod_revision,
                    kv.lease,
                    kv.value,
                    kv.raw,
                )
            )
        return cls.build(items.values(), members.values(), assignments, keyspace.revision)

    @classmethod
    def build(
        cls,
        items: Iterable[Item],
        members: Iterable[Member],
        assignments: Iterable[Assignment],
        revision: int = 0,
    ) -> State:
        """A State of the given parts (grouping and sorting the assignments)."""
        grouped: dict[str, list[Assignment]] = {}
        for a in assignments:
            grouped.setdefault(a.item, []).append(a)
        for group in grouped.values():
            group.sort(key=lambda a: (a.slot, a.member))
        return cls(
            {i.id: i for i in items},
            {m.id: m for m in members},
            dict(sorted(grouped.items())),
            revision,
        )

    @staticmethod
    def leader_in(keyspace: KeySpace, root: str) -> MemberID | None:
        """`State.leader()` read straight from the member keys of `keyspace`: cheap, for
        members that only need to know whether they lead."""
        best: tuple[int, str] | None = None
        prefix = members_prefix(root)
        for kv in keyspace.prefixed(prefix):
            if "#" in kv.key[len(prefix) :] and (
                best is None or (kv.create_revision, kv.key) < best
            ):
                best = (kv.create_revision, kv.key)
        return MemberID.parse(best[1][len(prefix) :]) if best is not None else None

    def leader(self) -> MemberID | None:
        """The member with the lowest (create revision, key): the one that allocates."""
        if not self.members:
            return None
        return min(self.members.values(), key=lambda m: (m.create_revision, m.key)).id

    def is_live(self, assignment: Assignment) -> bool:
        """Whether the assignment's member key exists."""
        return assignment.member in self.members

    def member_assignments(self, member: MemberID) -> list[Assignment]:
        """Every assignment of `member`, in (item, slot) order."""
        if not self._by_member and self.assignments:
            for assignments in self.assignments.values():
                for a in assignments:
                    self._by_member.setdefault(a.member, []).append(a)
        return list(self._by_member.get(member, ()))

    def current(self) -> dict[str, list[MemberID]]:
        """The live members of each existing item, primary first: the solver's `current`."""
        out: dict[str, list[MemberID]] = {}
        for item_id in self.items:
            out[item_id] = [a.member for a in self.assignments.get(item_id, ()) if self.is_live(a)]
        return out
