"""Run every benchmark with `--quick` and write bench/RESULTS.md from the figures they print.

Each `bench/<name>.py` prints progress on stderr and, as the last line of its stdout, one JSON
object of figures. This script runs them one after another (they share the machine's cores, so
never two at once), takes that object, and writes one table per benchmark: its ratios and
targets first, then every other figure, under the date, the commit (`git rev-parse --short
HEAD`, marked when src/ or bench/ had uncommitted changes) and the machine (cores, CPU model,
memory, kernel). A benchmark that fails or prints no JSON is reported on the page as failed,
and the script then exits with status 1.

    python bench/results.py                 # every benchmark but the opt-in ones (peers)
    python bench/results.py sqlite rocksdb  # only these (the page then lists only these)
    python bench/results.py --out /tmp/r.md

The whole run takes several minutes of CPU; progress goes to stderr.
"""

from __future__ import annotations

import os.path
import sys

# bench/ holds scripts named after packages; keep it off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import collections
import datetime
import json
import os
import platform
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
TIMEOUT_S = 30 * 60  # A --quick run takes about a minute; a stuck one must not hang `make`.
STDERR_TAIL = 15  # Lines of a failed benchmark's stderr quoted on the page.


@dataclass(frozen=True)
class Bench:
    """What a benchmark measures and against what, as the page states it."""

    measures: str
    baseline: str
    headline: tuple[str, ...] = ()  # Figures listed with the ratios, besides `ratio*`/`target*`.
    opt_in: bool = False  # Run only when named: it installs from registries, or is slow.


BENCHES: dict[str, Bench] = {
    "broker": Bench(
        measures="One client's sequential 1 MiB appends to a real broker, 100-byte appends "
        "through `AppendService` and one at a time, and a read of the persisted fragments.",
        baseline="the same disk, same run: `ratio_append` is append MB/s over a sequential "
        "write + fdatasync of fresh data; `ratio_read` is read MB/s over a native sequential "
        "read of the same bytes.",
        headline=("append_mbps", "append_p50_ms", "append_p99_ms", "append_service_per_s"),
    ),
    "cluster": Bench(
        measures="1 MiB appends through the client to three brokers on this machine, rounds "
        "alternating between a replication-1 and a replication-3 journal.",
        baseline="the replication-1 journal in the same run: `ratio_r3_r1` is r3 MB/s over r1 "
        "MB/s (no target; the brokers share the client's cores, so it measures CPU, not "
        "network).",
        headline=("r1_mb_s", "r3_mb_s"),
    ),
    "consumer": Bench(
        measures="A RocksDB-backed shard's messages/s, 1, 2 and 4 shards over one consumer "
        "process per core, end-to-end latency at 1k msg/s through a shard and back, and the "
        "output's gap when its primary gets SIGTERM.",
        baseline="an in-process `ReadCommittedIter` over the same journal, same run "
        "(`ratio_throughput`); `ratio_4_shards_over_1` is the host's rate with 4 shards over "
        "its rate with 1 (target 1.8); latency and hand-off are absolute, against the targets.",
        headline=(
            "msgs_per_s",
            "ratio_4_shards_over_1",
            "p50_ms",
            "p99_ms",
            "handoff_gap_s",
            "handoff_promoted_s",
        ),
    ),
    "floor": Bench(
        measures="The cheapest recording there is: each commit's WAL bytes shipped over a bare "
        "gRPC Append-shaped call to a server doing only a broker's per-byte work; no Recorder, "
        "broker, FUSE or page store. The floor under the store ratios (docs/store-targets.md).",
        baseline="the database alone on local disk, same run, same workloads as "
        "bench/sqlite.py and bench/rocksdb.py (apsw `synchronous=FULL`, rocksdict "
        "`sync=True`); each figure is the median over the runs of mode time / native time.",
    ),
    "message": Bench(
        measures="Publishing 100-byte JSON messages (committed, and in transactions) to a real "
        "broker, and reading them back read-committed.",
        baseline="`json.dumps` of the same records into one buffer (publishing) and "
        "`json.loads` of each line (reading), same run.",
        headline=("publish_committed_per_s", "publish_uncommitted_per_s", "read_committed_per_s"),
    ),
    "message_framing": Bench(
        measures="Microseconds per ~100-byte message to marshal, decode, and decode + unmarshal, "
        "for the JSON-lines, CSV and fixed-protobuf framings.",
        baseline="none: absolute figures, each the best of several repeats.",
        headline=tuple(
            f"{framing}.{step}_us"
            for framing in ("json", "csv", "fixed")
            for step in ("marshal", "decode", "decode_unmarshal")
        ),
    ),
    "recorder": Bench(
        measures="Ops recorded by a `Recorder` to a real broker, timed until a barrier commits "
        "them: 100-byte writes back to back and one per event-loop turn, and 1 MiB writes.",
        baseline="the same bytes sent as 1 MiB appends through `AppendService`, same run "
        "(`ratio_write_1mib`); the small-op rates are absolute.",
        headline=("small_burst_ops_per_s", "small_per_turn_ops_per_s", "write_1mib_mbps"),
    ),
    "recoverylog": Bench(
        measures="The recovery log's decoder and FSM without I/O (write payload, small ops, the "
        "recording side), then a Player against a real broker: a write-heavy log, and a log of "
        "10x dead data played from hints.",
        baseline="a bare protobuf parse of the same frames (`ratio_small_ops_vs_parse`); a "
        "plain `RetryReader` of the same bytes (`ratio_playback_vs_read`); reading only the live "
        "byte ranges (`ratio_dead_data_playback_vs_live_read`, target <= 1.5).",
        headline=("payload_mb_per_s_median", "small_ops_per_s_median", "record_ops_per_s"),
    ),
    "rocksdb": Bench(
        measures="The RocksDB store (rocksdict on a fusefs mount, recording to a real broker): "
        "transactions of 1,000 puts, then 1,000 mixed ops (half reads), each committed.",
        baseline="native rocksdict on local disk, same run, same options, each WriteBatch "
        "written with `sync=True`; the 1.5 target is read on `ratio_write_consumer` and "
        "`ratio_mixed_consumer` (docs/store-targets.md).",
    ),
    "spark": Bench(
        measures="A RocksDB shard exported through the `gazette-shards` Spark source: written "
        "to Parquet, and aggregated over every column.",
        baseline="Spark's own Parquet reader over the same rows in the same session "
        "(`ratio_write`: target <= 2; `ratio_agg*`).",
        headline=("export_rows_per_s", "playback_s"),
    ),
    "sqlite": Bench(
        measures="The SQLite store recording to a real broker: a consumer-like workload "
        "(1,000-row transactions) and random upserts, in several commit modes.",
        baseline="native apsw on local disk with `synchronous=FULL`, same transactions, same "
        "run; the 1.25 target is read on the figure `target_for` names (docs/store-targets.md).",
    ),
    "sqlite_log": Bench(
        measures="Recovery-log bytes per transaction of a bike-share-like consumer (4 rides a "
        "transaction, per-station upserts) on the SQLite store, for page sizes, against the "
        "RocksDB store on the same transactions.",
        baseline="the RocksDB store's log in the same run: `ratio_*` is SQLite's bytes over "
        "RocksDB's (`ratio_default`: the store's default page size; `ratio_4k`: SQLite's "
        "4 KiB); no target (docs/sqlite-app.md).",
        headline=("rocksdb_bytes_per_txn", "sqlite_default_bytes_per_txn"),
    ),
    "peers": Bench(
        measures="A running count over 1,000 keys of JSON records by one RocksDB shard "
        "against Bytewax with SQLite recovery; SIGKILL recovery of each; 1 MiB and 1 KiB "
        "appends, each awaited, by one Python client against NATS JetStream's file store.",
        baseline="the peers themselves (PyPI `bytewax` 0.21, Debian `nats-server`), in "
        "interleaved rounds of the same run: `consumer_vs_bytewax` and `broker_*_vs_nats` "
        "are our rates over theirs (target >= 1.0), `consumer_vs_bytewax_cpu` their CPU per "
        "record over ours (consumer + fusefs + broker); `recovery_s` is SIGKILL to the restarted "
        "shard's first commit (target <= 1 s).",
        headline=(
            "consumer_vs_bytewax",
            "consumer_vs_bytewax_cpu",
            "recovery_s",
            "broker_1mib_vs_nats",
            "broker_1kib_vs_nats",
        ),
        opt_in=True,
    ),
    "security": Bench(
        measures="1 MiB appends, 100-byte appends through `AppendService`, and a full read, "
        "by the client library against a broker with TLS and authorization on, and against "
        "a plaintext broker, in alternating rounds.",
        baseline="the plaintext broker in the same run: `ratio_*` is the secured figure over "
        "the plaintext one as clients use it by default (direct appends); `ratio_*_vs_grpc` "
        "over plaintext gRPC. Target >= 0.83 (at most 1.2x the time).",
        headline=("secured_append", "plain_append", "secured_read", "plain_read"),
    ),
}


@dataclass
class Outcome:
    name: str
    started: datetime.datetime
    seconds: float
    load_before: float
    figures: dict[str, Any] | None = None
    failure: str = ""
    stderr_tail: list[str] = field(default_factory=list)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_bench(name: str) -> Outcome:
    """Run `bench/<name>.py --quick`, passing its stderr through; its last stdout line is JSON."""
    script = BENCH_DIR / f"{name}.py"
    say(f"== bench/{name}.py --quick")
    out = Outcome(
        name,
        datetime.datetime.now(datetime.UTC),
        0.0,
        os.getloadavg()[0],
    )
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(script), "--quick"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    stdout_lines: list[str] = []

    def relay_stderr(stream: IO[str]) -> None:
        for line in stream:
            sys.stderr.write(line)
            tail.append(line.rstrip("\n"))

    def keep_stdout(stream: IO[str]) -> None:
        stdout_lines.extend(stream)

    readers = [
        threading.Thread(target=relay_stderr, args=(proc.stderr,), daemon=True),
        threading.Thread(target=keep_stdout, args=(proc.stdout,), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        out.failure = f"no result within {TIMEOUT_S // 60} minutes (killed)"
    for reader in readers:
        reader.join(timeout=10)
    out.seconds = time.monotonic() - t0
    out.stderr_tail = list(tail)
    if not out.failure and proc.returncode != 0:
        out.failure = f"exit status {proc.returncode}"
    if not out.failure:
        lines = [line for line in stdout_lines if line.strip()]
        try:
            figures = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            figures = None
        if isinstance(figures, dict):
            out.figures = figures
        else:
            out.failure = "its last line of output is no JSON object"
    say(f"   {name}: {out.failure or 'ok'} in {out.seconds:.0f} s")
    return out


def flatten(figures: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects become dotted keys (`json.marshal_us`)."""
    flat: dict[str, Any] = {}
    for key, value in figures.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def show(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(show(v) for v in value)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value).replace("|", "\\|")


def table(rows: list[tuple[str, Any]]) -> list[str]:
    lines = ["| figure | value |", "|---|---|"]
    lines += [f"| `{key}` | {show(value)} |" for key, value in rows]
    return lines


def is_headline(key: str, bench: Bench) -> bool:
    last = key.rsplit(".", 1)[-1]
    return "ratio" in last or last.startswith("target") or key in bench.headline


def section(out: Outcome) -> list[str]:
    bench = BENCHES[out.name]
    when = out.started.strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## {out.name} (`bench/{out.name}.py --quick`)",
        "",
        bench.measures,
        "",
        f"Baseline: {bench.baseline}",
        "",
        f"Run {when}, {out.seconds:.0f} s, 1-minute load average {out.load_before:.2f} before.",
        "",
    ]
    if out.figures is None:
        lines += [f"**Failed:** {out.failure}. The last lines of its stderr:", "", "```"]
        lines += out.stderr_tail or ["(nothing)"]
        return [*lines, "```", ""]
    flat = flatten({k: v for k, v in out.figures.items() if k != "bench"})
    head = [(k, v) for k, v in flat.items() if is_headline(k, bench)]
    rest = [(k, v) for k, v in flat.items() if not is_headline(k, bench)]
    lines += table(head)
    if rest:
        lines += ["", "<details><summary>Every other figure</summary>", ""]
        lines += [*table(rest), "", "</details>"]
    return [*lines, ""]


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def machine() -> str:
    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return (
        f"{os.cpu_count()} cores, {model}, {mem_gib:.0f} GiB, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def page(outcomes: list[Outcome], commit: str) -> str:
    date = outcomes[0].started.strftime("%Y-%m-%d") if outcomes else "-"
    lines = [
        "# Benchmark results",
        "",
        "Generated by `python bench/results.py` (`make bench`), which runs each `bench/*.py "
        "--quick` and keeps the JSON figures it prints last. Do not edit by hand; older "
        "figures are in git (`git log -p bench/RESULTS.md`).",
        "",
        f"- Date: {date}",
        f"- Commit: `{commit}`",
        f"- Machine: {machine()}",
        "",
        "Every ratio is against a baseline measured in the same run, named under each "
        "benchmark; absolute figures are for this machine only. The machine's speed drifts by "
        "tens of percent within minutes, and its cores are shared with the processes a "
        "benchmark starts (etcd, brokers, fusefs): read one run's figures as a sample, and "
        "compare runs on the same machine.",
        "",
    ]
    failed = [o.name for o in outcomes if o.figures is None]
    if failed:
        lines += [f"**Failed in this run:** {', '.join(failed)} (see their sections).", ""]
    for out in outcomes:
        lines += section(out)
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = [name for name, bench in BENCHES.items() if not bench.opt_in]
    parser.add_argument(
        "names",
        nargs="*",
        help=f"benchmarks to run (default all but the opt-in ones: {', '.join(default)})",
    )
    parser.add_argument("--out", default=str(BENCH_DIR / "RESULTS.md"), help="page to write")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    scripts = {p.stem for p in BENCH_DIR.glob("*.py")} - {"results"}
    if missing := sorted(scripts - BENCHES.keys()):
        parser.error(f"bench/ has scripts this page does not describe: {', '.join(missing)}")
    commit = git("rev-parse", "--short", "HEAD")
    if git("status", "--porcelain", "--", "src", "bench", ":!bench/RESULTS.md"):
        commit += " (with uncommitted changes under src/ or bench/)"
    outcomes = [run_bench(name) for name in args.names or default]
    Path(args.out).write_text(page(outcomes, commit))
    say(f"wrote {args.out}")
    if any(o.figures is None for o in outcomes):
        sys.exit(1)


if __name__ == "__main__":
    main()
