"""The demo behind `make demo`: etcd, a broker, and gazctl, end to end on this machine.

It starts a real etcd and a real `gazette-broker` on loopback, applies a hierarchical journal
spec with `gazctl journals apply`, appends a few thousand lines with `gazctl journals append`,
reads them back with `gazctl journals read`, lists the fragments the broker persisted, then
SIGKILLs the broker, restarts it and reads everything back again. Every step says what it did.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from broker.testing.broker import BrokerProcess
from broker.testing.etcd import EtcdServer

JOURNAL = "examples/demo/lines"


def step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def gazctl(broker: BrokerProcess, *args: str, stdin: bytes | None = None) -> bytes:
    """Run gazctl as a user would, against `broker`; fail loudly with its stderr."""
    env = {**os.environ, "BROKER_ADDRESS": broker.endpoint}
    proc = subprocess.run(
        [sys.executable, "-m", "gazctl.main", "journals", *args],
        input=stdin,
        capture_output=True,
        env=env,
        timeout=120,
    )
    if proc.returncode != 0:
        raise SystemExit(f"gazctl journals {' '.join(args)} failed:\n{proc.stderr.decode()}")
    return proc.stdout


def wait_persisted(broker: BrokerProcess, minimum: int, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        out = gazctl(broker, "fragments", "-l", f"name={JOURNAL}")
        persisted = [ln for ln in out.decode().splitlines() if "file://" in ln]
        if len(persisted) >= minimum or time.monotonic() > deadline:
            return out.decode()
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=5000, help="lines to append")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args()

    data = Path(tempfile.mkdtemp(prefix="gazette-demo-"))
    store = data / "fragments"
    store.mkdir()
    specs = data / "journals.yaml"
    specs.write_text(
        textwrap.dedent(f"""\
        # Journals under examples/demo/ share this configuration.
        name: examples/demo/
        replication: 1
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
    )

    step("starting etcd on loopback")
    with EtcdServer() as etcd:
        print(f"    etcd at {etcd.endpoint}")
        step("starting a broker")
        broker = BrokerProcess(etcd.endpoint, spool_dir=data / "spool")
        broker.start()
        try:
            print(f"    broker at {broker.endpoint}, spool dir {broker.spool_dir}")

            step(f"applying {specs.name} with `gazctl journals apply`")
            print(textwrap.indent(specs.read_text(), "    | "))
            sys.stdout.write(gazctl(broker, "apply", "--specs", str(specs)).decode())
            sys.stdout.write(gazctl(broker, "list", "-l", "app=demo", "--primary").decode())

            step(f"appending {args.lines} JSON lines with `gazctl journals append`")
            lines = b"".join(
                json.dumps({"n": i, "word": hashlib.sha1(b"%d" % i).hexdigest()[:8]}).encode()
                + b"\n"
                for i in range(args.lines)
            )
            t0 = time.perf_counter()
            batches = 4
            per = -(-args.lines // batches)
            all_lines = lines.splitlines(keepends=True)
            for b in range(batches):
                batch = b"".join(all_lines[b * per : (b + 1) * per])
                gazctl(broker, "append", "--journal", JOURNAL, "--framing", "lines", stdin=batch)
            print(
                f"    appended {len(lines):,} bytes in {batches} runs of gazctl, "
                f"{time.perf_counter() - t0:.2f}s"
            )

            step("reading the journal back with `gazctl journals read`")
            back = gazctl(broker, "read", "-l", f"name={JOURNAL}")
            assert back == lines, f"read back {len(back)} bytes, expected {len(lines)}"
            print(f"    read {len(back):,} bytes: identical to what was appended")

            step("fragments persisted by the broker (`gazctl journals fragments`)")
            sys.stdout.write(wait_persisted(broker, minimum=2))

            step("SIGKILL the broker, restart it, and read everything again")
            broker.kill()
            broker.start()
            back = gazctl(broker, "read", "-l", f"name={JOURNAL}")
            assert back == lines, "content differs after the broker crash"
            print(
                f"    after the crash: {len(back):,} bytes, identical (spool recovered from its"
                " commit log, fragments from the store)"
            )
        finally:
            broker.close()
    step("done")
    print(
        f"    etcd, a broker and gazctl: {args.lines} lines appended, read, persisted as"
        " GZIP fragments, and recovered after SIGKILL."
    )
    if args.keep:
        print(f"    data kept in {data}")
    else:
        import shutil

        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
