"""The assignment machinery shared by brokers and consumers, atop `gazette.keyspace`.

Items (journals, shards) are replicated by members (brokers, consumers). Each member
announces itself under a lease (`MemberSession`); every member runs an `Allocator`, of
which only the leader acts: it solves for the desired replicas of each item (`solve`)
and converges the assignment keys in etcd towards them without ever dropping an item
below its replication in consistent replicas. The modules:

- `model`: the key layout and `State`, a snapshot of items, members and assignments;
- `solver`: the pure assignment solver; `allocator`: the leader's convergence loop;
- `session`: a member's leased announcement.

The public names below are importable from the package; they load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gazette.allocator.allocator import (
        Allocator,
        Change,
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
        member_key,
        parse_assignment_key,
    )
    from gazette.allocator.session import LeaseLostError, MemberExistsError, MemberSession
    from gazette.allocator.solver import solve

_EXPORTS = {
    "Allocator": "gazette.allocator.allocator",
    "Change": "gazette.allocator.allocator",
    "plan_changes": "gazette.allocator.allocator",
    "wait_until_no_assignments": "gazette.allocator.allocator",
    "Assignment": "gazette.allocator.model",
    "Item": "gazette.allocator.model",
    "Member": "gazette.allocator.model",
    "MemberID": "gazette.allocator.model",
    "State": "gazette.allocator.model",
    "assignment_key": "gazette.allocator.model",
    "member_key": "gazette.allocator.model",
    "parse_assignment_key": "gazette.allocator.model",
    "LeaseLostError": "gazette.allocator.session",
    "MemberExistsError": "gazette.allocator.session",
    "MemberSession": "gazette.allocator.session",
    "solve": "gazette.allocator.solver",
}

__all__ = [
    "Allocator",
    "Assignment",
    "Change",
    "Item",
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
