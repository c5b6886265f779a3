"""MessageProducer applications (consumer.application, consumer.message_producer).

Unit tests run a real `ShardReplica` and transaction loop with an in-memory store (no etcd,
no broker): restarts at transaction boundaries, replays served by `replay_range`, errors.
The end-to-end test runs real `gazette-consumer` processes of tests/consumer/producer_app.py
against etcd and a broker, restarting the producer every few messages and SIGKILLing the
primary, and checks every message was counted exactly once.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.application import MessageProducer, ResolveArgs
from gazette.consumer.main import ConsumerStartupError, load_application
from gazette.consumer.message_producer import MessageSink
from gazette.consumer.protocol import pb
from gazette.consumer.replica import ReplicaContext, ShardReplica
from gazette.consumer.txn import checkpoint_offsets
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.envelope import Envelope
from gazette.message.publisher import Publisher
from gazette.message.sequencer import ReplayError
from gazette.message.uuid import Flags, build_uuid
from gazette.testing.broker import BrokerProcess
from gazette.testing.consumer import ConsumerProcess
from gazette.testing.etcd import EtcdServer
from tests.consumer.fakes import BASE_CLOCK, JOURNAL, Commit, FakeStore, Msg, P, outside
from tests.consumer.producer_app import INPUT_LABEL, Add
from tests.consumer.support import (
    REPO,
    apply_shards,
    committed_totals,
    json_journal,
    primary_of,
    recovery_log,
    shard_stubs,
    until_primary,
    until_ready,
    write_head,
)
from tests.kit.eventually import eventually
from tests.kit.specs import apply_specs

Code = pb.ReplicaStatus.Code


# --- unit tests: a real replica and transaction loop, an in-memory store -------------------


class Assignment:
    key = "/review/assign/shard#z#s#0"
    create_revision = 1


class MsgApp:
    """The Application side shared by the producers below: consumes `Msg`s into
    `store.state` of a FakeStore."""

    def new_store(self, shard: Any, recovered: Any) -> FakeStore:
        return FakeStore()

    def new_message(self, spec: Any) -> Msg:
        return Msg(None)

    def consume_message(self, shard: Any, store: FakeStore, env: Envelope, pub: Any) -> None:
        store.state.append(env.message.n)

    def finalize_txn(self, shard: Any, store: Any, pub: Any) -> None:
        pass


class ProducerApp(MsgApp):
    """Consumes `Msg`s into `store.state`; produces `batches[k]` on its k-th start (then
    returns), and waits forever once it ran out of batches."""

    def __init__(self, batches: list[list[Envelope]]) -> None:
        self.batches = batches
        self.starts: list[dict[str, int]] = []  # The checkpoint offsets of each start.
        self.start_state: list[list[int]] = []  # The store's committed state at each start.
        self.replays: list[tuple[str, int, int]] = []
        self.replay_with: list[Envelope] | None = None
        self.fail_with: BaseException | None = None
        self.finalized = 0

    def finalize_txn(self, shard: Any, store: Any, pub: Any) -> None:
        self.finalized += 1

    async def start_reading_messages(
        self, shard: Any, store: FakeStore, checkpoint: pb.Checkpoint, into: MessageSink
    ) -> None:
        self.starts.append(checkpoint_offsets(checkpoint))
        self.start_state.append(store.commits[-1].state if store.commits else [])
        k = len(self.starts) - 1
        if k >= len(self.batches):
            if self.fail_with is not None:
                raise self.fail_with
            await asyncio.Event().wait()
        for env in self.batches[k]:
            await into.put(env)

    def replay_range(
        self, shard: Any, store: Any, journal: str, begin: int, end: int
    ) -> AsyncIterator[Envelope]:
        self.replays.append((journal, begin, end))
        envs = self.replay_with
        if envs is None:
            envs = [e for b in self.batches for e in b if begin <= e.begin < end]

        async def gen() -> AsyncIterator[Envelope]:
            for env in envs:
                yield env

        return gen()

    def read_through(self, shard: Any, store: Any, args: ResolveArgs) -> dict[str, int]:
        return dict(args.read_through)


def make_replica(app: Any, tmp_path: Path) -> ShardReplica:
    ctx = ReplicaContext(
        app=app,
        etcd=None,  # type: ignore[arg-type]  # No recovery log, no hints: etcd is not used.
        client=None,  # type: ignore[arg-type]
        broker_endpoint="",
        workdir=tmp_path,
        root="/review",
        status_changed=lambda: None,
    )
    spec = pb.ShardSpec(id="shard", max_txn_duration=Duration(nanos=50_000_000))
    return ShardReplica(ctx, spec, Assignment())


async def run_replica(app: Any, tmp_path: Path, until: Any, timeout: float = 5.0) -> ShardReplica:
    r = make_replica(app, tmp_path)
    r.start()
    r.promote()
    try:
        await eventually(
            lambda: until(r), what="the replica's state", timeout=timeout, interval=0.005
        )
    except AssertionError:
        await r.stop()
        raise
    return r


def in_txn(i: int, flags: Flags = Flags.CONTINUE_TXN) -> Envelope:
    """The i-th message of producer P within a transaction (bytes [10*i, 10*i + 10))."""
    clock = BASE_CLOCK + 16 * (i + 1)
    return Envelope(JOURNAL, 10 * i, 10 * i + 10, Msg(build_uuid(P, clock, flags), i))


def test_counter_app_is_not_a_producer_but_producer_app_is() -> None:
    from tests.consumer.counter_app import Counter

    assert not isinstance(Counter(), MessageProducer)
    assert isinstance(ProducerApp([]), MessageProducer)


class PartialProducer(MsgApp):
    """An Application that defines start_reading_messages and replay_range, but forgot
    read_through."""

    def __init__(self) -> None:
        self.starts = 0

    async def start_reading_messages(
        self, shard: Any, store: Any, checkpoint: pb.Checkpoint, into: MessageSink
    ) -> None:
        self.starts += 1
        await into.put(outside(0))

    def replay_range(self, shard: Any, store: Any, journal: str, begin: int, end: int) -> Any:
        return []


def test_partial_producer_is_refused_when_loaded() -> None:
    """An Application with only some MessageProducer methods is not silently taken for a
    journal-sources application: loading it fails, naming what is missing."""
    assert not isinstance(PartialProducer(), MessageProducer)
    with pytest.raises(ConsumerStartupError, match=r"lacks read_through"):
        load_application("tests.consumer.test_message_producer:PartialProducer")


async def test_partial_producer_fails_its_shards(tmp_path: Path) -> None:
    """Run in process (not loaded by gazette-consumer): its shards fail, with the reason,
    instead of sitting PRIMARY reading the (absent) sources."""
    app = PartialProducer()
    r = await run_replica(app, tmp_path, lambda r: r.status.code == Code.FAILED)
    try:
        (err,) = r.status.errors
        assert "read_through" in err and "MessageProducer" in err, err
        assert app.starts == 0
    finally:
        await r.stop()


async def test_producer_that_returns_restarts_from_the_committed_checkpoint(
    tmp_path: Path,
) -> None:
    """Each time the producer returns, its messages are committed, and it is started again
    with the checkpoint of that commit: every message consumed exactly once, in order."""
    batches = [[outside(i) for i in range(k, k + 3)] for k in range(0, 9, 3)]
    app = ProducerApp(batches)
    r = await run_replica(app, tmp_path, lambda r: len(app.starts) == 4)
    try:
        store = r.store
        assert isinstance(store, FakeStore)
        assert store.state == list(range(9))
        # Started from nothing, then from the end of each batch, each time after the
        # previous batch was committed.
        assert app.starts == [{}, {JOURNAL: 30}, {JOURNAL: 60}, {JOURNAL: 90}]
        assert app.start_state == [[], [0, 1, 2], [0, 1, 2, 3, 4, 5], list(range(9))]
        assert checkpoint_offsets(store.commits[-1].checkpoint) == {JOURNAL: 90}
        assert r.producer_restarts == 3
        assert r.status.code == Code.PRIMARY
        assert r.shard.progress()[0] == {JOURNAL: 90}
    finally:
        await r.stop()


class IdleProducer(PartialProducer):
    """A producer with nothing to produce: it returns at once, every time."""

    async def start_reading_messages(
        self, shard: Any, store: Any, checkpoint: pb.Checkpoint, into: MessageSink
    ) -> None:
        self.starts += 1

    def read_through(self, shard: Any, store: Any, args: Any) -> dict[str, int]:
        return {}


async def test_an_idle_producer_is_restarted_with_growing_pauses(tmp_path: Path) -> None:
    """Returning without a message is not a tight loop: restarts are paced (0.05 s doubling),
    where a producer that delivers is restarted at once (the other tests)."""
    app = IdleProducer()
    r = await run_replica(app, tmp_path, lambda r: app.starts >= 2)
    try:
        await asyncio.sleep(1.0)  # The restarts' pacing is what is measured.
        # 0.05 + 0.1 + 0.2 + 0.4 (+ 0.8): a handful of restarts in ~1 s, not thousands.
        assert 3 <= app.starts <= 7, app.starts
        assert r.status.code == Code.PRIMARY
    finally:
        await r.stop()


async def test_duplicates_delivered_after_a_restart_are_dropped(tmp_path: Path) -> None:
    """Envelopes still go through the Sequencer: a producer that delivers again what was
    committed before its restart (same UUIDs) has them dropped, not consumed twice."""
    batches = [[outside(0), outside(1)], [outside(1), outside(2)]]
    app = ProducerApp(batches)
    r = await run_replica(app, tmp_path, lambda r: len(app.starts) == 3)
    try:
        assert isinstance(r.store, FakeStore)
        assert r.store.state == [0, 1, 2]
    finally:
        await r.stop()


class Fenced(Exception):
    pass


@dataclass
class FencedTable:
    """A database row of one shard, as SQLStore keeps it: a fence and a checkpoint."""

    fence: int = 0
    checkpoint: pb.Checkpoint = field(default_factory=pb.Checkpoint)


class FencingStore(FakeStore):
    """A FakeStore whose `restore_checkpoint` takes the next fence of a shared row (as
    SQLStore's does) and whose commits fail with `Fenced` once a later instance took it."""

    def __init__(self, table: FencedTable) -> None:
        super().__init__()
        self.table = table
        self.fence = -1
        self.restores = 0

    async def restore_checkpoint(self, shard: Any) -> pb.Checkpoint:
        self.restores += 1
        self.table.fence += 1
        self.fence = self.table.fence
        cp = pb.Checkpoint()
        cp.CopyFrom(self.table.checkpoint)
        return cp

    def start_commit(self, shard: Any, cp: pb.Checkpoint, wait_for: Any) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fence != self.table.fence:
            fut.set_exception(Fenced(f"fence {self.fence} is not {self.table.fence}"))
            return fut
        self.table.checkpoint.CopyFrom(cp)
        self.commits.append(Commit(pb.Checkpoint.FromString(cp.SerializeToString()), []))
        fut.set_result(None)
        return fut


async def test_restarts_do_not_restore_the_checkpoint_again(tmp_path: Path) -> None:
    """`restore_checkpoint` runs once per store (at recovery): a restart starts from the
    checkpoint of the last commit. Restoring again would take a new fence of an SQLStore, so
    that a process which lost its assignment (still reaching the database) fences out the
    shard's new primary at its next producer restart."""
    table = FencedTable()

    class Producer(ProducerApp):
        def new_store(self, shard: Any, recovered: Any) -> FakeStore:
            self.store = FencingStore(table)
            return self.store

    batches = [[outside(i) for i in range(k, k + 3)] for k in range(0, 9, 3)]
    app = Producer(batches)
    r = await run_replica(app, tmp_path, lambda r: len(app.starts) == 4)
    try:
        assert app.starts == [{}, {JOURNAL: 30}, {JOURNAL: 60}, {JOURNAL: 90}]
        assert r.producer_restarts == 3
        assert app.store.restores == 1
        assert table.fence == 1
    finally:
        await r.stop()


async def test_a_stale_primary_restarting_its_producer_does_not_fence_out_the_new_one(
    tmp_path: Path,
) -> None:
    """The review's scenario: A is primary; B (the new primary) restores, taking the next
    fence; then A's producer returns and restarts. B's commits must keep succeeding, and
    A's next commit fails with `Fenced`."""
    table = FencedTable()
    go = asyncio.Event()

    class Producer(ProducerApp):
        def new_store(self, shard: Any, recovered: Any) -> FakeStore:
            self.store = FencingStore(table)
            return self.store

        async def start_reading_messages(
            self, shard: Any, store: FakeStore, checkpoint: pb.Checkpoint, into: MessageSink
        ) -> None:
            self.starts.append(checkpoint_offsets(checkpoint))
            k = len(self.starts) - 1
            if k == 0:
                await into.put(outside(0))
                await go.wait()  # Until B took over.
            else:
                await into.put(outside(k))

    app = Producer([])
    a = await run_replica(
        app, tmp_path, lambda r: r.store is not None and len(r.store.commits) == 1
    )
    try:
        b = FencingStore(table)
        cp = await b.restore_checkpoint(None)  # B recovers: the next fence.
        assert checkpoint_offsets(cp) == {JOURNAL: 10}
        go.set()
        await eventually(
            lambda: a.status.code == Code.FAILED or len(app.starts) >= 3,
            what="A failed or restarted",
            timeout=5.0,
            interval=0.005,
        )
        assert table.fence == 2
        cp.sources[JOURNAL].read_through = 20
        await b.start_commit(None, cp, [])  # B, the rightful primary, still commits.
        assert any(e.startswith("Fenced: ") for e in a.status.errors), list(a.status.errors)
    finally:
        await a.stop()


async def test_replay_after_restart_uses_replay_range(tmp_path: Path) -> None:
    """A transaction of the upstream producer spans a restart: its messages were read (and
    checkpointed as pending) before it, its ACK after. The Sequencer must replay the span,
    and asks the application's `replay_range` for exactly those bytes."""
    first = [in_txn(0), in_txn(1), in_txn(2)]
    ack = in_txn(3, Flags.ACK_TXN)
    app = ProducerApp([first, [ack]])
    r = await run_replica(app, tmp_path, lambda r: len(app.starts) == 3)
    try:
        assert isinstance(r.store, FakeStore)
        assert app.replays == [(JOURNAL, 0, 30)]
        assert r.store.state == [0, 1, 2]
        # Nothing was committed before the ACK: the first restart saw an empty state.
        assert app.start_state[1] == []
        assert r.stats.acks == 1
    finally:
        await r.stop()


async def test_replay_of_other_messages_fails_the_shard(tmp_path: Path) -> None:
    """`replay_range` must re-produce exactly what was produced: anything else fails the
    shard (the Sequencer's ReplayError), rather than committing wrong state."""
    first = [in_txn(0), in_txn(1), in_txn(2)]
    app = ProducerApp([first, [in_txn(3, Flags.ACK_TXN)]])
    app.replay_with = [outside(7)]
    r = await run_replica(app, tmp_path, lambda r: r.status.code == Code.FAILED)
    try:
        assert app.replays == [(JOURNAL, 0, 30)]
        assert any(ReplayError.__name__ in e for e in r.status.errors), list(r.status.errors)
    finally:
        await r.stop()


class ProducerBroke(Exception):
    pass


async def test_producer_error_fails_the_shard_with_it(tmp_path: Path) -> None:
    """A producer raising is terminal: FAILED with that error as the cause; what it
    produced before its restart stays committed."""
    app = ProducerApp([[outside(0), outside(1)]])
    app.fail_with = ProducerBroke("upstream system went away")
    r = await run_replica(app, tmp_path, lambda r: r.status.code == Code.FAILED)
    try:
        assert list(r.status.errors) == ["ProducerBroke: upstream system went away"]
        assert r.store is None  # Released.
        assert r.shard.progress()[0] == {JOURNAL: 20}
    finally:
        await r.stop()


async def test_producer_error_mid_transaction_commits_nothing(tmp_path: Path) -> None:
    """An error queued after messages of an open transaction fails it: nothing commits."""

    class Failing(ProducerApp):
        async def start_reading_messages(
            self, shard: Any, store: FakeStore, checkpoint: pb.Checkpoint, into: MessageSink
        ) -> None:
            self.store = store
            await into.put(outside(0))
            await into.put(outside(1))
            raise ProducerBroke("mid-transaction")

    app = Failing([])
    r = await run_replica(app, tmp_path, lambda r: r.status.code == Code.FAILED)
    try:
        assert list(r.status.errors) == ["ProducerBroke: mid-transaction"]
        assert app.store.commits == []
        assert app.finalized == 0
    finally:
        await r.stop()


async def test_producer_raising_cancelled_error_itself_fails_the_shard(tmp_path: Path) -> None:
    """A CancelledError the runtime did not cause (the producer awaited a future someone
    else cancelled) fails the shard, rather than ending the producer silently and leaving
    the shard PRIMARY with nothing to process (the review's reproduction)."""

    class Cancels(ProducerApp):
        async def start_reading_messages(
            self, shard: Any, store: Any, checkpoint: Any, into: MessageSink
        ) -> None:
            self.starts.append({})
            await into.put(outside(0))
            fut = asyncio.get_running_loop().create_future()
            fut.cancel()
            await fut

    app = Cancels([])
    r = await run_replica(app, tmp_path, lambda r: r.status.code == Code.FAILED)
    try:
        (err,) = r.status.errors
        assert err.startswith("ProducerCancelled: "), err
        assert len(app.starts) == 1
    finally:
        await r.stop()


async def test_stopping_a_replica_cancels_its_producer(tmp_path: Path) -> None:
    """The runtime's own cancellation still cancels the producer (and fails nothing)."""
    cancelled = asyncio.Event()

    class Waits(ProducerApp):
        async def start_reading_messages(
            self, shard: Any, store: Any, checkpoint: Any, into: MessageSink
        ) -> None:
            self.starts.append({})
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

    app = Waits([])
    r = await run_replica(app, tmp_path, lambda r: len(app.starts) == 1)
    await r.stop()
    assert cancelled.is_set()
    assert r.status.code == Code.PRIMARY and list(r.status.errors) == []


async def test_non_async_start_reading_messages_fails_clearly(tmp_path: Path) -> None:
    class Sync(ProducerApp):
        def start_reading_messages(  # type: ignore[override]
            self, shard: Any, store: Any, checkpoint: Any, into: Any
        ) -> None:
            return None

    r = await run_replica(Sync([]), tmp_path, lambda r: r.status.code == Code.FAILED)
    try:
        (err,) = r.status.errors
        assert err.startswith("ProducerFinishedEarly: start_reading_messages must be a coroutine")
    finally:
        await r.stop()


async def test_sink_rejects_what_is_not_an_envelope() -> None:
    sink = MessageSink(asyncio.Queue(maxsize=1))
    with pytest.raises(TypeError, match="not dict"):
        await sink.put({"n": 1})  # type: ignore[arg-type]


async def test_producer_app_drops_partial_totals_of_a_cut_off_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tests/consumer/producer_app.py (the documented producer pattern): a transaction cut
    off before `finalize_txn` (the shard moved away, or failed) leaves no partial sums for
    the next time this process is the shard's primary (a new store)."""
    from tests.consumer import producer_app

    class FakeJSONStore:
        def __init__(self) -> None:
            self.state: dict[str, int] = {}

        @classmethod
        async def open(cls, recovered: Any) -> FakeJSONStore:
            return cls()

    monkeypatch.setattr(producer_app, "JSONFileStore", FakeJSONStore)
    monkeypatch.delenv("COUNTER_OUTPUT", raising=False)
    app = producer_app.ProducedCounter()
    shard: Any = type("S", (), {"id": "shard-000"})()
    pub: Any = None
    store: Any = await app.new_store(shard, object())
    app.consume_message(shard, store, Envelope("in", 0, 10, Add("k", 5)), pub)
    # Cut off: no finalize_txn. Later, primary again: a new store from the recovery log.
    store = await app.new_store(shard, object())
    app.consume_message(shard, store, Envelope("in", 10, 20, Add("k", 1)), pub)
    app.finalize_txn(shard, store, pub)
    assert store.state == {"k": 1}


# --- end to end: real etcd, broker and consumer processes ----------------------------------

_names = itertools.count()


async def feed_mixed(
    client: JournalClient, journal: str, stop: asyncio.Event, expected: dict[str, int]
) -> None:
    """Publish `Add`s until `stop`: alternately transactions of 20 uncommitted messages (one
    ACK each; their spans straddle the producer's restarts, forcing replays) and 20
    committed ones. `expected` sums what was acknowledged."""
    async with AppendService(client) as svc:
        pub = Publisher(svc)
        mapping = lambda _m: (journal, CONTENT_TYPE_JSON_LINES)  # noqa: E731
        i = 0
        for round_ in itertools.count():
            if stop.is_set():
                break
            batch: dict[str, int] = {}
            for _ in range(20):
                key = f"k{i % 5}"
                batch[key] = batch.get(key, 0) + i
                if round_ % 2 == 0:
                    pub.publish_uncommitted(mapping, Add(key, i))
                else:
                    pub.publish_committed(mapping, Add(key, i))
                i += 1
            if round_ % 2 == 0:
                await pub.commit()
            else:
                await pub.barrier()
            for k, v in batch.items():
                expected[k] = expected.get(k, 0) + v
            await asyncio.sleep(0.02)  # Paces the load.


class ProducerSetup:
    def __init__(self, etcd: EtcdServer, broker: BrokerProcess, tmp: Path) -> None:
        n = next(_names)
        self.prefix = f"producer-{os.getpid()}-{n}"
        self.root = f"/test-producer/{os.getpid()}/{n}"
        self.etcd, self.broker, self.tmp = etcd, broker, tmp
        self.input = f"{self.prefix}/in"
        self.output = f"{self.prefix}/out"
        self.consumers: list[ConsumerProcess] = []

    async def create_journals(self, client: JournalClient) -> None:
        store = self.tmp / "fragments"
        await apply_specs(
            client,
            [
                json_journal(self.input, store),
                json_journal(self.output, store),
                recovery_log(f"{self.prefix}/recovery/shard-000", store),
            ],
        )

    def shard_spec(self) -> pb.ShardSpec:
        spec = pb.ShardSpec(
            id="shard-000",
            recovery_log_prefix=f"{self.prefix}/recovery",
            hint_prefix=f"/test-hints/{self.prefix}",
            hint_backups=2,
            max_txn_duration=Duration(nanos=200_000_000),
            hot_standbys=1,
        )  # No sources: the application produces the messages.
        spec.labels.labels.add(name=INPUT_LABEL, value=self.input)
        return spec

    def consumer(self, i: int) -> ConsumerProcess:
        c = ConsumerProcess(
            "tests.consumer.producer_app:ProducedCounter",
            self.etcd.endpoint,
            [self.broker.endpoint],
            root=self.root,
            zone=f"z{i % 2}",
            suffix=f"consumer-{i}",
            workdir=self.tmp / f"consumer-{i}",
            extra_env={
                "COUNTER_OUTPUT": self.output,
                "PRODUCER_RESTART_EVERY": "37",
                "PYTHONPATH": str(REPO),
            },
            extra_args=["--hint-interval", "1"],
        )
        self.consumers.append(c)
        return c


@pytest.fixture
def producer_setup(
    etcd_server: EtcdServer, broker: BrokerProcess, tmp_path: Path
) -> Iterator[ProducerSetup]:
    s = ProducerSetup(etcd_server, broker, tmp_path)
    yield s
    for c in s.consumers:
        c.kill()


def _count(pattern: str, procs: list[ConsumerProcess]) -> int:
    return sum(len(re.findall(pattern, p.log_path.read_text(errors="replace"))) for p in procs)


async def test_produced_messages_count_exactly_once_across_restarts_and_kills(
    producer_setup: ProducerSetup, client: JournalClient
) -> None:
    """A shard without sources whose Application produces its messages (reading a journal
    named by a shard label, returning every 37 envelopes): across producer restarts and two
    SIGKILLs of the primary, the committed totals are exactly the sums fed, each key's
    totals strictly increasing. Replays went through `replay_range`; Stat's read_through
    of the produced journal (not a source) waits through `read_through`."""
    s = producer_setup
    await s.create_journals(client)
    procs = {c.suffix: c for c in (s.consumer(0).start(), s.consumer(1).start())}
    async with shard_stubs(s.consumers) as stubs:
        await apply_shards(stubs["consumer-0"], [s.shard_spec()])
        both = [Code.STANDBY, Code.PRIMARY]
        await until_ready(stubs["consumer-0"], both, "a primary and a standby")
        expected: dict[str, int] = {}
        stop = asyncio.Event()
        feeder = asyncio.create_task(feed_mixed(client, s.input, stop, expected))
        for _ in range(2):
            await asyncio.sleep(1.5)  # The primary processes input until it is killed.
            victim = await primary_of(stubs["consumer-0"], "shard-000")
            survivor = next(k for k in procs if k != victim)
            procs[victim].kill()
            await until_primary(stubs[survivor], survivor, "the standby's promotion")
            procs[victim].start()
            await until_ready(stubs[survivor], both, "a new standby")
            assert not feeder.done()
        await asyncio.sleep(1.0)  # The last primary processes input.
        stop.set()
        await feeder

        primary = await primary_of(stubs["consumer-0"], "shard-000")
        head = await write_head(client, s.input)
        t0 = time.monotonic()
        resp = await stubs[primary].Stat(
            pb.StatRequest(shard="shard-000", read_through={s.input: head}), timeout=60
        )
        assert resp.status == pb.OK, resp
        assert resp.read_through[s.input] >= head
        out_head = await write_head(client, s.output)
        final: dict[str, int] = {}
        for t in await committed_totals(client, s.output, out_head):
            assert t.total > final.get(t.key, -1), f"total of {t.key} repeated or went back"
            final[t.key] = t.total
        assert final == expected
        all_procs = list(procs.values())
        restarts = _count(r"message producer finished; restarting", all_procs)
        replays = _count(r"producer replay journal=", all_procs)
        print(
            f"producer restarts={restarts} replays={replays} stat wait={time.monotonic() - t0:.2f}s"
        )
        assert restarts >= 5, restarts
        assert replays >= 1, replays
