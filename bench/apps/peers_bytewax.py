"""Bytewax's side of bench/peers.py: a running count per key of JSON-lines records, with state
snapshotted to Bytewax's SQLite recovery partitions at the end of every epoch.

Runs under the virtualenv bench/peers.py makes for Bytewax (never the project's), as

    python peers_bytewax.py INPUT RECOVERY_DIR [--epoch S] [--emit]

INPUT is a file of JSON lines, each an object with a "key" (the very bytes our consumer reads
from its journal). RECOVERY_DIR is made and initialised with one partition when absent; when
present the dataflow resumes from its last snapshot (Bytewax rewinds the file source to the
offset of that epoch and replays from there).

Without --emit the count emits nothing (as our consumer's count publishes nothing), and the
last stdout line is ``{"seconds": S, "cpu_seconds": C}``: the dataflow's run, from the call
that runs it (after imports) to its return, and the process's CPU time over it. With --emit
every updated count is written to stdout as ``key count`` (flushed per batch) for
bench/peers.py to time the first output after a restart and to check the final counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
from bytewax.connectors.files import FileSource
from bytewax.dataflow import Dataflow
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import run_main


class _Lines(StatelessSinkPartition[Any]):
    def __init__(self, emit: bool) -> None:
        self.emit = emit

    def write_batch(self, items: list[Any]) -> None:
        if self.emit:
            sys.stdout.write("".join(f"{k} {n}\n" for k, n in items))
            sys.stdout.flush()


class LinesSink(DynamicSink[Any]):
    """``key count`` lines on stdout, or nothing at all."""

    def __init__(self, emit: bool) -> None:
        self.emit = emit

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Lines:
        return _Lines(self.emit)


def flow(path: Path, emit: bool) -> Dataflow:
    df = Dataflow("peers_count")
    lines = op.input("in", df, FileSource(path))
    keyed = op.key_on("key", lines, lambda line: json.loads(line)["key"])

    def count(n: int | None, _line: str) -> tuple[int, tuple[int, ...]]:
        n = (n or 0) + 1
        return n, ((n,) if emit else ())

    counts = op.stateful_flat_map("count", keyed, count)
    op.output("out", counts, LinesSink(emit))
    return df


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", type=Path)
    parser.add_argument("recovery", type=Path)
    parser.add_argument("--epoch", type=float, default=1.0, help="epoch (snapshot) seconds")
    parser.add_argument("--emit", action="store_true")
    args = parser.parse_args()
    if not args.recovery.exists():
        args.recovery.mkdir(parents=True)
        init_db_dir(args.recovery, 1)
    df = flow(args.input, args.emit)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    run_main(
        df,
        epoch_interval=timedelta(seconds=args.epoch),
        recovery_config=RecoveryConfig(str(args.recovery)),
    )
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    if not args.emit:
        print(json.dumps({"seconds": elapsed, "cpu_seconds": cpu}), flush=True)


if __name__ == "__main__":
    main()
