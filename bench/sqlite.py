"""SQLite store benchmark: the recorded store against native apsw on local disk, same run.

Workloads, in batched transactions of `--rows` rows: *consumer* (each transaction appends
events at increasing keys, which grows the database to tens of MiB with ~120-byte values,
and updates the aggregates of a hot set of rows, then commits) and *random* (upserts at
random keys all over the table). Both sides use WAL mode and the same page cache size.

- native: apsw on local disk, ``synchronous=FULL`` (each commit durable on disk when it
  returns) and ``synchronous=NORMAL`` (durable at checkpoints only).
- store: `SQLiteStore` recording to a real broker; each transaction is `transact` +
  `start_commit`, timed until its commit is in the recovery log (as durable as native FULL).
  ``ratio``: each commit awaited by SQLite's syncs (`sync_waits`); ``ratio_pipelined``: as a
  consumer, the next transaction runs while the previous one commits (``sync_waits=False``),
  and starts committing once that commit is in the log: the consumer's rule, the comparison
  the target is read as (docs/store-targets.md). ``ratio_pipelined_on_loop``: the same,
  SQLite on the event loop (``on_loop=True``, as native apsw runs on its caller's thread;
  docs/sqlite-store.md).
- paired (consumer workload): native FULL and the store by the consumer's rule run the same
  transactions interleaved, 10 blocks each side, alternating which goes first, each side
  continuing its own database (``ratio_paired_on_loop``, ``ratio_paired``: the sums of
  their blocks; ``*_block_min`` / ``*_block_max``: the blocks' own ratios). Both sides
  then see the same phases of a machine whose speed drifts within minutes, which best-of
  runs taken minutes apart do not; the store pays one extra round trip per block (its last
  commit).
- adaptive: as pipelined, but a transaction keeps taking batches until its predecessor's
  commit is in the log (a consumer's transaction keeps consuming while the previous one
  commits; Gazette does not fix transaction sizes). ``ratio_adaptive`` is against native FULL
  with one transaction per batch, ``ratio_adaptive_matched`` against native FULL with the
  same transactions as the store made (``adaptive_batches_per_commit``).

Prints progress, then one JSON line whose ratios are store time / native FULL time (the
equally durable baseline); ``target`` (1.25) is for the figure named by ``target_for``,
``consumer_ratio_paired_on_loop`` (docs/store-targets.md: the consumer's rule, measured
interleaved, SQLite on the caller's thread as natively; ``consumer_ratio_paired`` is the
store with SQLite in its own thread); ``ratio`` is each commit awaited, reported beside it;
``ratio_vs_normal`` is against native NORMAL. ``consumer_ratio_paired_on_loop_equal_durability``
is the paired run against a second broker with ``--spool-sync`` (each append fsynced before it
is acknowledged): the store as durable as native FULL on one host.
`--quick` runs in under a minute.
"""

from __future__ import annotations

import os.path
import sys

# This script is named after the package it measures; keep its directory off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import apsw
from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import AppendService, JournalClient, apply_journals
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.consumer.protocol import pb as cpb
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.recorder import Recorder
from gazette.stores.sqlite import SQLiteStore
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer

MiB = 1 << 20
SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v TEXT NOT NULL, n INTEGER);
CREATE TABLE IF NOT EXISTS agg (a INTEGER PRIMARY KEY, c INTEGER NOT NULL);
"""

WHERE = {"on_loop": ", on the loop", "synced": ", on the loop, broker with --spool-sync"}
"""How progress lines name where a store side runs SQLite."""


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


Batch = list[tuple[int, str, int]]


def consumer_batches(txns: int, rows: int, seed: int = 1) -> list[Batch]:
    """Each transaction appends `rows` events (increasing keys) and updates the aggregates of
    the keys it saw (a hot set of 2,000 rows): a stream consumer's batched transaction."""
    rnd = random.Random(seed)
    return [
        [(i * rows + j, f"{rnd.getrandbits(400):0120x}", rnd.randrange(2000)) for j in range(rows)]
        for i in range(txns)
    ]


def random_batches(txns: int, rows: int, seed: int = 1) -> list[Batch]:
    """Each transaction upserts `rows` rows at random keys of the whole table: every
    transaction dirties pages all over the database (the write-amplification worst case)."""
    rnd = random.Random(seed)
    keys = txns * rows
    return [
        [(rnd.randrange(keys), f"{rnd.getrandbits(400):0120x}", i) for _ in range(rows)]
        for i in range(txns)
    ]


def apply_batch(conn: apsw.Connection, batch: Batch) -> None:
    conn.executemany("INSERT OR REPLACE INTO kv (k, v, n) VALUES (?, ?, ?)", batch)
    conn.executemany(
        "INSERT INTO agg (a, c) VALUES (?, 1) ON CONFLICT (a) DO UPDATE SET c = c + 1",
        [(n % 2000,) for _, _, n in batch],
    )


def native(
    directory: Path, work: list[Batch], synchronous: str, sizes: list[int] | None = None
) -> float:
    """Native apsw, one transaction per batch, or per `sizes[j]` consecutive batches."""
    db = NativeBlocks(directory, synchronous)
    try:
        return db.run(work, sizes)
    finally:
        db.close()


class NativeBlocks:
    """Native apsw on one connection (WAL, `synchronous`), run a block of transactions at a
    time."""

    def __init__(self, directory: Path, synchronous: str = "FULL") -> None:
        directory.mkdir(parents=True)
        self.conn = apsw.Connection(str(directory / "native.db"))
        self.conn.execute("PRAGMA cache_size = -65536")
        self.conn.execute("PRAGMA journal_mode = wal")
        self.conn.execute(f"PRAGMA synchronous = {synchronous}")
        self.conn.execute(SCHEMA)

    def run(self, work: list[Batch], sizes: list[int] | None = None) -> float:
        """Seconds to commit one transaction per batch of `work`, or per `sizes[j]`
        consecutive batches."""
        groups = sizes or [1] * len(work)
        t0 = time.perf_counter()
        i = 0
        for size in groups:
            self.conn.execute("BEGIN")
            for batch in work[i : i + size]:
                apply_batch(self.conn, batch)
            i += size
            self.conn.execute("COMMIT")
        return time.perf_counter() - t0

    def close(self) -> None:
        self.conn.close()


async def paired(
    endpoint: str,
    fragments: Path,
    directory: Path,
    work: list[Batch],
    blocks: int,
    on_loop: bool = False,
) -> tuple[float, float, list[float]]:
    """Native FULL and the store by the consumer's rule, interleaved block by block.

    `work` is cut into `blocks` blocks (fewer if they do not divide it); each runs on
    native, then on the store (the other way round every other block), each side continuing
    its own database, so both sides see the same phases of a machine whose speed drifts.
    The store's block ends once its last commit is in the log, which costs it one round
    trip a block that an unbroken run would overlap. Returns native's and the store's total
    seconds, and each block's ratio."""
    async with JournalClient(endpoint) as client, AppendService(client) as svc:
        store, _ = await open_store(client, svc, fragments, directory / "store", False, on_loop)
        native = NativeBlocks(directory / "native")
        try:
            size = -(-len(work) // blocks)
            totals = [0.0, 0.0]
            ratios = []
            for k, first in enumerate(range(0, len(work), size)):
                block = work[first : first + size]
                times = [0.0, 0.0]
                for side in (0, 1) if k % 2 == 0 else (1, 0):
                    if side == 0:
                        times[0] = native.run(block)
                    else:
                        t0 = time.perf_counter()
                        await consume(store, block, first, adaptive=False)
                        times[1] = time.perf_counter() - t0
                totals[0] += times[0]
                totals[1] += times[1]
                ratios.append(times[1] / times[0])
        finally:
            native.close()
            await store.close()
        return totals[0], totals[1], ratios


def checkpoint(i: int) -> cpb.Checkpoint:
    """A consumer's checkpoint after transaction `i`: one source read through."""
    return cpb.Checkpoint(sources={"bench/input": cpb.Checkpoint.Source(read_through=i)})


async def open_store(
    client: JournalClient,
    svc: AppendService,
    fragments: Path,
    directory: Path,
    sync_waits: bool,
    on_loop: bool = False,
) -> tuple[SQLiteStore, Recorder]:
    """A store in `directory` (made here) recording to a new log, its first commit done,
    and its recorder; SQLite in the store's thread, or (`on_loop`) on the event loop."""
    frag = pb.JournalSpec.Fragment(
        length=256 * MiB, compression_codec=pb.NONE, refresh_interval=Duration(seconds=600)
    )
    frag.stores.append(f"file://{fragments}/")
    log = f"bench/sqlite-{os.getpid()}-{time.monotonic_ns()}"
    spec = pb.JournalSpec(name=log, replication=1, fragment=frag)
    await apply_journals(client, pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
    directory.mkdir(parents=True)
    rec = await Recorder.open(FSM(log), 0xBE4C, directory, svc, log)
    store = await SQLiteStore.open(
        rec, bootstrap_sql=SCHEMA, sync_waits=sync_waits, on_loop=on_loop
    )
    await store.start_commit(None, cpb.Checkpoint(), [])
    return store, rec


async def recorded(
    endpoint: str,
    fragments: Path,
    directory: Path,
    work: list[Batch],
    sync_waits: bool,
    adaptive: bool = False,
    on_loop: bool = False,
) -> tuple[float, SQLiteStore, int, list[int]]:
    """The store's time for `work`, the store, its log's size, and the batches per commit.

    Each transaction takes one batch, or (`adaptive`) takes batches until its predecessor's
    commit is in the log, as a consumer's transaction keeps consuming while the previous one
    commits (docs/store-targets.md). With `on_loop`, SQLite runs on the event loop."""
    async with JournalClient(endpoint) as client, AppendService(client) as svc:
        store, rec = await open_store(client, svc, fragments, directory, sync_waits, on_loop)
        t0 = time.perf_counter()
        sizes = await consume(store, work, 0, adaptive)
        elapsed = time.perf_counter() - t0
        log_bytes = rec.write_head
        await store.close()
        return elapsed, store, log_bytes, sizes


async def consume(store: SQLiteStore, work: list[Batch], first: int, adaptive: bool) -> list[int]:
    """Run `work` (batches `first`... of the workload) as a consumer does, until its last
    commit is in the log; returns the batches of each commit.

    The next transaction runs while the previous one commits, and a transaction starts
    committing once its predecessor's commit completed (the consumer's rule)."""
    pending: asyncio.Future[None] | None = None
    sizes: list[int] = []
    i = 0
    while i < len(work):
        size = 0
        while i < len(work):
            await store.transact(apply_batch, work[i])
            i += 1
            size += 1
            if not adaptive or pending is None or pending.done():
                break
        if pending is not None:
            await pending
        pending = store.start_commit(None, checkpoint(first + i - 1), [])
        sizes.append(size)
    if pending is not None:
        await pending
    return sizes


def measure(
    tmpdir: Path,
    endpoint: str,
    name: str,
    work: list[Batch],
    runs: int,
    blocks: int = 0,
    synced: str = "",
) -> dict[str, float]:
    figures: dict[str, list[float]] = {
        "full": [],
        "normal": [],
        "store": [],
        "pipelined": [],
        "on_loop": [],
        "adaptive": [],
        "matched": [],
    }
    per_commit: list[float] = []
    for run in range(runs):
        for sync in ("full", "normal"):
            s = native(tmpdir / f"{name}-native-{sync}-{run}", work, sync)
            figures[sync].append(s)
            say(f"  {name} run {run}: native {sync}: {s:.2f} s")
        for side, waits, adaptive in (
            ("store", True, False),
            ("pipelined", False, False),
            ("on_loop", False, False),
            ("adaptive", False, True),
        ):
            directory = tmpdir / f"{name}-{side}-{run}"
            s, store, log_bytes, sizes = asyncio.run(
                recorded(
                    endpoint,
                    tmpdir / "fragments",
                    directory,
                    work,
                    waits,
                    adaptive,
                    on_loop=side == "on_loop",
                )
            )
            figures[side].append(s)
            db_size = os.path.getsize(store.path)
            st = store.stats()
            where = WHERE.get(side, "")
            say(
                f"  {name} run {run}: {side} (sync_waits={waits}{where}): {s:.2f} s, "
                f"{len(sizes)} commits, database {db_size / MiB:.1f} MiB, log "
                f"{log_bytes / MiB:.1f} MiB (page records {st['page_bytes'] / MiB:.1f} MiB, "
                f"WALs kept {st['wal_bytes_kept'] / MiB:.1f} MiB), barriers {st['barriers']}, "
                f"compactions {st['compactions']}"
            )
            if side == "pipelined":
                stats = (db_size, log_bytes, st)
            if adaptive:
                per_commit.append(len(work) / len(sizes))
                m = native(tmpdir / f"{name}-native-matched-{run}", work, "full", sizes)
                figures["matched"].append(m)
                say(f"  {name} run {run}: native full, the same transactions: {m:.2f} s")
    interleaved: dict[str, float] = {}
    modes = ["on_loop", "thread"] + (["synced"] if synced else [])
    for mode in modes if blocks else ():
        native_s, store_s, ratios = asyncio.run(
            paired(
                synced if mode == "synced" else endpoint,
                tmpdir / "fragments",
                tmpdir / f"{name}-paired-{mode}",
                work,
                blocks,
                on_loop=mode != "thread",
            )
        )
        key = {
            "on_loop": "ratio_paired_on_loop",
            "thread": "ratio_paired",
            "synced": "ratio_paired_on_loop_equal_durability",
        }[mode]
        where = WHERE.get(mode, "")
        say(
            f"  {name} paired{where}: native {native_s:.2f} s, store {store_s:.2f} s over "
            f"{len(ratios)} interleaved blocks: {store_s / native_s:.3f}x (blocks "
            f"{min(ratios):.2f}-{max(ratios):.2f}x)"
        )
        interleaved[key] = round(store_s / native_s, 3)
        interleaved[f"{key}_block_min"] = round(min(ratios), 3)
        interleaved[f"{key}_block_max"] = round(max(ratios), 3)
    best = {k: min(v) for k, v in figures.items()}
    db_size, log_bytes, st = stats
    return {
        **interleaved,
        "ratio": round(best["store"] / best["full"], 3),
        "ratio_pipelined": round(best["pipelined"] / best["full"], 3),
        "ratio_pipelined_on_loop": round(best["on_loop"] / best["full"], 3),
        "ratio_adaptive": round(best["adaptive"] / best["full"], 3),
        "ratio_adaptive_matched": round(best["adaptive"] / best["matched"], 3),
        "adaptive_batches_per_commit": round(statistics.median(per_commit), 2),
        "ratio_vs_normal": round(best["store"] / best["normal"], 3),
        "store_s": round(best["store"], 3),
        "pipelined_s": round(best["pipelined"], 3),
        "on_loop_s": round(best["on_loop"], 3),
        "adaptive_s": round(best["adaptive"], 3),
        "native_full_s": round(best["full"], 3),
        "native_matched_s": round(best["matched"], 3),
        "native_normal_s": round(best["normal"], 3),
        "database_mib": round(db_size / MiB, 1),
        "log_mib": round(log_bytes / MiB, 1),
        "page_records_mib": round(st["page_bytes"] / MiB, 1),
        "wal_kept_mib": round(st["wal_bytes_kept"] / MiB, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run (< 1 minute)")
    parser.add_argument("--rows", type=int, default=1000, help="rows per transaction")
    parser.add_argument("--runs", type=int, default=0, help="alternating runs of each side")
    args = parser.parse_args()
    txns = 200 if args.quick else 1000
    runs = args.runs or (2 if args.quick else 3)
    say(f"workload: {txns} transactions x {args.rows} rows, {runs} runs of each side")
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-", dir="/var/tmp") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "fragments").mkdir()
        with (
            EtcdServer() as etcd,
            BrokerProcess(etcd.endpoint, spool_dir=tmpdir / "spool") as b,
            BrokerProcess(
                etcd.endpoint,
                root="/gazette/synced",
                suffix="broker-synced",
                spool_dir=tmpdir / "spool-synced",
                extra_args=["--spool-sync"],
            ) as synced,
        ):
            consumer = measure(
                tmpdir,
                b.endpoint,
                "consumer",
                consumer_batches(txns, args.rows),
                runs,
                blocks=10,
                synced=synced.endpoint,
            )
            rand = measure(tmpdir, b.endpoint, "random", random_batches(txns // 4, args.rows), 1)
    result = {
        "bench": "sqlite",
        "ratio": consumer["ratio"],
        "target": 1.25,
        "target_for": "consumer_ratio_paired_on_loop",
        **{f"consumer_{k}": v for k, v in consumer.items() if k != "ratio"},
        "random_ratio": rand["ratio"],
        **{f"random_{k}": v for k, v in rand.items() if k != "ratio"},
        "txns": txns,
        "rows_per_txn": args.rows,
        "runs": runs,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
