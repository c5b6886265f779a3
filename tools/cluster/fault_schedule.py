"""The faults the cluster runner injects, what each tests, and the schedule of a run (no I/O).

A fault is a name (the runner's `--faults` takes them), a sentence saying what it tests, and
whether it belongs to the quick run. `faults.py` holds what each does to the cluster; this
module only names and orders them, so the plan of a run is testable without a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    name: str
    tests: str
    """What surviving it shows (one sentence, for the docs and `--list`)."""
    quick: bool = False
    """In the `--quick` run."""


FAULTS: tuple[Fault, ...] = (
    Fault(
        "etcd-crash",
        "SIGKILL the etcd leader, restart it on its data: brokers and summers fail over to "
        "the other members and keep their leases.",
    ),
    Fault(
        "broker-crash",
        "SIGKILL the primary broker of the acknowledged journal: its lease expires, its "
        "journals move, acknowledged appends stay readable on the other replicas.",
        quick=True,
    ),
    Fault(
        "brokers-crash",
        "SIGKILL two brokers of the acknowledged journal's route at once: one replica of "
        "three is left, and nothing it acknowledged is lost.",
    ),
    Fault(
        "summer-crash",
        "SIGKILL the summer holding the most shard primaries: standbys take over and every "
        "sum is still published exactly once.",
    ),
    Fault(
        "brokers-restart",
        "SIGTERM every broker, wait for them to exit, start them again: journals survive a "
        "whole-cluster restart through their fragments in S3.",
    ),
    Fault(
        "summers-restart",
        "SIGTERM every summer, wait, start them again: shards recover their stores from "
        "their recovery logs and resume where their checkpoints say.",
    ),
    Fault(
        "isolate-host",
        "cut a host that serves the acknowledged journal and a shard off the network past "
        "the lease TTL: its work moves, and its processes, on rejoining, are fenced.",
        quick=True,
    ),
    Fault(
        "split-2-3",
        "partition the hosts into two (with two etcd members) and three (with one): the "
        "minority's brokers and summers lose their leases, appends stall without loss.",
    ),
    Fault(
        "drop-one-way",
        "drop what the acknowledged journal's primary sends to one of its replicas (one "
        "direction): replication stalls, and the route heals without a lost append.",
    ),
    Fault(
        "isolate-etcd-leader",
        "cut the etcd leader's host off: a new leader is elected and leases kept through "
        "the other members; the old leader's host rejoins as a follower.",
    ),
    Fault(
        "pause-host",
        "SIGSTOP every process of a host serving the acknowledged journal and a shard past "
        "the lease TTL, then SIGCONT: the zombies resume with their leases gone and must "
        "commit nothing.",
    ),
)

BY_NAME = {f.name: f for f in FAULTS}


class UnknownFault(ValueError):
    """A name given to `--faults` that is no fault."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(
            f"unknown fault(s): {', '.join(names)}; known: {', '.join(f.name for f in FAULTS)}"
        )
        self.names = list(names)


def plan(*, quick: bool = False, only: str = "", trials: int = 1) -> list[str]:
    """The faults of a run, in order: those of `only` (comma-separated, in its order) if
    given, else the quick ones if `quick`, else all; each `trials` times in a row."""
    if trials < 1:
        raise ValueError(f"trials must be at least 1, not {trials}")
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()]
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            raise UnknownFault(unknown)
        if not names:
            raise ValueError("--faults names no fault")
    else:
        names = [f.name for f in FAULTS if f.quick or not quick]
    return [n for n in names for _ in range(trials)]
