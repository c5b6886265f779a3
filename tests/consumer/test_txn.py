"""Review tests of the transaction loop (consumer.txn) with small fakes: no etcd, no broker.

Each test names the exactly-once / liveness property it checks; see the review report.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.broker.client.append_service import AppendService
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.application import Shard
from gazette.consumer.protocol import pb
from gazette.consumer.txn import (
    SOURCE_DONE,
    Transactions,
    checkpoint_offsets,
    sequencer_from_checkpoint,
)
from gazette.message import CONTENT_TYPE_JSON_LINES, JSONMessage
from gazette.message.envelope import Envelope
from gazette.message.publisher import Publisher
from gazette.message.sequencer import QueueOutcome, Sequencer
from gazette.message.uuid import Flags, ProducerID, build_uuid
from tests.consumer.fakes import (
    BASE_CLOCK,
    JOURNAL,
    Commit,
    FakeReaders,
    FakeStore,
    Msg,
    outside,
)
from tests.kit.eventually import eventually


class AsyncCommitStore(FakeStore):
    """A store whose start_commit is a coroutine (the Store protocol allows any awaitable,
    and txn.py wraps it with ensure_future): it snapshots the state when it first runs."""

    def start_commit(self, shard: Any, cp: pb.Checkpoint, wait_for: Any) -> Any:  # type: ignore[override]
        async def commit() -> None:
            copy = pb.Checkpoint()
            copy.CopyFrom(cp)
            self.commits.append(Commit(copy, list(self.state)))

        return commit()


class App:
    """Appends each consumed message's number to the store state."""

    def __init__(self, consume_delay: float = 0.0) -> None:
        self.consume_delay = consume_delay

    def new_store(self, shard: Any, recovered: Any) -> Any:
        raise NotImplementedError

    def new_message(self, spec: Any) -> Msg:
        return Msg(None)

    def consume_message(self, shard: Any, store: FakeStore, env: Envelope, pub: Any) -> Any:
        store.state.append(env.message.n)
        if self.consume_delay:
            return asyncio.sleep(self.consume_delay)
        return None

    def finalize_txn(self, shard: Any, store: Any, pub: Any) -> None:
        pass


def make_txns(
    store: FakeStore,
    app: App,
    *,
    max_txn: Duration | None = None,
    min_txn: Duration | None = None,
    cp: pb.Checkpoint | None = None,
    disable_wait_for_ack: bool = False,
) -> tuple[Transactions, FakeReaders]:
    spec = pb.ShardSpec(
        id="review-shard",
        sources=[pb.ShardSpec.Source(journal=JOURNAL)],
        disable_wait_for_ack=disable_wait_for_ack,
    )
    if max_txn is not None:
        spec.max_txn_duration.CopyFrom(max_txn)
    if min_txn is not None:
        spec.min_txn_duration.CopyFrom(min_txn)
    svc = AppendService(None)  # type: ignore[arg-type]  # Nothing is appended.
    svc.track_released()  # As the runtime's per-shard services.
    shard = Shard(spec, "/review/items/review-shard", None, svc)  # type: ignore[arg-type]
    readers = FakeReaders()
    seq = sequencer_from_checkpoint(cp, 8192) if cp is not None else Sequencer()
    txns = Transactions(shard, app, store, Publisher(svc), seq, readers)  # type: ignore[arg-type]
    return txns, readers


def redelivered_after_restore(cp: pb.Checkpoint, envs: list[Envelope]) -> list[int]:
    """Message numbers a Sequencer restored from `cp` delivers again when reading resumes at
    the checkpoint's offsets (what a new primary does), replaying spans begun before them."""
    seq = sequencer_from_checkpoint(cp, 8192)
    start = checkpoint_offsets(cp).get(JOURNAL, 0)
    out = []
    for env in envs:
        if env.begin < start:
            continue
        if seq.queue_uncommitted(env) is QueueOutcome.ACK_COMMIT_REPLAY:
            _, begin, end = seq.replay_range()
            seq.start_replay(e for e in envs if begin <= e.begin and e.end <= end)
        while seq.step():
            assert seq.dequeued is not None
            out.append(seq.dequeued.message.n)
    return out


def running(task: asyncio.Task[Any], cond: Any) -> Any:
    """A check of `cond` that raises the error the loop of `task` failed with, if it did."""

    def check() -> Any:
        if task.done():
            task.result()
        return cond()

    return check


async def _until(cond: Any, timeout: float = 5.0, interval: float = 0.001) -> None:
    await eventually(cond, what="the condition", timeout=timeout, interval=interval)


async def run_until(txns: Transactions, cond: Any, timeout: float = 5.0) -> None:
    task = asyncio.create_task(txns.run())
    try:
        await eventually(running(task, cond), what="the condition", timeout=timeout, interval=0.001)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_checkpoint_of_txn_closed_by_max_duration_covers_its_last_message() -> None:
    """A transaction that reaches max_txn_duration right after consuming a message must
    checkpoint that message as processed: its effect is in the same commit. Otherwise a
    recovering primary consumes it a second time (exactly-once violation).

    txn.py breaks out of the loop before `ready()` (Sequencer.step) steps past the
    last dequeued envelope, so `checkpoint()`/`read_through()` (txn.py) still
    describe the state *before* that message.
    """
    store = FakeStore()
    # max_txn_duration of 1ns: every transaction closes right after its first message.
    txns, readers = make_txns(store, App(), max_txn=Duration(nanos=1))
    envs = [outside(i) for i in range(3)]
    for env in envs:
        readers.queue.put_nowait(env)
    await run_until(txns, lambda: len(store.commits) >= 1)

    first = store.commits[0]
    assert first.state == [0], first.state  # Message 0's effect is in this commit.
    again = redelivered_after_restore(first.checkpoint, envs)
    assert 0 not in again, (
        f"message 0 is committed in the store, yet a primary recovering this checkpoint "
        f"({first.checkpoint}) consumes it again: {again}"
    )


async def test_checkpoint_of_txn_closed_by_slow_consume_covers_its_last_message() -> None:
    """The same with a realistic max_txn_duration (100ms) and an application whose
    consume_message is a slow coroutine: the deadline passes during the await."""
    store = FakeStore()
    txns, readers = make_txns(store, App(consume_delay=0.15), max_txn=Duration(nanos=100_000_000))
    envs = [outside(i) for i in range(2)]
    for env in envs:
        readers.queue.put_nowait(env)
    await run_until(txns, lambda: len(store.commits) >= 1)
    first = store.commits[0]
    again = redelivered_after_restore(first.checkpoint, envs)
    assert not set(first.state) & set(again), (first.state, again, first.checkpoint)


async def test_recovery_mid_stream_over_committed_only_input_opens_no_span(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A new primary recovers the checkpoint of a transaction that max_txn_duration closed
    right after a committed (OUTSIDE_TXN) message, and reads on from its offsets. The input
    holds committed messages only: none may be taken for part of a CONTINUE_TXN span (the
    Sequencer logs "span discarded" when one is), and each is consumed once overall."""
    envs = [outside(i) for i in range(6)]
    store = FakeStore()
    # max_txn_duration of 1ns: every transaction closes right after its first message.
    txns, readers = make_txns(store, App(), max_txn=Duration(nanos=1))
    for env in envs[:3]:
        readers.queue.put_nowait(env)
    await run_until(txns, lambda: len(store.commits) >= 2)
    last = store.commits[1]  # The primary dies: this is its last durable commit.
    assert last.state == [0, 1]

    recovered = FakeStore(state=list(last.state), commits=[last])
    cp = await recovered.restore_checkpoint(None)
    txns, readers = make_txns(recovered, App(), max_txn=Duration(nanos=1), cp=cp)
    start = checkpoint_offsets(cp).get(JOURNAL, 0)
    for env in envs:
        if env.begin >= start:  # As SourceReaders reads from the checkpoint's offsets.
            readers.queue.put_nowait(env)
    with caplog.at_level(logging.WARNING, logger="gazette.message.sequencer"):
        await run_until(txns, lambda: len(recovered.state) >= len(envs))
    assert recovered.state == list(range(len(envs)))
    assert not caplog.records, caplog.text


async def test_next_transaction_does_not_leak_into_a_commit_started_as_a_coroutine() -> None:
    """Store.start_commit may return any awaitable (consumer/store.py OpFuture =
    Awaitable); txn.py wraps it in ensure_future, so a coroutine's body first runs at
    the loop's next iteration. By then the next transaction already consumed ready messages
    synchronously (txn.py do not yield), and their effects land in the commit of
    the previous checkpoint. stores/sqlite/store.py has exactly this shape
    (ensure_future(self._start_commit(...)): the commit job is queued only when the task
    first runs, after the next transaction's first `transact`)."""
    store = AsyncCommitStore()
    txns, readers = make_txns(store, App(), max_txn=Duration(nanos=1))
    envs = [outside(i) for i in range(3)]
    for env in envs:
        readers.queue.put_nowait(env)
    await run_until(txns, lambda: len(store.commits) >= 1)
    first = store.commits[0]
    read = checkpoint_offsets(first.checkpoint).get(JOURNAL, 0)
    # Messages whose effects are in the commit but lie beyond its checkpoint.
    leaked = [n for n in first.state if envs[n].begin >= read and n != 0]
    assert not leaked, (
        f"commit of checkpoint read_through={read} holds effects of later messages {leaked}"
    )


async def test_failed_commit_fails_the_shard_while_idle() -> None:
    """A failed store commit must fail the shard (FAILED status) even when no further
    message arrives. txn.py only awaits `_prev` after the *next* transaction's first
    message (txn.py `_next_blocking` waits on the queue alone), so an idle shard whose
    last commit failed stays PRIMARY forever and Stat waits forever."""
    store = FakeStore(fail_commits=True)
    txns, readers = make_txns(store, App())
    readers.queue.put_nowait(outside(0))
    task = asyncio.create_task(txns.run())
    try:
        await asyncio.wait({task}, timeout=1.0)
        assert store.commits, "the transaction did not commit"
        assert task.done(), "Transactions.run still runs 1s after its commit failed"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_progress_covers_trailing_messages_that_commit_nothing() -> None:
    """Stat(read_through=write head) must return once everything up to the head is read,
    even when the last messages commit nothing (a duplicate OUTSIDE_TXN re-sent by a
    retrying producer, a rolled-back span). txn.py only starts a transaction for a
    *committed* envelope (`_next_blocking`, txn.py), so `Shard._set_progress` never
    advances past such trailing bytes and Stat waits until the next real message."""
    store = FakeStore()
    txns, readers = make_txns(store, App())
    first = outside(0)
    dup = Envelope(JOURNAL, 10, 20, Msg(first.message.uid, 0))  # Same UUID: a duplicate.
    readers.queue.put_nowait(first)
    task = asyncio.create_task(txns.run())
    try:
        async with asyncio.timeout(2.0):
            await txns.shard.wait_read_through({JOURNAL: 10})  # The first txn committed.
        readers.queue.put_nowait(dup)  # Read after that transaction closed.
        async with asyncio.timeout(2.0):
            await txns.shard.wait_read_through({JOURNAL: 20})
    except TimeoutError:
        raise AssertionError(
            f"progress stuck at {txns.shard.progress()[0]} though the journal is read "
            f"through 20 (sequencer: {txns.seq.read_through()})"
        ) from None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_progress_covers_the_last_message_of_a_txn_closed_by_max_duration() -> None:
    """Stat(read_through=write head) returns once the last message is committed, also when
    max_txn_duration closed its transaction right after consuming it (before the Sequencer
    stepped past it) and nothing follows."""
    store = FakeStore()
    txns, readers = make_txns(store, App(), max_txn=Duration(nanos=1))
    readers.queue.put_nowait(outside(0))
    task = asyncio.create_task(txns.run())
    try:
        async with asyncio.timeout(2.0):
            await txns.shard.wait_read_through({JOURNAL: 10})
    except TimeoutError:
        raise AssertionError(
            f"progress stuck at {txns.shard.progress()[0]} though message 0 [0, 10) is "
            f"committed: {store.commits[-1].checkpoint if store.commits else None}"
        ) from None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class WaitForStore(FakeStore):
    """Records how many futures each commit was told to wait for."""

    def __init__(self) -> None:
        super().__init__()
        self.wait_for_counts: list[int] = []

    def start_commit(self, shard: Any, cp: pb.Checkpoint, wait_for: Any) -> asyncio.Future[None]:
        self.wait_for_counts.append(len(wait_for))
        for f in wait_for:
            f.cancel()  # Tasks wrapping done(); cancelling them leaves the appends alone.
        return super().start_commit(shard, cp, wait_for)


async def test_commit_does_not_wait_for_other_shards_appends() -> None:
    """All shards of a process share one AppendService (runtime.py, ReplicaContext
    .append_service), and `pending_except(recovery_log)` (txn.py) lists every pending
    append of the process: another shard's gated ACKs (waiting on *its* store commit), its
    recovery log, its raw appends. So one shard's commit waits on every other shard's
    in-flight work, and a shard whose commit hangs stalls the commits of all others.
    Upstream gives each shard its own AppendService."""
    store = WaitForStore()
    txns, readers = make_txns(store, App())
    svc = AppendService(None)  # type: ignore[arg-type]  # The other shard's own service.
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    # Another shard's gated ACK (its store commit never completes).
    other = svc.start_append(bpb.AppendRequest(journal="other-shard/out"), [never])
    other.write(b"ack")
    other.release()
    readers.queue.put_nowait(outside(0))
    try:
        await run_until(txns, lambda: bool(store.commits))
        assert store.wait_for_counts == [0], (
            f"this shard's commit waits for {store.wait_for_counts[0]} append(s) of another shard"
        )
    finally:
        never.cancel()
        await asyncio.sleep(0)


class RawAppendApp(App):
    """Issues a raw (at-least-once) append per message through the shard's AppendService,
    as Application docs invite; the append fails fast (like JOURNAL_NOT_FOUND or a
    RegisterMismatch, which the AppendService does not retry)."""

    def consume_message(self, shard: Any, store: FakeStore, env: Envelope, pub: Any) -> Any:
        store.state.append(env.message.n)
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failed.set_exception(RuntimeError("JOURNAL_NOT_FOUND"))
        aa = shard.append_service.start_append(bpb.AppendRequest(journal="raw/out"), [failed])
        aa.write(b"raw record\n")
        aa.release()
        return asyncio.sleep(0.05)  # The append fails before the transaction closes.


class WaitingStore(FakeStore):
    """A store honouring the contract: its commit becomes durable (recorded) only once every
    future of `wait_for` succeeded, and fails otherwise."""

    def start_commit(self, shard: Any, cp: pb.Checkpoint, wait_for: Any) -> asyncio.Future[None]:
        copy = pb.Checkpoint()
        copy.CopyFrom(cp)
        state = list(self.state)

        async def commit() -> None:
            await asyncio.gather(*wait_for)
            self.commits.append(Commit(copy, state))

        return asyncio.ensure_future(commit())


async def test_failed_raw_append_of_the_transaction_fails_its_commit() -> None:
    """ "All raw transaction []byte content must have been appended via the shard
    JournalClient" and the commit must wait for those appends, failing if one fails.
    `pending_except` (append_service.py) skips appends already *done*, including
    failed ones, so a raw append that failed before the transaction closed is not in
    `wait_for` and the checkpoint commits as if it had landed (the record is lost)."""
    store = WaitingStore()
    txns, readers = make_txns(store, RawAppendApp())
    readers.queue.put_nowait(outside(0))
    task = asyncio.create_task(txns.run())
    await asyncio.wait({task}, timeout=0.5)  # The loop fails, or goes on having committed.
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not store.commits or store.commits[0].state == [], (
        "the checkpoint covering message 0 committed though its raw append failed"
    )


class BeginFinisherApp(App):
    def __init__(self) -> None:
        super().__init__()
        self.begun = 0
        self.finished = 0

    def begin_txn(self, shard: Any, store: Any) -> None:
        self.begun += 1

    def finished_txn(self, shard: Any, store: Any, committed: Any) -> None:
        self.finished += 1

    def consume_message(self, shard: Any, store: FakeStore, env: Envelope, pub: Any) -> Any:
        raise ValueError("boom")


async def test_begin_txn_is_paired_with_finished_txn_on_error() -> None:
    """Upstream: "A call to BeginTxn is always paired with a call to FinishedTxn" (which is
    notified when the transaction "has started to commit, or has errored"), so apps can
    release semaphores taken in BeginTxn. txn.py calls `_finished` only after a
    successful `_start_commit`; an error in consume/finalize leaks the app's resource."""
    app = BeginFinisherApp()
    txns, readers = make_txns(FakeStore(), app)
    readers.queue.put_nowait(outside(0))
    task = asyncio.create_task(txns.run())
    await asyncio.gather(task, return_exceptions=True)
    assert app.begun == 1
    assert app.finished == 1, "FinishedTxn was never called for a transaction that errored"


@dataclass
class Out(JSONMessage):
    n: int = 0


class PublishingApp(App):
    """Publishes each message uncommitted to the journal named by its number's parity."""

    def consume_message(self, shard: Any, store: FakeStore, env: Envelope, pub: Any) -> Any:
        store.state.append(env.message.n)
        out = (f"review/out-{'even' if env.message.n % 2 == 0 else 'odd'}", CONTENT_TYPE_JSON_LINES)
        pub.publish_uncommitted(lambda _m: out, Out(env.message.n))
        return None


class HeldAppends:
    """A JournalClient stand-in answering appends OK at once, except those `held` (journal,
    nth append to it), which answer once `release` is set."""

    direct = None  # No direct appends: every append is an `append_call`.

    def __init__(self, held: set[tuple[str, int]]) -> None:
        self.held = held
        self.release = asyncio.Event()
        self.heads: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.done: list[tuple[str, int]] = []

    async def append_call(self, journal: str) -> Any:
        client = self

        class Call:
            def __init__(self) -> None:
                self.msgs: list[bpb.AppendRequest] = []

            async def write(self, msg: bpb.AppendRequest) -> None:
                self.msgs.append(msg)

            async def done_writing(self) -> None:
                pass

            def cancel(self) -> bool:
                return True

            def __await__(self) -> Any:
                return self.respond().__await__()

            async def respond(self) -> bpb.AppendResponse:
                journal = self.msgs[0].journal
                nth = client.counts.get(journal, 0)
                client.counts[journal] = nth + 1
                if (journal, nth) in client.held:
                    await client.release.wait()
                size = sum(len(m.content) for m in self.msgs)
                begin = client.heads.get(journal, 0)
                client.heads[journal] = begin + size
                client.done.append((journal, nth))
                commit = bpb.Fragment(journal=journal, begin=begin, end=begin + size)
                return bpb.AppendResponse(status=bpb.OK, commit=commit)

        return Call()

    def update_route(self, journal: str, header: Any) -> None:
        pass

    def invalidate_route(self, journal: str) -> None:
        pass


async def test_next_commit_starts_before_the_previous_acks_and_carries_their_intents() -> None:
    """ACK appends are off the critical path: a transaction commits once the previous store
    commit is durable, though the previous ACKs are not appended yet; its checkpoint then
    holds the previous intent of each journal it did not publish to, so a recovery from it
    still commits the previous transaction's messages there. Progress waits for every ACK."""
    store = FakeStore()
    txns, readers = make_txns(store, PublishingApp())
    # Transaction 1's ACK to out-even (the second append there) is held.
    client = HeldAppends({("review/out-even", 1)})
    svc = AppendService(client)  # type: ignore[arg-type]
    svc.track_released()
    txns.shard.append_service = svc
    txns.pub = Publisher(svc)
    readers.queue.put_nowait(outside(0))  # Transaction 1 publishes to out-even.
    task = asyncio.create_task(txns.run())
    try:
        await _until(running(task, lambda: len(store.commits) >= 1))
        readers.queue.put_nowait(outside(1))  # Transaction 2 publishes to out-odd.
        await _until(running(task, lambda: len(store.commits) >= 2))
        first, second = store.commits[0].checkpoint, store.commits[1].checkpoint
        assert set(first.ack_intents) == {"review/out-even"}
        assert ("review/out-even", 1) not in client.done  # Still held.
        assert set(second.ack_intents) == {"review/out-even", "review/out-odd"}
        assert second.ack_intents["review/out-even"] == first.ack_intents["review/out-even"]
        assert checkpoint_offsets(second)[JOURNAL] == 20
        # Progress is not reported past transaction 1 while its ACK is held.
        await asyncio.sleep(0.05)  # Time it would take to report it.
        assert checkpoint_offsets(store.commits[-1].checkpoint)[JOURNAL] == 20
        assert not txns.shard.progress()[0]

        client.release.set()
        await _until(lambda: txns.shard.progress()[0])
        assert txns.shard.progress()[0][JOURNAL] == 20
        # Every ACK landed: a third transaction (to out-even) carries no intent of out-odd.
        readers.queue.put_nowait(outside(2))
        await _until(lambda: len(store.commits) >= 3)
        third = store.commits[2].checkpoint
        assert set(third.ack_intents) == {"review/out-even"}
        assert third.ack_intents["review/out-even"] != first.ack_intents["review/out-even"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_completions_pending_behind_a_stuck_ack_are_bounded() -> None:
    """An ACK append that never completes holds back progress (completions report it in
    order): the loop stops starting commits after a few pending completions (backpressure)
    rather than piling them up without bound."""
    store = FakeStore()
    txns, readers = make_txns(store, PublishingApp())
    client = HeldAppends({("review/out-even", 1)})  # Transaction 1's ACK: held forever.
    svc = AppendService(client)  # type: ignore[arg-type]
    svc.track_released()
    txns.shard.append_service = svc
    txns.pub = Publisher(svc)
    task = asyncio.create_task(txns.run())
    try:
        readers.queue.put_nowait(outside(0))
        for i in range(1, 40, 2):  # Odd messages: transactions publishing to out-odd only.
            await asyncio.sleep(0.01)  # Paces the input: one transaction each.
            readers.queue.put_nowait(outside(i))
        await asyncio.sleep(0.2)  # Commits would pile up meanwhile, were they not bounded.
        assert not task.done()
        assert 2 <= len(store.commits) <= 1 + 8, len(store.commits)
        assert not txns.shard.progress()[0]
        client.release.set()  # The ACK lands: everything goes through.
        await _until(
            lambda: checkpoint_offsets(store.commits[-1].checkpoint).get(JOURNAL) == 400,
            interval=0.005,
        )
        await _until(lambda: txns.shard.progress()[0].get(JOURNAL) == 400, interval=0.005)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class RaisingStore(FakeStore):
    def start_commit(self, shard: Any, cp: pb.Checkpoint, wait_for: Any) -> asyncio.Future[None]:
        raise RuntimeError("start_commit failed at once")


async def test_start_commit_raising_at_once_aborts_the_gated_acks() -> None:
    """The transaction's gated ACK appends are aborted, so they do not block their journal
    (the AppendService can close) and the error fails the loop."""
    store = RaisingStore()
    txns, readers = make_txns(store, PublishingApp())
    client = HeldAppends(set())
    svc = AppendService(client)  # type: ignore[arg-type]
    svc.track_released()
    txns.shard.append_service = svc
    txns.pub = Publisher(svc)
    readers.queue.put_nowait(outside(0))
    with pytest.raises(RuntimeError, match="at once"):
        async with asyncio.timeout(5):
            await txns.run()
    async with asyncio.timeout(5):
        await svc.close()
    assert ("review/out-even", 1) not in client.done  # The ACK was never appended.


class GatedCommitStore(FakeStore):
    """Each commit becomes durable when the test resolves its gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[asyncio.Future[None]] = []

    def start_commit(self, shard: Any, cp: pb.Checkpoint, wait_for: Any) -> asyncio.Future[None]:
        super().start_commit(shard, cp, wait_for)
        self.gates.append(asyncio.get_running_loop().create_future())
        return self.gates[-1]


async def test_stats_count_bytes_and_time_each_phase() -> None:
    """The counters behind /debug/metrics: bytes read, and the seconds of each phase (the
    loop's own add up to at most its wall time; consuming is the application's time, waiting
    for the previous commit is stalling, committing covers the store's delay)."""
    from gazette.consumer.txn import PHASES

    store = GatedCommitStore()
    txns, readers = make_txns(store, App(consume_delay=0.005), max_txn=Duration(seconds=1))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for i in range(8):  # The first transaction: ~40 ms of consuming.
        readers.queue.put_nowait(outside(i))
    task = asyncio.create_task(txns.run())
    try:
        await _until(lambda: len(store.gates) == 1)  # Its commit is in flight...
        for i in range(8, 10):  # ...while the second transaction consumes two messages...
            readers.queue.put_nowait(outside(i))
        await _until(lambda: txns.stats.messages == 10)
        await asyncio.sleep(0.02)  # ...then waits for that commit (a stall measured)...
        for i in range(10, 16):  # ...consumes six more that came meanwhile...
            readers.queue.put_nowait(outside(i))
        await _until(lambda: txns.stats.messages == 16)
        await asyncio.sleep(0.02)  # ...and waits again.
        store.gates[0].set_result(None)
        await _until(lambda: len(store.gates) == 2)
        store.gates[1].set_result(None)
        await _until(lambda: txns.last_committed == store.commits[1].checkpoint)
        assert txns._prev is not None  # The second completion, which records its phases.
        await asyncio.wait({txns._prev}, timeout=5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    wall = loop.time() - t0
    stats = txns.stats
    assert stats.messages == 16
    assert stats.read_bytes == 16 * 10  # Envelopes of 10 bytes each.
    phases = dict(zip((p for p, _ in PHASES), stats.phase_seconds, strict=True))
    assert all(v >= 0 for v in phases.values()), phases
    timed = zip(PHASES, stats.phase_seconds, strict=True)
    sync = sum(v for (_, kind), v in timed if kind == "sync")
    assert sync <= wall + 0.01, (phases, wall)
    # Every consume slept 5 ms, also those of messages that came while the loop waited.
    assert phases["20-consuming"] >= 16 * 0.005 * 0.9, phases
    assert phases["30-stalled"] >= 0.025, phases
    assert phases["50-committing"] >= 0.07, phases  # The first commit was held that long.


# Waiting for ACKs. Producer Q publishes a transaction (messages 1 and 2, CONTINUE_TXN) right
# behind producer P's committed message 0, and acknowledges it later (message 3).
Q = ProducerID(bytes.fromhex("02000000000b"))


def of_q(i: int, flags: Flags) -> Envelope:
    """Message i of producer Q (bytes [10*i, 10*i + 10)), with `flags`."""
    clock = BASE_CLOCK + 16 * (i + 1)
    return Envelope(JOURNAL, 10 * i, 10 * i + 10, Msg(build_uuid(Q, clock, flags), i))


def committed_then_open_span(readers: FakeReaders) -> Envelope:
    """Queue P's message 0 and Q's uncommitted messages 1 and 2; returns Q's ACK of them."""
    readers.queue.put_nowait(outside(0))
    readers.queue.put_nowait(of_q(1, Flags.CONTINUE_TXN))
    readers.queue.put_nowait(of_q(2, Flags.CONTINUE_TXN))
    return of_q(3, Flags.ACK_TXN)


@pytest.mark.parametrize("disable", [False, True], ids=["wait", "disable_wait_for_ack"])
async def test_txn_waits_at_a_stall_for_the_ack_of_a_span_begun_in_it(disable: bool) -> None:
    """Upstream keeps a transaction open past an input stall while a span begun in it awaits
    its ACK (up to max_txn_duration), unless the ShardSpec sets disable_wait_for_ack: then
    it closes at the stall, and the span is consumed by a later transaction."""
    store = FakeStore()
    txns, readers = make_txns(
        store, App(), max_txn=Duration(seconds=5), disable_wait_for_ack=disable
    )
    ack = committed_then_open_span(readers)
    task = asyncio.create_task(txns.run())
    try:
        await asyncio.sleep(0.2)  # The input stalls with Q's span open.
        if disable:
            assert [c.state for c in store.commits] == [[0]]
        else:
            assert store.commits == [], "the transaction closed while awaiting Q's ACK"
        readers.queue.put_nowait(ack)
        await _until(running(task, lambda: store.commits and store.commits[-1].state == [0, 1, 2]))
        assert [c.state for c in store.commits] == ([[0], [0, 1, 2]] if disable else [[0, 1, 2]])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_wait_for_ack_is_bounded_by_max_txn_duration() -> None:
    """An ACK that does not come holds the transaction open until max_txn_duration only; the
    next transaction does not wait for that span again (it was not begun in it)."""
    store = FakeStore()
    txns, readers = make_txns(store, App(), max_txn=Duration(nanos=300_000_000))
    ack = committed_then_open_span(readers)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    task = asyncio.create_task(txns.run())
    try:
        await _until(running(task, lambda: len(store.commits) == 1))
        assert loop.time() - t0 >= 0.3 * 0.9  # Held open for the ACK until max_txn_duration.
        assert store.commits[0].state == [0]
        # A longer max_txn_duration from now on: a transaction waiting for Q's span again
        # would not close for 5 seconds.
        spec = pb.ShardSpec()
        spec.CopyFrom(txns.shard.spec)
        spec.max_txn_duration.FromSeconds(5)
        txns.apply_spec(spec)
        readers.queue.put_nowait(outside(4))
        t1 = loop.time()
        await _until(running(task, lambda: len(store.commits) == 2))
        assert loop.time() - t1 < 1.0
        assert store.commits[1].state == [0, 4]
        readers.queue.put_nowait(ack)  # Late: commits Q's span in the next transaction.
        await _until(running(task, lambda: len(store.commits) == 3))
        assert store.commits[2].state == [0, 4, 1, 2]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_wait_for_ack_keeps_min_txn_duration() -> None:
    """An ACK that comes before min_txn_duration elapsed does not close the transaction
    early: it still closes at min_txn_duration (when the input stalls), not at the ACK."""
    store = FakeStore()
    txns, readers = make_txns(
        store, App(), min_txn=Duration(nanos=300_000_000), max_txn=Duration(seconds=5)
    )
    readers.queue.put_nowait(committed_then_open_span(readers))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    task = asyncio.create_task(txns.run())
    try:
        await _until(running(task, lambda: len(store.commits) == 1))
        assert 0.3 * 0.9 <= loop.time() - t0 < 2.0
        assert store.commits[0].state == [0, 1, 2]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_an_ended_source_does_not_wait_for_acks() -> None:
    """A source that ended (a MessageProducer returned) delivers no ACK: the open
    transaction commits at once rather than wait out max_txn_duration for one."""
    store = FakeStore()
    txns, readers = make_txns(store, App(), max_txn=Duration(seconds=5))
    committed_then_open_span(readers)
    readers.queue.put_nowait(SOURCE_DONE)
    async with asyncio.timeout(1.0):
        await txns.run()
    assert [c.state for c in store.commits] == [[0]]


async def test_the_first_transaction_over_a_backlog_commits_soon() -> None:
    """A new primary over a backlog commits past its checkpoint within FIRST_TXN_MAX, not a
    whole max_txn_duration later; the transactions after it run to max_txn_duration."""
    store = FakeStore()
    txns, readers = make_txns(store, App(consume_delay=0.002), max_txn=Duration(seconds=1))
    for i in range(2000):  # ~4 s of consuming: never a stall
        readers.queue.put_nowait(outside(i))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    commits: list[float] = []
    task = asyncio.create_task(txns.run())
    try:
        while len(commits) < 2:
            await _until(running(task, lambda: len(store.commits) > len(commits)), timeout=5)
            commits.append(loop.time() - t0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert commits[0] < 0.5, commits
    assert commits[1] - commits[0] > 0.8, commits
    assert 0 < len(store.commits[0].state) < len(store.commits[1].state)


# -- Batches: readers queue lists, the Sequencer takes runs at once --------------------------


class BatchApp(App):
    """Consumes whole runs (BatchConsumer), recording each run's length."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[int] = []

    def consume_messages(
        self, shard: Any, store: FakeStore, envs: list[Envelope], pub: Any
    ) -> None:
        self.runs.append(len(envs))
        store.state.extend(env.message.n for env in envs)


def _mixed(n: int) -> list[Envelope]:
    """`n` OUTSIDE_TXN messages of P with a transaction of producer Q (two CONTINUE_TXN
    and their ACK) in the middle, at consecutive offsets."""
    envs = [outside(i) for i in range(n)]
    mid = n // 2
    q = [of_q(1000, Flags.CONTINUE_TXN), of_q(1001, Flags.CONTINUE_TXN), of_q(1002, Flags.ACK_TXN)]
    out = envs[:mid] + q + envs[mid:]
    return [Envelope(JOURNAL, 10 * i, 10 * i + 10, e.message) for i, e in enumerate(out)]


@pytest.mark.parametrize("app_type", [App, BatchApp])
async def test_batches_commit_exactly_once_whatever_the_transaction_boundaries(
    app_type: type[App],
) -> None:
    """Readers queue lists; transactions close after every message (max_txn_duration 1ns),
    so between runs and inside them. Every commit's checkpoint covers exactly what its
    state holds: a primary recovering it consumes the rest, none of it twice."""
    store = FakeStore()
    app = app_type()
    txns, readers = make_txns(store, app, max_txn=Duration(nanos=1))
    envs = _mixed(40)
    for k in range(0, len(envs), 7):
        readers.queue.put_nowait(envs[k : k + 7])
    want = [e.message.n for e in envs if (e.message.get_uuid().int >> 48) & 0x3FF != 2]
    await run_until(txns, lambda: store.state == want)
    await run_until(txns, lambda: store.commits and store.commits[-1].state == want)
    for commit in store.commits:
        again = redelivered_after_restore(commit.checkpoint, envs)
        assert commit.state + [n for n in again if n != 1002] == want, commit.checkpoint
    if isinstance(app, BatchApp):
        assert max(app.runs) > 1  # Runs were handed over whole.


async def test_an_async_consume_message_is_awaited_for_each_message_of_a_run() -> None:
    store = FakeStore()
    order: list[tuple[str, int]] = []

    class SlowApp(App):
        async def consume_message(self, shard: Any, s: FakeStore, env: Envelope, pub: Any) -> None:
            order.append(("start", env.message.n))
            # Suspends mid-message: the next must not start before this one ends.
            await asyncio.sleep(0.001)
            order.append(("end", env.message.n))
            s.state.append(env.message.n)

    txns, readers = make_txns(store, SlowApp())
    readers.queue.put_nowait([outside(i) for i in range(5)])
    await run_until(txns, lambda: store.state == list(range(5)))
    assert order == [(what, i) for i in range(5) for what in ("start", "end")]


async def test_a_slow_awaitable_consume_closes_transactions_inside_a_queued_list() -> None:
    """A consume_message returning awaitables gets single-message runs once it did: a
    queued list does not hold the transaction open past max_txn_duration."""
    store = FakeStore()
    txns, readers = make_txns(store, App(consume_delay=0.05), max_txn=Duration(nanos=80_000_000))
    envs = [outside(i) for i in range(12)]
    readers.queue.put_nowait(envs)
    await run_until(txns, lambda: store.state == list(range(12)) and len(store.commits) >= 3)
    # Twelve messages of 50 ms with transactions of at most 80 ms: several commits, where
    # a run taken whole would have made one transaction of all twelve.
    assert len(store.commits) >= 3, [len(c.state) for c in store.commits]
    for commit in store.commits:
        again = redelivered_after_restore(commit.checkpoint, envs)
        assert commit.state + again == list(range(12)), commit.checkpoint
