"""The etcd keyspace mirror and the assignment machinery shared by brokers and consumers.

Items (journals, shards) are replicated by members (brokers, consumers). Each member
announces itself under a lease (`MemberSession`); every member runs an `Allocator`, of
which only the leader acts: it solves for the desired replicas of each item (`solve`)
and converges the assignment keys in etcd towards them without ever dropping an item
below its replication in consistent replicas. The modules:

- `etcd`: a small typed asyncio etcd client; `keyspace`: a decoded mirror of a prefix;
- `model`: the key layout and `State`, a snapshot of items, members and assignments;
- `solver`: the pure assignment solver; `allocator`: the leader's convergence loop;
- `session`: a member's leased announcement.

The public names below are importable from the package; they load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from allocator.allocator import Allocator, Change, plan_changes, wait_until_no_assignments
    from allocator.etcd import Compare, Etcd, EtcdError
    from allocator.keyspace import KeySpace, KeyValue
    from allocator.model import (
        Assignment,
        Item,
        Member,
        MemberID,
        State,
        assignment_key,
        member_key,
        parse_assignment_key,
    )
    from allocator.session import LeaseLostError, MemberExistsError, MemberSession
    from allocator.solver import solve

_EXPORTS = {
    "Allocator": "allocator.allocator",
    "Change": "allocator.allocator",
    "plan_changes": "allocator.allocator",
    "wait_until_no_assignments": "allocator.allocator",
    "Compare": "allocator.etcd",
    "Etcd": "allocator.etcd",
    "EtcdError": "allocator.etcd",
    "KeySpace": "allocator.keyspace",
    "KeyValue": "allocator.keyspace",
    "Assignment": "allocator.model",
    "Item": "allocator.model",
    "Member": "allocator.model",
    "MemberID": "allocator.model",
    "State": "allocator.model",
    "assignment_key": "allocator.model",
    "member_key": "allocator.model",
    "parse_assignment_key": "allocator.model",
    "LeaseLostError": "allocator.session",
    "MemberExistsError": "allocator.session",
    "MemberSession": "allocator.session",
    "solve": "allocator.solver",
}

__all__ = [
    "Allocator",
    "Assignment",
    "Change",
    "Compare",
    "Etcd",
    "EtcdError",
    "Item",
    "KeySpace",
    "KeyValue",
    "LeaseLostError",
    "Member",
    "MemberExistsError",
    "MemberID",
    "MemberSession",
    "State",
    "assignment_key",
    "member_key",
    "parse_assignment_key",
    "plan_changes",
    "solve",
    "wait_until_no_assignments",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'allocator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
