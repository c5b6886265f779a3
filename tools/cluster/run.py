"""The fault suite on the namespace cluster: stream-sum under load, faults, and checks.

Usage (root; iproute2, nsenter, etcd; ``make cluster`` runs the full schedule):

    python tools/cluster/run.py [--quick] [--secure] [--faults a,b] [--trials N] [--list]

Builds five hosts (`node_cluster.Layout`) with every process started by the node script,
then starts an appender logging each acknowledged append to a replication-3 journal, and for
each fault of the schedule (`fault_schedule`): starts a bounded stream-sum chunker, injects
the fault (`faults`), heals it, waits until every journal and shard has its full replica set
again (timing it), checks that the processes the fault cut off or paused past their lease
were fenced, waits for the chunker, runs the stream-sum verifier over the streams it
finished, and checks that every append acknowledged so far is still at its offsets. Prints a
table and a final JSON line; exits 1 on any violation, lost append, zombie not fenced or
failure. The Net is torn down whatever happens.

With ``--secure`` (``make cluster SECURE=1``) everything runs with TLS and authorization on:
a CA, each host's certificate (naming its address) and a key are made for the run
(`secured.Secured`) and handed to the node script through the node contract, and the
runner's clients (appender, chunker, verifier, gazctl, the convergence checks) present a
client certificate and sign with the key.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fault_schedule  # noqa: E402
import trial_table  # noqa: E402
from ack_check import JournalContent, longest_gap, lost_acks, parse_acks  # noqa: E402
from faults import ACTIONS  # noqa: E402
from node_cluster import (  # noqa: E402
    ACK_JOURNAL,
    EXAMPLES,
    NODE_SCRIPT,
    ClusterError,
    Layout,
    NodeCluster,
    Settings,
)
from secured import Secured  # noqa: E402

from gazette.broker.client.retry_reader import RetryReader  # noqa: E402
from gazette.broker.protocol import pb  # noqa: E402
from gazette.testing.netns import Net  # noqa: E402

STREAM_SUM = EXAMPLES / "stream-sum"
sys.path.insert(0, str(STREAM_SUM))

from stream_sum.record import load_record  # noqa: E402
from stream_sum.verifier import VerifyResult, verify_sums  # noqa: E402


@dataclass(frozen=True)
class Load:
    """A trial's chunker: `streams` streams of `chunks` chunks at `rate` chunks/s."""

    streams: int
    chunks: int
    concurrency: int
    rate: float


FULL_LOAD = Load(streams=300, chunks=10, concurrency=30, rate=150)
QUICK_LOAD = Load(streams=150, chunks=10, concurrency=20, rate=100)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Runner:
    def __init__(self, cluster: NodeCluster, work: Path, load: Load, timeout: float) -> None:
        self.cluster = cluster
        self.work = work
        self.load = load
        self.timeout = timeout
        self.acks_log = work / "acks.jsonl"
        self.appender: subprocess.Popen[bytes] | None = None

    def client_env(self) -> dict[str, str]:
        """The environment of the runner's client processes: the example on the path, and
        the cluster's TLS and keys if it is secured."""
        path = [str(STREAM_SUM), os.environ.get("PYTHONPATH", "")]
        return {
            **os.environ,
            **self.cluster.client_env(),
            "PYTHONPATH": os.pathsep.join(p for p in path if p),
        }

    def start_appender(self, max_s: float) -> None:
        self.acks_log.touch()
        self.appender = subprocess.Popen(
            [sys.executable, str(Path(__file__).parent / "appender.py"),
             "--broker", self.cluster.brokers_arg(), "--journal", ACK_JOURNAL,
             "--log", str(self.acks_log), "--rate", "20", "--max-seconds", f"{max_s:.0f}"],
            env=self.client_env(),
            stdout=open(self.work / "appender.log", "ab"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def stop_appender(self) -> None:
        if self.appender is not None and self.appender.poll() is None:
            self.appender.terminate()
            try:
                self.appender.wait(30)
            except subprocess.TimeoutExpired:
                self.appender.kill()
                self.appender.wait()

    def start_chunker(self, record: Path) -> subprocess.Popen[bytes]:
        ld = self.load
        return subprocess.Popen(
            [sys.executable, str(Path(__file__).parent / "chunker.py"),
             "--broker", self.cluster.brokers_arg(live_first=True),
             "--streams", str(ld.streams), "--chunks", str(ld.chunks),
             "--concurrency", str(ld.concurrency), "--rate", str(ld.rate),
             "--record", str(record), "--log-level", "warning"],
            env=self.client_env(),
            stdout=open(record.with_suffix(".log"), "ab"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_started(self, chunker: subprocess.Popen[bytes], record: Path) -> None:
        """Wait until the chunker wrote its record's header: it listed the partitions and
        read the sums journal's write head, which it does once, at start, through the
        first broker it is given (a fault then would fail it, not test anything)."""
        deadline = time.monotonic() + 60
        while not (record.exists() and record.stat().st_size > 0):
            if chunker.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"the chunker did not start (see {record.with_suffix('.log')})")
            time.sleep(0.1)

    async def _verify(self, record: Path) -> VerifyResult:
        async with self.cluster.journal_client(
            self.cluster.brokers_arg(live_first=True).split(",")
        ) as client:
            res = await verify_sums(client, [load_record(record)], timeout=self.timeout)
        for v in res.violations[:10]:
            say(f"  violation: {v}")
        say(f"  verifier: {res.summary()}")
        return res

    async def _read_acked(self, end: int) -> JournalContent:
        content = JournalContent()
        if end <= 0:
            return content
        req = pb.ReadRequest(journal=ACK_JOURNAL, offset=0, end_offset=end, block=True)
        async with self.cluster.journal_client(
            self.cluster.brokers_arg(live_first=True).split(",")
        ) as client:
            reader = RetryReader(client, req)
            try:
                while data := await asyncio.wait_for(reader.read(), self.timeout):
                    content.add(reader.offset - len(data), data)
            except TimeoutError:
                say(f"  ack read stalled at offset {reader.offset} of {end}")
            finally:
                reader.close()
        return content

    def check_acks(self) -> tuple[int, int]:
        acks = parse_acks(self.acks_log.read_text())
        content = asyncio.run(self._read_acked(max((a.end for a in acks), default=0)))
        lost = lost_acks(acks, content)
        for lo in lost[:10]:
            say(f"  {lo}")
        return len(acks), len(lost)

    def ack_times(self) -> list[float]:
        return [a.t for a in parse_acks(self.acks_log.read_text())]

    def trial(self, index: int, name: str) -> trial_table.TrialResult:
        result = trial_table.TrialResult(name)
        record = self.work / f"trial-{index:02d}-{name}.jsonl"
        chunker = self.start_chunker(record)
        t_start = time.time()
        try:
            self.wait_started(chunker, record)
            time.sleep(2)  # load flowing before the fault
            t_inject = time.monotonic()
            injected = ACTIONS[name](self.cluster)
            injected.heal()
            say(
                f"  injected on {injected.victims}, healed after {time.monotonic() - t_inject:.1f}s"
            )
            try:
                result.recovery_s = self.cluster.wait_converged(self.timeout)
                say(f"  converged {result.recovery_s:.1f}s after healing")
            except ClusterError as err:
                say(f"  {err}")
                result.failures.append(str(err))
            result.zombies = len(injected.suspects)
            for suspect in injected.suspects:
                fenced, how = self.cluster.fenced(suspect)
                result.zombies_fenced += fenced
                say(f"  {'fenced' if fenced else 'NOT FENCED'}: {how}")
            try:
                rc = chunker.wait(self.timeout * 2)
                if rc != 0:
                    result.failures.append(
                        f"chunker exited {rc} (see {record.with_suffix('.log')})"
                    )
            except subprocess.TimeoutExpired:
                result.failures.append("chunker did not finish its load in time")
                chunker.terminate()
                chunker.wait(30)
        except Exception as err:
            result.failures.append(f"{type(err).__name__}: {err}")
            say(traceback.format_exc())
        finally:
            if chunker.poll() is None:
                chunker.kill()
                chunker.wait()
        if record.exists() and record.stat().st_size > 0:
            res = asyncio.run(self._verify(record))
            result.streams_verified, result.streams_expected = res.verified, res.expected
            result.violations = len(res.violations)
            result.violation_kinds = dict(Counter(v.kind for v in res.violations))
            if res.violations:
                for line in asyncio.run(self.cluster.progress()):
                    say(f"  {line}")
        else:
            result.failures.append("the chunker left no record")
        result.acks_checked, result.acks_lost = self.check_acks()
        result.append_stall_s = longest_gap(self.ack_times(), t_start, time.time())
        if self.appender is not None and self.appender.poll() is not None:
            result.failures.append(f"the appender exited {self.appender.returncode}")
        return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one partition and one broker crash")
    p.add_argument("--faults", default="", help="comma-separated faults (see --list)")
    p.add_argument("--trials", type=int, default=1, help="times each fault is injected")
    p.add_argument("--lease-ttl", type=int, default=6, help="brokers' and summers' lease TTL")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to converge, verify")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    p.add_argument(
        "--secure", action="store_true", help="TLS and authorization on (certificates made for it)"
    )
    p.add_argument("--list", action="store_true", help="list the faults and exit")
    args = p.parse_args()
    if args.list:
        for f in fault_schedule.FAULTS:
            print(f"{f.name:20} {'(quick) ' if f.quick else ''}{f.tests}")
        return 0
    try:
        plan = fault_schedule.plan(quick=args.quick, only=args.faults, trials=args.trials)
    except ValueError as err:
        p.error(str(err))
    if os.geteuid() != 0 or not shutil.which("nsenter") or not shutil.which("ip"):
        p.error("needs root, iproute2 and nsenter")
    if not os.access(NODE_SCRIPT, os.X_OK):
        p.error(f"{NODE_SCRIPT} is missing or not executable")
    logging.basicConfig(level="WARNING")
    load = QUICK_LOAD if args.quick else FULL_LOAD
    settings = Settings(lease_ttl=args.lease_ttl)
    results: list[trial_table.TrialResult] = []
    t0 = time.monotonic()
    with Net(Layout().hosts, directory=Path(tempfile.gettempdir()), keep=args.keep) as net:
        say(f"hosts up in {net.directory}; starting the cluster{' secured' * args.secure}")
        secured = None
        if args.secure:
            hosts = {h.name: h.address for h in net.hosts}
            secured = Secured.make(net.directory / "certs", hosts)
        cluster = NodeCluster(net, Layout(), settings, secured)
        runner = Runner(cluster, net.directory, load, args.timeout)
        try:
            cluster.up(timeout=args.timeout)
            say(f"cluster converged in {time.monotonic() - t0:.1f}s; faults: {', '.join(plan)}")
            # Bounded by the worst case of every trial (start, fault, convergence, chunker,
            # verifier, ack read), should the runner fail to stop it.
            runner.start_appender(len(plan) * (6 * args.timeout + 120))
            for i, name in enumerate(plan):
                say(f"trial {i + 1}/{len(plan)}: {name}")
                results.append(runner.trial(i, name))
                for failure in results[-1].failures:
                    say(f"  FAILURE: {failure}")
        except ClusterError as err:
            say(f"cluster failure: {err}")
            results.append(trial_table.TrialResult("cluster-up", failures=[str(err)]))
        finally:
            runner.stop_appender()
    print()
    print(trial_table.render(trial_table.summarize(results)))
    print(f"({cluster.restarts} processes restarted by the supervisor; "
          f"{time.monotonic() - t0:.0f}s in all)")  # fmt: skip
    print(trial_table.final_json(results), flush=True)
    return trial_table.exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
