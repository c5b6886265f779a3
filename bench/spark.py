"""Spark export benchmark: a 1M-key RocksDB shard through ``gazette-shards`` vs Parquet.

Real etcd and broker on this machine. A `RocksDBStore` recorded to a recovery log is filled
with N keys (``n`` + an n-gram -> its count as ASCII digits, as word-count keeps them) in
transactions of 10,000; its hints go to etcd and a ShardSpec under a consumer root names the
log, as a running consumer leaves them. Then, in one local[2] Spark session:

1. ``export``: ``spark.read.format("gazette-shards")`` (each task plays the log back from the
   hints into a temporary directory, opens RocksDB read-only and yields Arrow batches of its
   key range: ``splits=auto`` reads it as 2 partitions on 2 cores) written
   to Parquet (default columns: shard, checkpoint, key, value; the per-row read-through map is
   opt-in); the same rows read back from that Parquet and written again (``parquet``) is
   the baseline: `ratio_write` = export / parquet (target <= 2).
2. ``agg``: an aggregation reading every column of the rows (count, bytes of each column),
   no write: `ratio_agg`; and one of key and value only, `ratio_agg_kv`, where Parquet reads
   just those two columns while the Python source still produces all four (Python data
   sources can't prune columns). `ratio_agg_alternative`: the every-column aggregation
   with the shard read as 2 partitions if auto chose 1 (as on 2 cores), else as 1.
   `ratio_agg_private_playback`: the every-column aggregation with ``share_playback=false``
   (each task plays the log into a directory of its own, as before shared playback).
   Keys are read by the native scanner (``rocksdb_scan=native``, `stores.rocksdb.scan`);
   `ratio_agg_rocksdict`: the every-column aggregation reading them through rocksdict.
   `ratio_agg_python_source`: the same aggregation over the exported Parquet read by pyarrow
   inside a trivial Python data source (`parquet_source`): the floor of Spark's Python data
   source path for these rows, with no playback or store; `ratio_agg_over_python_source`
   is the export's time over it.
3. Playback alone (the `consumer.spark.playback` step each task does, outside Spark):
   `playback_s`, and the export's read rate without it, `rows_per_s_after_playback`.

4. Unless ``--quick``: 200k committed JSON messages over two journals exported through
   ``gazette-journals`` (an aggregation; two partitions) vs one in-process `ReadCommittedIter`
   reading both: `journals_rows_per_s`, `journals_reader_rows_per_s`.

Python workers and the source are warmed up by an untimed first job (a session's first Python data
source job costs ~7 s once), and the Parquet writer by an untimed export and Parquet write.
Prints progress, then one JSON line. `--quick` (50k keys) runs in under a minute.

``--sizes 1000000,5000000``: only `ratio_write`, at each size, in interleaved rounds, with
each job's CPU (JVM and Python) and the task's phases timed apart (`run_sizes`); about 6
minutes for those two sizes and 3 rounds on 2 cores.
"""

from __future__ import annotations

import os.path
import sys

# Keep this script's directory off the import path (bench/broker.py shadows package `broker`).
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import (
    AppendService,
    JournalClient,
    OffsetNotYetAvailable,
    apply_journals,
)
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.hints import store_primary_hints
from gazette.consumer.protocol import pb
from gazette.consumer.spec import ShardKeys
from gazette.keyspace.etcd import Etcd
from gazette.message import CONTENT_TYPE_JSON_LINES, JSONMessage
from gazette.message.iterators import ReadCommittedIter
from gazette.message.publisher import Publisher
from gazette.stores.rocksdb import RocksDBStore
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer

SHARD = "bench-part-000"
ROOT = "/bench/spark"
HINT_PREFIX = "/bench/spark-hints"
LOG_PREFIX = "bench/spark/recovery"
BATCH = 10_000


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def key(i: int) -> bytes:
    return b"n%07d gram%d" % (i, i % 977)


async def fill_shard(
    etcd_endpoint: str, broker: str, tmp: Path, keys: int, shard: str = SHARD
) -> dict[str, Any]:
    """Write `keys` keys through a recorded RocksDB store; leave hints and a ShardSpec in etcd."""
    log = f"{LOG_PREFIX}/{shard}"
    async with JournalClient(broker) as client:
        frag = bpb.JournalSpec.Fragment(
            length=256 << 20, compression_codec=bpb.NONE, refresh_interval=Duration(seconds=600)
        )
        frag.stores.append(f"file://{tmp / 'fragments'}/")
        spec = bpb.JournalSpec(name=log, replication=1, fragment=frag)
        spec.labels.labels.add(name="content-type", value="application/x-gazette-recoverylog")
        change = bpb.ApplyRequest.Change(upsert=spec)
        await apply_journals(client, bpb.ApplyRequest(changes=[change]))
    t0 = time.perf_counter()
    store = await RocksDBStore.open(broker, log, tmp / f"store-{shard}")
    try:
        for n, start in enumerate(range(0, keys, BATCH)):
            for i in range(start, min(keys, start + BATCH)):
                store.put(key(i), b"%d" % (i % 100_003 + 1))
            cp = pb.Checkpoint()
            cp.sources["bench/input"].read_through = n + 1
            await store.start_commit(None, cp, [])  # type: ignore[arg-type]
        hints = await store.build_hints()
    finally:
        await store.close()
    write_s = time.perf_counter() - t0
    shard_spec = pb.ShardSpec(
        id=shard,
        recovery_log_prefix=LOG_PREFIX,
        hint_prefix=HINT_PREFIX,
        max_txn_duration=Duration(seconds=1),
    )
    shard_spec.sources.add(journal="bench/input")
    shard_spec.labels.labels.add(name="app", value="bench")
    async with Etcd(etcd_endpoint) as etcd:
        await store_primary_hints(etcd, HINT_PREFIX, shard, hints)
        await etcd.put(ShardKeys(ROOT).item(shard).encode(), shard_spec.SerializeToString())
    return {"write_s": write_s}


@dataclass
class Delta(JSONMessage):
    """A word-count-like message: `delta` more of `ngram`."""

    ngram: str = ""
    delta: int = 0


async def fill_journals(broker: str, tmp: Path, messages: int) -> list[str]:
    """`messages` Deltas over two JSON journals, in committed transactions of 1,000."""
    names = [f"bench/spark/deltas/part-{i:03d}" for i in range(2)]
    async with JournalClient(broker) as client:
        changes = []
        for name in names:
            frag = bpb.JournalSpec.Fragment(
                length=256 << 20,
                compression_codec=bpb.NONE,
                refresh_interval=Duration(seconds=600),
            )
            frag.stores.append(f"file://{tmp / 'fragments'}/")
            spec = bpb.JournalSpec(name=name, replication=1, fragment=frag)
            spec.labels.labels.add(name="app", value="bench-deltas")
            spec.labels.labels.add(name="content-type", value=CONTENT_TYPE_JSON_LINES)
            changes.append(bpb.ApplyRequest.Change(upsert=spec))
        await apply_journals(client, bpb.ApplyRequest(changes=changes))
        async with AppendService(client) as svc:
            pub = Publisher(svc)
            mappings = [lambda _, j=name: (j, CONTENT_TYPE_JSON_LINES) for name in names]
            for i in range(messages):
                pub.publish_uncommitted(mappings[i % 2], Delta(f"w{i % 977} x", i))
                if i % 1000 == 999:
                    await pub.commit()
            await pub.commit()
            await pub.barrier()
    return names


async def read_committed(broker: str, names: list[str]) -> int:
    """Every committed message of `names` to their heads, in-process (the baseline)."""
    n = 0
    async with JournalClient(broker) as client:
        for name in names:
            it = ReadCommittedIter(
                client, bpb.ReadRequest(journal=name, block=False), None, lambda _: Delta()
            )
            try:
                async for env in it:
                    n += env.message.ngram != ""
            except OffsetNotYetAvailable:
                pass
            finally:
                it.close()
    return n


def playback_seconds(options: dict[str, str]) -> float:
    from gazette.consumer.spark.options import ShardsOptions
    from gazette.consumer.spark.playback import played_shard
    from gazette.consumer.spark.resolve import resolve_shards_sync

    opts = ShardsOptions.parse(options)
    (plan,) = resolve_shards_sync(opts)
    t0 = time.perf_counter()
    with played_shard(plan, opts.brokers, opts.tmpdir):
        took = time.perf_counter() - t0
    return took


def session() -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def parquet_source() -> Any:
    """A Python data source that yields the Arrow batches of a Parquet directory's files (one
    partition per file, read by pyarrow in the task): the same rows as an export, through the
    same Python data source path but with no playback or store behind it. Its time over
    Spark's own Parquet reader is the floor of that path (`ratio_agg_python_source`)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class File(InputPartition):
        def __init__(self, path: str) -> None:
            super().__init__(path)
            self.path = path

    class Reader(DataSourceReader):
        def __init__(self, directory: str, schema: Any) -> None:
            self.directory = directory
            self.schema = schema

        def partitions(self) -> list[File]:
            files = sorted(Path(self.directory).glob("part-*.parquet"))
            return [File(str(f)) for f in files]

        def read(self, partition: Any) -> Any:
            import pyarrow as pa
            import pyarrow.parquet as pq
            from pyspark.sql.pandas.types import to_arrow_schema

            arrow = to_arrow_schema(self.schema, timezone="UTC")
            table = pq.read_table(partition.path)
            for batch in table.to_batches(max_chunksize=65536):
                yield pa.RecordBatch.from_arrays(batch.columns, schema=arrow)

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench-parquet-python"

        def schema(self) -> str:
            return "shard STRING, checkpoint BINARY, key BINARY, value BINARY"

        def reader(self, schema: Any) -> Reader:
            return Reader(self.options["path"], schema)

    return Source


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def tree_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of process `pid` alone, and of its descendants (Spark's
    Python workers and the scanners they start; children they reaped included)."""
    tick = os.sysconf("SC_CLK_TCK")
    own, others = 0.0, 0.0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue  # It exited meanwhile (its parent's reaped-children time counts it).
        fields = stat[stat.rindex(")") + 2 :].split()
        utime, stime, cutime, cstime = (int(x) / tick for x in fields[11:15])
        if p == pid:
            own += utime + stime
            others += cutime + cstime
        else:
            others += utime + stime + cutime + cstime
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{p}/task").iterdir():
                with contextlib.suppress(OSError):
                    stack.extend(int(c) for c in (task / "children").read_text().split())
    return own, others


def task_phases(options: dict[str, str]) -> dict[str, float]:
    """What a one-split task does, outside Spark and one phase at a time: play the shard
    (`playback_s`), scan it with the native scanner (`scan_s`), and scan it again building
    the Arrow record batches Spark receives (`arrow_s`, the scan included)."""
    import pyarrow as pa

    from gazette.consumer.spark.options import ShardsOptions
    from gazette.consumer.spark.playback import played_shard, rocksdb_batches
    from gazette.consumer.spark.resolve import resolve_shards_sync
    from gazette.stores.rocksdb.scan import ScanStream

    opts = ShardsOptions.parse(options)
    (plan,) = resolve_shards_sync(opts)
    schema = pa.schema(
        [("shard", pa.string()), ("checkpoint", pa.binary())]
        + [("key", pa.binary()), ("value", pa.binary())]
    )
    t0 = time.perf_counter()
    with played_shard(plan, opts.brokers, opts.tmpdir) as played:
        t1 = time.perf_counter()
        with ScanStream(played.directory, b"\x01") as stream:
            scanned = sum(len(keys) for keys, _ in stream)
        t2 = time.perf_counter()
        built = sum(b.num_rows for b in rocksdb_batches(played, schema, scan="native"))
        t3 = time.perf_counter()
    assert scanned == built, (scanned, built)
    return {"playback_s": t1 - t0, "scan_s": t2 - t1, "arrow_s": t3 - t2}


def spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "min": round(ordered[0], 3),
        "median": round(ordered[len(ordered) // 2], 3),
        "max": round(ordered[-1], 3),
    }


def run_sizes(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """`ratio_write` at each of `args.sizes` keys (one shard per size, one session), in
    interleaved rounds: per size, the export written to Parquet and that Parquet read and
    written again back to back (which goes first alternates), then the same rows written
    from a Python data source over the Parquet (the floor of the Python path). Each job's
    CPU is split into the JVM's (Spark: Arrow to rows, the Parquet writer) and its
    descendants' (Python workers: playback, batches; scanners); `ratio_write_cpu` is the
    export's CPU over Parquet's, steadier than the wall-clock ratio on a shared machine. The
    task's phases are timed outside Spark (`task_phases`). Every job runs once untimed first:
    the first Parquet write of a session compiles the writer's code (8-20 s at 1M keys)."""
    (tmp / "fragments").mkdir()
    out: dict[str, Any] = {"bench": "spark-sizes", "target": 2.0, "repeat": args.repeat}
    load = [os.getloadavg()[0]]
    with EtcdServer() as etcd, BrokerProcess(etcd.endpoint, spool_dir=tmp / "spool") as broker:
        options: dict[int, dict[str, str]] = {}
        for keys in args.sizes:
            shard = f"bench-keys-{keys}"
            say(f"filling RocksDB shard {shard} (transactions of {BATCH})")
            filled = asyncio.run(fill_shard(etcd.endpoint, broker.endpoint, tmp, keys, shard))
            say(f"  written and recorded in {filled['write_s']:.1f}s")
            options[keys] = {
                "etcd": etcd.endpoint,
                "root": ROOT,
                "broker": broker.endpoint,
                "shards": shard,
                "store": "rocksdb",
                "tmpdir": str(tmp),
                "rocksdb_scan": "native",
                **({"splits": args.splits} if args.splits else {}),
            }
        spark = session()
        from gazette.consumer import spark as gazette_spark

        gazette_spark.register(spark)
        spark.dataSource.register(parquet_source())
        jvm = spark.sparkContext._gateway.proc.pid

        def write(keys: int, what: str) -> dict[str, float]:
            exported = tmp / f"export-{keys}.parquet"
            target = tmp / f"{what}-{keys}.parquet"
            shutil.rmtree(target, ignore_errors=True)
            if what == "export":
                reader = spark.read.format("gazette-shards")
                for k, v in options[keys].items():
                    reader = reader.option(k, v)
            elif what == "parquet":
                reader = spark.read.format("parquet").option("path", str(exported))
            else:
                reader = spark.read.format("bench-parquet-python").option("path", str(exported))
            before = tree_cpu(jvm)
            took, _ = timed(lambda: reader.load().write.parquet(str(target)))
            after = tree_cpu(jvm)
            return {
                "write_s": took,
                "jvm_cpu_s": after[0] - before[0],
                "python_cpu_s": after[1] - before[1],
            }

        jobs = ("export", "parquet", "python_source")
        for keys in args.sizes[:1]:
            warm = [round(write(keys, what)["write_s"], 2) for what in jobs]
            say(f"warm-up at {keys} keys (untimed): {dict(zip(jobs, warm, strict=True))}")
        runs: dict[int, dict[str, list[float]]] = {k: {} for k in args.sizes}
        for r in range(args.repeat):
            for keys in args.sizes:
                got: dict[str, dict[str, float]] = {}
                # Round 0 writes the export first: the Parquet side reads it.
                order = ("export", "parquet") if r % 2 == 0 else ("parquet", "export")
                for what in (*order, "python_source"):
                    got[what] = write(keys, what)
                phases = task_phases(options[keys])
                ex, pq = got["export"], got["parquet"]
                cpu = [m["jvm_cpu_s"] + max(0.0, m["python_cpu_s"]) for m in (ex, pq)]
                measured = {
                    "ratio_write": ex["write_s"] / pq["write_s"],
                    "ratio_write_cpu": cpu[0] / cpu[1],
                    **phases,
                }
                for what, figures in got.items():
                    measured.update({f"{what}_{name}": v for name, v in figures.items()})
                for name, v in measured.items():
                    runs[keys].setdefault(name, []).append(v)
                say(
                    f"round {r + 1}, {keys} keys: export {ex['write_s']:.2f}s (JVM "
                    f"{ex['jvm_cpu_s']:.1f}s CPU, Python {ex['python_cpu_s']:.1f}s) vs parquet "
                    f"{pq['write_s']:.2f}s (JVM {pq['jvm_cpu_s']:.1f}s): ratio "
                    f"{measured['ratio_write']:.2f} (CPU {measured['ratio_write_cpu']:.2f}); "
                    "Python source "
                    f"{got['python_source']['write_s']:.2f}s; task phases "
                    + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
                    + f"; load {os.getloadavg()[0]:.1f}"
                )
                load.append(os.getloadavg()[0])
        spark.stop()
    out["sizes"] = {
        str(keys): {name: spread(values) for name, values in row.items()}
        for keys, row in runs.items()
    }
    if len(args.sizes) > 1:
        lo, hi = args.sizes[0], args.sizes[-1]
        out["growth"] = {
            "keys": round(hi / lo, 3),
            **{
                what: round(min(runs[hi][f"{what}_write_s"]) / min(runs[lo][f"{what}_write_s"]), 3)
                for what in jobs
            },
        }
    out["load"] = spread(load)
    return out


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    keys = args.keys or (50_000 if args.quick else 1_000_000)
    (tmp / "fragments").mkdir()
    with EtcdServer() as etcd, BrokerProcess(etcd.endpoint, spool_dir=tmp / "spool") as broker:
        say(f"filling a RocksDB shard with {keys} keys (transactions of {BATCH})")
        filled = asyncio.run(fill_shard(etcd.endpoint, broker.endpoint, tmp, keys))
        say(f"  written and recorded in {filled['write_s']:.1f}s")
        options = {
            "etcd": etcd.endpoint,
            "root": ROOT,
            "broker": broker.endpoint,
            "shards": SHARD,
            "store": "rocksdb",
            "tmpdir": str(tmp),
            # The native scanner (`make bench` builds it): fail rather than fall back unseen.
            "rocksdb_scan": "native",
        }
        play_s = playback_seconds(options)
        say(f"playback alone: {play_s:.2f}s")

        spark_s, spark = timed(session)
        say(f"Spark local[2] started in {spark_s:.1f}s")
        from pyspark.sql import functions as F

        from gazette.consumer import spark as gazette_spark

        gazette_spark.register(spark)
        spark.dataSource.register(parquet_source())

        if args.splits:
            options["splits"] = args.splits

        def source(**extra: str) -> Any:
            reader = spark.read.format("gazette-shards")
            for k, v in {**options, **extra}.items():
                reader = reader.option(k, v)
            return reader.load()

        def python_source(path: Path) -> Any:
            return spark.read.format("bench-parquet-python").option("path", str(path)).load()

        def agg(df: Any) -> Any:
            """Every column read: the rows, as an export reads them."""
            return df.agg(
                F.count(F.lit(1)).alias("rows"),
                F.sum(F.length("shard")).alias("shard_bytes"),
                F.sum(F.length("checkpoint")).alias("checkpoint_bytes"),
                F.sum(F.length("key")).alias("key_bytes"),
                F.sum(F.length("value")).alias("value_bytes"),
            ).collect()[0]

        def agg_kv(df: Any) -> Any:
            """Only key and value: Parquet reads just those two columns (the source can't
            prune: Python data sources produce every column)."""
            return df.agg(
                F.count(F.lit(1)).alias("rows"),
                F.sum(F.length("key")).alias("key_bytes"),
                F.sum(F.length("value")).alias("value_bytes"),
            ).collect()[0]

        # The first job of a Python data source in a session costs seconds (its planner's
        # worker and imports): pay it once, untimed, as for the Python workers above.
        warm_s, _ = timed(lambda: agg(source()))
        say(f"first gazette-shards job (warm-up, Python workers started) {warm_s:.1f}s")
        partitions = source().rdd.getNumPartitions()
        splits = options.get("splits", "auto")
        say(f"the shard is read as {partitions} partition(s) (splits={splits})")

        exported = tmp / "export.parquet"
        again = tmp / "again.parquet"
        # So is a session's first Parquet write (the writer's code compiled: 8-20 s at 1M keys,
        # which the first timed write, the export's, would otherwise pay).
        warm_s, _ = timed(lambda: source().write.parquet(str(exported)))
        warm_parquet_s, _ = timed(
            lambda: spark.read.parquet(str(exported)).write.parquet(str(again))
        )
        say(f"first writes (warm-up): export {warm_s:.1f}s, parquet {warm_parquet_s:.1f}s")
        export_s: list[float] = []
        parquet_s: list[float] = []
        agg_export_s: list[float] = []
        agg_parquet_s: list[float] = []
        kv_export_s: list[float] = []
        kv_parquet_s: list[float] = []
        alternative = 2 if partitions == 1 else 1
        alternative_s: list[float] = []
        private_s: list[float] = []
        rocksdict_s: list[float] = []
        python_source_s: list[float] = []
        rows = None
        for r in range(args.repeat):
            for done in (exported, again):
                shutil.rmtree(done, ignore_errors=True)
            t, _ = timed(lambda: source().write.parquet(str(exported)))
            export_s.append(t)
            t, _ = timed(lambda: spark.read.parquet(str(exported)).write.parquet(str(again)))
            parquet_s.append(t)
            t, got = timed(lambda: agg(source()))
            agg_export_s.append(t)
            t, want = timed(lambda: agg(spark.read.parquet(str(exported))))
            agg_parquet_s.append(t)
            assert got == want and got["rows"] == keys, (got, want)
            t, got_kv = timed(lambda: agg_kv(source()))
            kv_export_s.append(t)
            t, want_kv = timed(lambda: agg_kv(spark.read.parquet(str(exported))))
            kv_parquet_s.append(t)
            assert got_kv == want_kv, (got_kv, want_kv)
            t, got_alt = timed(lambda: agg(source(splits=str(alternative))))
            alternative_s.append(t)
            assert got_alt == want, (got_alt, want)
            t, got_private = timed(lambda: agg(source(share_playback="false")))
            private_s.append(t)
            assert got_private == want, (got_private, want)
            t, got_rocksdict = timed(lambda: agg(source(rocksdb_scan="rocksdict")))
            rocksdict_s.append(t)
            assert got_rocksdict == want, (got_rocksdict, want)
            if r == 0:
                agg(python_source(exported))  # Its planner's worker starts: untimed.
            t, got_python = timed(lambda: agg(python_source(exported)))
            python_source_s.append(t)
            assert got_python == want, (got_python, want)
            rows = got["rows"]
            say(
                f"run {r + 1}: write export {export_s[-1]:.2f}s vs parquet {parquet_s[-1]:.2f}s; "
                f"agg export {agg_export_s[-1]:.2f}s vs parquet {agg_parquet_s[-1]:.2f}s; "
                f"key/value agg export {kv_export_s[-1]:.2f}s vs parquet {kv_parquet_s[-1]:.2f}s"
                + f"; agg export as {alternative} partition(s) {alternative_s[-1]:.2f}s"
                + f"; agg export, a playback per task {private_s[-1]:.2f}s"
                + f"; agg export through rocksdict {rocksdict_s[-1]:.2f}s"
                + f"; agg of the Parquet through a Python source {python_source_s[-1]:.2f}s"
            )
        journals: dict[str, Any] = {}
        if args.messages:
            say(f"publishing {args.messages} messages to 2 JSON journals (transactions of 1000)")
            names = asyncio.run(fill_journals(broker.endpoint, tmp, args.messages))
            reader_s, n = timed(lambda: asyncio.run(read_committed(broker.endpoint, names)))
            assert n == args.messages, n

            def journals_agg() -> Any:
                df = (
                    spark.read.format("gazette-journals")
                    .option("broker", broker.endpoint)
                    .option("selector", "app=bench-deltas")
                    .option("schema", "ngram STRING, delta BIGINT")
                    .load()
                )
                return df.agg(F.count(F.lit(1)).alias("rows"), F.sum("delta")).collect()[0]

            journals_agg()  # Warm-up.
            spark_s_j, got_j = timed(journals_agg)
            assert got_j["rows"] == args.messages, got_j
            journals = {
                "journal_messages": args.messages,
                "journals_export_s": round(spark_s_j, 3),
                "journals_rows_per_s": round(args.messages / spark_s_j),
                "journals_reader_s": round(reader_s, 3),
                "journals_reader_rows_per_s": round(args.messages / reader_s),
            }
            say(f"journals: export {spark_s_j:.2f}s (2 partitions) vs one reader {reader_s:.2f}s")
        spark.stop()
    e, p, ae, ap = min(export_s), min(parquet_s), min(agg_export_s), min(agg_parquet_s)
    ke, kp = min(kv_export_s), min(kv_parquet_s)
    assert rows is not None
    return {
        "bench": "spark",
        "keys": keys,
        "rows": rows,
        "ratio_write": round(e / p, 3),
        "ratio_agg": round(ae / ap, 3),
        "ratio_agg_kv": round(ke / kp, 3),
        "target": 2.0,
        "export_write_s": round(e, 3),
        "parquet_write_s": round(p, 3),
        "export_agg_s": round(ae, 3),
        "parquet_agg_s": round(ap, 3),
        "export_agg_kv_s": round(ke, 3),
        "parquet_agg_kv_s": round(kp, 3),
        "partitions": partitions,
        "alternative_partitions": alternative,
        "ratio_agg_alternative": round(min(alternative_s) / ap, 3),
        "ratio_agg_private_playback": round(min(private_s) / ap, 3),
        "ratio_agg_rocksdict": round(min(rocksdict_s) / ap, 3),
        "ratio_agg_python_source": round(min(python_source_s) / ap, 3),
        "ratio_agg_over_python_source": round(ae / min(python_source_s), 3),
        "export_rows_per_s": round(rows / ae),
        "parquet_rows_per_s": round(rows / ap),
        "playback_s": round(play_s, 3),
        "rows_per_s_after_playback": round(rows / max(ae - play_s, 1e-3)),
        "store_write_s": round(filled["write_s"], 3),
        "spark_start_s": round(spark_s, 3),
        "repeat": args.repeat,
        **journals,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50k keys (< 1 minute)")
    parser.add_argument("--keys", type=int, default=0, help="keys in the shard (default 1M)")
    parser.add_argument(
        "--sizes",
        default="",
        help="comma-separated key counts (e.g. 1000000,5000000): only ratio_write at each, "
        "in interleaved rounds, with the CPU and the task's phases (run_sizes)",
    )
    parser.add_argument("--repeat", type=int, default=0, help="timed runs (best is reported)")
    parser.add_argument("--splits", default="", help="the source's splits option (default auto)")
    parser.add_argument(
        "--messages", type=int, default=-1, help="journal messages (default: 0 quick, 200k)"
    )
    args = parser.parse_args()
    args.repeat = args.repeat or (1 if args.quick else 3)
    if args.messages < 0:
        args.messages = 0 if args.quick else 200_000
    args.sizes = [int(n) for n in args.sizes.split(",") if n]
    with tempfile.TemporaryDirectory(prefix="bench-spark-", dir="/var/tmp") as t:
        result = run_sizes(args, Path(t)) if args.sizes else run(args, Path(t))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
