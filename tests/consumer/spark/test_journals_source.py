"""The gazette-journals Spark source on a real etcd and broker, with local[2] Spark.

Journals hold transactions of several producers (acknowledged, abandoned, outside of
transactions); the export must equal what `ReadCommittedIter` (or `ReadUncommittedIter`)
returns when reading each journal to its write head, one Spark partition per journal.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gazette.broker.client import AppendService, JournalClient, apply_journals
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.consumer.spark.journals_source import GazetteJournalsDataSource, envelope_meta
from gazette.message.envelope import Envelope
from gazette.message.iterators import ReadCommittedIter, ReadUncommittedIter
from gazette.message.mapping import MappingFunc
from gazette.message.publisher import Publisher
from gazette.message.uuid import Flags
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.conftest import session_broker
from tests.consumer.spark.conftest import pausable_broker
from tests.kit.specs import journal_spec
from tests.message.notes import JSON, Note

CSV = "text/csv"
FIXED = "application/x-protobuf-fixed"


def _spec(name: str, store: str, content_type: str, topic: str) -> pb.JournalSpec:
    return journal_spec(
        name, store, length=1 << 24, content_type=content_type, labels={"topic": topic}
    )


def _to(journal: str) -> MappingFunc:
    return lambda msg: (journal, JSON)


@dataclass
class Fixture:
    broker: BrokerProcess
    journals: list[str]  # JSON journals of topic "notes".


async def _publish(endpoint: str, store: str) -> list[str]:
    names = [f"spark/notes/part-{i:03d}" for i in range(3)]
    changes = [pb.ApplyRequest.Change(upsert=_spec(n, store, JSON, "notes")) for n in names]
    changes.append(pb.ApplyRequest.Change(upsert=_spec("spark/odd/csv", store, CSV, "mixed")))
    changes.append(pb.ApplyRequest.Change(upsert=_spec("spark/odd/fixed", store, FIXED, "fixed")))
    unknown = _spec("spark/odd/unknown", store, "application/x-unknown", "unknown")
    changes.append(pb.ApplyRequest.Change(upsert=unknown))
    changes.append(pb.ApplyRequest.Change(upsert=_spec("spark/empty/e", store, JSON, "empty")))
    changes.append(pb.ApplyRequest.Change(upsert=_spec("spark/late/l", store, JSON, "late")))
    async with JournalClient(endpoint) as client:
        await apply_journals(client, pb.ApplyRequest(changes=changes))
        async with AppendService(client) as svc:
            a, b, c = Publisher(svc), Publisher(svc), Publisher(svc)
            for t in range(3):
                for i in range(40):  # A: acknowledged transactions across all journals.
                    a.publish_uncommitted(_to(names[i % 3]), Note(producer="a", txn=t, i=i))
                    if i % 3 == 0:  # B: never acknowledged.
                        b.publish_uncommitted(_to(names[i % 2]), Note(producer="b", txn=t, i=i))
                    if i % 5 == 0:  # C: outside of transactions.
                        c.publish_committed(_to(names[2]), Note(producer="c", txn=t, i=i))
                    if i % 10 == 0:
                        await asyncio.sleep(0)
                await a.commit()
            for p in (a, b, c):
                await p.barrier()
    return names


@pytest.fixture(scope="module")
def cluster(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    store = f"file://{tmp_path_factory.mktemp('spark-journals-store')}/"
    for broker in session_broker(etcd_server, tmp_path_factory, "spark-journals"):
        names = asyncio.run(_publish(broker.endpoint, store))
        yield Fixture(broker, names)


async def _reader_rows(
    endpoint: str, journals: list[str], committed: bool
) -> list[tuple[Any, ...]]:
    """Rows as the source makes them (ACKs included), from the message iterators."""
    out: list[tuple[Any, ...]] = []
    async with JournalClient(endpoint) as client:
        for journal in journals:
            req = pb.ReadRequest(journal=journal, block=False)
            it: ReadCommittedIter | ReadUncommittedIter
            if committed:
                it = ReadCommittedIter(client, req, None, lambda spec: Note())
            else:
                it = ReadUncommittedIter(client, req, None, lambda spec: Note())
            envs: list[Envelope] = []
            try:
                async for env in it:
                    envs.append(env)
            except Exception as err:  # OffsetNotYetAvailable at the head.
                assert type(err).__name__ == "OffsetNotYetAvailable", err
            finally:
                it.close()
            for env in envs:
                m = env.message
                out.append(
                    (env.journal, env.begin, env.end, *envelope_meta(env), m.producer, m.txn, m.i)
                )
    return out


def _load(spark: Any, **options: str) -> Any:
    reader = spark.read.format("gazette-journals")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


@pytest.fixture(scope="module")
def registered(spark: Any) -> Any:
    spark.dataSource.register(GazetteJournalsDataSource)
    return spark


COLUMNS = ["journal", "begin", "end", "uuid", "producer", "clock", "flags"]


@pytest.mark.parametrize("committed", [True, False])
def test_export_equals_the_message_readers(
    registered: Any, cluster: Fixture, committed: bool
) -> None:
    want = asyncio.run(_reader_rows(cluster.broker.endpoint, cluster.journals, committed))
    df = _load(
        registered,
        broker=cluster.broker.endpoint,
        selector="topic=notes",
        committed=str(committed).lower(),
        acks="true",
        schema="message_producer STRING, txn BIGINT, i BIGINT",
    )
    assert df.rdd.getNumPartitions() == 3  # One per journal.
    # With a schema but no message type, JSON columns are the document's keys by name.
    df2 = _load(
        registered,
        broker=cluster.broker.endpoint,
        selector="topic=notes",
        committed=str(committed).lower(),
        acks="true",
        message="tests.message.notes:Note",
    )
    assert df2.columns == [*COLUMNS, "message_producer", "txn", "i"]
    rows = df2.collect()
    got = [tuple(r) for r in rows]
    # Rows of a partition are in reader order; partitions are in journal-name order.
    assert got == want
    assert len(got) > 100
    if committed:
        data = [r for r in got if r[6] is not None and not r[6] & int(Flags.ACK_TXN)]
        names = {r[7] for r in data}
        assert names == {"a", "c"}  # B never committed.
        assert len(data) == 3 * 40 + 3 * 8
    else:
        assert {r[7] for r in got} >= {"a", "b", "c"}
    # The keys-by-name form agrees on the journal, offsets and txn/i.
    by_keys = [(r[0], r[1], r[8], r[9]) for r in df.collect()]
    assert by_keys == [(w[0], w[1], w[8], w[9]) for w in want]


def test_default_json_doc_and_acks_left_out(registered: Any, cluster: Fixture) -> None:
    df = _load(registered, broker=cluster.broker.endpoint, selector="name:prefix=spark/notes/")
    assert df.columns == [*COLUMNS, "doc"]
    rows = df.collect()
    docs = [json.loads(r["doc"]) for r in rows]
    assert all(d["producer"] in ("a", "c") for d in docs)  # No ACKs (they have no producer).
    assert all(d["uuid"] == r["uuid"] for d, r in zip(docs, rows, strict=True))
    assert all(r["flags"] & int(Flags.ACK_TXN) == 0 for r in rows)
    assert len(rows) == 3 * 40 + 3 * 8
    assert df.filter("journal = 'spark/notes/part-002'").count() == 3 * 13 + 3 * 8


def test_csv_fields_and_empty_journal(registered: Any, cluster: Fixture) -> None:
    # Uncommitted CSV records without UUIDs (a plain appended file) read as their fields.
    asyncio.run(_append(cluster.broker.endpoint, "spark/odd/csv", b",x,1\n,y,2\n"))
    df = _load(
        registered, broker=cluster.broker.endpoint, selector="topic=mixed", committed="false"
    )
    assert [(r["uuid"], list(r["fields"])) for r in df.collect()] == [
        (None, ["x", "1"]),
        (None, ["y", "2"]),
    ]
    df = _load(registered, broker=cluster.broker.endpoint, selector="topic=empty")
    assert df.count() == 0


async def _append(endpoint: str, journal: str, data: bytes) -> None:
    from gazette.broker.client import append

    async with JournalClient(endpoint) as client:
        await append(client, pb.AppendRequest(journal=journal), data)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"selector": "topic=notes"}, "option broker is required"),
        ({"broker": "{broker}"}, "option selector is required"),
        ({"broker": "{broker}", "selector": "topic=nothing-here"}, "no journals match"),
        ({"broker": "{broker}", "selector": "topic=notes", "committed": "maybe"}, "true or false"),
        ({"broker": "{broker}", "selector": "topic=notes", "end": "never"}, "only 'head'"),
        ({"broker": "{broker}", "selector": "topic=notes", "colour": "red"}, "unknown option"),
        ({"broker": "{broker}", "selector": "topic=unknown"}, "no framing for content type"),
        ({"broker": "{broker}", "selector": "topic in (notes, mixed)"}, "different framings"),
        ({"broker": "{broker}", "selector": "topic=fixed"}, "give option message"),
        (
            {"broker": "{broker}", "selector": "topic=notes", "message": "no.such:Module"},
            "option message",
        ),
        ({"broker": "127.0.0.1:1", "selector": "topic=notes"}, "UNAVAILABLE"),
        (
            {"broker": "{broker}", "selector": "topic=notes", "broker_timeout": "-1"},
            "option broker_timeout='-1': expected a finite number of seconds",
        ),
    ],
)
def test_bad_options_fail_before_any_job(
    registered: Any, cluster: Fixture, options: dict[str, str], error: str
) -> None:
    tracker = registered.sparkContext.statusTracker()
    jobs_before = len(tracker.getJobIdsForGroup(None))
    opts = {k: v.replace("{broker}", cluster.broker.endpoint) for k, v in options.items()}
    with pytest.raises(Exception, match=error):
        _load(registered, **opts)
    assert len(tracker.getJobIdsForGroup(None)) == jobs_before


def test_source_reads_to_the_head_of_planning(registered: Any, cluster: Fixture) -> None:
    endpoint = cluster.broker.endpoint
    asyncio.run(_append(endpoint, "spark/late/l", b'{"producer":"early"}\n'))
    df = _load(registered, broker=endpoint, selector="topic=late", committed="false")
    assert df.count() == 1
    # Appends after planning are not read by this DataFrame's jobs.
    asyncio.run(_append(endpoint, "spark/late/l", b'{"producer":"late"}\n'))
    assert df.count() == 1
    again = _load(registered, broker=endpoint, selector="topic=late", committed="false")
    assert again.count() == 2


def test_a_read_that_makes_no_progress_fails_after_the_broker_timeout(
    registered: Any, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """A broker that hangs while tasks read: the client would wait for ever; the task fails
    once it read nothing for ``broker_timeout`` seconds, and so does planning; a read after
    it recovers works. The broker is this test's own (its own etcd root, a lease that
    outlives the pause), so that stopping it disturbs no other test."""
    import signal
    import time

    private = pausable_broker(etcd_server.endpoint, tmp_path / "spool", "journals-stall")
    with private:
        endpoint = private.endpoint
        store = f"file://{tmp_path}/"

        async def publish() -> None:
            async with JournalClient(endpoint) as client:
                spec = _spec("stall/notes", store, JSON, "stall")
                await apply_journals(
                    client, pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)])
                )
            for i in range(20):
                await _append(endpoint, "stall/notes", b'{"producer":"p","i":%d}\n' % i)

        asyncio.run(publish())
        df = _load(
            registered,
            broker=endpoint,
            selector="topic=stall",
            broker_timeout="1.5",
            committed="false",
        )
        assert df.count() == 20
        assert private.proc is not None
        pid = private.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(Exception, match="reading it made no progress for 1.5s"):
                df.count()
            assert time.monotonic() - t0 < 30
            # Planning too: connections are accepted (the kernel's backlog), never answered.
            t0 = time.monotonic()
            with pytest.raises(Exception, match=r"no answer from broker\(s\) .* within 1.5s"):
                _load(registered, broker=endpoint, selector="topic=stall", broker_timeout="1.5")
            assert time.monotonic() - t0 < 10
        finally:
            os.kill(pid, signal.SIGCONT)
        assert df.count() == 20


def test_module_importable_without_spark_session() -> None:
    assert GazetteJournalsDataSource.name() == "gazette-journals"
    assert Path(os.path.dirname(__file__)).name == "spark"


def test_values_not_of_the_column_type_fail_naming_the_column(
    registered: Any, cluster: Fixture
) -> None:
    df = _load(
        registered,
        broker=cluster.broker.endpoint,
        selector="topic=notes",
        schema="message_producer BIGINT, txn STRING",  # txn converts (as JSON text); not this.
    )
    with pytest.raises(
        Exception, match=r"journal spark/notes/part-00\d offsets .*message_producer"
    ):
        df.collect()
    txns = _load(
        registered, broker=cluster.broker.endpoint, selector="topic=notes", schema="txn STRING"
    ).collect()
    assert {r["txn"] for r in txns} == {"0", "1", "2"}
