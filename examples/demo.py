"""The demo behind `make demo`: etcd, a cluster of three brokers, and gazctl, end to end on this
machine.

It starts a real etcd and three real `gazette-broker` processes on loopback (zones zone-a,
zone-b, zone-a), applies a hierarchical journal spec (`replication: 3`) with `gazctl journals
apply`, shows each journal's route (primary and replicas) with `gazctl journals list`, appends a
few thousand lines with `gazctl journals append`, reads them back with `gazctl journals read`,
lists the fragments the brokers persisted, then SIGKILLs the journal's primary broker: the route
gets a new primary, everything reads back identically from the survivors, an append waits
until the journal has its three replicas again, the killed broker is restarted and rejoins the
route, and every line reads back identically.

Then the word-count example (examples/word-count, `word_count.demo`) runs on the same etcd
and brokers: two `gazette-consumer` processes with one hot standby per shard, text fed as
n-gram deltas, a primary SIGKILLed and its standby taking over, and n-gram counts queried
through the example's gRPC query API, equal to the counts of the text; last, the shards are
exported to a Spark DataFrame (`gazette-shards`, local[2]) while the consumers run, and the top
n-grams printed from it. Every step says what it did.

With ``--secure`` (``make demo SECURE=1``) the same runs with TLS and authorization on
everywhere (docs/security.md): certificates and a key made for the run, etcd asking for client
certificates, brokers and consumers serving TLS and verifying signed tokens, and every client
(gazctl, the consumers, the Spark export, the demo's own) presenting them, as each reads its
settings from the environment under upstream's names.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gazette.broker.client import list_all_journals, name_selector
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.testing.broker import BrokerProcess
from gazette.testing.devcluster import DevCluster

sys.path.insert(0, str(Path(__file__).resolve().parent / "word-count"))
from word_count import demo as word_count_demo  # noqa: E402
from word_count.clients import journal_client  # noqa: E402

JOURNAL = "examples/demo/lines"
ZONES = ["zone-a", "zone-b", "zone-a"]


def step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def gazctl_cmd(broker: BrokerProcess, *args: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "BROKER_ADDRESS": broker.endpoint}
    return [sys.executable, "-m", "gazette.gazctl.main", "journals", *args], env


def gazctl(
    broker: BrokerProcess, *args: str, stdin: bytes | None = None, echo: bool = False
) -> bytes:
    """Run gazctl as a user would, against `broker`; fail loudly with its stderr. With `echo`,
    print what it said on stderr."""
    argv, env = gazctl_cmd(broker, *args)
    proc = subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"gazctl journals {' '.join(args)} failed:\n{proc.stderr.decode()}")
    if echo:
        sys.stdout.write(textwrap.indent(proc.stderr.decode(), "    gazctl: "))
    return proc.stdout


@contextlib.contextmanager
def background_gazctl(broker: BrokerProcess, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """gazctl started in the background; killed if the block exits before gazctl did."""
    argv, env = gazctl_cmd(broker, *args)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def show(out: bytes) -> None:
    sys.stdout.write(textwrap.indent(out.decode(), "    "))
    if not out.endswith(b"\n"):
        sys.stdout.write("\n")


def current_route(broker: BrokerProcess) -> pb.Route:
    async def fetch() -> pb.Route:
        async with journal_client(broker.endpoint) as client:
            for j in await list_all_journals(client, name_selector(JOURNAL)):
                return j.route
        return pb.Route(primary=-1)

    return asyncio.run(fetch())


def wait_route(
    broker: BrokerProcess, ok: Callable[[pb.Route], bool], what: str, timeout: float = 60
) -> tuple[pb.Route, float]:
    """Poll `broker` until the journal's route satisfies `ok`; the route and seconds waited."""
    t0 = time.monotonic()
    while True:
        route = current_route(broker)
        if ok(route):
            return route, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"the route did not reach {what} within {timeout}s: {route}")
        time.sleep(0.1)


def has_primary(route: pb.Route, members: int) -> bool:
    return len(route.members) == members and 0 <= route.primary < len(route.members)


def describe(route: pb.Route) -> str:
    if not route.members:
        return "    (no brokers)"
    lines = []
    for i, (m, ep) in enumerate(zip(route.members, route.endpoints, strict=False)):
        role = "primary" if i == route.primary else "replica"
        lines.append(f"    {role:8} {m.zone}#{m.suffix} at {ep}")
    return "\n".join(lines)


def wait_persisted(broker: BrokerProcess, minimum: int, timeout: float = 30) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        out = gazctl(broker, "fragments", "-l", f"name={JOURNAL}")
        persisted = [ln for ln in out.decode().splitlines() if "file://" in ln]
        if len(persisted) >= minimum or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def journals_yaml(store: Path) -> str:
    """The demo's journal specs, as ``gazctl journals apply`` reads them."""
    return textwrap.dedent(f"""\
        # Journals under examples/demo/ share this configuration.
        name: examples/demo/
        replication: 3            # every append commits on three brokers
        labels:
          - name: app
            value: demo
        fragment:
          length: 65536            # roll fragments at 64 KiB so the demo persists several
          compression_codec: GZIP
          stores: ["file://{store}/"]
          refresh_interval: 10s
          flush_interval: 1m0s
        children:
          - name: {JOURNAL}
            labels:
              - name: content-type
                value: application/x-ndjson
        """)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=5000, help="lines to append")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument("--secure", action="store_true", help="TLS and authorization on everywhere")
    args = parser.parse_args()

    data = Path(tempfile.mkdtemp(prefix="gazette-demo-"))
    store = data / "fragments"
    store.mkdir()
    specs = data / "journals.yaml"
    specs.write_text(journals_yaml(store))

    t_start = time.monotonic()
    step(f"starting etcd and three brokers in zones {', '.join(ZONES)} (what `gazette-dev` runs)")
    # The demo ends by stopping every broker: there is nowhere to drain to (the cluster's
    # --drain-timeout 0).
    with DevCluster(data / "cluster", brokers=len(ZONES), secure=args.secure) as cluster:
        assert cluster.brokers is not None
        brokers = cluster.brokers.brokers
        if args.secure:
            # Every process started from here on (gazctl, consumers, Spark's workers) and the
            # demo's own clients read their TLS and authorization settings from here.
            os.environ.update(cluster.secure_env)
            print(
                "    secured: certificates and an auth key made for the run under "
                f"{cluster.directory / 'certs'}; etcd asks for client certificates; brokers "
                "serve TLS and verify tokens"
            )
        print(f"    etcd at {cluster.etcd.endpoint}")
        for b in brokers:
            print(f"    {b.zone}#{b.suffix} at {b.endpoint}, spool dir {b.spool_dir}")
        run_demo(brokers, specs, args.lines)
        word_count_demo.run(cluster.etcd.endpoint, [b.endpoint for b in brokers], data)
    step("done")
    print(
        f"    etcd, three brokers, two consumers and gazctl in {time.monotonic() - t_start:.0f}s:"
        " lines appended to a journal replicated three times, read, persisted as GZIP"
        " fragments; the primary was SIGKILLed, a survivor took over, the killed broker"
        " rejoined, and nothing was lost; word-count's shards survived the SIGKILL of a primary"
        " with exact counts, exported to Spark."
        + (" All of it with TLS and authorization on." if args.secure else "")
    )
    if args.keep:
        print(f"    data kept in {data}")
    else:
        import shutil

        shutil.rmtree(data, ignore_errors=True)


def run_demo(brokers: list[BrokerProcess], specs: Path, n_lines: int) -> None:
    # gazctl talks to one broker; any broker serves any journal, proxying to its primary.
    gz = brokers[0]
    step(f"applying {specs.name} with `gazctl journals apply`")
    print(textwrap.indent(specs.read_text(), "    | "))
    gazctl(gz, "apply", "--specs", str(specs), echo=True)
    route, secs = wait_route(gz, lambda r: has_primary(r, 3), "three brokers")
    print(f"    the brokers' allocator assigned {JOURNAL} to three brokers in {secs:.1f}s")

    step("routes: `gazctl journals list --primary --replicas` (* marks the primary)")
    show(gazctl(gz, "list", "-l", "app=demo", "--primary", "--replicas"))

    step(f"appending {n_lines} JSON lines with `gazctl journals append` (via {gz.suffix})")
    lines = b"".join(
        json.dumps({"n": i, "word": hashlib.sha1(b"%d" % i).hexdigest()[:8]}).encode() + b"\n"
        for i in range(n_lines)
    )
    t0 = time.perf_counter()
    batches = 4
    per = -(-n_lines // batches)
    all_lines = lines.splitlines(keepends=True)
    for n in range(batches):
        batch = b"".join(all_lines[n * per : (n + 1) * per])
        gazctl(gz, "append", "--journal", JOURNAL, "--framing", "lines", stdin=batch)
    print(
        f"    appended {len(lines):,} bytes in {batches} runs of gazctl, "
        f"{time.perf_counter() - t0:.2f}s; each append committed on all three replicas"
    )

    step("reading the journal back with `gazctl journals read`")
    back = gazctl(gz, "read", "-l", f"name={JOURNAL}")
    assert back == lines, f"read back {len(back)} bytes, expected {len(lines)}"
    print(f"    read {len(back):,} bytes: identical to what was appended")

    step("fragments persisted by the brokers (`gazctl journals fragments`)")
    show(wait_persisted(gz, minimum=2))

    route = current_route(gz)
    victim = next(b for b in brokers if b.suffix == route.members[route.primary].suffix)
    survivors = [b for b in brokers if b is not victim]
    gz = survivors[0]
    step(f"SIGKILL the journal's primary broker, {victim.zone}#{victim.suffix}")
    victim.kill()
    route, secs = wait_route(
        gz,
        lambda r: (
            0 <= r.primary < len(r.members) and victim.suffix not in {m.suffix for m in r.members}
        ),
        "a new primary",
    )
    print(
        f"    {secs:.1f}s later (once its etcd lease, TTL 4 s, expired) the route has a new"
        " primary:"
    )
    print(describe(route))
    show(gazctl(gz, "list", "-l", "app=demo", "--primary", "--replicas"))

    step(f"reading everything back from the survivors (via {gz.suffix})")
    back = gazctl(gz, "read", "-l", f"name={JOURNAL}")
    assert back == lines, f"read back {len(back)} bytes after the kill, expected {len(lines)}"
    print(f"    read {len(back):,} bytes: identical; no acknowledged append was lost")

    more = b"".join(
        json.dumps({"n": i, "after": "failover"}).encode() + b"\n"
        for i in range(n_lines, n_lines + 1000)
    )
    step("appending 1000 more lines while only two of the three brokers live")
    more_file = specs.parent / "more.ndjson"
    more_file.write_bytes(more)
    with background_gazctl(
        gz, "append", "--journal", JOURNAL, "--framing", "lines", "-i", str(more_file)
    ) as appender:
        time.sleep(2)
        if appender.poll() is None:
            print(
                "    gazctl is still waiting after 2s: the journal has replication 3 and its"
                " route two brokers,\n    so the primary refuses appends and gazctl retries"
                " them with backoff"
            )
        else:
            print(f"    gazctl exited with status {appender.returncode} within 2s")

        step(f"restarting the killed broker {victim.zone}#{victim.suffix}")
        t0 = time.monotonic()
        victim.start()
        route, secs = wait_route(
            gz,
            lambda r: has_primary(r, 3) and victim.suffix in {m.suffix for m in r.members},
            "the restarted broker",
        )
        print(
            f"    ready and back in the route {time.monotonic() - t0:.1f}s after the restart"
            f" (route converged {secs:.1f}s after ready):"
        )
        print(describe(route))
        show(gazctl(gz, "list", "-l", "app=demo", "--primary", "--replicas"))
        _, err_bytes = appender.communicate(timeout=60)
    err = err_bytes.decode()
    if appender.returncode != 0:
        raise SystemExit(f"the waiting append failed:\n{err}")
    failed = [ln for ln in err.splitlines() if "will retry" in ln]
    # Usually each attempt is refused with the status; one may instead see gRPC INTERNAL,
    # when the broker answers before gazctl has sent the whole append.
    refused = [ln for ln in failed if "INSUFFICIENT_JOURNAL_BROKERS" in ln]
    print(f"    the waiting append committed after {len(failed)} failed attempt(s), e.g.:")
    for ln in [*(refused or failed)[:1], err.strip().splitlines()[-1]]:
        print(f"    gazctl: {ln}")

    step("reading everything back through each of the three brokers")
    for b in brokers:
        back = gazctl(b, "read", "-l", f"name={JOURNAL}")
        assert back == lines + more, f"{b.suffix}: read {len(back)} bytes, differs"
        print(f"    via {b.zone}#{b.suffix}: {len(back):,} bytes, identical")


if __name__ == "__main__":
    main()
