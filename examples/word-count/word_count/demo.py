"""The word-count part of `make demo` (also runnable alone: ``python -m word_count.demo``
starts its own etcd and broker).

Applies the word-count journals with ``gazctl journals apply``, starts two ``gazette-consumer
word_count.app:WordCount`` processes (zones zone-a and zone-b), applies one shard per deltas
partition (hot_standbys 1) with ``gazctl shards apply``, feeds a few paragraphs with
``python -m word_count.feed``, shows each shard's primary and standby, SIGKILLs a primary,
shows its standby take over, feeds more text, and queries the top n-grams through the
``/wordcount.NGrams/Query`` API of both processes (one of them proxying to the primary),
checking every count against the text; then exports the shards to a Spark DataFrame with the
``gazette-shards`` source while the consumers run, and prints the top n-grams from it. Every
process it starts is stopped at the end.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import cast

import grpc.aio

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import pb
from gazette.testing.consumer import ConsumerProcess
from word_count.clients import journal_client, shard_client
from word_count.messages import deltas_partition, ngrams, shard_id, words
from word_count.query import query
from word_count.specs import journals_yaml, shards_yaml

__all__ = ["run"]

PACKAGE_DIR = Path(__file__).resolve().parents[1]
PARTITIONS = 2
ROOT = "/gazette/consumers/word-count"
PRIMARY, STANDBY = pb.ReplicaStatus.PRIMARY, pb.ReplicaStatus.STANDBY

FIRST = """\
It was the best of times, it was the worst of times, it was the age of wisdom, it was the
age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the
season of Light, it was the season of Darkness, it was the spring of hope, it was the winter
of despair, we had everything before us, we had nothing before us, we were all going direct
to Heaven, we were all going direct the other way.

Four score and seven years ago our fathers brought forth on this continent, a new nation,
conceived in Liberty, and dedicated to the proposition that all men are created equal. Now
we are engaged in a great civil war, testing whether that nation, or any nation so conceived
and so dedicated, can long endure. We are met on a great battle-field of that war.
"""

SECOND = """\
But, in a larger sense, we can not dedicate, we can not consecrate, we can not hallow this
ground. The brave men, living and dead, who struggled here, have consecrated it, far above our
poor power to add or detract. It is for us the living, rather, to be dedicated here to the
unfinished work which they who fought here have thus far so nobly advanced. It is rather for
us to be here dedicated to the great task remaining before us, that this nation, under God,
shall have a new birth of freedom, and that government of the people, by the people, for the
people, shall not perish from the earth.
"""


def step(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def show(out: str) -> None:
    sys.stdout.write(textwrap.indent(out if out.endswith("\n") else out + "\n", "    "))


class Tools:
    """gazctl and the word-count commands, run as a user would."""

    def __init__(self, broker: str, consumer: str) -> None:
        self.env = {
            **os.environ,
            "BROKER_ADDRESS": broker,
            "CONSUMER_ADDRESS": consumer,
            "PYTHONPATH": os.pathsep.join(
                [str(PACKAGE_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }

    def run(self, *argv: str, stdin: bytes | None = None) -> str:
        proc = subprocess.run(
            [sys.executable, *argv], input=stdin, capture_output=True, env=self.env, timeout=120
        )
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr.decode()}")
        return proc.stdout.decode() + proc.stderr.decode()

    def gazctl(self, *args: str) -> str:
        return self.run("-m", "gazette.gazctl.main", *args)


async def _statuses(endpoint: str) -> dict[str, dict[str, int]]:
    async with shard_client(endpoint) as sc:
        resp = await sc.stub.List(pb.ListRequest(), timeout=5)
    return {
        s.spec.id: {m.suffix: st.code for m, st in zip(s.route.members, s.status, strict=False)}
        for s in resp.shards
    }


def wait_shards(
    endpoint: str, ok: Callable[[dict[str, int]], bool], what: str, timeout: float = 60
) -> float:
    """Poll the consumer at `endpoint` until every shard's statuses satisfy `ok`."""
    t0 = time.monotonic()
    while True:
        try:
            st = asyncio.run(_statuses(endpoint))
            if len(st) == PARTITIONS and all(ok(s) for s in st.values()):
                return time.monotonic() - t0
        except grpc.aio.AioRpcError:
            pass
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"shards did not reach {what} within {timeout}s")
        time.sleep(0.1)


def primary_and_standby(s: dict[str, int]) -> bool:
    return sorted(s.values()) == sorted([PRIMARY, STANDBY])


async def _read_through(broker: str, consumer: str) -> None:
    """Wait until every shard's committed transactions read its partition to the write head."""
    async with journal_client(broker) as client, shard_client(consumer) as sc:
        for i in range(PARTITIONS):
            journal = deltas_partition(i)
            stub = client.stub_for(journal)
            call = stub.Read(bpb.ReadRequest(journal=journal, offset=-1, metadata_only=True))
            meta = cast(bpb.ReadResponse, await call.read())
            req = pb.StatRequest(shard=shard_id(i), read_through={journal: meta.write_head})
            resp = await sc.stub.Stat(req, timeout=60)
            if resp.status != pb.OK:
                raise SystemExit(f"Stat {shard_id(i)}: {pb.Status.Name(resp.status)}")


def counts_of(text: str) -> Counter[str]:
    return Counter(ngrams(words(text), 2))


def run(etcd: str, brokers: list[str], data: Path) -> None:
    """The word-count demo against a running etcd and brokers; files go under `data`."""
    tools = Tools(brokers[0], "")
    step("word-count: applying its journals with `gazctl journals apply`")
    store = data / "word-count-fragments"
    store.mkdir(exist_ok=True)
    jyaml = data / "word-count-journals.yaml"
    jyaml.write_text(journals_yaml(PARTITIONS, f"file://{store}/", replication=len(brokers)))
    print(textwrap.indent(jyaml.read_text(), "    | "))
    show(tools.gazctl("journals", "apply", "--specs", str(jyaml)))

    consumers = [
        ConsumerProcess(
            "word_count.app:WordCount",
            etcd,
            brokers,
            root=ROOT,
            zone=zone,
            suffix=f"word-count-{i}",
            workdir=data / f"word-count-{i}",
            lease_ttl=3,
            extra_env={"PYTHONPATH": tools.env["PYTHONPATH"]},
            extra_args=["--hint-interval", "1", "--drain-timeout", "0"],
        )
        for i, zone in enumerate(["zone-a", "zone-b"])
    ]
    by_suffix = {c.suffix: c for c in consumers}
    try:
        step("starting two consumers: `gazette-consumer word_count.app:WordCount` (lease TTL 3 s)")
        for c in consumers:
            c.start()
            print(f"    {c.zone}#{c.suffix} at {c.endpoint}, work dir {c.workdir}")
        tools = Tools(brokers[0], consumers[0].endpoint)

        step(f"applying {PARTITIONS} shards (hot_standbys: 1) with `gazctl shards apply`")
        syaml = data / "word-count-shards.yaml"
        syaml.write_text(shards_yaml(PARTITIONS, hot_standbys=1))
        print(textwrap.indent(syaml.read_text(), "    | "))
        show(tools.gazctl("shards", "apply", "--specs", str(syaml)))
        secs = wait_shards(consumers[0].endpoint, primary_and_standby, "a primary and a standby")
        print(f"    every shard has a primary and a hot standby after {secs:.1f}s:")
        show(tools.gazctl("shards", "list", "-l", "app=word-count"))

        step("feeding a few paragraphs with `python -m word_count.feed` (one delta per bigram)")
        first = data / "first.txt"
        first.write_text(FIRST)
        show(tools.run("-m", "word_count.feed", "--broker", brokers[0], str(first)))
        expected = counts_of(FIRST)

        st = asyncio.run(_statuses(consumers[0].endpoint))
        victim_suffix = next(m for m, c in st[shard_id(0)].items() if c == PRIMARY)
        victim = by_suffix[victim_suffix]
        survivor = next(c for c in consumers if c is not victim)
        step(f"SIGKILL {victim.zone}#{victim.suffix}, the primary of {shard_id(0)}")
        victim.kill()
        secs = wait_shards(
            survivor.endpoint,
            lambda s: s.get(survivor.suffix) == PRIMARY,
            f"{survivor.suffix} primary of every shard",
        )
        print(
            f"    {secs:.1f}s later (its lease expired) the standby {survivor.zone}#"
            f"{survivor.suffix} is the primary of every shard:"
        )
        tools = Tools(brokers[0], survivor.endpoint)
        show(tools.gazctl("shards", "list", "-l", "app=word-count"))

        step("feeding more text while the killed consumer is down")
        second = data / "second.txt"
        second.write_text(SECOND)
        show(tools.run("-m", "word_count.feed", "--broker", brokers[0], str(second)))
        expected += counts_of(SECOND)

        step(f"restarting {victim.zone}#{victim.suffix}: it recovers the logs as a hot standby")
        t0 = time.monotonic()
        victim.start()
        wait_shards(survivor.endpoint, primary_and_standby, "a primary and a standby")
        print(
            f"    every shard has its standby back {time.monotonic() - t0:.1f}s after the restart"
        )
        show(tools.gazctl("shards", "list", "-l", "app=word-count"))

        asyncio.run(_read_through(brokers[0], survivor.endpoint))
        step("top bigrams through the query API (`/wordcount.NGrams/Query`) of each consumer")
        for c in consumers:
            got: Counter[str] = Counter()
            served = []
            for i in range(PARTITIONS):
                resp = asyncio.run(query(c.endpoint, {"shard": shard_id(i), "prefix": ""}))
                got.update(resp["counts"])
                how = "itself" if resp["served_by"] == f"{c.zone}#{c.suffix}" else "proxied"
                served.append(f"{resp['shard']} {how} ({resp['served_by']})")
            if got != expected:
                diff = {g for g in got.keys() | expected.keys() if got[g] != expected[g]}
                raise SystemExit(f"counts via {c.suffix} differ from the text's: {sorted(diff)}")
            print(f"    via {c.zone}#{c.suffix}: {'; '.join(served)}")
            print(f"      all {len(got)} bigram counts equal those computed from the text")
        print("    top 8 bigrams (query count / expected):")
        for gram, n in got.most_common(8):
            print(f"      {n:3d} / {expected[gram]:3d}  {gram}")
        gram = expected.most_common(1)[0][0]
        resp = asyncio.run(query(consumers[0].endpoint, {"ngram": gram}))
        print(
            f"    one bigram, {gram!r}: count {resp['counts'][gram]} from {resp['shard']}\n"
            f"      (its shard found by FNV-1a of the bigram), served by {resp['served_by']}"
        )
        print("    the same with the CLI: python -m word_count.query --ngram 'it was'")
        show(
            tools.run(
                "-m", "word_count.query", "--consumer", consumers[0].endpoint, "--ngram", "it was"
            )
        )
        spark_export(etcd, brokers, expected)
    finally:
        step("stopping the consumers")
        for c in consumers:
            c.stop(timeout=15)
        print("    stopped")


def spark_export(etcd: str, brokers: list[str], expected: Counter[str]) -> None:
    """Export every word-count shard into one Spark DataFrame with the ``gazette-shards``
    source (each task plays a shard's recovery log from its primary hints into a temporary
    directory: the consumers keep running), and print the top bigrams from it."""
    step('exporting the shards to a Spark DataFrame (`spark.read.format("gazette-shards")`)')
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    t0 = time.monotonic()
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from gazette.consumer import spark as gazette_spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("word-count-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    try:
        spark.sparkContext.setLogLevel("ERROR")
        gazette_spark.register(spark)
        print(f"    local[2] Spark session started in {time.monotonic() - t0:.1f}s")
        options = {
            "etcd": etcd,
            "root": ROOT,
            "broker": ",".join(brokers),
            "selector": "app=word-count",
            "store": "rocksdb",
            "key_prefix": "n",  # Keys are b"n" + bigram; values its count as ASCII digits.
        }
        # A secured cluster: etcd's TLS files as options (the brokers' TLS and key the
        # source takes from the BROKER_* environment, which Spark's workers inherit).
        for option in ("etcd_trusted_ca_file", "etcd_cert_file", "etcd_cert_key_file"):
            if value := os.environ.get(option.upper()):
                options[option] = value
        print("    options: " + ", ".join(f"{k}={v}" for k, v in options.items()))
        t0 = time.monotonic()
        df = spark.read.format("gazette-shards").options(**options).load()
        grams = df.select(
            "shard",
            F.expr("cast(substring(key, 2) as string)").alias("bigram"),
            F.expr("cast(cast(value as string) as bigint)").alias("count"),
        )
        print(f"    {df.rdd.getNumPartitions()} partitions (one per shard); schema:")
        show(df._jdf.schema().treeString())
        rows = grams.collect()
        print(f"    {len(rows)} rows exported in {time.monotonic() - t0:.1f}s")
        got: Counter[str] = Counter({r["bigram"]: r["count"] for r in rows})
        if got != expected:
            diff = {g for g in got.keys() | expected.keys() if got[g] != expected[g]}
            raise SystemExit(f"exported counts differ from the text's: {sorted(diff)[:10]}")
        print(f"    all {len(got)} exported bigram counts equal those computed from the text")
        print("    top 8 bigrams, from the DataFrame:")
        top = grams.orderBy(F.desc("count"), F.asc("bigram")).limit(8).collect()
        for r in top:
            print(f"      {r['count']:3d}  {r['bigram']:<20} {r['shard']}")
        print(
            "    the same to Parquet with the CLI: gazctl shards export --to counts.parquet "
            f"--etcd {etcd} --root {ROOT} -l app=word-count --store rocksdb"
        )
    finally:
        spark.stop()


def main() -> None:
    from gazette.testing.broker import BrokerProcess
    from gazette.testing.etcd import EtcdServer

    data = Path(tempfile.mkdtemp(prefix="word-count-demo-"))
    with EtcdServer() as etcd:
        with BrokerProcess(etcd.endpoint, root="/gazette/cluster", spool_dir=data / "spool") as b:
            run(etcd.endpoint, [b.endpoint], data)
    import shutil

    shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
