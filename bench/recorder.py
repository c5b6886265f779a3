"""Recorder benchmark: ops recorded to a real broker, timed until a barrier commits them.

- small_burst: 100-byte writes recorded back to back (the Recorder batches them), with
  `throttle` bounding what is uncommitted; ops/s.
- small_per_turn: one 100-byte write per event-loop turn (as a FUSE server records); ops/s.
- write_1mib: 1 MiB writes recorded back to back; MB/s of payload, against the same bytes
  sent as 1 MiB appends through the AppendService (the ratio isolates the Recorder's cost).

Starts etcd and a broker; prints one JSON line. `--quick` uses fewer ops.
"""

from __future__ import annotations

import os.path
import sys

# This script shares its name with no package, but keep its directory off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import AppendService, JournalClient, apply_journals
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.recorder import Recorder
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer

MiB = 1 << 20


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def make_journal(client: JournalClient, name: str, store: Path) -> str:
    frag = pb.JournalSpec.Fragment(
        length=256 * MiB, compression_codec=pb.NONE, refresh_interval=Duration(seconds=600)
    )
    frag.stores.append(f"file://{store}/")
    spec = pb.JournalSpec(name=name, replication=1, fragment=frag)
    await apply_journals(client, pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
    return name


async def small_burst(svc: AppendService, log: str, root: Path, n: int) -> tuple[float, int]:
    rec = await Recorder.open(FSM(), 0xB1, root, svc, log)
    rpcs = svc.rpc_count
    data = b"x" * 100
    t0 = time.perf_counter()
    f = rec.record_create("small")
    for i in range(n):
        rec.record_write(f, i * 100, data)
        if i % 1000 == 999:
            await rec.throttle(8 * MiB)
    await rec.barrier()
    rate = n / (time.perf_counter() - t0)
    return rate, svc.rpc_count - rpcs


async def small_per_turn(svc: AppendService, log: str, root: Path, n: int) -> tuple[float, int]:
    rec = await Recorder.open(FSM(), 0xB2, root, svc, log)
    rpcs = svc.rpc_count
    data = b"x" * 100
    t0 = time.perf_counter()
    f = rec.record_create("small")
    for i in range(n):
        rec.record_write(f, i * 100, data)
        await asyncio.sleep(0)
    await rec.barrier()
    rate = n / (time.perf_counter() - t0)
    return rate, svc.rpc_count - rpcs


async def write_1mib(svc: AppendService, log: str, root: Path, total: int) -> float:
    rec = await Recorder.open(FSM(), 0xB3, root, svc, log)
    block = os.urandom(MiB)
    t0 = time.perf_counter()
    f = rec.record_create("big")
    for i in range(total // MiB):
        rec.record_write(f, i * MiB, block)
        await rec.throttle(32 * MiB)
    await rec.barrier()
    return total / (time.perf_counter() - t0) / 1e6


async def service_1mib(svc: AppendService, log: str, total: int) -> float:
    block = os.urandom(MiB)
    t0 = time.perf_counter()
    last = None
    for i in range(total // MiB):
        a = svc.start_append(pb.AppendRequest(journal=log))
        a.write(block)
        last = a.release()
        if i % 32 == 31:
            await last.done()
    assert last is not None
    await last.done()
    return total / (time.perf_counter() - t0) / 1e6


async def run(endpoint: str, store: Path, root: Path, n_small: int, total: int) -> dict[str, float]:
    out: dict[str, float] = {}
    async with JournalClient(endpoint) as client, AppendService(client) as svc:
        for name in ("burst", "turn", "big", "plain"):
            await make_journal(client, f"bench/recorder-{name}", store)
        say(f"small_burst: {n_small} x 100 B ...")
        rate, rpcs = await small_burst(svc, "bench/recorder-burst", root, n_small)
        say(f"  {rate:.0f} ops/s in {rpcs} RPCs")
        out["small_burst_ops_per_s"], out["small_burst_rpcs"] = rate, rpcs
        n_turn = n_small // 4
        say(f"small_per_turn: {n_turn} x 100 B ...")
        rate, rpcs = await small_per_turn(svc, "bench/recorder-turn", root, n_turn)
        say(f"  {rate:.0f} ops/s in {rpcs} RPCs")
        out["small_per_turn_ops_per_s"], out["small_per_turn_rpcs"] = rate, rpcs
        say(f"write_1mib: {total // MiB} x 1 MiB ...")
        await service_1mib(svc, "bench/recorder-plain", 16 * MiB)  # Warm up.
        out["write_1mib_mbps"] = await write_1mib(svc, "bench/recorder-big", root, total)
        out["service_1mib_mbps"] = await service_1mib(svc, "bench/recorder-plain", total)
        say(
            f"  recorder {out['write_1mib_mbps']:.0f} MB/s, "
            f"plain AppendService {out['service_1mib_mbps']:.0f} MB/s"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run (< 1 minute)")
    args = parser.parse_args()
    n_small, total = (100_000, 128 * MiB) if args.quick else (400_000, 512 * MiB)
    with tempfile.TemporaryDirectory(prefix="bench-recorder-", dir="/var/tmp") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "store").mkdir()
        with EtcdServer() as etcd, BrokerProcess(etcd.endpoint, spool_dir=tmpdir / "spool") as b:
            fig = asyncio.run(run(b.endpoint, tmpdir / "store", tmpdir / "files", n_small, total))
    result = {
        "bench": "recorder",
        **{k: round(v) for k, v in fig.items()},
        "ratio_write_1mib": round(fig["write_1mib_mbps"] / fig["service_1mib_mbps"], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
