"""Peers benchmark: our consumer against Bytewax, our broker against NATS JetStream, side by
side on this machine in interleaved rounds.

The peers come from their ordinary registries, installed when absent (idempotent): Bytewax
(PyPI ``bytewax==0.21.*``) and the NATS client (PyPI ``nats-py``) into a virtualenv of their
own, ``.peers-venv/`` at the repository's root (env PEERS_VENV elsewhere); ``nats-server``
from Debian (``apt-get install nats-server``, after one ``apt-get update``).

1. Consumer vs Bytewax: a running count over 1,000 keys of N JSON records (N = 300k; 100k
   with --quick), durable state on both sides. The records are published once to one journal
   (publish time excluded) and the journal's bytes are written to a file, so both sides read
   the very same lines.
   - Ours: one `gazette-consumer` process of bench/apps/consumer_bench_app.py's `Echo`
     (counts per key in a RocksDB store recorded through fusefs to the broker; publishes
     nothing), one broker, one etcd. Each round is a new shard (one source journal, a new
     recovery log) on the running process, timed from its assignment (Apply) until Stat
     reports the input's write head read through, i.e. committed: shard start, playback of
     its empty log, every transaction and RocksDB commit. Also from PRIMARY, as
     bench/consumer.py times it.
   - Bytewax: bench/apps/peers_bytewax.py, one worker, FileSource over the file, the count
     in `stateful_flat_map` (emitting nothing), SQLite recovery partitions snapshotted at the
     end of every 1 s epoch (our transactions last up to 1 s: max_txn_duration); timed from
     `run_main` (after imports) to its return.
   `consumer_vs_bytewax`: our records/s over Bytewax's, per pair of rounds; the median and
   the spread of the pairs. `consumer_vs_bytewax_cpu`, the same per core: Bytewax's CPU
   seconds per record over ours, ours summing every process of our side (the consumer, its
   fusefs servers, the broker).
2. Recovery: our shard is SIGKILLed mid-stream (once half of the input is committed) and the
   process restarted at once under the same name (suffix, port, work directory).
   `recovery_s`: from SIGKILL to the shard's first commit past its recovered checkpoint
   (Stat read_through of that checkpoint + 1); `recovery_primary_s`: to PRIMARY again. For
   reference, Bytewax emitting every count to stdout is SIGKILLed half way (and after 1.5
   epochs, so that it has a snapshot: its input is the same file repeated to 600k records)
   and restarted on its recovery directory: `bytewax_first_output_s` from SIGKILL to its
   first output line, and how many counts it emitted twice (it replays from its last
   snapshot; we publish nothing twice). Bytewax's final counts are checked here; ours are
   exactly-once by construction, which the consumer's crash tests check.
3. Broker vs NATS JetStream: one Python client each, each message awaited before the next:
   our `append` (gazette.broker.client, direct appends as clients use by default) to a
   replication-1 journal of one broker (no --spool-sync: the spool is written, not fsynced,
   before the ack), against nats-py `js.publish` to a file-backed stream of one
   `nats-server` (JetStream's default file store: written, fsynced on a timer, never per
   ack; no fsync shows under strace during a run). 1 MiB and 1 KiB messages: MB/s, msgs/s,
   p50 latency, and each server's and client's CPU per message. `broker_1mib_vs_nats` and
   `broker_1kib_vs_nats`: our messages/s over NATS's, median of the rounds.

Rounds alternate which side goes first; at least two of each. The figures carry the load
average seen before and after: other work on the machine shows there.

    python bench/peers.py [--quick] [--rounds R] [--records N] [--py-spy DIR]
                          [--only consumer,recovery,broker]

--only runs the named comparisons alone (repeatable or a comma list; all three by default);
the JSON line then holds only their figures.

--py-spy DIR also records, in an extra round that is not measured, our consumer process and
then our broker with py-spy (installed into the project's venv if absent), writes the raw
stacks to DIR and summarises them (top functions by own and by total samples) on stderr and
under "profile". Progress goes to stderr; the last stdout line is one JSON object.

Not part of `make bench`'s default list (bench/results.py runs it only when named:
`python bench/results.py peers`) because it installs from PyPI and Debian. A run takes
1.3 minutes with --quick at load 6-9 (100k records, two rounds of each comparison) and
1.5 minutes without.
"""

from __future__ import annotations

import os.path
import sys

# bench/ holds scripts named after packages; keep it off the import path, and put the
# repository on it for the tests' journal specs.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc.aio
from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import JournalClient, append, apply_journals
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.testing.broker import BrokerProcess
from gazette.testing.consumer import ConsumerProcess
from gazette.testing.etcd import EtcdServer, free_port
from tests.kit.specs import RECOVERY_LOG, journal_spec

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
APPS = BENCH / "apps"
sys.path.insert(0, str(APPS))
from pings import journal_bytes, publish_pings  # noqa: E402

PEERS_VENV = Path(os.environ.get("PEERS_VENV", REPO / ".peers-venv"))
PEER_PACKAGES = ("bytewax==0.21.*", "nats-py")
KEYS = 1000
MiB = 1 << 20
INPUT = "peers/input"
ROOT = "/bench-peers"
EPOCH_S = 1.0  # Bytewax's epoch (snapshot) interval; our shards' max_txn_duration.
BYTEWAX_RECOVERY_RECORDS = 600_000  # At least this many in Bytewax's recovery input.


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- Installing the peers ---------------------------------------------------------------


def ensure_peers() -> Path:
    """The peers' virtualenv python, with Bytewax and nats-py; nats-server on PATH."""
    py = PEERS_VENV / "bin" / "python"
    probe = [str(py), "-c", "import bytewax, nats"]
    if not py.exists() or subprocess.run(probe, capture_output=True).returncode != 0:
        say(f"installing {' '.join(PEER_PACKAGES)} into {PEERS_VENV} (PyPI) ...")
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    if shutil.which("nats-server") is None:
        say("installing nats-server (Debian) ...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "nats-server"], check=True, env=env)
    return py


def ensure_py_spy() -> str:
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        say("installing py-spy into the project's venv (PyPI) ...")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], check=True)
    return str(exe)


# -- Figures -----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU time so far of each living descendant of `pid` (a shard's fusefs server)."""
    out: dict[int, float] = {}
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            for kid in kids:
                try:
                    out[kid] = cpu_seconds(kid)
                except OSError:
                    continue
                todo.append(kid)
    return out


def spread(values: list[float], digits: int = 3) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def p50(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


@contextmanager
def py_spy(exe: str, pid: int, out: Path) -> Iterator[None]:
    """py-spy recording `pid` (and its children) into `out` while the block runs."""
    cmd = [exe, "record", "--pid", str(pid), "--rate", "200", "--format", "raw"]
    cmd += ["--subprocesses", "--nonblocking", "--output", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attaches before sampling
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def summarize_profile(path: Path, top: int = 12) -> dict[str, Any]:
    """py-spy's raw stacks summarised: the share of samples in each process (the one
    profiled and its children, e.g. a shard's fusefs server), and within the profiled
    process the top functions and modules by own samples, the top source lines by own
    samples, and the top project functions (src/, bench/apps) by total samples."""
    procs: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    lines: collections.Counter[str] = collections.Counter()
    modules: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = main = 0
    for row in path.read_text().splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        samples += n
        frames = stack.split(";")
        owners = [f for f in frames if f.startswith("process ")]
        procs[_process(owners[-1])] += n
        if len(owners) > 1:
            continue
        main += n
        code = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not code:
            own["(no Python frame)"] += n
            continue
        leaf = code[-1]
        own[_frame(leaf)] += n
        lines[_frame(leaf, line=True)] += n
        modules[_frame(leaf).partition(" (")[2].rstrip(")")] += n
        for f in {_frame(f) for f in code if _is_ours(f)}:
            total[f] += n

    def pct(c: collections.Counter[str], of: int) -> dict[str, float]:
        return {f: round(100 * k / max(of, 1), 1) for f, k in c.most_common(top)}

    return {
        "samples": samples,
        "process_pct": pct(procs, samples),
        "own_pct": pct(own, main),
        "own_module_pct": pct(modules, main),
        "own_line_pct": pct(lines, main),
        "total_pct": pct(total, main),
    }


def _process(frame: str) -> str:
    """``process 12:"python -m gazette.fusefs.server ..."`` -> ``gazette.fusefs.server``."""
    words = frame.split('"', 1)[-1].split()
    return words[words.index("-m") + 1] if "-m" in words else words[0]


def _frame(frame: str, line: bool = False) -> str:
    """``func (src/message/mod.py:12)`` -> ``func (message/mod.py)``, or with its line."""
    name, _, where = frame.partition(" (")
    file, _, num = where.rstrip(")").rpartition(":")
    short = "/".join(file.split("/")[-2:])
    return f"{name} ({short}:{num})" if line else f"{name} ({short})"


def _is_ours(frame: str) -> bool:
    where = frame.partition(" (")[2]
    return where.startswith("src/") or "/gazette/" in where or "_bench_app" in where


def show_profile(title: str, prof: dict[str, Any]) -> None:
    say(f"{title}: {prof['samples']} samples")
    for kind, label in (
        ("process_pct", "per process"),
        ("own_pct", "own samples, per function"),
        ("own_module_pct", "own samples, per module"),
        ("own_line_pct", "own samples, per line"),
        ("total_pct", "total samples, per project function"),
    ):
        say(f"  {label}:")
        for f, p in prof[kind].items():
            say(f"    {p:5.1f}%  {f}")


# -- Consumer vs Bytewax -----------------------------------------------------------------


def shard_spec(sid: str) -> pb.ShardSpec:
    return pb.ShardSpec(
        id=sid,
        sources=[pb.ShardSpec.Source(journal=INPUT)],
        recovery_log_prefix="peers/recovery",
        hint_prefix=f"{ROOT}-hints",
        hint_backups=1,
        max_txn_duration=Duration(seconds=int(EPOCH_S)),
    )


async def publish_input(client: JournalClient, n: int, file: Path) -> int:
    """Publish `n` Pings over `KEYS` keys to INPUT and copy its bytes to `file`; its head."""
    await publish_pings(client, INPUT, n, KEYS)
    data = await journal_bytes(client, INPUT)
    file.write_bytes(data)
    assert data.count(b"\n") == n, (data.count(b"\n"), n)
    return len(data)


async def statuses(stub: pb_grpc.ShardStub, sid: str) -> list[int]:
    try:
        resp = await stub.List(pb.ListRequest())
    except grpc.aio.AioRpcError:
        return []
    for s in resp.shards:
        if s.spec.id == sid:
            return sorted(st.code for st in s.status)
    return []


async def until_primary(stub: pb_grpc.ShardStub, sid: str, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    while await statuses(stub, sid) != [pb.ReplicaStatus.PRIMARY]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"shard {sid} did not become PRIMARY")
        await asyncio.sleep(0.005)
    return time.monotonic()


async def add_shard(client: JournalClient, stub: pb_grpc.ShardStub, sid: str) -> None:
    log = journal_spec(f"peers/recovery/{sid}", content_type=RECOVERY_LOG, length=64 * MiB)
    await apply_journals(client, bpb.ApplyRequest(changes=[bpb.ApplyRequest.Change(upsert=log)]))
    req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=shard_spec(sid))])
    assert (await stub.Apply(req)).status == pb.OK


async def remove_shard(stub: pb_grpc.ShardStub, sid: str) -> None:
    req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(delete=sid, expect_mod_revision=-1)])
    await stub.Apply(req)


async def ours_round(
    client: JournalClient, stub: pb_grpc.ShardStub, sid: str, head: int, pids: dict[str, int]
) -> dict[str, float]:
    """One shard counting the whole input: seconds from assignment and from PRIMARY to the
    input committed, and the CPU seconds meanwhile of the consumer, its children (the shard's
    fusefs server) and the broker."""
    cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
    kids0 = children_cpu_seconds(pids["consumer"])
    t0 = time.monotonic()
    await add_shard(client, stub, sid)
    t1 = await until_primary(stub, sid)
    resp = await stub.Stat(pb.StatRequest(shard=sid, read_through={INPUT: head}), timeout=600)
    t2 = time.monotonic()
    assert resp.status == pb.OK, resp
    out = {"seconds": t2 - t0, "from_primary_s": t2 - t1}
    out |= {f"{k}_cpu_s": cpu_seconds(p) - cpu0[k] for k, p in pids.items()}
    kids = children_cpu_seconds(pids["consumer"])
    out["children_cpu_s"] = sum(c - kids0.get(k, 0.0) for k, c in kids.items())
    await remove_shard(stub, sid)
    return out


def run_peer(py: Path, script: str, *args: str) -> dict[str, Any]:
    """Run bench/apps/`script` under the peers' interpreter; the JSON of its last line."""
    done = subprocess.run([str(py), str(APPS / script), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{script} failed:\n{done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def bytewax_round(py: Path, file: Path, recovery: Path) -> dict[str, float]:
    return run_peer(py, "peers_bytewax.py", str(file), str(recovery), "--epoch", str(EPOCH_S))


async def consumer_vs_bytewax(
    client: JournalClient,
    stub: pb_grpc.ShardStub,
    py: Path,
    tmp: Path,
    n: int,
    head: int,
    rounds: int,
    pids: dict[str, int],
) -> dict[str, Any]:
    file = tmp / "input.jsonl"
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for r in range(rounds):

        async def run_ours(r: int = r) -> None:
            ours.append(await ours_round(client, stub, f"count-{r}", head, pids))
            o = ours[-1]
            say(
                f"  round {r + 1} ours: {n / o['seconds']:,.0f} records/s "
                f"({n / o['from_primary_s']:,.0f} from PRIMARY; CPU s: consumer "
                f"{o['consumer_cpu_s']:.1f}, its fusefs {o['children_cpu_s']:.1f}, "
                f"broker {o['broker_cpu_s']:.1f})"
            )

        async def run_bytewax(r: int = r) -> None:
            theirs.append(bytewax_round(py, file, tmp / f"bytewax-{r}"))
            b = theirs[-1]
            say(
                f"  round {r + 1} bytewax: {n / b['seconds']:,.0f} records/s "
                f"(CPU {b['cpu_seconds']:.1f} s)"
            )

        order: list[Callable[[], Any]] = [run_ours, run_bytewax]
        for step in order if r % 2 == 0 else reversed(order):
            await step()
    ratios = [b["seconds"] / o["seconds"] for o, b in zip(ours, theirs, strict=True)]
    # Per core: records per CPU second, ours counting every process of our side.
    cpu_ratios = [
        b["cpu_seconds"] / (o["consumer_cpu_s"] + o["children_cpu_s"] + o["broker_cpu_s"])
        for o, b in zip(ours, theirs, strict=True)
    ]
    say(f"consumer vs bytewax: {statistics.median(ratios):.2f}x (pairs {ratios})")
    say(f"  per CPU second: {statistics.median(cpu_ratios):.2f}x (pairs {cpu_ratios})")
    return {
        "consumer_vs_bytewax": round(statistics.median(ratios), 3),
        "consumer_vs_bytewax_spread": spread(ratios),
        "consumer_vs_bytewax_cpu": round(statistics.median(cpu_ratios), 3),
        "consumer_vs_bytewax_cpu_spread": spread(cpu_ratios),
        "ours_records_per_s": spread([n / o["seconds"] for o in ours], 0),
        "ours_records_per_s_from_primary": spread([n / o["from_primary_s"] for o in ours], 0),
        "bytewax_records_per_s": spread([n / b["seconds"] for b in theirs], 0),
        "ours_consumer_cpu_us_per_record": spread([o["consumer_cpu_s"] * 1e6 / n for o in ours], 1),
        "ours_fusefs_cpu_us_per_record": spread([o["children_cpu_s"] * 1e6 / n for o in ours], 1),
        "ours_broker_cpu_us_per_record": spread([o["broker_cpu_s"] * 1e6 / n for o in ours], 1),
        "bytewax_cpu_us_per_record": spread([b["cpu_seconds"] * 1e6 / n for b in theirs], 1),
    }


# -- Recovery ----------------------------------------------------------------------------


async def ours_recovery(
    client: JournalClient, proc: ConsumerProcess, sid: str, head: int
) -> dict[str, float]:
    """SIGKILL `proc` once half of the input is committed, restart it at once; seconds from
    the kill to: the restarted process ready, the shard PRIMARY, its first commit."""
    async with grpc.aio.insecure_channel(proc.endpoint) as ch:
        stub = pb_grpc.ShardStub(ch)
        await add_shard(client, stub, sid)
        await until_primary(stub, sid)
        await stub.Stat(pb.StatRequest(shard=sid, read_through={INPUT: head // 2}), timeout=300)
        t0 = time.monotonic()
        proc.kill()
    proc.start()
    ready = time.monotonic()
    async with grpc.aio.insecure_channel(proc.endpoint) as ch:
        stub = pb_grpc.ShardStub(ch)
        primary = await until_primary(stub, sid)
        resp = await stub.Stat(pb.StatRequest(shard=sid), timeout=60)
        checkpoint = resp.read_through[INPUT]
        if checkpoint < head:  # Else a commit past the recovered checkpoint read it all already.
            req = pb.StatRequest(shard=sid, read_through={INPUT: checkpoint + 1})
            await stub.Stat(req, timeout=60)
        commit = time.monotonic()
        resp = await stub.Stat(pb.StatRequest(shard=sid, read_through={INPUT: head}), timeout=600)
        assert resp.status == pb.OK and resp.read_through[INPUT] >= head, resp
        await remove_shard(stub, sid)
    figures = {"ready_s": ready - t0, "primary_s": primary - t0, "commit_s": commit - t0}
    say(
        "  ours after SIGKILL: process ready {ready_s:.2f} s, PRIMARY {primary_s:.2f} s, "
        "first commit past the checkpoint {commit_s:.2f} s".format(**figures)
    )
    return figures


def bytewax_recovery(py: Path, file: Path, recovery: Path, n: int) -> dict[str, float]:
    """SIGKILL Bytewax (emitting every count) half way through `file` and after at least
    1.5 epochs (so that a snapshot exists), restart it on the same recovery directory;
    seconds from the kill to its first output, and counts emitted twice."""
    cmd = [str(py), str(APPS / "peers_bytewax.py"), str(file), str(recovery)]
    cmd += ["--epoch", str(EPOCH_S), "--emit"]
    last: dict[str, int] = {}
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None
    emitted = 0
    started = 0.0
    for _line in first.stdout:
        emitted += 1
        started = started or time.monotonic()
        if emitted >= n // 2 and time.monotonic() - started >= 1.5 * EPOCH_S:
            break
    else:
        raise RuntimeError(f"bytewax finished {file} before it could be killed half way")
    t0 = time.monotonic()
    first.kill()
    first.wait()
    for _line in first.stdout:  # what it wrote before it died
        emitted += 1
    first.stdout.close()
    second = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert second.stdout is not None
    first_output = 0.0
    for line in second.stdout:
        if not first_output:
            first_output = time.monotonic() - t0
        emitted += 1
        key, count = line.split()
        last[key] = int(count)
    if second.wait() != 0:
        raise RuntimeError(f"bytewax's resumed run failed with {second.returncode}")
    assert sum(last.values()) == n and len(last) == KEYS, (sum(last.values()), len(last))
    figures = {"first_output_s": first_output, "reemitted": float(emitted - n)}
    say(
        f"  bytewax after SIGKILL: first output {first_output:.2f} s, "
        f"{emitted - n:,} counts emitted twice"
    )
    return figures


def counter_process(
    etcd: EtcdServer, broker: BrokerProcess, tmp: Path, suffix: str
) -> ConsumerProcess:
    """A started consumer of the counting app (`Echo` with no output), named `suffix`."""
    return ConsumerProcess(
        "consumer_bench_app:Echo",
        etcd.endpoint,
        [broker.endpoint],
        root=ROOT,
        suffix=suffix,
        workdir=tmp / suffix,
        extra_env={"PYTHONPATH": str(APPS), "ECHO_OUTPUT": ""},
        extra_args=["--drain-timeout", "0", "--log-level", "WARNING"],
    ).start()


async def recovery(
    client: JournalClient,
    etcd: EtcdServer,
    broker: BrokerProcess,
    py: Path,
    tmp: Path,
    n: int,
    head: int,
    rounds: int,
) -> dict[str, Any]:
    proc = counter_process(etcd, broker, tmp, "restarted")
    # Bytewax's input repeated until it lasts several epochs even while emitting each count,
    # so that it is killed after a snapshot (its first output after the restart does not
    # depend on the input's length).
    repeats = -(-BYTEWAX_RECOVERY_RECORDS // n)
    bw_input = tmp / "input-repeated.jsonl"
    with open(bw_input, "wb") as f:
        for _ in range(repeats):
            f.write((tmp / "input.jsonl").read_bytes())
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    try:
        for r in range(rounds):
            if r % 2 == 0:
                ours.append(await ours_recovery(client, proc, f"recover-{r}", head))
            theirs.append(bytewax_recovery(py, bw_input, tmp / f"bw-rec-{r}", n * repeats))
            if r % 2 == 1:
                ours.append(await ours_recovery(client, proc, f"recover-{r}", head))
    finally:
        proc.kill()
    return {
        "recovery_s": round(statistics.median(o["commit_s"] for o in ours), 2),
        "recovery_s_spread": spread([o["commit_s"] for o in ours], 2),
        "recovery_primary_s": spread([o["primary_s"] for o in ours], 2),
        "recovery_process_ready_s": spread([o["ready_s"] for o in ours], 2),
        "bytewax_first_output_s": spread([b["first_output_s"] for b in theirs], 2),
        "bytewax_reemitted": spread([b["reemitted"] for b in theirs], 0),
    }


# -- Broker vs NATS JetStream ------------------------------------------------------------


class NatsServer:
    """A `nats-server` with JetStream on a file store under `directory`, on 127.0.0.1."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def __enter__(self) -> NatsServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "nats.conf"
        # 1 MiB messages need a max_payload above the 1 MB default; all else is default.
        conf.write_text(
            f'listen: "127.0.0.1:{self.port}"\nmax_payload: 8MB\n'
            f'jetstream {{ store_dir: "{self.directory / "store"}" }}\n'
        )
        log = open(self.directory / "nats.log", "wb")
        self.proc = subprocess.Popen(
            ["nats-server", "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        deadline = time.monotonic() + 20
        while b"Server is ready" not in (self.directory / "nats.log").read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((self.directory / "nats.log").read_text()[-2000:])
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def ours_appends(
    client: JournalClient, journal: str, size: int, count: int
) -> dict[str, Any]:
    block = os.urandom(size)
    req = bpb.AppendRequest(journal=journal)
    await append(client, req, block)  # warm: route, connection, spool
    lat = []
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for _ in range(count):
        t = time.perf_counter()
        await append(client, req, block)
        lat.append(time.perf_counter() - t)
    return {
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - cpu0,
        "latencies": lat,
    }


def nats_appends(py: Path, url: str, stream: str, size: int, count: int) -> dict[str, Any]:
    return run_peer(py, "peers_nats.py", url, stream, str(size), str(count))


async def broker_vs_nats(
    client: JournalClient,
    broker: BrokerProcess,
    nats: NatsServer,
    py: Path,
    store: Path,
    rounds: int,
    sizes: dict[str, tuple[int, int]],
) -> dict[str, Any]:
    assert broker.proc is not None and nats.proc is not None
    servers = {"ours": broker.proc.pid, "nats": nats.proc.pid}
    got: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in range(rounds):
        for label, (size, count) in sizes.items():
            journal = f"peers/append-{label}-{r}"
            spec = journal_spec(journal, store, length=512 * MiB)
            await apply_journals(
                client, bpb.ApplyRequest(changes=[bpb.ApplyRequest.Change(upsert=spec)])
            )
            sides = ["ours", "nats"] if r % 2 == 0 else ["nats", "ours"]
            for side in sides:
                server0 = cpu_seconds(servers[side])
                if side == "ours":
                    f = await ours_appends(client, journal, size, count)
                else:
                    f = nats_appends(py, nats.url, f"append_{label}_{r}", size, count)
                f["server_cpu_seconds"] = cpu_seconds(servers[side]) - server0
                got[label, side].append(f)
                say(
                    f"  round {r + 1} {label} {side}: {count / f['seconds']:,.0f} msgs/s, "
                    f"{count * size / f['seconds'] / 1e6:,.1f} MB/s, "
                    f"p50 {p50(f['latencies']) * 1e3:.2f} ms"
                )
    out: dict[str, Any] = {}
    for label, (size, count) in sizes.items():
        ratios = [  # our messages/s over theirs, for the same count
            t["seconds"] / o["seconds"]
            for o, t in zip(got[label, "ours"], got[label, "nats"], strict=True)
        ]
        out[f"broker_{label}_vs_nats"] = round(statistics.median(ratios), 3)
        out[f"broker_{label}_vs_nats_spread"] = spread(ratios)
        for side in ("ours", "nats"):
            fs = got[label, side]
            out[f"{side}_{label}"] = {
                "msgs_per_s": spread([count / f["seconds"] for f in fs], 0),
                "mb_per_s": spread([count * size / f["seconds"] / 1e6 for f in fs], 1),
                "p50_ms": spread([p50(f["latencies"]) * 1e3 for f in fs], 3),
                "server_cpu_us_per_msg": spread(
                    [f["server_cpu_seconds"] * 1e6 / count for f in fs], 1
                ),
                "client_cpu_us_per_msg": spread([f["cpu_seconds"] * 1e6 / count for f in fs], 1),
            }
        say(f"broker vs nats, {label}: {out[f'broker_{label}_vs_nats']:.2f}x (pairs {ratios})")
    return out


# -- Profiles ----------------------------------------------------------------------------


async def profile(
    client: JournalClient,
    stub: pb_grpc.ShardStub | None,
    consumer: ConsumerProcess | None,
    broker: BrokerProcess,
    head: int,
    store: Path,
    out: Path,
    mib: int = 512,
    kib: int = 10_000,
) -> dict[str, Any]:
    """py-spy over an unmeasured round of each: our consumer process (with its children)
    counting the input (unless `consumer` is None), our broker taking `mib` 1 MiB appends and
    `kib` 1 KiB appends (enough samples at py-spy's 200 Hz)."""
    exe = ensure_py_spy()
    out.mkdir(parents=True, exist_ok=True)
    assert broker.proc is not None
    figures: dict[str, Any] = {}
    if consumer is not None and stub is not None:
        assert consumer.proc is not None
        pids = {"consumer": consumer.proc.pid, "broker": broker.proc.pid}
        with py_spy(exe, consumer.proc.pid, out / "consumer.txt"):
            await ours_round(client, stub, "count-profiled", head, pids)
        figures["consumer"] = summarize_profile(out / "consumer.txt")
        show_profile("py-spy, our consumer process over one round", figures["consumer"])
    # A journal for each size, so that neither profile sees the other's fragment persisted.
    specs = [journal_spec(f"peers/profiled-{k}", store, length=1 << 30) for k in ("mib", "kib")]
    await apply_journals(
        client, bpb.ApplyRequest(changes=[bpb.ApplyRequest.Change(upsert=s) for s in specs])
    )
    with py_spy(exe, broker.proc.pid, out / "broker-1mib.txt"):
        await ours_appends(client, specs[0].name, MiB, mib)
    with py_spy(exe, broker.proc.pid, out / "broker-1kib.txt"):
        await ours_appends(client, specs[1].name, 1024, kib)
    figures["broker_1mib"] = summarize_profile(out / "broker-1mib.txt")
    figures["broker_1kib"] = summarize_profile(out / "broker-1kib.txt")
    show_profile(f"py-spy, our broker over {mib} x 1 MiB appends", figures["broker_1mib"])
    show_profile(f"py-spy, our broker over {kib} x 1 KiB appends", figures["broker_1kib"])
    return figures


# -- Main --------------------------------------------------------------------------------


async def run(args: argparse.Namespace, py: Path, tmp: Path) -> dict[str, Any]:
    n = args.records
    sizes = {"1mib": (MiB, 32 if args.quick else 128), "1kib": (1024, 2000 if args.quick else 8000)}
    store = tmp / "fragments"
    out: dict[str, Any] = {"bench": "peers"}
    if args.only != set(COMPARISONS):
        out["only"] = sorted(args.only)
    with (
        EtcdServer() as etcd,
        BrokerProcess(etcd.endpoint, spool_dir=tmp / "spool") as broker,
        NatsServer(tmp / "nats") as nats,
    ):
        async with JournalClient(broker.endpoint) as client:
            head = 0
            if args.only & {"consumer", "recovery"}:
                spec = journal_spec(
                    INPUT, store, content_type=CONTENT_TYPE_JSON_LINES, length=1 << 30
                )
                await apply_journals(
                    client, bpb.ApplyRequest(changes=[bpb.ApplyRequest.Change(upsert=spec)])
                )
                say(f"publishing {n:,} records over {KEYS} keys (not timed) ...")
                head = await publish_input(client, n, tmp / "input.jsonl")
                out |= {"records": n, "keys": KEYS, "record_bytes": round(head / n, 1)}
            if "consumer" in args.only:
                consumer = counter_process(etcd, broker, tmp, "counter")
                try:
                    assert consumer.proc is not None and broker.proc is not None
                    pids = {"consumer": consumer.proc.pid, "broker": broker.proc.pid}
                    async with grpc.aio.insecure_channel(consumer.endpoint) as ch:
                        stub = pb_grpc.ShardStub(ch)
                        say(f"consumer vs bytewax, {args.rounds} rounds each ...")
                        out |= await consumer_vs_bytewax(
                            client, stub, py, tmp, n, head, args.rounds, pids
                        )
                        if args.py_spy:
                            out["profile"] = await profile(
                                client, stub, consumer, broker, head, store, args.py_spy
                            )
                finally:
                    consumer.kill()
            elif args.py_spy and "broker" in args.only:
                out["profile"] = await profile(client, None, None, broker, 0, store, args.py_spy)
            if "recovery" in args.only:
                say(f"recovery after SIGKILL, {args.recovery_rounds} round(s) each ...")
                out |= await recovery(client, etcd, broker, py, tmp, n, head, args.recovery_rounds)
            if "broker" in args.only:
                say(f"broker vs nats jetstream, {args.rounds} rounds each ...")
                out |= await broker_vs_nats(client, broker, nats, py, store, args.rounds, sizes)
    return out


def _wait_unmounted(tmp: Path, timeout: float = 10.0) -> None:
    """Wait until the fusefs mounts of killed consumers under `tmp` are gone (each unmounts
    itself when its parent dies), so that removing `tmp` does not walk into one."""
    from gazette.fusefs.mount import force_unmount, mounts_under

    deadline = time.monotonic() + timeout
    while mounts_under(tmp) and time.monotonic() < deadline:
        time.sleep(0.05)
    for mnt in mounts_under(tmp):
        force_unmount(mnt)


COMPARISONS = ("consumer", "recovery", "broker")

GUARANTEES = {
    "ours_consumer": "exactly-once state and output: each transaction's counts, the input "
    "offsets read through and any output commit atomically (RocksDB recorded to the broker)",
    "bytewax": "state snapshotted to SQLite at each 1 s epoch; on resume the input replays "
    "from the last snapshot and outputs since then are emitted again (at-least-once output)",
    "ours_broker": "replication 1, acknowledged once written to the spool (no fsync: no "
    "--spool-sync)",
    "nats": "JetStream file store, one server: acknowledged once written, fsynced on a "
    "timer (server default), never per message",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run, about a minute")
    parser.add_argument("--rounds", type=int, default=0, help="rounds of each side (>= 2)")
    parser.add_argument("--records", type=int, default=0, help="input records (300k)")
    parser.add_argument("--py-spy", type=Path, help="profile our side into this directory")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAMES",
        help=f"run only these comparisons ({', '.join(COMPARISONS)}; repeatable or a comma list)",
    )
    args = parser.parse_args()
    args.only = {name.strip() for arg in args.only for name in arg.split(",") if name.strip()}
    if unknown := args.only - set(COMPARISONS):
        parser.error(f"--only: unknown {', '.join(sorted(unknown))} (of {', '.join(COMPARISONS)})")
    args.only = args.only or set(COMPARISONS)
    args.rounds = max(2, args.rounds or (2 if args.quick else 3))
    args.records = args.records or (100_000 if args.quick else 300_000)
    args.recovery_rounds = 2
    py = ensure_peers()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as d:
        tmp = Path(d)
        try:
            out = asyncio.run(run(args, py, tmp))
        finally:
            _wait_unmounted(tmp)
    peers = {"ours_consumer", "bytewax"} if args.only & {"consumer", "recovery"} else set()
    peers |= {"ours_broker", "nats"} if "broker" in args.only else set()
    out["guarantees"] = {k: v for k, v in GUARANTEES.items() if k in peers}
    out["load_avg_1m"] = {"before": round(load0, 2), "after": round(os.getloadavg()[0], 2)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
