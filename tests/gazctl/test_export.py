"""``gazctl journals export`` and ``gazctl shards export``: Parquet through local Spark.

Runs gazctl in-process; it reuses the test session's local[2] Spark (the `spark` fixture).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.hints import store_primary_hints
from gazette.consumer.protocol import pb
from gazette.consumer.spec import ShardKeys
from gazette.keyspace.etcd import Etcd
from gazette.message.publisher import Publisher
from gazette.stores.rocksdb import RocksDBStore
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer, free_port
from tests.consumer.spark.conftest import spark  # noqa: F401 -- the session fixture
from tests.gazctl.conftest import Gazctl
from tests.kit.specs import RECOVERY_LOG, apply_specs, journal_spec
from tests.message.notes import Note

SPECS = """
name: {prefix}
replication: 1
labels:
  - {{name: content-type, value: application/x-ndjson}}
  - {{name: topic, value: {topic}}}
fragment:
  length: 1048576
  compression_codec: NONE
  stores: ["file://{store}/"]
  refresh_interval: 1m0s
children:
  - name: {prefix}a
  - name: {prefix}b
"""


async def _publish(endpoint: str, prefix: str) -> None:
    async with JournalClient(endpoint) as client, AppendService(client) as svc:
        pub, dropped = Publisher(svc), Publisher(svc)
        for i in range(30):
            journal = f"{prefix}{'ab'[i % 2]}"
            pub.publish_uncommitted(
                lambda m, j=journal: (j, "application/x-ndjson"), Note("p", 1, i)
            )
            dropped.publish_uncommitted(
                lambda m, j=journal: (j, "application/x-ndjson"), Note("never", 1, i)
            )
        await pub.commit()
        await dropped.barrier()


def _setup(gazctl: Gazctl, broker: BrokerProcess, prefix: str, tmp_path: Path) -> str:
    topic = prefix.strip("/").replace("/", "-")
    # Replication-1 primaries reserve offsets in the store before acknowledging: it exists.
    (tmp_path / "store").mkdir()
    specs = SPECS.format(prefix=prefix, topic=topic, store=tmp_path / "store")
    r = gazctl("journals", "apply", "--specs", "-", stdin=specs.encode())
    assert r.rc == 0, r.err
    asyncio.run(_publish(broker.endpoint, prefix))
    return topic


def test_journals_export_committed_and_not(
    gazctl: Gazctl,
    gazctl_broker: BrokerProcess,
    prefix: str,
    tmp_path: Path,
    spark: Any,  # noqa: F811
) -> None:
    topic = _setup(gazctl, gazctl_broker, prefix, tmp_path)
    out = tmp_path / "committed.parquet"
    r = gazctl(
        "journals", "export", "-l", f"topic={topic}", "--to", str(out),
        "--schema", "message_producer STRING, txn BIGINT, i BIGINT",
    )  # fmt: skip
    assert r.rc == 0, r.err
    assert "2 partition(s)" in r.err and "wrote 30 rows" in r.err
    table = pq.read_table(out)
    assert table.column_names == [
        "journal", "begin", "end", "uuid", "producer", "clock", "flags",
        "message_producer", "txn", "i",
    ]  # fmt: skip
    rows = table.to_pylist()
    assert sorted(r["i"] for r in rows) == list(range(30))
    assert {r["message_producer"] for r in rows} == {"p"}
    assert {r["journal"] for r in rows} == {f"{prefix}a", f"{prefix}b"}

    # Uncommitted: the never-acknowledged messages too, and ACKs with --acks.
    out2 = tmp_path / "all.parquet"
    r = gazctl(
        "journals", "export", "-l", f"topic={topic}", "--to", str(out2), "--no-committed",
        "--acks",
    )  # fmt: skip
    assert r.rc == 0, r.err
    docs = pq.read_table(out2).column("doc").to_pylist()
    assert sum('"producer":"never"' in d for d in docs) == 30
    assert len(docs) == 30 + 30 + 2  # One ACK per journal.

    # The output exists: refused unless --mode overwrite.
    r = gazctl("journals", "export", "-l", f"topic={topic}", "--to", str(out))
    assert r.rc == 1 and "exists" in r.err
    r = gazctl(
        "journals", "export", "-l", f"topic={topic}", "--to", str(out), "--mode", "overwrite"
    )
    assert r.rc == 0, r.err
    assert pq.read_table(out).column_names[-1] == "doc"


def test_journals_export_errors(
    gazctl: Gazctl,
    tmp_path: Path,
    spark: Any,  # noqa: F811
) -> None:
    out = tmp_path / "x.parquet"
    r = gazctl("journals", "export", "-l", "topic=no-such-topic", "--to", str(out))
    assert r.rc == 1
    errors = [ln for ln in r.err.splitlines() if ln.startswith("gazctl: error:")]
    assert errors == [ln for ln in r.err.splitlines() if "error" in ln.lower()]  # No traceback.
    assert errors[0].startswith("gazctl: error: gazette-journals: no journals match selector")
    r = gazctl("journals", "export", "-l", "topic=x", "--to", str(out), "-O", "nonsense")
    assert r.rc == 1 and "expected KEY=VALUE" in r.err
    r = gazctl("journals", "export", "-l", "topic=x", "--to", str(out), "-O", "end=never")
    assert r.rc == 1 and "only 'head'" in r.err, r.err
    assert not out.exists()


def test_shards_export_errors_before_any_job(
    gazctl: Gazctl,
    etcd_server: EtcdServer,
    tmp_path: Path,
    spark: Any,  # noqa: F811
) -> None:
    out = tmp_path / "s.parquet"
    tracker = spark.sparkContext.statusTracker()
    jobs = len(tracker.getJobIdsForGroup(None))
    r = gazctl(
        "shards", "export", "--to", str(out), "--etcd", etcd_server.endpoint,
        "--root", "/gazctl-export/none", "--shards", "no-such-shard", "--store", "rocksdb",
    )  # fmt: skip
    assert r.rc == 1
    assert r.err.startswith("gazctl: error: shard 'no-such-shard' not found: "), r.err
    r = gazctl(
        "shards", "export", "--to", str(out), "--etcd", etcd_server.endpoint,
        "--root", "/gazctl-export/none", "-l", "app=x", "--store", "rocksdb", "--table", "t",
    )  # fmt: skip
    assert r.rc == 1 and "table" in r.err, r.err
    assert "starting Spark" not in r.err
    assert len(tracker.getJobIdsForGroup(None)) == jobs
    assert not out.exists()


async def _rocksdb_shard(etcd: str, broker: str, tmp: Path, root: str, keys: int) -> None:
    """A RocksDB store recorded to a log, its hints and ShardSpec in etcd, as a consumer
    leaves them (no consumer process needed to export it)."""
    shard, log_prefix, hint_prefix = "export-000", f"gz{root}/recovery", f"{root}-hints"
    log = f"{log_prefix}/{shard}"
    spec = journal_spec(log, tmp / "fragments", length=1 << 24, content_type=RECOVERY_LOG)
    async with JournalClient(broker) as client:
        await apply_specs(client, [spec])
    store = await RocksDBStore.open(broker, log, tmp / "store")
    try:
        for i in range(keys):
            store.put(b"n%04d" % i, b"%d" % (i * 3))
        cp = pb.Checkpoint()
        cp.sources["some/input"].read_through = 1234
        await store.start_commit(None, cp, [])  # type: ignore[arg-type]
        hints = await store.build_hints()
    finally:
        await store.close()
    shard_spec = pb.ShardSpec(
        id=shard,
        recovery_log_prefix=log_prefix,
        hint_prefix=hint_prefix,
        max_txn_duration=Duration(seconds=1),
    )
    shard_spec.sources.add(journal="some/input")
    shard_spec.labels.labels.add(name="app", value="export")
    async with Etcd(etcd) as client_etcd:
        await store_primary_hints(client_etcd, hint_prefix, shard, hints)
        await client_etcd.put(ShardKeys(root).item(shard).encode(), shard_spec.SerializeToString())


def test_shards_export_rocksdb(
    gazctl: Gazctl,
    gazctl_broker: BrokerProcess,
    etcd_server: EtcdServer,
    prefix: str,
    tmp_path: Path,
    spark: Any,  # noqa: F811
) -> None:
    root = "/gazctl-export/" + prefix.strip("/").replace("/", "-")
    (tmp_path / "fragments").mkdir()
    asyncio.run(_rocksdb_shard(etcd_server.endpoint, gazctl_broker.endpoint, tmp_path, root, 500))
    out = tmp_path / "shards.parquet"
    r = gazctl(
        "shards", "export", "--to", str(out), "--etcd", etcd_server.endpoint, "--root", root,
        "-l", "app=export", "--store", "rocksdb", "-O", "read_through=true",
    )  # fmt: skip
    assert r.rc == 0, r.err
    assert "1 partition(s)" in r.err and "wrote 500 rows" in r.err
    rows = pq.read_table(out).to_pylist()
    assert {r["shard"] for r in rows} == {"export-000"}
    assert {(r["key"], r["value"]) for r in rows} == {
        (b"n%04d" % i, b"%d" % (i * 3)) for i in range(500)
    }
    assert all(dict(r["read_through"]) == {"some/input": 1234} for r in rows)
    assert all(r["checkpoint"] for r in rows)

    out2 = tmp_path / "shards-no-checkpoint.parquet"
    r = gazctl(
        "shards", "export", "--to", str(out2), "--etcd", etcd_server.endpoint, "--root", root,
        "-l", "app=export", "--store", "rocksdb", "--checkpoint", "none",
    )  # fmt: skip
    assert r.rc == 0, r.err
    table = pq.read_table(out2)
    assert table.column_names == ["shard", "key", "value"]
    assert table.num_rows == 500


def test_shards_export_checks_etcd_and_shards_before_spark(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """A wrong --etcd, or a shard that does not exist, fails in seconds: before Spark
    starts (a command line of its own, as a user runs it: no Spark session to reuse)."""
    unused = f"127.0.0.1:{free_port()}"
    out = tmp_path / "s.parquet"
    cases = [
        (unused, "etcd does not answer (etcd " + unused),
        (etcd_server.endpoint, "shard 'no-such-shard' not found: no ShardSpec at /gz-none/"),
    ]
    for etcd, message in cases:
        t0 = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable, "-m", "gazette.gazctl", "shards", "export", "--to", str(out),
                "--etcd", etcd, "--root", "/gz-none", "--shards", "no-such-shard",
                "--store", "rocksdb",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        took = time.monotonic() - t0
        assert proc.returncode == 1, proc.stderr
        assert "starting Spark" not in proc.stderr
        assert f"gazctl: error: {message}" in proc.stderr, proc.stderr
        assert "check --etcd (env ETCD_ADDRESS)" in proc.stderr or etcd != unused
        # The interpreter's start and imports, then at most the etcd check's 2 s.
        assert took < 15, took
    assert not out.exists()
