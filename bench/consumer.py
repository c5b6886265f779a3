"""Consumer benchmark: messages/s per shard, end-to-end latency at 1k msg/s, graceful hand-off.

Real etcd, one broker and `gazette-consumer` processes of `bench/apps/consumer_bench_app.py`
(`Echo`: counts messages per key in a RocksDB store recorded through fusefs, and republishes
each message exactly once) on this machine.

1. Throughput: N `Ping` messages are published first; one shard (no standby, no output)
   then consumes them. Figure: messages/s from the shard becoming PRIMARY until Stat reports
   the input read through. Baseline, same run: an in-process read-committed reader
   (`ReadCommittedIter`: read, decode, sequence) over the same journal; `ratio_throughput` is
   the shard's rate over the reader's (the cost of transactions, the store and the log).
2. Latency: a second shard (hot_standbys 1, two processes) echoes Pings published at 1k msg/s
   (one every millisecond, stamped when published) as Pongs (publish_uncommitted); a
   downstream read-committed reader takes each Pong's arrival minus its Ping's send time:
   publisher batching, publish, read, transaction, RocksDB commit to the recovery log, ACK,
   downstream read. Measured twice: with the feeder's Publisher lingering `LINGER` (5 ms, as
   Kafka producers do by default) to batch its appends (``p50_ms``, ``p99_ms``), then
   releasing each message as its own append (``*_unbatched``: ~1,000 append RPCs/s, which
   with the broker's share take ~1 of this machine's 2 cores away from the pipeline measured).
   ``txn_phase_ms``: the linger phase's transactions on the primary, from its /debug/metrics:
   mean milliseconds per transaction of each phase, and how many transactions ran.
3. Scaling with cores: 1, 2 and 4 shards, each reading its own journal of N Pings, spread
   by the allocator over one consumer process per core (the supported way to use a host's
   cores: several member processes); the shards are PRIMARY on empty journals before the
   Pings land in all of them at once. Figures: the host's messages/s, each shard's,
   ``ratio_4_shards_over_1`` (the host's rate with 4 shards over its rate with 1), and
   ``cpu_us_per_msg``: the CPU time meanwhile of each kind of process (consumer, fusefs
   server, broker, etcd, this script's appends and Stat calls), per message.
4. Hand-off: while (2) runs, the primary gets SIGTERM; the standby takes over. Figure: the
   longest gap between consecutive Pong arrivals around it (at 1k msg/s the normal gap is a
   transaction), and the time from SIGTERM until the standby reports PRIMARY.

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
import collections
import json
import tempfile
import time
from pathlib import Path

import aiohttp
import grpc.aio
from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import AppendService, JournalClient, append, apply_journals
from gazette.broker.client.reader import write_head
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.iterators import ReadCommittedIter
from gazette.message.publisher import Publisher
from gazette.testing.broker import BrokerProcess
from gazette.testing.consumer import ConsumerProcess
from gazette.testing.etcd import EtcdServer

APPS = Path(__file__).resolve().parent / "apps"
sys.path.insert(0, str(APPS))
from consumer_bench_app import Ping, Pong  # noqa: E402
from pings import journal_bytes, publish_pings  # noqa: E402

ROOT = "/bench-consumer"
LINGER = 0.005
"""The feeder's `Publisher` linger for the headline latency (Kafka's default linger.ms is 5)."""
RECOVERYLOG = "application/x-gazette-recoverylog"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def journal(name: str, store: Path, content_type: str) -> bpb.JournalSpec:
    frag = bpb.JournalSpec.Fragment(
        length=1 << 26, compression_codec=bpb.NONE, refresh_interval=Duration(seconds=60)
    )
    frag.stores.append(f"file://{store}/")
    spec = bpb.JournalSpec(name=name, replication=1, fragment=frag)
    spec.labels.labels.add(name="content-type", value=content_type)
    return spec


def shard(sid: str, source: str, standbys: int) -> pb.ShardSpec:
    return pb.ShardSpec(
        id=sid,
        sources=[pb.ShardSpec.Source(journal=source)],
        recovery_log_prefix="bench/recovery",
        hint_prefix="/bench-consumer-hints",
        hint_backups=1,
        max_txn_duration=Duration(seconds=1),
        hot_standbys=standbys,
    )


def echo_process(
    etcd: EtcdServer,
    broker: BrokerProcess,
    tmp: Path,
    suffix: str,
    args: list[str] | None = None,
    *,
    zone: str = "local",
    output: str = "",
) -> ConsumerProcess:
    """A `gazette-consumer` of the Echo app, republishing to `output` if given (and then
    draining for up to 30 s when stopped, for the hand-off)."""
    return ConsumerProcess(
        "consumer_bench_app:Echo",
        etcd.endpoint,
        [broker.endpoint],
        root=ROOT,
        zone=zone,
        suffix=suffix,
        workdir=tmp / suffix,
        extra_env={"PYTHONPATH": str(APPS), "ECHO_OUTPUT": output},
        extra_args=["--drain-timeout", "30" if output else "0", "--log-level", "WARNING"]
        + (args or []),
    )


async def statuses(stub: pb_grpc.ShardStub, sid: str) -> list[int]:
    try:
        resp = await stub.List(pb.ListRequest())
    except grpc.aio.AioRpcError:
        return []
    for s in resp.shards:
        if s.spec.id == sid:
            return sorted(st.code for st in s.status)
    return []


async def wait_status(
    stub: pb_grpc.ShardStub, sid: str, want: list[int], timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while await statuses(stub, sid) != sorted(want):
        if time.monotonic() > deadline:
            raise TimeoutError(f"shard {sid} did not reach {want}")
        await asyncio.sleep(0.01)


async def baseline_rate(client: JournalClient, name: str, n: int, end: int) -> float:
    """Messages/s of an in-process read-committed reader over the same messages."""
    req = bpb.ReadRequest(journal=name, offset=0, end_offset=end, block=True)
    it = ReadCommittedIter(client, req, None, lambda _s: Ping())
    got = 0
    t0 = time.perf_counter()
    try:
        while True:
            try:
                await it.next()
            except StopAsyncIteration:
                break
            got += 1
    finally:
        it.close()
    assert got == n, (got, n)
    return n / (time.perf_counter() - t0)


async def throughput(
    client: JournalClient, etcd: EtcdServer, broker: BrokerProcess, tmp: Path, n: int
) -> tuple[float, float]:
    await publish_pings(client, "bench/in-tput", n)
    head = await write_head(client, "bench/in-tput")
    base = max([await baseline_rate(client, "bench/in-tput", n, head) for _ in range(2)])
    say(f"throughput: baseline read-committed reader {base:,.0f} msg/s")
    c = echo_process(etcd, broker, tmp, "tput").start()
    try:
        async with grpc.aio.insecure_channel(c.endpoint) as ch:
            stub = pb_grpc.ShardStub(ch)
            req = pb.ApplyRequest(
                changes=[pb.ApplyRequest.Change(upsert=shard("tput", "bench/in-tput", 0))]
            )
            assert (await stub.Apply(req)).status == pb.OK
            await wait_status(stub, "tput", [pb.ReplicaStatus.PRIMARY])
            t0 = time.perf_counter()
            resp = await stub.Stat(
                pb.StatRequest(shard="tput", read_through={"bench/in-tput": head}), timeout=300
            )
            rate = n / (time.perf_counter() - t0)
            assert resp.status == pb.OK
            req = pb.ApplyRequest(
                changes=[pb.ApplyRequest.Change(delete="tput", expect_mod_revision=-1)]
            )
            await stub.Apply(req)
    finally:
        c.kill()
    say(f"throughput: one shard {rate:,.0f} msg/s ({rate / base:.2f} of the baseline)")
    return rate, base


def tree_cpu() -> dict[int, tuple[str, float]]:
    """This process and each living descendant: its role and its user + system CPU seconds
    so far. The role is the module a Python process runs with ``-m``, the program's name of
    any other (etcd), or else its parent's (a fusefs server's mount guardian)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    todo = [(os.getpid(), "bench")]
    while todo:
        pid, parent = todo.pop()
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            kids = [
                int(k)
                for task in Path(f"/proc/{pid}/task").iterdir()
                for k in (task / "children").read_text().split()
            ]
        except OSError:
            continue  # It exited.
        if pid == os.getpid():
            role = parent
        elif len(argv) > 2 and argv[1] == "-m":
            role = argv[2].removeprefix("gazette.").removesuffix(".main")
        elif not os.path.basename(argv[0]).startswith("python"):
            role = os.path.basename(argv[0])
        else:
            role = parent
        out[pid] = (role, (int(fields[11]) + int(fields[12])) / tick)
        todo += [(kid, role) for kid in kids]
    return out


def cpu_split(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], messages: int
) -> dict[str, float]:
    """CPU microseconds per message of each role between two `tree_cpu` readings."""
    total: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        total[role] = total.get(role, 0.0) + cpu - before.get(pid, (role, 0.0))[1]
    return {role: round(cpu * 1e6 / messages, 2) for role, cpu in sorted(total.items())}


async def primary_endpoints(stub: pb_grpc.ShardStub, ids: list[str]) -> dict[str, str] | None:
    """Each shard's primary's endpoint, once every one of `ids` has a PRIMARY (else None)."""
    try:
        resp = await stub.List(pb.ListRequest())
    except grpc.aio.AioRpcError:
        return None
    out = {}
    for s in resp.shards:
        r = s.route
        if s.spec.id in ids and r.primary >= 0 and len(r.endpoints) > r.primary:
            if any(st.code == pb.ReplicaStatus.PRIMARY for st in s.status):
                out[s.spec.id] = r.endpoints[r.primary].split("://", 1)[-1]
    return out if len(out) == len(ids) else None


async def scaling(
    client: JournalClient, etcd: EtcdServer, broker: BrokerProcess, tmp: Path, n: int
) -> dict[str, object]:
    """Shards on every core of the host: 1, 2 and 4 shards, spread by the allocator over one
    consumer process per core, each consuming its own journal of the same `n` Pings. The
    shards start on empty journals; once all are PRIMARY, each journal gets the Pings' bytes
    in one append (published once, beforehand), so every shard starts consuming at once.
    Per count: each shard's rate (its messages over the time from those appends to its Stat
    reporting them read through) and the host's (all messages over the time to the last)."""
    counts = (1, 2, 4)
    cores = os.cpu_count() or 1
    store = tmp / "fragments"
    template = "bench/in-scale"
    ids_of = {c: [f"scale-{c}-{k}" for k in range(c)] for c in counts}
    every = [sid for ids in ids_of.values() for sid in ids]
    await apply_journals(
        client,
        bpb.ApplyRequest(
            changes=[
                bpb.ApplyRequest.Change(upsert=journal(name, store, CONTENT_TYPE_JSON_LINES))
                for name in [template, *(f"bench/in-{sid}" for sid in every)]
            ]
            + [
                bpb.ApplyRequest.Change(upsert=journal(f"bench/recovery/{sid}", store, RECOVERYLOG))
                for sid in every
            ]
        ),
    )
    await publish_pings(client, template, n)
    data = await journal_bytes(client, template)
    # Each shard starts its own fusefs process before it is PRIMARY; none is started ahead to
    # replace it (~0.45 s of CPU each) while the shards are measured.
    procs = [
        echo_process(etcd, broker, tmp, f"scale{i}", ["--fusefs-prestart", "0"]).start()
        for i in range(cores)
    ]
    out: dict[str, object] = {"processes": cores, "msgs_per_shard": n}
    try:
        async with grpc.aio.insecure_channel(procs[0].endpoint) as ch:
            stub = pb_grpc.ShardStub(ch)
            for count in counts:
                ids = ids_of[count]
                sources = {sid: f"bench/in-{sid}" for sid in ids}
                specs = [shard(sid, sources[sid], 0) for sid in ids]
                req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=sp) for sp in specs])
                assert (await stub.Apply(req)).status == pb.OK
                deadline = time.monotonic() + 60
                while (endpoints := await primary_endpoints(stub, ids)) is None:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"shards {ids} did not all become PRIMARY")
                    await asyncio.sleep(0.01)
                cpu0 = tree_cpu()
                t0 = time.perf_counter()

                async def through(
                    sid: str, endpoint: str, t0: float = t0, sources: dict[str, str] = sources
                ) -> float:
                    await append(client, bpb.AppendRequest(journal=sources[sid]), data)
                    async with grpc.aio.insecure_channel(endpoint) as c:
                        req = pb.StatRequest(shard=sid, read_through={sources[sid]: len(data)})
                        resp = await pb_grpc.ShardStub(c).Stat(req, timeout=300)
                        assert resp.status == pb.OK, resp
                    return time.perf_counter() - t0

                times = await asyncio.gather(*(through(sid, endpoints[sid]) for sid in ids))
                cpu = cpu_split(cpu0, tree_cpu(), count * n)
                per_shard = sorted(round(n / t) for t in times)
                host = count * n / max(times)
                out[f"shards_{count}"] = {
                    "host_msgs_per_s": round(host),
                    "per_shard_msgs_per_s": per_shard,
                    "shards_per_process": sorted(
                        collections.Counter(endpoints.values()).values(), reverse=True
                    ),
                    "cpu_us_per_msg": cpu,
                }
                say(f"scaling: {count} shard(s): host {host:,.0f} msg/s, per shard {per_shard}")
                say(f"  CPU µs per message: {cpu}")
                req = pb.ApplyRequest(
                    changes=[
                        pb.ApplyRequest.Change(delete=sid, expect_mod_revision=-1) for sid in ids
                    ]
                )
                assert (await stub.Apply(req)).status == pb.OK
    finally:
        for p in procs:
            p.kill()
    one = out["shards_1"]["host_msgs_per_s"]  # type: ignore[index]
    four = out["shards_4"]["host_msgs_per_s"]  # type: ignore[index]
    out["ratio_4_shards_over_1"] = round(four / one, 2)
    return out


async def txn_phases(procs: list[ConsumerProcess]) -> dict[str, tuple[float, dict[str, float]]]:
    """Per process: the echo shard's transactions and seconds per phase (its metrics)."""
    out: dict[str, tuple[float, dict[str, float]]] = {}
    async with aiohttp.ClientSession() as http:
        for p in procs:
            async with http.get(f"{p.http_endpoint}/debug/metrics") as resp:
                text = await resp.text()
            txns, phases = 0.0, {}
            for line in text.splitlines():
                if line.startswith('gazette_shard_transactions_total{shard="echo"}'):
                    txns = float(line.rsplit(" ", 1)[1])
                elif line.startswith('gazette_shard_phase_seconds_total{shard="echo"'):
                    phase = line.split('phase="', 1)[1].split('"', 1)[0]
                    phases[phase] = float(line.rsplit(" ", 1)[1])
            out[p.suffix] = (txns, phases)
    return out


def per_txn_phases(
    before: dict[str, tuple[float, dict[str, float]]],
    after: dict[str, tuple[float, dict[str, float]]],
) -> dict[str, float]:
    """Mean milliseconds per transaction of each phase, on the process that ran them."""
    suffix = max(after, key=lambda k: after[k][0] - before.get(k, (0.0, {}))[0])
    txns0, phases0 = before.get(suffix, (0.0, {}))
    txns1, phases1 = after[suffix]
    n = max(txns1 - txns0, 1.0)
    out = {k: round((v - phases0.get(k, 0.0)) * 1000 / n, 2) for k, v in sorted(phases1.items())}
    out["transactions"] = n
    return out


async def latency_and_handoff(
    client: JournalClient, etcd: EtcdServer, broker: BrokerProcess, tmp: Path, seconds: float
) -> tuple[dict[float, tuple[float, float]], float, float, dict[str, float]]:
    procs = [
        echo_process(etcd, broker, tmp, f"echo-{i}", zone=f"z{i}", output="bench/out").start()
        for i in range(2)
    ]
    arrivals: list[tuple[float, float]] = []  # (arrival, latency)
    stop = asyncio.Event()

    async def downstream() -> None:
        req = bpb.ReadRequest(journal="bench/out", offset=0, block=True)
        it = ReadCommittedIter(client, req, None, lambda _s: Pong())
        try:
            while not stop.is_set():
                env = await it.next()
                if env.message.sent_ns:
                    now = time.time_ns()
                    arrivals.append((time.monotonic(), (now - env.message.sent_ns) / 1e6))
        finally:
            it.close()

    async def feed(linger: float, done: asyncio.Event) -> None:
        """Publish a Ping every millisecond until `done`, each stamped when published."""
        async with AppendService(client) as svc:
            pub = Publisher(svc, linger=linger)
            mapping = lambda _m: ("bench/in-echo", CONTENT_TYPE_JSON_LINES)  # noqa: E731
            t0 = time.monotonic()
            i = 0
            while not done.is_set():
                pub.publish_committed(mapping, Ping(f"k{i % 100}", time.time_ns()))
                i += 1
                await asyncio.sleep(max(0.0, t0 + i / 1000 - time.monotonic()))
            await pub.barrier()

    async def measure(linger: float) -> tuple[float, float]:
        """p50 and p99 latency (ms) over `seconds` of feeding with `linger`."""
        done = asyncio.Event()
        feeder = asyncio.create_task(feed(linger, done))
        begin = len(arrivals)
        await asyncio.sleep(seconds)
        done.set()
        await feeder
        steady = sorted(lat for _, lat in arrivals[begin + (len(arrivals) - begin) // 5 :])
        p50 = steady[len(steady) // 2]
        p99 = steady[int(len(steady) * 0.99)]
        say(
            f"latency at 1k msg/s, publisher linger {linger * 1000:g} ms: p50 {p50:.1f} ms, "
            f"p99 {p99:.1f} ms over {len(steady)} messages"
        )
        return p50, p99

    try:
        chans = [grpc.aio.insecure_channel(p.endpoint) for p in procs]
        stubs = [pb_grpc.ShardStub(ch) for ch in chans]
        req = pb.ApplyRequest(
            changes=[pb.ApplyRequest.Change(upsert=shard("echo", "bench/in-echo", 1))]
        )
        assert (await stubs[0].Apply(req)).status == pb.OK
        await wait_status(stubs[0], "echo", [pb.ReplicaStatus.STANDBY, pb.ReplicaStatus.PRIMARY])
        reader = asyncio.create_task(downstream())
        lat = {0.0: await measure(0.0)}
        before = await txn_phases(procs)
        lat[LINGER] = await measure(LINGER)
        after = await txn_phases(procs)
        phase_ms = per_txn_phases(before, after)
        say(
            "transactions of the linger phase (the primary's /debug/metrics), mean ms each: "
            + ", ".join(f"{k} {v}" for k, v in phase_ms.items())
        )
        feeding = asyncio.Event()
        feeder = asyncio.create_task(feed(LINGER, feeding))
        await asyncio.sleep(1.0)

        resp = await stubs[0].List(pb.ListRequest())
        route = resp.shards[0].route
        victim_suffix = route.members[route.primary].suffix
        victim = next(i for i, p in enumerate(procs) if p.suffix == victim_suffix)
        other = 1 - victim
        before = len(arrivals)
        t0 = time.monotonic()
        stopping = asyncio.ensure_future(asyncio.to_thread(procs[victim].stop))
        while await statuses(stubs[other], "echo") != [pb.ReplicaStatus.PRIMARY]:
            await asyncio.sleep(0.005)
        promoted = time.monotonic() - t0
        await stopping
        await asyncio.sleep(2.0)
        stop.set()
        feeding.set()
        await feeder
        reader.cancel()
        window = [t for t, _ in arrivals[max(before - 1, 0) :]]
        gap = (
            max(b - a for a, b in zip(window, window[1:], strict=False)) if len(window) > 1 else 0.0
        )
        say(
            f"graceful hand-off: standby PRIMARY {promoted:.2f}s after SIGTERM; "
            f"longest output gap {gap:.2f}s"
        )
        for ch in chans:
            await ch.close(None)
        return lat, gap, promoted, phase_ms
    finally:
        for p in procs:
            p.kill()


async def run(args: argparse.Namespace) -> dict[str, object]:
    n = 100_000 if args.quick else 400_000
    seconds = 8.0 if args.quick else 30.0
    with tempfile.TemporaryDirectory(prefix="bench-consumer-") as d:
        tmp = Path(args.keep or d)
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            return await _run_in(args, tmp, n, seconds)
        finally:
            _wait_unmounted(tmp)


def _wait_unmounted(tmp: Path, timeout: float = 10.0) -> None:
    """Wait until the fusefs mounts of killed consumers under `tmp` are gone (each unmounts
    itself when its parent dies), so that removing `tmp` does not walk into one."""
    from gazette.fusefs.mount import force_unmount, mounts_under

    deadline = time.monotonic() + timeout
    while mounts_under(tmp) and time.monotonic() < deadline:
        time.sleep(0.05)
    for mnt in mounts_under(tmp):
        force_unmount(mnt)


async def _run_in(args: argparse.Namespace, tmp: Path, n: int, seconds: float) -> dict[str, object]:
    store = tmp / "fragments"
    store.mkdir()
    with EtcdServer() as etcd, BrokerProcess(etcd.endpoint, spool_dir=tmp / "spool") as broker:
        async with JournalClient(broker.endpoint) as client:
            specs = [
                journal("bench/in-tput", store, CONTENT_TYPE_JSON_LINES),
                journal("bench/in-echo", store, CONTENT_TYPE_JSON_LINES),
                journal("bench/out", store, CONTENT_TYPE_JSON_LINES),
                journal("bench/recovery/tput", store, RECOVERYLOG),
                journal("bench/recovery/echo", store, RECOVERYLOG),
            ]
            await apply_journals(
                client,
                bpb.ApplyRequest(changes=[bpb.ApplyRequest.Change(upsert=s) for s in specs]),
            )
            rate, base = await throughput(client, etcd, broker, tmp, n)
            scale = await scaling(client, etcd, broker, tmp, n)
            lat, gap, promoted, phases = await latency_and_handoff(
                client, etcd, broker, tmp, seconds
            )
    return {
        "bench": "consumer",
        "msgs_per_s": round(rate),
        "baseline_msgs_per_s": round(base),
        "ratio_throughput": round(rate / base, 3),
        "p50_ms": round(lat[LINGER][0], 1),
        "p99_ms": round(lat[LINGER][1], 1),
        "p50_ms_unbatched": round(lat[0.0][0], 1),
        "p99_ms_unbatched": round(lat[0.0][1], 1),
        "publisher_linger_ms": LINGER * 1000,
        "handoff_gap_s": round(gap, 2),
        "handoff_promoted_s": round(promoted, 2),
        "txn_phase_ms": phases,
        "scaling": scale,
        "ratio_4_shards_over_1": scale["ratio_4_shards_over_1"],
        "target_4_shards_over_1": 1.8,
        "target_msgs_per_s": 50_000,
        "target_p99_ms": 50,
        "target_handoff_s": 0.5,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer messages, shorter phases")
    p.add_argument("--keep", default="", help="work in (and keep) this directory: logs")
    args = p.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
