"""Cluster benchmark: 1 MiB append throughput with replication 3 against replication 1, same run.

Three broker processes (zones zone-a, zone-b, zone-a) on one etcd, all on this machine. One
client appends 1 MiB blocks sequentially (each awaits its commit) through the client library
(`broker.client.append`, which dials the journal's primary from its route) to two journals:
`bench/r1` (replication 1) and `bench/r3` (replication 3: the primary forwards every chunk to
two replicas and commits once both acknowledged). Rounds alternate between the journals so
drift of this machine's speed hits both alike. The figure of interest is r3 MB/s over r1 MB/s;
the issue sets no numeric target for it.

The three brokers and the client share this machine's cores, so replication costs CPU the
client and the primary would otherwise have: the ratio measures that, not network latency.
Per-process CPU seconds per MiB are printed to show where the time goes.

Prints progress, then one JSON line. `--quick` runs in well under a minute.
"""

from __future__ import annotations

import os.path
import sys

# Keep this script's directory off the import path (bench/broker.py shadows package `broker`).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import (
    JournalClient,
    append,
    apply_journals,
    list_all_journals,
    name_selector,
)
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.testing.broker import BrokerProcess
from gazette.testing.cluster import BrokerCluster
from gazette.testing.etcd import EtcdServer

MiB = 1 << 20
ZONES = ["zone-a", "zone-b", "zone-a"]
JOURNALS = {"bench/r1": 1, "bench/r3": 3}


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(brokers: list[BrokerProcess]) -> dict[str, float]:
    snap = {"client": time.process_time()}
    for b in brokers:
        assert b.proc is not None
        snap[b.suffix] = cpu_seconds(b.proc.pid)
    return snap


def spec(name: str, replication: int, store: Path) -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name,
        replication=replication,
        labels=pb.LabelSet(labels=[pb.Label(name="app", value="bench-cluster")]),
        fragment=pb.JournalSpec.Fragment(
            length=64 * MiB,
            compression_codec=pb.NONE,
            stores=[f"file://{store}/"],
            refresh_interval=Duration(seconds=30),
        ),
    )


async def wait_routes(client: JournalClient, timeout: float = 30.0) -> dict[str, pb.Route]:
    """Wait until every bench journal has its R members and a primary; return the routes.

    Listing also fills the client's route cache, so the appends dial each primary directly.
    """
    deadline = time.monotonic() + timeout
    while True:
        routes = {}
        for name in JOURNALS:
            for j in await list_all_journals(client, name_selector(name)):
                routes[name] = j.route
        if all(
            name in routes and len(routes[name].members) == r and routes[name].primary >= 0
            for name, r in JOURNALS.items()
        ):
            return routes
        if time.monotonic() > deadline:
            raise SystemExit(f"journals not assigned within {timeout}s: {routes}")
        await asyncio.sleep(0.1)


def describe(route: pb.Route) -> str:
    members = [
        f"{m.zone}#{m.suffix}" + ("*" if i == route.primary else "")
        for i, m in enumerate(route.members)
    ]
    return " ".join(members)


async def append_round(client: JournalClient, journal: str, block: bytes, count: int) -> float:
    """Seconds to append `count` blocks one after another, each awaiting its commit."""
    req = pb.AppendRequest(journal=journal)
    t0 = time.perf_counter()
    for _ in range(count):
        resp = await append(client, req, block)
        assert resp.commit.end - resp.commit.begin == len(block), resp
    return time.perf_counter() - t0


@dataclass(frozen=True)
class Figures:
    """Append figures of one journal over all rounds."""

    mb_s: float
    rounds_mb_s: list[float]
    cpu_ms_per_mib: dict[str, float]  # per process: client, primary, and the other brokers


async def run(
    brokers: list[BrokerProcess], store: Path, per_round: int, rounds: int
) -> dict[str, Figures]:
    async with JournalClient([b.endpoint for b in brokers]) as client:
        await apply_journals(
            client,
            pb.ApplyRequest(
                changes=[
                    pb.ApplyRequest.Change(upsert=spec(n, r, store)) for n, r in JOURNALS.items()
                ]
            ),
        )
        routes = await wait_routes(client)
        for name, route in routes.items():
            say(f"  {name}: route {describe(route)} (* primary)")
        block = os.urandom(MiB)
        for name in JOURNALS:  # warm up channels, spools and the replication pipelines
            await append(client, pb.AppendRequest(journal=name), block)

        elapsed: dict[str, list[float]] = {name: [] for name in JOURNALS}
        cpu: dict[str, dict[str, float]] = {name: {} for name in JOURNALS}
        for i in range(rounds):
            for name in JOURNALS:
                before = cpu_snapshot(brokers)
                secs = await append_round(client, name, block, per_round)
                after = cpu_snapshot(brokers)
                elapsed[name].append(secs)
                for proc, t in after.items():
                    cpu[name][proc] = cpu[name].get(proc, 0.0) + t - before[proc]
                say(
                    f"  round {i + 1}/{rounds} {name}: {per_round} x 1 MiB in {secs:.2f}s, "
                    f"{per_round * MiB / secs / 1e6:.0f} MB/s"
                )
        routes = await wait_routes(client)
    mib = per_round * rounds
    out = {}
    for name, times in elapsed.items():
        primary = routes[name].members[routes[name].primary].suffix
        per_mib = {
            ("primary" if p == primary else p): round(t / mib * 1e3, 1)
            for p, t in sorted(cpu[name].items())
        }
        say(
            f"  {name}: CPU ms per MiB appended: "
            + ", ".join(f"{p} {t}" for p, t in per_mib.items())
        )
        out[name] = Figures(
            mb_s=mib * MiB / sum(times) / 1e6,
            rounds_mb_s=[per_round * MiB / t / 1e6 for t in times],
            cpu_ms_per_mib=per_mib,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run (< 1 minute)")
    args = parser.parse_args()
    per_round, rounds = (64, 4) if args.quick else (128, 6)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-cluster-", dir="/var/tmp") as tmp:
        tmpdir = Path(tmp)
        store = tmpdir / "store"
        store.mkdir()
        with EtcdServer() as etcd:
            # The bench ends by stopping every broker: nowhere to drain journals to (the
            # cluster's default --drain-timeout 0).
            cluster = BrokerCluster(
                etcd.endpoint, root="/gazette/bench-cluster", spool_root=tmpdir, zones=ZONES
            )
            brokers = cluster.brokers
            say(f"load average (1 min) before the run: {load:.2f} on {os.cpu_count()} cores")
            say(f"starting etcd and {len(brokers)} brokers (zones {', '.join(ZONES)}) ...")
            with cluster:
                say(f"appending {rounds} rounds of {per_round} x 1 MiB to each of r1, r3 ...")
                figures = asyncio.run(run(brokers, store, per_round, rounds))
    r1, r3 = figures["bench/r1"], figures["bench/r3"]
    say(f"  r1 {r1.mb_s:.0f} MB/s, r3 {r3.mb_s:.0f} MB/s, ratio r3/r1 {r3.mb_s / r1.mb_s:.2f}")
    result = {
        "bench": "cluster",
        "r1_mb_s": round(r1.mb_s),
        "r3_mb_s": round(r3.mb_s),
        "ratio_r3_r1": round(r3.mb_s / r1.mb_s, 2),
        "target": None,  # the issue asks for the ratio and sets no number
        "loadavg_1m_before": round(load, 2),
        "r1_rounds_mb_s": [round(x) for x in r1.rounds_mb_s],
        "r3_rounds_mb_s": [round(x) for x in r3.rounds_mb_s],
        "ratio_r3_r1_per_round": [
            round(a / b, 2) for a, b in zip(r3.rounds_mb_s, r1.rounds_mb_s, strict=True)
        ],
        "r1_cpu_ms_per_mib": r1.cpu_ms_per_mib,
        "r3_cpu_ms_per_mib": r3.cpu_ms_per_mib,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
