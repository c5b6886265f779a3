"""Security benchmark: what TLS and authorization cost, against plaintext in the same run.

Two real brokers on one etcd: one plaintext (as brokers run by default), one with TLS
(``--server-cert-file``) and authorization (``--auth-keys``). The same client library work
runs against each, in interleaved rounds (the order reversed every other round):

- append: sequential 1 MiB appends, each awaiting its commit, MB/s. Both brokers take them
  over their direct-append port, as clients do by default: the secured one with TLS (the
  same certificate as its gRPC port) and an authorization frame per append. `plain_grpc` is
  the plaintext broker with direct appends off, to separate the cost of TLS from that of
  gRPC.
- small: 100-byte messages through `AppendService`, messages/s, from a producer that
  yields to the event loop every 100 messages (one that never yields hands the service
  every message before its first append starts: one append of them all). The service
  batches what is written while an append is in flight, so a slower round trip makes
  larger batches and fewer appends (`*_small_batch`: the median of messages per append),
  and the client's Python per message dominates: a weak measure of what TLS costs.
- read: a read of the journal from offset 0 to its write head, over gRPC (TLS on the
  secured broker), MB/s.

`ratio_*` are time ratios (the plaintext time over the secured time, so 1.0 is free and
0.83 is 1.2x the time; the target is >= 0.83), taken within each round, between the two
brokers' runs back to back, so that load varying over the run cancels out: `ratio_*` is
their median over the rounds, `ratio_*_min` and `ratio_*_max` their spread. The figures
themselves are medians over the rounds. `*_cpu_append` and `*_cpu_read` are the CPU
milliseconds per MB of this process and the broker together (from /proc), and
`cpu_ratio_*` the plaintext CPU over the secured CPU of each round (median, min, max): what
TLS costs where CPU is what limits, which wall times on a loaded machine blur. Prints
progress, then one JSON line. `--quick` runs in well under a minute on an idle machine.
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
import base64
import json
import statistics
import tempfile
import time
from pathlib import Path

from gazette.auth.keys import NO_AUTH, Authorizer, KeyedAuth
from gazette.auth.tls import ClientTLS
from gazette.broker.client import AppendService, JournalClient, append, apply_journals
from gazette.broker.client.reader import write_head
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.testing.broker import BrokerProcess
from gazette.testing.certs import write_certs
from gazette.testing.etcd import EtcdServer
from tests.kit.specs import journal_spec

MiB = 1 << 20
KEY = base64.b64encode(b"bench secret").decode()
TARGET = 1 / 1.2


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Target:
    """A broker and how a client reaches it."""

    def __init__(
        self,
        name: str,
        endpoint: str,
        tls: ClientTLS | None,
        auth: Authorizer,
        direct: bool,
        broker_pid: int,
    ) -> None:
        self.name, self.endpoint, self.tls, self.auth, self.direct = (
            name,
            endpoint,
            tls,
            auth,
            direct,
        )
        self.broker_pid = broker_pid
        self.figures: dict[str, list[float]] = {"append": [], "small": [], "read": []}
        self.cpu: dict[str, list[float]] = {"append": [], "read": []}
        """CPU milliseconds per MB (this process and the broker together), per round."""
        self.batch: list[float] = []
        """100-byte messages per append of the small phase, per round (direct appends)."""

    def client(self) -> JournalClient:
        return JournalClient(
            self.endpoint, tls=self.tls, auth=self.auth, direct_appends=self.direct
        )


def process_cpu(pid: int) -> float:
    """CPU seconds (user and system, all threads) process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CPUClock:
    """CPU time of this process and a broker, between `start` and `ms_per_mb`."""

    def __init__(self, broker_pid: int) -> None:
        self.broker_pid = broker_pid
        self.start()

    def start(self) -> None:
        self._t0 = time.process_time() + process_cpu(self.broker_pid)

    def ms_per_mb(self, nbytes: int) -> float:
        used = time.process_time() + process_cpu(self.broker_pid) - self._t0
        return used * 1e3 / (nbytes / 1e6)


async def one_round(t: Target, journal: str, mib: int, small: int) -> None:
    block = os.urandom(MiB)
    req = pb.AppendRequest(journal=journal)
    async with t.client() as client:
        await append(client, req, block)  # warm: channel, route, spool
        t0, cpu = time.perf_counter(), CPUClock(t.broker_pid)
        for _ in range(mib):
            await append(client, req, block)
        t.figures["append"].append(mib * MiB / (time.perf_counter() - t0) / 1e6)
        t.cpu["append"].append(cpu.ms_per_mb(mib * MiB))

        direct = client.direct
        appends_before = direct.answered if direct is not None else 0
        async with AppendService(client) as svc:
            msg = b"x" * 99 + b"\n"
            t0 = time.perf_counter()
            ops = []
            for i in range(small):
                aa = svc.start_append(req)
                aa.write(msg)
                ops.append(aa.release())
                if i % 100 == 99:
                    await asyncio.sleep(0)  # A producer yields now and then.
            for op in ops:
                await op.done()
            t.figures["small"].append(small / (time.perf_counter() - t0))
        if direct is not None:
            t.batch.append(small / max(direct.answered - appends_before, 1))

        head = await write_head(client, journal)
        t0 = time.perf_counter()
        cpu.start()
        n = 0
        call = client.stub_for(journal, primary=False).Read(
            pb.ReadRequest(journal=journal, offset=0, end_offset=head)
        )
        async for resp in call:
            n += len(resp.content)
        assert n == head, (n, head)
        t.figures["read"].append(n / (time.perf_counter() - t0) / 1e6)
        t.cpu["read"].append(cpu.ms_per_mb(n))


async def run(targets: list[Target], rounds: int, mib: int, small: int, store: Path) -> None:
    for t in targets:
        async with t.client() as client:
            spec = journal_spec(f"bench/security-{t.name}", store / t.name, length=256 * MiB)
            await apply_journals(
                client, pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)])
            )
    for r in range(rounds):
        for t in targets if r % 2 == 0 else reversed(targets):
            await one_round(t, f"bench/security-{t.name}", mib, small)
            f = {k: v[-1] for k, v in t.figures.items()}
            c = {k: v[-1] for k, v in t.cpu.items()}
            say(
                f"  round {r + 1} {t.name}: append {f['append']:.0f} MB/s "
                f"({c['append']:.2f} ms CPU/MB), small {f['small']:.0f}/s, "
                f"read {f['read']:.0f} MB/s ({c['read']:.2f} ms CPU/MB)"
            )


def paired_ratios(secured: list[float], plain: list[float]) -> list[float]:
    """The secured figure over the plaintext one of each round."""
    return [s / p for s, p in zip(secured, plain, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run (< 1 minute)")
    args = parser.parse_args()
    rounds, mib, small = (3, 48, 5_000) if args.quick else (5, 128, 20_000)
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
        root = Path(tmp)
        certs = write_certs(root / "certs")
        with EtcdServer() as etcd:
            plain = BrokerProcess(
                etcd.endpoint, root="/bench/plain", suffix="plain", spool_dir=root / "plain"
            )
            secured = BrokerProcess(
                etcd.endpoint,
                root="/bench/secured",
                suffix="secured",
                spool_dir=root / "secured",
                extra_args=[
                    "--server-cert-file", str(certs.server_cert),
                    "--server-cert-key-file", str(certs.server_key),
                    "--auth-keys", KEY,
                ],
            )  # fmt: skip
            with plain, secured:
                assert plain.proc is not None and secured.proc is not None
                targets = [
                    Target("plain", plain.endpoint, None, NO_AUTH, True, plain.proc.pid),
                    Target("plain_grpc", plain.endpoint, None, NO_AUTH, False, plain.proc.pid),
                    Target(
                        "secured",
                        secured.endpoint,
                        ClientTLS(certs.ca),
                        KeyedAuth(KEY),
                        True,
                        secured.proc.pid,
                    ),
                ]
                say(f"{rounds} rounds: {mib} x 1 MiB appends, {small} x 100 B, a full read")
                asyncio.run(run(targets, rounds, mib, small, root / "store"))
    med = {t.name: {k: statistics.median(v) for k, v in t.figures.items()} for t in targets}
    out: dict[str, float] = {}
    for name, figures in med.items():
        for k, v in figures.items():
            out[f"{name}_{k}"] = round(v, 1)
    by_name = {t.name: {**t.figures, **{f"cpu_{k}": v for k, v in t.cpu.items()}} for t in targets}
    for k in ("append", "small", "read"):
        for suffix, base in (("", "plain"), ("_vs_grpc", "plain_grpc")):
            ratios = paired_ratios(by_name["secured"][k], by_name[base][k])
            out[f"ratio_{k}{suffix}"] = round(statistics.median(ratios), 3)
            if not suffix:
                out[f"ratio_{k}_min"] = round(min(ratios), 3)
                out[f"ratio_{k}_max"] = round(max(ratios), 3)
    for k in ("append", "read"):
        for name, t_cpu in ((t.name, t.cpu[k]) for t in targets):
            out[f"{name}_cpu_{k}"] = round(statistics.median(t_cpu), 2)
        # Plaintext CPU over secured CPU, as the time ratios: what TLS costs when CPU is
        # what limits (a loaded machine), whatever the load does to wall time.
        cpu_ratios = paired_ratios(by_name["plain"]["cpu_" + k], by_name["secured"]["cpu_" + k])
        out[f"cpu_ratio_{k}"] = round(statistics.median(cpu_ratios), 3)
        out[f"cpu_ratio_{k}_min"] = round(min(cpu_ratios), 3)
        out[f"cpu_ratio_{k}_max"] = round(max(cpu_ratios), 3)
    for t in targets:
        if t.batch:
            out[f"{t.name}_small_batch"] = round(statistics.median(t.batch), 1)
    out["target_ratio"] = round(TARGET, 3)
    say(
        "secured / plaintext (median of rounds, min-max): "
        + ", ".join(
            f"{k} {out[f'ratio_{k}']:.2f}x "
            f"({out[f'ratio_{k}_min']:.2f}-{out[f'ratio_{k}_max']:.2f})"
            for k in ("append", "small", "read")
        )
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
