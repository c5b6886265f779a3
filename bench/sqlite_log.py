"""Recovery-log cost of a SQLite application against a RocksDB one on the same workload.

The workload is a stream consumer's: each transaction consumes `--rides` bike rides and
updates the per-station aggregates each ride touches (its start and end station's row among
`--stations`), then commits with a consumer Checkpoint, as examples/bike-share does. The same
transactions run through:

- ``rocksdb``: `RocksDBStore` (rocksdict on a fusefs mount), one key per station;
- ``sqlite_<page>_<mode>``: `SQLiteStore` on the loop, table ``stations`` with one row per
  station, for page sizes and journal modes (``sqlite_default`` is the store's default).

Each side's figure is what its recovery log grew by (the Recorder's write head) over the
transactions, per transaction; ``ratio*`` is a SQLite side's bytes over RocksDB's, measured in
the same run. ``*_snappy`` is the log's bytes compressed as a SNAPPY fragment store keeps them
(the broker's spool and its replication carry the uncompressed bytes). ``*_txn_ms`` is the
mean wall time of a transaction, commit included (a sanity check of what a page size costs in
speed; bench/sqlite.py measures speed). ``*_live_kib`` is what a playback from the store's
hints reads at the end: the part of the log that ``gazctl shards prune`` must keep, however
long the log grew. ``ratio_default`` names the store's default against
RocksDB; ``ratio_4k`` the same workload with 4 KiB pages (SQLite's default, the store's before
it set its own).

Prints progress on stderr, then one JSON line. `--quick` runs in under a minute.
"""

from __future__ import annotations

import os.path
import sys

# bench/ holds scripts named after packages; keep it off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import asyncio
import io
import json
import random
import struct
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import AppendService, JournalClient, RetryReader, apply_journals
from gazette.broker.fragment.codecs import compress_stream
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.consumer.protocol import pb as cpb
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.prune import live_ranges
from gazette.recoverylog.recorder import Recorder
from gazette.stores.rocksdb import RocksDBStore
from gazette.stores.sqlite import DEFAULT_PAGE_SIZE, SQLiteStore

MiB = 1 << 20
SCHEMA = """
CREATE TABLE IF NOT EXISTS stations (
    id INTEGER PRIMARY KEY,
    departures INTEGER NOT NULL DEFAULT 0,
    arrivals INTEGER NOT NULL DEFAULT 0,
    ride_seconds INTEGER NOT NULL DEFAULT 0
);
"""
UPSERT = (
    "INSERT INTO stations (id, departures, arrivals, ride_seconds) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET departures = departures + excluded.departures, "
    "arrivals = arrivals + excluded.arrivals, ride_seconds = ride_seconds + excluded.ride_seconds"
)
CONTENT_TYPE = "application/x-gazette-recoverylog"

Ride = tuple[int, int, int]  # Start station, end station, seconds.


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def workload(txns: int, rides: int, stations: int, seed: int = 1) -> list[list[Ride]]:
    """`txns` transactions of `rides` rides between random stations (a few busy ones: the
    weights fall as 1/rank, as the rides of a city's bike share)."""
    rnd = random.Random(seed)
    ids = list(range(1, stations + 1))
    weights = [1 / (i + 1) for i in range(stations)]
    return [
        [
            (*rnd.choices(ids, weights, k=2), rnd.randrange(60, 3600))  # type: ignore[misc]
            for _ in range(rides)
        ]
        for _ in range(txns)
    ]


def checkpoint(i: int) -> cpb.Checkpoint:
    """A consumer's checkpoint after transaction `i`: one source read through."""
    return cpb.Checkpoint(
        sources={"examples/bike-share/rides/part-000": cpb.Checkpoint.Source(read_through=i)}
    )


def sqlite_rows(rides: list[Ride]) -> list[tuple[int, int, int, int]]:
    return [r for s, e, sec in rides for r in ((s, 1, 0, sec), (e, 0, 1, 0))]


def apply_sqlite(conn: apsw.Connection, rides: list[Ride]) -> None:
    conn.executemany(UPSERT, sqlite_rows(rides))


@dataclass
class Side:
    """One side's figures."""

    log_bytes: int
    snappy_bytes: int
    live_bytes: int
    seconds: float
    txns: int

    def figures(self, name: str) -> dict[str, float]:
        return {
            f"{name}_bytes_per_txn": round(self.log_bytes / self.txns),
            f"{name}_snappy_bytes_per_txn": round(self.snappy_bytes / self.txns),
            f"{name}_live_kib": round(self.live_bytes / 1024, 1),
            f"{name}_txn_ms": round(1000 * self.seconds / self.txns, 3),
        }


def live_bytes(hints: rpb.FSMHints, head: int) -> int:
    """Bytes of the log a playback from `hints` reads, up to `head`: what pruning keeps."""
    spans = live_ranges({"shard": [hints]}).get(hints.log, [])
    return sum(min(end, head) - begin for begin, end in spans if begin < head)


async def new_log(client: JournalClient, fragments: Path, name: str) -> str:
    frag = pb.JournalSpec.Fragment(
        length=256 * MiB, compression_codec=pb.NONE, refresh_interval=Duration(seconds=600)
    )
    frag.stores.append(f"file://{fragments}/")
    log = f"bench/sqlite-log/{name}-{os.getpid()}-{time.monotonic_ns()}"
    spec = pb.JournalSpec(name=log, replication=1, fragment=frag)
    spec.labels.labels.add(name="content-type", value=CONTENT_TYPE)
    await apply_journals(client, pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
    return log


async def snappy_size(client: JournalClient, log: str, begin: int, end: int) -> int:
    """The bytes [begin, end) of `log` would take compressed with SNAPPY."""
    out = io.BytesIO()
    data = bytearray()
    async with RetryReader(client, pb.ReadRequest(journal=log, offset=begin, block=True)) as rr:
        while len(data) < end - begin:
            data += await rr.read(end - begin - len(data))
    compress_stream(pb.SNAPPY, io.BytesIO(bytes(data)), out)
    return len(out.getvalue())


async def consume(
    work: list[list[Ride]],
    apply: Callable[[list[Ride]], Awaitable[None]],
    commit: Callable[[int], asyncio.Future[None]],
) -> float:
    """Run `work` by the consumer's rule (the next transaction runs while the previous one
    commits; a commit starts once the one before is in the log); its seconds."""
    t0 = time.perf_counter()
    pending: asyncio.Future[None] | None = None
    for i, rides in enumerate(work):
        await apply(rides)
        if pending is not None:
            await pending
        pending = commit(i)
    if pending is not None:
        await pending
    return time.perf_counter() - t0


async def sqlite_side(
    endpoint: str, tmp: Path, work: list[list[Ride]], page_size: int, journal_mode: str
) -> Side:
    async with JournalClient(endpoint) as client, AppendService(client) as svc:
        name = f"sqlite-{page_size}-{journal_mode}"
        log = await new_log(client, tmp / "fragments", name)
        directory = tmp / f"{name}-{time.monotonic_ns()}"
        directory.mkdir()
        rec = await Recorder.open(FSM(log), 0x5E1, directory, svc, log)
        store = await SQLiteStore.open(
            rec,
            bootstrap_sql=SCHEMA,
            on_loop=True,
            journal_mode=journal_mode,
            page_size=page_size or DEFAULT_PAGE_SIZE,
        )
        await store.start_commit(None, cpb.Checkpoint(), [])
        begin = rec.write_head

        async def apply(rides: list[Ride]) -> None:
            await store.transact(apply_sqlite, rides)

        try:
            seconds = await consume(
                work, apply, lambda i: store.start_commit(None, checkpoint(i), [])
            )
            end = rec.write_head
            live = live_bytes(await store.build_hints(), end)
        finally:
            await store.close()
        snappy = await snappy_size(client, log, begin, end)
        return Side(end - begin, snappy, live, seconds, len(work))


async def rocksdb_side(endpoint: str, tmp: Path, work: list[list[Ride]]) -> Side:
    async with JournalClient(endpoint) as client:
        log = await new_log(client, tmp / "fragments", "rocksdb")
    store = await RocksDBStore.open(endpoint, log, tmp / f"rocksdb-{time.monotonic_ns()}")
    try:
        await store.start_commit(None, cpb.Checkpoint(), [])
        begin = (await store.mount.stats())["write_head"]

        async def apply(rides: list[Ride]) -> None:
            for station, dep, arr, sec in sqlite_rows(rides):
                key = b"s" + station.to_bytes(4, "big")
                raw = store.get(key)
                d, a, s = struct.unpack("<qqq", raw) if raw is not None else (0, 0, 0)
                store.put(key, struct.pack("<qqq", d + dep, a + arr, s + sec))

        seconds = await consume(
            work,
            apply,
            lambda i: asyncio.ensure_future(store.start_commit(None, checkpoint(i), [])),
        )
        end = (await store.mount.stats())["write_head"]
        live = live_bytes(await store.build_hints(), end)
    finally:
        await store.close()
    async with JournalClient(endpoint) as client:
        snappy = await snappy_size(client, log, begin, end)
    return Side(end - begin, snappy, live, seconds, len(work))


SQLITE_SIDES = [(0, "wal"), (4096, "wal"), (2048, "wal"), (1024, "wal"), (512, "wal")]
"""(page size, journal mode) of each SQLite side; page size 0: the store's default."""


def label(page_size: int, mode: str) -> str:
    return "sqlite_default" if page_size == 0 else f"sqlite_{page_size}_{mode}"


def main() -> None:
    from gazette.testing.broker import BrokerProcess
    from gazette.testing.etcd import EtcdServer

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run (< 1 minute)")
    parser.add_argument("--txns", type=int, default=0, help="transactions (2,000; quick 500)")
    parser.add_argument("--rides", type=int, default=4, help="rides per transaction")
    parser.add_argument("--stations", type=int, default=800, help="stations")
    parser.add_argument(
        "--sides", default="", help="comma-separated labels of the sides to run (default: all)"
    )
    args = parser.parse_args()
    txns = args.txns or (500 if args.quick else 2000)
    work = workload(txns, args.rides, args.stations)
    wanted = set(filter(None, args.sides.split(",")))
    say(f"workload: {txns} transactions x {args.rides} rides over {args.stations} stations")
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-log-", dir="/var/tmp") as t:
        tmp = Path(t)
        (tmp / "fragments").mkdir()
        with EtcdServer() as etcd, BrokerProcess(etcd.endpoint, spool_dir=tmp / "spool") as b:
            rocks = asyncio.run(rocksdb_side(b.endpoint, tmp, work))
            say(f"  rocksdb: {rocks}")
            results.update(rocks.figures("rocksdb"))
            for page_size, mode in SQLITE_SIDES:
                name = label(page_size, mode)
                if wanted and name not in wanted:
                    continue
                side = asyncio.run(sqlite_side(b.endpoint, tmp, work, page_size, mode))
                say(f"  {name}: {side}")
                results.update(side.figures(name))
                results[f"ratio_{name.removeprefix('sqlite_')}"] = round(
                    side.log_bytes / rocks.log_bytes, 2
                )
                results[f"ratio_{name.removeprefix('sqlite_')}_snappy"] = round(
                    side.snappy_bytes / rocks.snappy_bytes, 2
                )
    out: dict[str, Any] = {"bench": "sqlite_log"}
    for k in ("ratio_default", "ratio_4096_wal"):
        if k in results:
            out[k.replace("4096_wal", "4k")] = results.pop(k)
    print(json.dumps({**out, **results, "txns": txns, "rides_per_txn": args.rides}))


if __name__ == "__main__":
    main()
