"""Security benchmark: what TLS and authorization cost, against plaintext in the same run.

Two real brokers on one etcd: one plaintext (as brokers run by default), one with TLS
(``--server-cert-file``) and authorization (``--auth-keys``). The same client library work
runs against each, in alternating rounds, and each figure is the median of its rounds:

- append: sequential 1 MiB appends, each awaiting its commit, MB/s. The plaintext broker
  takes them over its direct-append port, as clients do by default; the secured one over
  gRPC + TLS (no plaintext port is open there). `plain_grpc` is the plaintext broker with
  direct appends off, to separate the cost of TLS from that of gRPC.
- small: 100-byte appends through `AppendService` (batched), appends/s.
- read: a read of the journal from offset 0 to its write head, MB/s.

`ratio_*` are the secured figures over the plaintext ones (time ratios: plaintext time over
secured time, so 1.0 is free and 0.83 is 1.2x the time); the target is >= 0.83.
Prints progress, then one JSON line. `--quick` runs in well under a minute.
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
        self, name: str, endpoint: str, tls: ClientTLS | None, auth: Authorizer, direct: bool
    ) -> None:
        self.name, self.endpoint, self.tls, self.auth, self.direct = (
            name,
            endpoint,
            tls,
            auth,
            direct,
        )
        self.figures: dict[str, list[float]] = {"append": [], "small": [], "read": []}

    def client(self) -> JournalClient:
        return JournalClient(
            self.endpoint, tls=self.tls, auth=self.auth, direct_appends=self.direct
        )


async def one_round(t: Target, journal: str, mib: int, small: int) -> None:
    block = os.urandom(MiB)
    req = pb.AppendRequest(journal=journal)
    async with t.client() as client:
        await append(client, req, block)  # warm: channel, route, spool
        t0 = time.perf_counter()
        for _ in range(mib):
            await append(client, req, block)
        t.figures["append"].append(mib * MiB / (time.perf_counter() - t0) / 1e6)

        async with AppendService(client) as svc:
            msg = b"x" * 99 + b"\n"
            t0 = time.perf_counter()
            ops = []
            for _ in range(small):
                aa = svc.start_append(req)
                aa.write(msg)
                ops.append(aa.release())
            for op in ops:
                await op.done()
            t.figures["small"].append(small / (time.perf_counter() - t0))

        head = await write_head(client, journal)
        t0 = time.perf_counter()
        n = 0
        call = client.stub_for(journal, primary=False).Read(
            pb.ReadRequest(journal=journal, offset=0, end_offset=head)
        )
        async for resp in call:
            n += len(resp.content)
        assert n == head, (n, head)
        t.figures["read"].append(n / (time.perf_counter() - t0) / 1e6)


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
            say(
                f"  round {r + 1} {t.name}: append {f['append']:.0f} MB/s, "
                f"small {f['small']:.0f}/s, read {f['read']:.0f} MB/s"
            )


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
                targets = [
                    Target("plain", plain.endpoint, None, NO_AUTH, direct=True),
                    Target("plain_grpc", plain.endpoint, None, NO_AUTH, direct=False),
                    Target(
                        "secured",
                        secured.endpoint,
                        ClientTLS(certs.ca),
                        KeyedAuth(KEY),
                        direct=True,
                    ),
                ]
                say(f"{rounds} rounds: {mib} x 1 MiB appends, {small} x 100 B, a full read")
                asyncio.run(run(targets, rounds, mib, small, root / "store"))
    med = {t.name: {k: statistics.median(v) for k, v in t.figures.items()} for t in targets}
    out: dict[str, float] = {}
    for name, figures in med.items():
        for k, v in figures.items():
            out[f"{name}_{k}"] = round(v, 1)
    for k in ("append", "small", "read"):
        out[f"ratio_{k}"] = round(med["secured"][k] / med["plain"][k], 3)
        out[f"ratio_{k}_vs_grpc"] = round(med["secured"][k] / med["plain_grpc"][k], 3)
    out["target_ratio"] = round(TARGET, 3)
    say(
        "secured / plaintext: "
        + ", ".join(f"{k} {out[f'ratio_{k}']:.2f}x" for k in ("append", "small", "read"))
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
