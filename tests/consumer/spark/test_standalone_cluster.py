"""The shards export on a Spark standalone cluster, on network-namespace hosts (marked
``cluster``: opt-in, root).

    h0, h1  a broker and a stream-sum summer each (SQLite stores, hot standbys 1)
    h2      the Spark master and a worker (1 core)
    h3      a worker (1 core)
    h4      etcd and the moto S3 fragment store; cut off from h2 and h3

Workers see a private ``/tmp`` (`cluster_support.start_worker`) and reach neither etcd nor
S3: their executors get the shards' plans from the driver and read recovery logs from the
brokers, nothing else. Two drivers export the same quiescent state: one in this process (the
root namespace, ``spark.read.format("gazette-shards")``), one by ``gazctl shards export``
run on h1, writing Parquet to a directory every host shares. Both must equal, row for row,
the sums folded from the chunk journals through each exported checkpoint's read-through
offsets, which must be the journals' write heads.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import grpc.aio
import pyarrow.parquet as pq
import pytest

from gazette.broker.client import JournalClient
from gazette.broker.client.list import apply_journals
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.message.iterators import ReadCommittedIter
from gazette.testing.netns import Host, Net
from gazette.testing.s3 import MotoS3Server
from tests.consumer.spark.cluster_support import (
    HostConsumer,
    PatientBroker,
    executor_logs,
    master_url,
    private_tmp_of,
    start_master,
    start_worker,
    wait_master,
    wait_worker,
)
from tests.consumer.support import write_head
from tests.examples.conftest import STREAM_SUM
from tests.examples.shards_support import all_shards, statuses, until
from tests.kit.eventually import eventually
from tests.testing.hosts_support import etcd_endpoint, start_etcd, start_s3

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("nsenter") or not shutil.which("unshare"),
        reason="network and mount namespaces need root, nsenter and unshare",
    ),
]

from stream_sum.messages import Chunk, RunningSum, chunks_partition, shard_id  # noqa: E402
from stream_sum.specs import journal_specs, shard_specs  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
PARTITIONS = 2
ROOT = "/cluster-spark/stream-sum"
HINTS = "/cluster-spark/hints"
SCHEMA = "stream STRING, seq BIGINT, total BIGINT"
EXAMPLE_ENV = {"PYTHONPATH": f"{STREAM_SUM}{os.pathsep}{REPO}"}
SPARK_CONF = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
}

Row = tuple[str, str, int, int]
"""(shard, stream, seq, total)."""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every host sees (the workers' /tmp is their own): the Parquet output."""
    d = Path(tempfile.mkdtemp(prefix="gzn-spark-out-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def expected_rows(broker: str, read_through: dict[str, dict[str, int]]) -> list[Row]:
    """What the summers' stores hold at checkpoints of `read_through` (shard -> journal ->
    offset): the running sums of the streams still open, folded from the committed chunks."""
    rows: list[Row] = []
    async with JournalClient(broker) as client:
        for shard, offsets in read_through.items():
            for journal, end in offsets.items():
                sums: dict[str, RunningSum] = {}
                req = bpb.ReadRequest(journal=journal, offset=0, end_offset=end, block=True)
                it = ReadCommittedIter(client, req, None, lambda _s: Chunk())
                async for env in it:
                    chunk: Chunk = env.message
                    sums.setdefault(chunk.stream, RunningSum(chunk.stream)).add(chunk)
                rows += [(shard, s.stream, s.seq, s.total) for s in sums.values() if not s.ended]
    return sorted(rows)


def rows_and_checkpoints(records: list[dict[str, Any]]) -> tuple[list[Row], dict[str, bytes]]:
    """The rows, and each shard's checkpoint (every row of a shard carries the same)."""
    rows, checkpoints = [], {}
    for r in records:
        rows.append((r["shard"], r["stream"], r["seq"], r["total"]))
        assert checkpoints.setdefault(r["shard"], r["checkpoint"]) == r["checkpoint"]
    return sorted(rows), checkpoints


def read_throughs(checkpoints: dict[str, bytes]) -> dict[str, dict[str, int]]:
    out = {}
    for shard, blob in checkpoints.items():
        cp = pb.Checkpoint.FromString(blob)
        out[shard] = {j: int(s.read_through) for j, s in cp.sources.items()}
    return out


async def chunk_heads(broker: str) -> dict[str, int]:
    async with JournalClient(broker) as client:
        return {
            chunks_partition(i): await write_head(client, chunks_partition(i))
            for i in range(PARTITIONS)
        }


async def setup_gazette(s3: str, brokers: list[str], consumers: list[HostConsumer]) -> None:
    """The stream-sum journals (fragments in `s3`) and shards, once every shard has a
    primary and a standby."""
    async with JournalClient(brokers[0]) as client:
        specs = journal_specs(PARTITIONS, f"s3://fragments/stream-sum/?endpoint={s3}", 2)
        changes = [bpb.ApplyRequest.Change(upsert=s) for s in specs]
        await apply_journals(client, bpb.ApplyRequest(changes=changes))
    async with grpc.aio.insecure_channel(consumers[0].endpoint) as ch:
        stub = pb_grpc.ShardStub(ch)
        shards = shard_specs(PARTITIONS, hot_standbys=1, hint_prefix=HINTS)
        req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=s) for s in shards])
        assert (await stub.Apply(req)).status == pb.OK
        both = lambda s: sorted(s.values()) == sorted([PRIMARY, STANDBY])  # noqa: E731
        await until(all_shards(stub, PARTITIONS, both), "a primary and a standby per shard")


async def wait_consumed(consumers: list[HostConsumer], heads: dict[str, int]) -> None:
    """Until each shard's primary has read its chunks through `heads`."""
    by_suffix = {c.suffix: c for c in consumers}
    for i in range(PARTITIONS):
        journal = chunks_partition(i)

        async def read(shard: str = shard_id(i), journal: str = journal) -> bool:
            async with grpc.aio.insecure_channel(consumers[0].endpoint) as ch:
                st = await statuses(pb_grpc.ShardStub(ch))
            primary = next(m for m, code in st[shard].items() if code == PRIMARY)
            async with grpc.aio.insecure_channel(by_suffix[primary].endpoint) as ch:
                req = pb.StatRequest(shard=shard, read_through={journal: heads[journal]})
                resp = await pb_grpc.ShardStub(ch).Stat(req, timeout=30)
                return bool(resp.status == pb.OK)

        await eventually(
            read, what=f"{shard_id(i)} to read {journal}", timeout=60, interval=0.2,
            ignoring=(grpc.aio.AioRpcError, StopIteration),
        )  # fmt: skip


def source_options(etcd: str, brokers: list[str]) -> dict[str, str]:
    return {
        "etcd": etcd,
        "root": ROOT,
        "broker": ",".join(brokers),
        "selector": "app=stream-sum",
        "store": "sqlite",
        "table": "sums",
    }


def export_in_process(master: str, etcd: str, brokers: list[str], executors: set[str]) -> Any:
    """``spark.read.format("gazette-shards")`` from a driver in this process: the records,
    once the executors of the cluster (on hosts `executors`) joined. SQLite's columns are
    inferred (the driver plays the first shard)."""
    from pyspark.sql import SparkSession

    from gazette.consumer.spark import register
    from gazette.gazctl.export import driver_address

    driver = driver_address(master)
    builder = (
        SparkSession.builder.master(master)
        .appName("gazette-cluster-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", driver)
        .config("spark.driver.bindAddress", driver)
        .config("spark.pyspark.python", sys.executable)
    )
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    try:
        tracker = session.sparkContext._jsc.sc().statusTracker()

        def joined() -> bool:
            hosts = {str(i.host()) for i in tracker.getExecutorInfos()}
            return executors <= hosts and driver in hosts

        deadline = time.monotonic() + 60
        while not joined():
            assert time.monotonic() < deadline, "the executors did not join"
            time.sleep(0.2)
        hosts = sorted(str(i.host()) for i in tracker.getExecutorInfos())
        assert hosts == sorted({*executors, driver}), hosts
        register(session)
        reader = session.read.format("gazette-shards")
        for k, v in source_options(etcd, brokers).items():
            reader = reader.option(k, v)
        df = reader.load()
        assert df.columns == ["shard", "checkpoint", "stream", "seq", "total"]
        assert df.rdd.getNumPartitions() == PARTITIONS
        return [r.asDict() for r in df.collect()]
    finally:
        session.stop()


def gazctl_export_on(host: Host, master: str, etcd: str, brokers: list[str], to: Path) -> str:
    """``gazctl shards export`` run on `host` (its driver there), to Parquet `to`; its
    stderr (also in the host's ``gazctl.log``)."""
    argv = [
        sys.executable, "-m", "gazette.gazctl.main", "shards", "export",
        "--master", master, "--to", str(to),
        "--etcd", etcd, "--root", ROOT, "--broker", ",".join(brokers),
        "-l", "app=stream-sum", "--store", "sqlite", "--table", "sums", "--schema", SCHEMA,
        *(a for k, v in SPARK_CONF.items() for a in ("--conf", f"{k}={v}")),
    ]  # fmt: skip
    log = host.directory / "gazctl.log"
    with log.open("wb") as f:
        rc = subprocess.run(host.command(argv), stdout=f, stderr=f, timeout=120).returncode
    text = log.read_text(errors="replace")
    assert rc == 0, text
    return text


PRIMARY, STANDBY = pb.ReplicaStatus.PRIMARY, pb.ReplicaStatus.STANDBY


# About 4 minutes here (a Spark master, two workers and two drivers on 2 cores), near the
# suite's 300 s default.
@pytest.mark.timeout(600)
def test_shards_export_on_a_standalone_cluster(
    tmp_path: Path, shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0 = time.monotonic()
    # Spark starts the Python workers of this driver and of the executors with this
    # interpreter (the JVM reads it from its environment when the session starts).
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    with Net(5, directory=tmp_path, keep=True) as net:
        h0, h1, h2, h3, h4 = net.hosts
        # The JVMs first: the CPU they take to start would starve the others.
        master_proc = start_master(h2)
        master = master_url(h2)
        wait_master(h2, master_proc)
        workers = {h: start_worker(h, master) for h in (h2, h3)}
        for h, w in workers.items():
            wait_worker(h, w)

        start_etcd([h4], token=net.tag)
        etcd = etcd_endpoint(h4)
        s3 = start_s3(h4)
        env = MotoS3Server.env()
        boto3.client("s3", endpoint_url=s3, **_boto_args(env)).create_bucket(Bucket="fragments")
        brokers = [PatientBroker(h, etcd, root="/cluster-spark/brokers", env=env) for h in (h0, h1)]
        for b in brokers:
            b.start()
        endpoints = [b.endpoint for b in brokers]
        consumers = [
            HostConsumer(
                h, "stream_sum.app:Summer", etcd, endpoints, root=ROOT,
                env={**env, **EXAMPLE_ENV}, extra_args=["--hint-interval", "1"],
            )
            for h in (h0, h1)
        ]  # fmt: skip
        for c in consumers:
            c.start()
        asyncio.run(setup_gazette(s3, endpoints, consumers))

        # Load, then a quiescent state: the chunker stops (streams left open stay in the
        # stores) and the shards read everything it published.
        chunker = subprocess.Popen(
            [sys.executable, "-m", "stream_sum.chunker", "--broker", ",".join(endpoints),
             "--streams", "0", "--chunks", "50", "--concurrency", "120", "--rate", "1500",
             "--seed", "11", "--log-level", "warning"],
            env={**os.environ, **EXAMPLE_ENV}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        # Paces the load: four seconds of chunks, then a clean stop.
        time.sleep(4)
        chunker.send_signal(signal.SIGTERM)
        out, _ = chunker.communicate(timeout=60)
        assert chunker.returncode == 0, out
        heads = asyncio.run(chunk_heads(endpoints[0]))
        asyncio.run(wait_consumed(consumers, heads))

        # The executors need the brokers only: etcd and the fragment store are cut off.
        net.partition([[h2, h3], [h4]])
        t_ready = time.monotonic()

        try:
            records = export_in_process(master, etcd, endpoints, {h2.address, h3.address})
            t_read = time.monotonic()
            stderr = gazctl_export_on(h1, master, etcd, endpoints, shared_dir / "sums.parquet")
        except BaseException:
            for h, w in workers.items():
                print(f"=== executors of {h}\n{executor_logs(w)}")
            raise
        t_gazctl = time.monotonic()

        rows, checkpoints = rows_and_checkpoints(records)
        exported = read_throughs(checkpoints)
        assert sorted(exported) == [shard_id(i) for i in range(PARTITIONS)]
        assert exported == {shard_id(i): {chunks_partition(i): heads[chunks_partition(i)]}
                            for i in range(PARTITIONS)}  # fmt: skip
        expected = asyncio.run(expected_rows(endpoints[0], exported))
        assert {r[0] for r in expected} == set(exported), "a shard holds no open stream"
        assert rows == expected

        table = pq.read_table(shared_dir / "sums.parquet").to_pylist()
        parquet_rows, parquet_checkpoints = rows_and_checkpoints(table)
        assert parquet_rows == expected
        assert read_throughs(parquet_checkpoints) == exported
        assert f"wrote {len(expected)} rows" in stderr, stderr
        # Nothing the driver wrote reached the workers' /tmp (their executors' work only).
        for w in workers.values():
            assert not any(n.startswith(("pytest-", "gzn-")) for n in private_tmp_of(w))
        print(
            f"{len(expected)} rows of {PARTITIONS} shards; cluster and load ready in "
            f"{t_ready - t0:.1f}s, in-process export {t_read - t_ready:.1f}s, gazctl on "
            f"{h1.name} {t_gazctl - t_read:.1f}s"
        )


def _boto_args(env: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_DEFAULT_REGION"],
    }
