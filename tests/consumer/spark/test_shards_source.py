"""``gazette-shards`` end to end: etcd, a broker, real `gazette-consumer` processes (RocksDB,
SQLite and JSON stores), and a local[2] Spark exporting their shards while they consume.

Every export is checked against the input: a counter's totals are a function of the input it
read through, so the rows of a shard must equal the sums of its input journal up to the
read-through offset of the checkpoint exported with them.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from gazette.broker.client import JournalClient
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.hints import load_hints
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.consumer.spark import WrongStoreKind, register
from gazette.consumer.spark.errors import InvalidOption
from gazette.consumer.spark.playback import PlayedShard, check_store, rocksdb_batches
from gazette.consumer.spark.resolve import ShardPlan
from gazette.keyspace.etcd import Etcd
from gazette.message.iterators import ReadCommittedIter
from gazette.testing.broker import BrokerProcess
from gazette.testing.consumer import ConsumerProcess
from gazette.testing.etcd import EtcdServer
from tests.consumer.counter_app import Add
from tests.consumer.support import (
    REPO,
    apply_shards,
    feed,
    json_journal,
    recovery_log,
    write_head,
)
from tests.kit.eventually import eventually
from tests.kit.specs import apply_specs

_names = itertools.count()


class App:
    """Journals, shards and one consumer process of application `app`."""

    def __init__(
        self, etcd: EtcdServer, broker: BrokerProcess, tmp: Path, app: str, shards: int
    ) -> None:
        n = next(_names)
        self.app = app
        self.prefix = f"spark-{os.getpid()}-{n}"
        self.root = f"/test-spark/{os.getpid()}/{n}"
        self.hint_prefix = f"/test-spark-hints/{self.prefix}"
        self.etcd, self.broker, self.tmp = etcd, broker, tmp / self.prefix
        self.tmp.mkdir()
        self.inputs = [f"{self.prefix}/in-{i}" for i in range(shards)]
        self.shard_ids = [f"shard-{i:03d}" for i in range(shards)]
        self.consumer: ConsumerProcess | None = None

    async def start(self, client: JournalClient, disabled: tuple[str, ...] = ()) -> None:
        store = self.tmp / "fragments"
        specs = [json_journal(j, store) for j in self.inputs]
        specs += [
            recovery_log(f"{self.prefix}/recovery/{s}", store) for s in [*self.shard_ids, *disabled]
        ]
        await apply_specs(client, specs)
        self.consumer = ConsumerProcess(
            self.app,
            self.etcd.endpoint,
            [self.broker.endpoint],
            root=self.root,
            workdir=self.tmp / "consumer",
            extra_env={"PYTHONPATH": str(REPO)},
            extra_args=["--hint-interval", "1"],
        ).start()
        shard_specs = [
            pb.ShardSpec(
                id=sid,
                sources=[pb.ShardSpec.Source(journal=j)],
                recovery_log_prefix=f"{self.prefix}/recovery",
                hint_prefix=self.hint_prefix,
                hint_backups=2,
                max_txn_duration={"nanos": 100_000_000},
                labels={"labels": [{"name": "app", "value": "counter"}]},
            )
            for sid, j in zip(self.shard_ids, self.inputs, strict=True)
        ]
        shard_specs += [
            pb.ShardSpec(
                id=sid,
                sources=[pb.ShardSpec.Source(journal=self.inputs[0])],
                recovery_log_prefix=f"{self.prefix}/recovery",
                hint_prefix=self.hint_prefix,
                max_txn_duration={"seconds": 1},
                disable=True,
            )
            for sid in disabled
        ]
        async with grpc.aio.insecure_channel(self.consumer.endpoint) as ch:
            await apply_shards(pb_grpc.ShardStub(ch), shard_specs)

    async def wait_for_hints(self, timeout: float = 30.0) -> None:
        """Until every shard's primary wrote hints of a store holding something."""
        async with Etcd(self.etcd.endpoint) as etcd:

            async def hinted() -> bool:
                for shard in self.shard_ids:
                    hints = await load_hints(etcd, self.hint_prefix, shard)
                    if hints[0] is None or not hints[0].live_nodes:
                        return False
                return True

            await eventually(hinted, what="hints of every shard", timeout=timeout, interval=0.2)

    async def wait_consumed(self, client: JournalClient, timeout: float = 30.0) -> None:
        """Until every shard read its input through the input's current write head."""
        assert self.consumer is not None
        async with grpc.aio.insecure_channel(self.consumer.endpoint) as ch:
            stub = pb_grpc.ShardStub(ch)
            deadline = time.monotonic() + timeout
            for shard, journal in zip(self.shard_ids, self.inputs, strict=True):
                req = pb.StatRequest(
                    shard=shard, read_through={journal: await write_head(client, journal)}
                )

                async def read(req: pb.StatRequest = req) -> bool:
                    resp = await stub.Stat(req, timeout=timeout)
                    return bool(resp.status == pb.OK)

                await eventually(
                    read,
                    what=f"{shard} to read {journal}",
                    timeout=max(deadline - time.monotonic(), 0),
                    interval=0.1,
                    ignoring=(grpc.aio.AioRpcError,),  # Restarting.
                )

    async def wait_for_backup_hints(self, shard: str, timeout: float = 30.0) -> None:
        async with Etcd(self.etcd.endpoint) as etcd:

            async def backed_up() -> bool:
                hints = await load_hints(etcd, self.hint_prefix, shard)
                return len(hints) > 1 and hints[1] is not None

            await eventually(
                backed_up, what=f"backup hints of {shard}", timeout=timeout, interval=0.2
            )

    def options(self, **extra: str) -> dict[str, str]:
        return {
            "etcd": self.etcd.endpoint,
            "root": self.root,
            "broker": self.broker.endpoint,
            "read_through": "true",
            **extra,
        }

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.kill()


@pytest.fixture
def apps(etcd_server: EtcdServer, broker: BrokerProcess, tmp_path: Path) -> Iterator[Any]:
    made: list[App] = []

    def make(app: str, shards: int) -> App:
        a = App(etcd_server, broker, tmp_path, app, shards)
        made.append(a)
        return a

    yield make
    for a in made:
        a.close()


@pytest.fixture(scope="module")
def spark_shards(spark: Any) -> Any:
    register(spark)
    return spark


async def sums_through(client: JournalClient, journal: str, end: int) -> dict[str, int]:
    """Each key's sum of the Adds of `journal` before offset `end` (what a counter which
    read `journal` through `end` holds)."""
    out: dict[str, int] = {}
    if end == 0:
        return out
    req = bpb.ReadRequest(journal=journal, offset=0, end_offset=end, block=True)
    it = ReadCommittedIter(client, req, None, lambda _s: Add())
    try:
        while True:
            try:
                env = await it.next()
            except StopAsyncIteration:
                break
            if env.message.key:
                out[env.message.key] = out.get(env.message.key, 0) + env.message.n
    finally:
        it.close()
    return out


async def feeding(
    client: JournalClient, journals: list[str], body: Callable[[], Awaitable[None]]
) -> None:
    """Run `body` while Adds are fed to `journals`."""
    stop = asyncio.Event()
    feeders = [asyncio.create_task(feed(client, j, stop, {})) for j in journals]
    try:
        await body()
        assert not any(f.done() for f in feeders), "a feeder failed"
    finally:
        stop.set()
        await asyncio.gather(*feeders)


def collect(spark: Any, **options: str) -> tuple[Any, list[Any]]:
    df = spark.read.format("gazette-shards").options(**options).load()
    return df, df.collect()


async def test_rocksdb_shards_export_while_consuming(
    apps: Any, client: JournalClient, spark_shards: Any
) -> None:
    app = apps("tests.consumer.counter_app:Counter", 2)
    await app.start(client, disabled=("shard-off",))

    async def body() -> None:
        await app.wait_consumed(client)
        await app.wait_for_hints()
        await app.wait_consumed(client)  # More commits after the hints: playback goes past.
        t0 = time.monotonic()
        df, rows = await asyncio.to_thread(
            collect,
            spark_shards,
            # The native scanner must read what a recorded store wrote (not fall back).
            **app.options(selector="app=counter", store="rocksdb", rocksdb_scan="native"),
        )
        print(f"rocksdb export of 2 shards: {len(rows)} rows in {time.monotonic() - t0:.1f}s")
        assert df.rdd.getNumPartitions() == 2
        assert df.columns == ["shard", "checkpoint", "read_through", "key", "value"]
        by_shard: dict[str, list[Any]] = {}
        for r in rows:
            by_shard.setdefault(r.shard, []).append(r)
        assert sorted(by_shard) == app.shard_ids
        for shard, journal in zip(app.shard_ids, app.inputs, strict=True):
            srows = by_shard[shard]
            assert len({bytes(r.checkpoint) for r in srows}) == 1
            cp = pb.Checkpoint.FromString(bytes(srows[0].checkpoint))
            through = cp.sources[journal].read_through
            assert srows[0].read_through == {journal: through}
            assert through > 0
            got = {bytes(r.key): bytes(r.value) for r in srows}
            want = await sums_through(client, journal, through)
            assert got == {b"k" + k.encode(): str(v).encode() for k, v in want.items()}

        # Three key ranges of shard-000, each played by its own task while the shard keeps
        # committing: one snapshot (one checkpoint), every key once.
        df, rows = await asyncio.to_thread(
            collect,
            spark_shards,
            **app.options(shards="shard-000", store="rocksdb", splits="3", rocksdb_scan="native"),
        )
        assert df.rdd.getNumPartitions() == 3
        assert len({bytes(r.checkpoint) for r in rows}) == 1
        keys = [bytes(r.key) for r in rows]
        assert len(keys) == len(set(keys))
        journal = app.inputs[0]
        want = await sums_through(client, journal, rows[0].read_through[journal])
        assert {bytes(r.key): bytes(r.value) for r in rows} == {
            b"k" + k.encode(): str(v).encode() for k, v in want.items()
        }

        # A decoder to typed columns, and a key prefix (passed to the decoder stripped).
        _, decoded = await asyncio.to_thread(
            collect,
            spark_shards,
            **app.options(
                shards="shard-001",
                store="rocksdb",
                key_prefix="k",
                decoder="tests.consumer.spark.apps:decode_total",
                schema="name STRING, total BIGINT",
            ),
        )
        cp = pb.Checkpoint.FromString(bytes(decoded[0].checkpoint))
        want = await sums_through(client, app.inputs[1], cp.sources[app.inputs[1]].read_through)
        assert {r.name: r.total for r in decoded} == want

        # Errors raised on the driver at load(), before any job.
        def fails(match: str, **options: str) -> None:
            with pytest.raises(Exception, match=match):
                spark_shards.read.format("gazette-shards").options(**options).load()

        base = app.options()
        await asyncio.to_thread(
            fails, "shard 'shard-999' not found", shards="shard-999", store="rocksdb", **base
        )
        await asyncio.to_thread(
            fails, "no shard matches selector", selector="app=nope", store="rocksdb", **base
        )
        await asyncio.to_thread(
            fails,
            "no primary hints.*wait for them, or export from hints=backup.0",
            shards="shard-off",
            store="rocksdb",
            **base,
        )
        await asyncio.to_thread(
            fails,
            "no backup.5 hints",
            shards="shard-000",
            hints="backup.5",
            store="rocksdb",
            **base,
        )
        await asyncio.to_thread(
            fails,
            "option store=sqlite but its recovery log holds a RocksDB",
            shards="shard-000",
            store="sqlite",
            table="totals",
            **base,
        )
        await asyncio.to_thread(
            fails,
            "'hints'.*'primary' or 'backup.N'",
            shards="shard-000",
            store="rocksdb",
            hints="latest",
            **base,
        )
        await asyncio.to_thread(
            fails, "'store': must be one of", shards="shard-000", store="leveldb", **base
        )
        await asyncio.to_thread(
            fails,
            "either shards or selector",
            shards="shard-000",
            selector="app=counter",
            store="rocksdb",
            **base,
        )
        await asyncio.to_thread(
            fails,
            "'decoder': cannot load",
            shards="shard-000",
            store="rocksdb",
            decoder="no.such:fn",
            schema="a INT",
            **base,
        )
        await asyncio.to_thread(fails, "'shardz': unknown option", shardz="x", **base)

        # A wrong broker address: the query's planning fails after broker_timeout, where it
        # would otherwise wait for ever (the client retries unreachable brokers).
        refusing = socket.socket()
        refusing.bind(("127.0.0.1", 0))
        try:
            dead = f"127.0.0.1:{refusing.getsockname()[1]}"
            wrong = {**base, "broker": dead, "broker_timeout": "2"}
            t0 = time.monotonic()
            unanswered = f"no broker of (http://)?{dead} answered within 2s"
            with pytest.raises(Exception, match=unanswered):
                await asyncio.to_thread(
                    collect, spark_shards, shards="shard-000", store="rocksdb", **wrong
                )
            assert time.monotonic() - t0 < 30
        finally:
            refusing.close()

        # A new primary keeps the hints of the state it recovered as backup.0 (before it
        # serves Stat): an export from them plays the log on from an older point, to the
        # same kind of state.
        assert app.consumer is not None
        app.consumer.kill()  # A lone consumer's graceful stop waits --drain-timeout...
        await asyncio.to_thread(app.consumer.start)
        await app.wait_for_backup_hints("shard-000")
        await app.wait_consumed(client)
        _, rows = await asyncio.to_thread(
            collect,
            spark_shards,
            **app.options(shards="shard-000", store="rocksdb", hints="backup.0"),
        )
        journal = app.inputs[0]
        want = await sums_through(client, journal, rows[0].read_through[journal])
        assert {bytes(r.key): bytes(r.value) for r in rows} == {
            b"k" + k.encode(): str(v).encode() for k, v in want.items()
        }

    await feeding(client, app.inputs, body)


async def test_sqlite_and_json_shards_export_while_consuming(
    apps: Any, client: JournalClient, spark_shards: Any
) -> None:
    sql = apps("tests.consumer.spark.apps:SQLiteCounter", 1)
    js = apps("tests.consumer.spark.apps:JSONCounter", 1)
    await asyncio.gather(sql.start(client), js.start(client))

    async def body() -> None:
        await asyncio.gather(sql.wait_consumed(client), js.wait_consumed(client))
        await asyncio.gather(sql.wait_for_hints(), js.wait_for_hints())
        journal = sql.inputs[0]

        df, rows = await asyncio.to_thread(
            collect, spark_shards, **sql.options(shards="shard-000", store="sqlite", table="totals")
        )
        assert df.columns == ["shard", "checkpoint", "read_through", "key", "total", "ratio", "tag"]
        types = dict(df.dtypes)
        assert (types["key"], types["total"], types["ratio"], types["tag"]) == (
            "string",
            "bigint",
            "double",
            "binary",
        )
        through = rows[0].read_through[journal]
        want = await sums_through(client, journal, through)
        assert {r.key: r.total for r in rows} == want
        assert all(r.ratio == r.total / 2 and bytes(r.tag) == r.key.encode() for r in rows)

        # A query: expression columns take the types of their values.
        df, rows = await asyncio.to_thread(
            collect,
            spark_shards,
            **sql.options(
                shards="shard-000",
                store="sqlite",
                query="SELECT key, total * 2 AS doubled FROM totals WHERE total > 0",
            ),
        )
        assert dict(df.dtypes)["doubled"] == "bigint"
        want = await sums_through(client, journal, rows[0].read_through[journal])
        assert {r.key: r.doubled for r in rows} == {k: 2 * v for k, v in want.items() if v > 0}

        # The JSON store: one row holding the state.
        df, rows = await asyncio.to_thread(
            collect, spark_shards, **js.options(selector="id=shard-000", store="json")
        )
        assert df.columns == ["shard", "checkpoint", "read_through", "state"]
        assert len(rows) == 1
        import json

        jj = js.inputs[0]
        want = await sums_through(client, jj, rows[0].read_through[jj])
        assert json.loads(rows[0].state) == want

        with pytest.raises(Exception, match="store=json but its recovery log holds"):
            await asyncio.to_thread(
                collect, spark_shards, **sql.options(shards="shard-000", store="json")
            )

    await feeding(client, sql.inputs + js.inputs, body)


def test_played_files_of_another_store_kind_are_refused(tmp_path: Path) -> None:
    """The task-side check (when hints could not tell the kind): files of a RocksDB played
    for store=sqlite or json."""
    (tmp_path / "CURRENT").write_text("MANIFEST-000001\n")
    played = PlayedShard(ShardPlan("shard-x", "log", "key", b"{}"), tmp_path, {}, 0, 0.0)
    assert check_store(played, "rocksdb")
    for kind in ("sqlite", "json"):
        with pytest.raises(WrongStoreKind, match=f"store={kind} but its recovery log holds a Ro"):
            check_store(played, kind)
    empty = PlayedShard(played.plan, tmp_path / "none", {}, 0, 0.0)
    assert not check_store(empty, "sqlite")


@pytest.mark.parametrize("scan", ["native", "rocksdict"])
def test_rocksdb_rows_skip_store_keys_and_stop_at_the_key_prefix(tmp_path: Path, scan: str) -> None:
    """Application keys only (no 0x00 store keys), within `key_prefix`, across batches."""
    import pyarrow as pa
    from rocksdict import Rdict

    from gazette.stores.rocksdb.store import CHECKPOINT_KEY, recorded_options

    db = Rdict(str(tmp_path), recorded_options())
    cp = pb.Checkpoint()
    cp.sources["in"].read_through = 42
    db[CHECKPOINT_KEY] = cp.SerializeToString()
    keys = [b"a1", b"k0", b"k1", b"k2", b"k3", b"k4", b"l0", b"z"]
    for k in keys:
        db[k] = k.upper()
    db.close()
    schema = pa.schema(
        [
            ("shard", pa.string()),
            ("checkpoint", pa.binary()),
            ("read_through", pa.map_(pa.string(), pa.int64())),
            ("key", pa.binary()),
            ("value", pa.binary()),
        ]
    )
    played = PlayedShard(ShardPlan("shard-x", "log", "key", b"{}"), tmp_path, {}, 0, 0.0)
    cases = [(b"", keys), (b"k", keys[1:6]), (b"m", []), (b"k\xff", [])]
    for (prefix, want), size in itertools.product(cases, (1, 2, 5)):
        batches = list(
            rocksdb_batches(played, schema, key_prefix=prefix, batch_size=size, scan=scan)
        )
        rows = [r for b in batches for r in b.to_pylist()]
        assert [r["key"] for r in rows] == want
        assert all(r["value"] == r["key"].upper() for r in rows)
        assert all(r["read_through"] == [("in", 42)] and r["shard"] == "shard-x" for r in rows)


def test_checkpoint_option_full_offsets_or_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Option ``checkpoint``: the serialized checkpoint per row, only its read-through offsets
    (producer states and ACK intents dropped), or no such column; a large full checkpoint is
    logged, since every row carries a copy."""
    import pyarrow as pa
    from rocksdict import Rdict

    from gazette.consumer.spark.options import ShardsOptions
    from gazette.consumer.spark.playback import LARGE_CHECKPOINT
    from gazette.consumer.spark.shards_source import base_columns, base_ddl
    from gazette.stores.rocksdb.store import CHECKPOINT_KEY, recorded_options

    cp = pb.Checkpoint()
    cp.sources["in/a"].read_through = 42
    cp.sources["in/b"].read_through = 7
    for i in range(LARGE_CHECKPOINT // 20):  # Producers a shard has seen: a large checkpoint.
        entry = cp.sources["in/a"].producers.add(id=b"%06d" % i)
        entry.state.last_ack = 10**15 + i
        entry.state.begin = i
    cp.ack_intents["out"] = b'{"_meta":{"uuid":"..."}}\n'
    assert len(cp.SerializeToString()) > LARGE_CHECKPOINT
    db = Rdict(str(tmp_path), recorded_options())
    db[CHECKPOINT_KEY] = cp.SerializeToString()
    db[b"k"] = b"v"
    db.close()
    played = PlayedShard(ShardPlan("shard-x", "log", "key", b"{}"), tmp_path, {}, 0, 0.0)
    base = {"etcd": "e", "root": "/r", "broker": "b", "shards": "shard-x", "store": "rocksdb"}
    rt = pa.map_(pa.string(), pa.int64())
    kv = [("key", pa.binary()), ("value", pa.binary())]

    def rows(mode: str, read_through: bool) -> list[dict[str, Any]]:
        opts = ShardsOptions.parse({**base, "checkpoint": mode, "read_through": str(read_through)})
        assert opts.checkpoint == mode
        types = {"shard": pa.string(), "checkpoint": pa.binary(), "read_through": rt}
        fields = [(name, types[name]) for name in base_columns(opts)]
        ddl = base_ddl(opts)
        assert ("checkpoint BINARY" in ddl) == (mode != "none")
        assert ("read_through MAP" in ddl) == read_through
        schema = pa.schema(fields + kv)
        batches = rocksdb_batches(played, schema, checkpoint_mode=mode)
        return [r for b in batches for r in b.to_pylist()]

    caplog.set_level("WARNING", logger="gazette.consumer.spark.playback")
    (full,) = rows("full", False)
    assert pb.Checkpoint.FromString(full["checkpoint"]) == cp
    assert "checkpoint=offsets" in caplog.text and "shard=shard-x" in caplog.text
    caplog.clear()

    (offsets,) = rows("offsets", True)
    want = pb.Checkpoint()
    want.sources["in/a"].read_through = 42
    want.sources["in/b"].read_through = 7
    assert pb.Checkpoint.FromString(offsets["checkpoint"]) == want
    assert sorted(offsets["read_through"]) == [("in/a", 42), ("in/b", 7)]
    assert (offsets["key"], offsets["value"]) == (b"k", b"v")
    assert caplog.text == ""

    (none,) = rows("none", True)
    assert list(none) == ["shard", "read_through", "key", "value"]
    assert sorted(none["read_through"]) == [("in/a", 42), ("in/b", 7)]
    assert list(rows("none", False)[0]) == ["shard", "key", "value"]

    with pytest.raises(InvalidOption, match="'checkpoint'.*must be one of full, offsets, none"):
        ShardsOptions.parse({**base, "checkpoint": "some"})


@pytest.mark.parametrize("scan", ["native", "rocksdict"])
def test_the_utf8_decimal_decoder_types_word_count_rows(tmp_path: Path, scan: str) -> None:
    import pyarrow as pa
    from rocksdict import Rdict

    from gazette.consumer.spark.decoders import utf8_decimal
    from gazette.stores.rocksdb.store import recorded_options

    db = Rdict(str(tmp_path), recorded_options())
    db[b"nof the"] = b"12"
    db[b"nthe"] = b"7"
    db[b"x"] = b"not a count"
    db.close()
    schema = pa.schema(
        [
            ("shard", pa.string()),
            ("checkpoint", pa.binary()),
            ("read_through", pa.map_(pa.string(), pa.int64())),
            ("key", pa.string()),
            ("value", pa.int64()),
        ]
    )
    played = PlayedShard(ShardPlan("shard-x", "log", "key", b"{}"), tmp_path, {}, 0, 0.0)
    batches = rocksdb_batches(played, schema, key_prefix=b"n", decoder=utf8_decimal, scan=scan)
    rows = [(r["key"], r["value"]) for b in batches for r in b.to_pylist()]
    assert rows == [("of the", 12), ("the", 7)]


def test_schema_columns_may_not_reuse_the_base_names() -> None:
    """A decoder's (or query's) column named like a base column would be taken for it: the
    reader refuses it on the driver, also where that base column is absent."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from gazette.consumer.spark.errors import ExportError
    from gazette.consumer.spark.shards_source import GazetteShardsDataSource

    source = GazetteShardsDataSource(
        {
            "etcd": "e",
            "root": "/r",
            "broker": "b",
            "shards": "shard-1",
            "store": "rocksdb",
            "checkpoint": "none",
            "decoder": "gazette.consumer.spark.decoders:utf8_decimal",
            "schema": "read_through STRING, value BIGINT",
        }
    )

    def schema(*names: str) -> StructType:
        return StructType(
            [StructField(n, LongType() if n == "value" else StringType()) for n in names]
        )

    with pytest.raises(ExportError, match=r"columns \['read_through'\] of the schema clash"):
        source.reader(schema("shard", "read_through", "value"))
    assert source.reader(schema("shard", "key", "value")).schema.names == ["shard", "key", "value"]
