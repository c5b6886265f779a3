"""What each fault of `fault_schedule.FAULTS` does to a `NodeCluster`, and how it is undone.

A fault picks its victims from the cluster's state as it is when injected (the primary of the
acknowledged journal, the summer holding most shard primaries, the etcd leader), applies
itself, and holds: past the lease TTL when the point is that leases expire and work moves.
`inject` returns the victims and the heal; the runner times recovery from the heal. Faults
that leave processes running without their leases (a host cut off or paused past the TTL)
also return those processes as they were before (`Suspect`): after convergence the runner
checks each zombie was fenced.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from node_cluster import ACK_JOURNAL, ClusterError, NodeCluster, Suspect

from gazette.testing.netns import Host


@dataclass
class Injected:
    victims: str
    heal: Callable[[], None]
    suspects: list[Suspect] = field(default_factory=list)


def _hold(c: NodeCluster, ttls: float) -> None:
    time.sleep(c.settings.lease_ttl * ttls)


def _route(c: NodeCluster) -> list[Host]:
    route = c.route_hosts(ACK_JOURNAL)
    if not route:
        raise ClusterError(f"{ACK_JOURNAL} has no primary to aim at")
    return route


def _serving_host(c: NodeCluster) -> Host:
    """A summer host in the acknowledged journal's route, one with shard primaries and no
    etcd member first: a fault there hits a broker primary or replica and a shard primary."""
    route = _route(c)
    primaries = c.shard_primary_hosts()
    candidates = [h for h in c.summer_hosts if h in route] or list(c.summer_hosts)

    def rank(h: Host) -> tuple[bool, bool, int]:
        return (h not in primaries, h in c.etcd_hosts, route.index(h) if h in route else 9)

    return min(candidates, key=rank)


def etcd_crash(c: NodeCluster) -> Injected:
    victim = c.etcd_leader() or c.etcd_hosts[0]
    c.crash(victim, "etcd")
    _hold(c, 2)
    return Injected(f"etcd@{victim.name}", lambda: c.release([(victim, "etcd")]))


def _crash_brokers(c: NodeCluster, n: int) -> Injected:
    victims = _route(c)[:n]
    for h in victims:
        c.crash(h, "broker")
    _hold(c, 1.5)
    pairs = [(h, "broker") for h in victims]
    return Injected(", ".join(f"broker@{h.name}" for h in victims), lambda: c.release(pairs))


def broker_crash(c: NodeCluster) -> Injected:
    return _crash_brokers(c, 1)


def brokers_crash(c: NodeCluster) -> Injected:
    return _crash_brokers(c, 2)


def summer_crash(c: NodeCluster) -> Injected:
    victim = (c.shard_primary_hosts() or c.summer_hosts)[0]
    c.crash(victim, "summer")
    _hold(c, 1.5)
    return Injected(f"summer@{victim.name}", lambda: c.release([(victim, "summer")]))


def _restart_all(c: NodeCluster, role: str, hosts: list[Host]) -> Injected:
    pairs = [(h, role) for h in hosts]
    try:
        c.stop(pairs)
    except ClusterError:
        c.release(pairs)  # The trial fails; the next one starts from a whole cluster.
        raise
    time.sleep(1)
    return Injected(f"every {role}", lambda: c.release(pairs))


def brokers_restart(c: NodeCluster) -> Injected:
    return _restart_all(c, "broker", c.broker_hosts)


def summers_restart(c: NodeCluster) -> Injected:
    return _restart_all(c, "summer", c.summer_hosts)


def isolate_host(c: NodeCluster) -> Injected:
    victim = _serving_host(c)
    suspects = c.suspects(victim)
    c.net.isolate(victim)
    _hold(c, 2)
    return Injected(victim.name, lambda: c.net.heal(victim), suspects)


def split_2_3(c: NodeCluster) -> Injected:
    hosts = c.net.hosts
    a, b = hosts[:2], hosts[2:]
    c.net.partition([a, b])
    _hold(c, 2)
    names = f"{','.join(h.name for h in a)} | {','.join(h.name for h in b)}"
    return Injected(names, c.net.heal_all)


def drop_one_way(c: NodeCluster) -> Injected:
    route = _route(c)
    src, dst = route[0], route[1]
    c.net.drop(src, dst)
    _hold(c, 2)
    return Injected(f"{src.name} -> {dst.name}", c.net.heal_all)


def isolate_etcd_leader(c: NodeCluster) -> Injected:
    victim = c.etcd_leader()
    if victim is None:
        raise ClusterError("the etcd members do not agree on a leader")
    c.net.isolate(victim)
    _hold(c, 2)
    return Injected(victim.name, lambda: c.net.heal(victim))


def pause_host(c: NodeCluster) -> Injected:
    victim = _serving_host(c)
    suspects = c.suspects(victim)
    victim.pause()
    _hold(c, 2)
    return Injected(victim.name, victim.resume, suspects)


ACTIONS: dict[str, Callable[[NodeCluster], Injected]] = {
    "etcd-crash": etcd_crash,
    "broker-crash": broker_crash,
    "brokers-crash": brokers_crash,
    "summer-crash": summer_crash,
    "brokers-restart": brokers_restart,
    "summers-restart": summers_restart,
    "isolate-host": isolate_host,
    "split-2-3": split_2_3,
    "drop-one-way": drop_one_way,
    "isolate-etcd-leader": isolate_etcd_leader,
    "pause-host": pause_host,
}
