"""Consumer transactions: read-committed messages of a shard's sources, pipelined commits.

`SourceReaders` reads every source journal (read-uncommitted, from the checkpointed offsets)
into one bounded queue (``read_channel_size``). `Transactions` sequences those envelopes with
one `Sequencer` (``ring_buffer_size``; replays when a committed span left the ring) and runs
the transaction loop described in `consumer.application`:

1. A transaction begins with the first committed message (or acknowledgement) ready.
2. It consumes messages while they are ready, until ``max_txn_duration`` (the first one, over
   a backlog, until `FIRST_TXN_MAX`: a new primary commits past its checkpoint soon); once
   the queue stalls it closes, but not before ``min_txn_duration`` nor before the previous
   transaction's commit completed, nor while it waits for an ACK: a producer began a
   CONTINUE_TXN span since the last checkpoint (`Sequencer.has_pending`) and the ShardSpec
   does not set ``disable_wait_for_ack``. Like upstream, this waits only for spans begun in
   this transaction, only while the source may still deliver, and never past
   ``max_txn_duration``: the next transaction does not wait for them again.
3. Closing: `finalize_txn`; then the Checkpoint (sources read through, producer states,
   ACK intents of what was published); the store commit waits for every pending append of
   the transaction except those to the recovery log; the ACK intents are appended only once
   the commit is durable. The next transaction starts at once (pipelining), and may close
   and start its own store commit as soon as the previous store commit is durable, while the
   previous ACKs are still being appended: its checkpoint then also carries the previous
   intents of journals it did not publish to (ACKs are cumulative per producer and journal,
   so a recovery from it re-appends what may not have landed); in journals it did publish
   to, its messages are queued behind the previous ACKs, and its commit waits for them.

Acknowledgement messages are sequenced and counted in a transaction, but not passed to the
application. Any error fails the loop (the shard then reports FAILED).

The loop reads from a `MessageSource`: `SourceReaders` for journal sources (never ends), or
`consumer.message_producer.ProducedMessages` for an Application that is a MessageProducer.
A source that ends (`SOURCE_DONE`) completes the open transaction, and `Transactions.run`
returns once its commit is durable: the replica then restarts the source from
`Transactions.last_committed` (the store's checkpoint is restored only once, at recovery).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.application import Application, BatchConsumer, BeginFinisher, Shard
from gazette.consumer.protocol import pb
from gazette.consumer.store import Store
from gazette.message.envelope import Envelope
from gazette.message.iterators import ReadUncommittedIter, read_range
from gazette.message.publisher import AckIntent, Publisher
from gazette.message.sequencer import (
    MustStartReplay,
    ProducerState,
    QueueOutcome,
    Sequencer,
    states_from_checkpoint,
)
from gazette.message.uuid import Flags

__all__ = [
    "PHASES",
    "PRODUCER_PRUNE_HORIZON_NS",
    "SOURCE_DONE",
    "MessageSource",
    "SourceDone",
    "SourceItem",
    "SourceReaders",
    "TxnStats",
    "Transactions",
    "checkpoint_offsets",
    "sequencer_from_checkpoint",
]

log = logging.getLogger(__name__)

PRODUCER_PRUNE_HORIZON_NS = 24 * 3600 * 10**9
"""Producers idle this long (by their journal's clocks) leave checkpoints, as upstream."""

_YIELD_EVERY = 256  # Messages consumed back to back before letting other tasks run.
FIRST_TXN_MAX = 0.1
"""Seconds the first transaction of a `Transactions` (a primary just recovered, or a source
restarted) runs at most while it consumes a backlog, ``min_txn_duration`` permitting, however
long ``max_txn_duration`` is: the first commit past the recovered checkpoint then lands within
this rather than a whole ``max_txn_duration`` later (Stat read-through, downstream readers and
a recovery's measure all wait for it). Once it stalls, the usual rules hold (it may wait for
an ACK); the transactions after it run to ``max_txn_duration``."""
_MAX_COMPLETING = 8
"""Transactions whose completion (ACK appends, progress) may be pending at once: an ACK
append that keeps retrying holds the loop back (backpressure) instead of piling them up."""
_ACK_TXN = int(Flags.ACK_TXN)
_REPLAY = object()  # `Transactions._ready`: the Sequencer must replay before going on.

PHASES = (
    ("10-not-running", "sync"),
    ("20-consuming", "sync"),
    ("30-stalled", "sync"),
    ("40-preparing", "sync"),
    ("50-committing", "async"),
    ("60-acknowledging", "async"),
)
"""The phases of a transaction, as upstream's metrics name them (`consumer.metrics`), and
whether each runs in the loop (sync) or overlaps later transactions (async)."""
_NOT_RUNNING, _CONSUMING, _STALLED, _PREPARING, _COMMITTING, _ACKNOWLEDGING = range(6)


class SourceDone:
    """The type of `SOURCE_DONE`."""

    def __repr__(self) -> str:
        return "SOURCE_DONE"


SOURCE_DONE: Final = SourceDone()
"""Queued by a source that ended without an error (a MessageProducer returned)."""

SourceItem = Envelope | list[Envelope] | BaseException | SourceDone
"""What a source queues: an envelope, envelopes in journal order (at most `SOURCE_BATCH`),
the error that ended it, or `SOURCE_DONE`."""

SOURCE_BATCH = 256
"""Envelopes a source queues as one item at most. Handing the transaction loop batches,
rather than one envelope per queue put and get, takes the queue off the per-message path;
the queue's bound in items is the shard's ``read_channel_size`` divided by this."""


class MessageSource(Protocol):
    """Where the transaction loop takes envelopes from: `queue` (bounded), filled by `run`
    (which never raises: errors are queued); `replay` re-reads a range for the Sequencer."""

    queue: asyncio.Queue[SourceItem]

    async def run(self) -> None: ...

    async def replay(self, journal: str, begin: int, end: int) -> list[Envelope]: ...


def _maybe_async(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """An awaitable-returning wrapper of `fn`, which may be sync or async."""
    if inspect.iscoroutinefunction(fn):
        return fn

    async def call(*args: Any) -> Any:
        out = fn(*args)
        if inspect.isawaitable(out):
            return await out
        return out

    return call


def checkpoint_offsets(cp: pb.Checkpoint) -> dict[str, int]:
    """Per source journal, the offset a checkpoint read through."""
    return {journal: src.read_through for journal, src in cp.sources.items()}


def sequencer_from_checkpoint(cp: pb.Checkpoint, ring_size: int) -> Sequencer:
    """A Sequencer restored from a checkpoint's producer states and offsets."""
    states = states_from_checkpoint(
        {
            journal: [(e.id, e.state.last_ack, e.state.begin) for e in src.producers]
            for journal, src in cp.sources.items()
        }
    )
    return Sequencer(states=states, ring_size=ring_size, offsets=checkpoint_offsets(cp))


def _build_checkpoint(
    read_through: dict[str, int],
    states: dict[tuple[str, Any], ProducerState],
    intents: list[AckIntent],
) -> pb.Checkpoint:
    cp = pb.Checkpoint()
    for journal, offset in read_through.items():
        cp.sources[journal].read_through = offset
    for (journal, producer), state in sorted(states.items()):
        entry = cp.sources[journal].producers.add(id=bytes(producer))
        entry.state.last_ack = state.last_ack
        entry.state.begin = state.begin
    for intent in intents:
        cp.ack_intents[intent.journal] = intent.intent
    return cp


class SourceReaders:
    """Reads the shard's source journals into `queue` (envelopes, or the error that ended a
    reader). `iters` holds each source's iterator (its framing serves replays)."""

    def __init__(self, shard: Shard, app: Application, offsets: dict[str, int], size: int) -> None:
        self.shard = shard
        self.queue: asyncio.Queue[SourceItem] = asyncio.Queue(maxsize=-(-size // SOURCE_BATCH))
        self.iters: dict[str, ReadUncommittedIter] = {}
        for src in shard.spec.sources:
            offset = max(offsets.get(src.journal, 0), src.min_offset)
            req = bpb.ReadRequest(journal=src.journal, offset=offset, block=True)
            self.iters[src.journal] = ReadUncommittedIter(
                shard.journal_client, req, None, app.new_message
            )

    async def run(self) -> None:
        """Read until cancelled; a reader's error is queued for the transaction loop."""
        async with asyncio.TaskGroup() as tg:
            for journal, it in self.iters.items():
                tg.create_task(self._read(it), name=f"read {journal}")

    async def _read(self, it: ReadUncommittedIter) -> None:
        queue = self.queue
        try:
            while True:
                batch = await it.next_batch()
                for i in range(0, len(batch), SOURCE_BATCH):
                    part = batch[i : i + SOURCE_BATCH] if len(batch) > SOURCE_BATCH else batch
                    if queue.full():
                        await queue.put(part)
                    else:
                        queue.put_nowait(part)  # No coroutine per batch while there is room.
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # noqa: BLE001 - handed to the transaction loop
            await queue.put(err)
        finally:
            it.close()

    async def replay(self, journal: str, begin: int, end: int) -> list[Envelope]:
        """[begin, end) of `journal` read again, with its source's framing and request."""
        it = self.iters.get(journal) or next(iter(self.iters.values()))
        return await read_range(it, journal, begin, end)


class TxnStats:
    """Counters of a shard's transactions (for Stat, logs and benchmarks)."""

    def __init__(self) -> None:
        self.txns = 0
        self.messages = 0
        self.acks = 0
        self.read_bytes = 0
        """Bytes of the envelopes transactions read (acknowledgements included)."""
        self.phase_seconds = [0.0] * len(PHASES)
        """Cumulative seconds of each of `PHASES`."""
        self.last_txn_messages = 0
        self.last_txn_seconds = 0.0
        self.last_commit_seconds = 0.0
        """Store commit of the last completed transaction (durable in the log)."""
        self.last_acks_seconds = 0.0
        """Appends of its ACK intents, after the commit."""


class Transactions:
    """The transaction loop of a primary shard (module docs). `run` until cancelled."""

    def __init__(
        self,
        shard: Shard,
        app: Application,
        store: Store,
        publisher: Publisher,
        sequencer: Sequencer,
        readers: MessageSource,
        *,
        recovery_log: str = "",
        stats: TxnStats | None = None,
    ) -> None:
        self.shard = shard
        self.app = app
        self.store = store
        self.pub = publisher
        self.seq = sequencer
        self.readers = readers
        self.recovery_log = recovery_log
        self.stats = stats if stats is not None else TxnStats()
        spec = shard.spec
        self.min_dur = self.max_dur = 0.0
        self.wait_for_ack = True
        self._first_txn = True
        self.apply_spec(spec)
        self._consume: Callable[..., Any] = app.consume_message
        self._consume_batch: Callable[..., Any] | None = (
            app.consume_messages if isinstance(app, BatchConsumer) else None
        )
        # A run is consumed whole before the transaction may close. A `consume_message` that
        # is a coroutine (or once it returned an awaitable) may take long per message: its
        # runs are single messages, so that `max_txn_duration` is checked after each.
        self._run_max = (
            1
            if self._consume_batch is None and inspect.iscoroutinefunction(app.consume_message)
            else SOURCE_BATCH
        )
        self._finalize = _maybe_async(app.finalize_txn)
        self._begin: Callable[..., Awaitable[Any]] | None = None
        self._finished: Callable[..., Any] | None = None
        if isinstance(app, BeginFinisher):
            self._begin = _maybe_async(app.begin_txn)
            self._finished = app.finished_txn
        self._prev: asyncio.Future[None] | None = None
        """The last transaction's completion: store commit, ACK appends, progress (each
        completion awaits the one before it, so this one covers them all)."""
        self._prev_commit: asyncio.Future[Any] | None = None
        """The last transaction's store commit."""
        self._completing: collections.deque[asyncio.Future[None]] = collections.deque()
        """Completions not known done, oldest first."""
        self._unacked: dict[str, AckIntent] = {}
        """Per journal, the latest ACK intent checkpointed whose append is not known done."""
        self.last_committed: pb.Checkpoint | None = None
        """The Checkpoint of the latest transaction whose store commit succeeded (None until
        one did). Once `run` returned, that of the last transaction: where a restarted
        source resumes. Its ACK intents were appended by then: not to be appended again."""
        self._commits = 0  # Store commits started.
        self._last_committed_n = 0  # The number of the commit `last_committed` is of.
        self._pending: SourceItem | None = None  # Taken off the queue early.
        self._batch: list[Envelope] = []  # The queued list being taken, from _batch_pos.
        self._batch_pos = 0
        self._ended = False  # The source queued SOURCE_DONE: nothing more will come.
        self._begun = False  # A transaction began (BeginFinisher): `finished_txn` is owed.
        self._prepared_at = 0.0  # When the last transaction's commit started (loop time).
        # Offsets read through as of the last checkpoint.
        self._last_read_through: dict[str, int] = sequencer.read_through()

    def apply_spec(self, spec: pb.ShardSpec) -> None:
        """Take `spec`'s min and max transaction durations and its wait-for-ACK setting
        (from the next stall on)."""
        self.min_dur = spec.min_txn_duration.ToNanoseconds() / 1e9
        self.max_dur = spec.max_txn_duration.ToNanoseconds() / 1e9 or 1.0
        self.wait_for_ack = not spec.disable_wait_for_ack

    async def run(self) -> None:
        """Run transactions until cancelled, or until the source ended: then the open
        transaction is committed and `run` returns once that commit (and its ACKs) completed.
        Raises the error that failed the shard."""
        try:
            while await self._transaction():
                pass
            if self._prev is not None:
                await self._prev  # Raises if the last commit failed.
        finally:
            pending = [f for f in self._completing if not f.done()]
            if pending:
                # Let the last commits finish (or fail) rather than cut them off mid-way, but
                # not forever: the store is released after this returns.
                await asyncio.wait(pending, timeout=10.0)
                for f in pending:
                    f.cancel()
            for f in self._completing:
                with contextlib.suppress(BaseException):
                    await f
            self._completing.clear()

    async def _transaction(self) -> bool:
        """One transaction; False (and no transaction) once the source ended."""
        loop = asyncio.get_running_loop()
        env = await self._next_blocking()
        if isinstance(env, SourceDone):
            return False
        started = loop.time()
        try:
            await self._run_transaction(env, started)
        except BaseException as err:
            if self._begun:
                failed: asyncio.Future[Any] = loop.create_future()
                failed.set_exception(err if isinstance(err, Exception) else RuntimeError(err))
                failed.exception()  # Retrieved: the error is the shard's, raised below.
                self._notify_finished(failed)
            raise
        return True

    async def _run_transaction(self, env: Envelope | list[Envelope] | None, started: float) -> None:
        loop = asyncio.get_running_loop()
        if self._begin is not None:
            self._begun = True
            await self._begin(self.shard, self.store)
        elif self._finished is not None:
            self._begun = True
        n = 0
        if env is not None:
            n = len(env) if env.__class__ is list else 1
            out = self._handle(env)
            if out is not None:
                await out
        min_at, max_at = started + self.min_dur, started + self.max_dur
        # The first transaction closes early while it consumes a backlog; once it stalls,
        # the usual rules hold (it may then wait for an ACK up to max_txn_duration).
        early_at = max_at
        if self._first_txn:
            self._first_txn = False
            early_at = min(started + max(min(self.max_dur, FIRST_TXN_MAX), self.min_dur), max_at)
        ready = self._ready
        handle = self._handle
        next_yield = n + _YIELD_EVERY
        waited = 0.0  # Seconds the loop waited (for messages, the previous commit, min_dur).
        while True:
            # The hot loop: no coroutine per message unless the application's is one.
            now = loop.time()
            if now >= early_at:
                break
            got = ready()
            if got is _REPLAY:
                await self._replay()
                continue
            if got is not None:
                out = handle(got)  # type: ignore[arg-type]
                if out is not None:
                    await out
                n += len(got) if got.__class__ is list else 1  # type: ignore[arg-type]
                if n >= next_yield:
                    next_yield = n + _YIELD_EVERY
                    await asyncio.sleep(0)
                continue
            self._raise_failed()
            prev_done = self._prev_commit is None or self._prev_commit.done()
            if (now >= min_at or self._ended) and prev_done and not self._awaits_ack():
                break  # A source that ended closes the transaction without waiting.
            early_at = max_at  # Stalled: it has no backlog after all; the usual rules.
            await self._stall(min_at if now < min_at else None, max_at, prev_done)
            waited += loop.time() - now
        closed = loop.time()
        if self._prev_commit is not None:
            await self._prev_commit  # Raises if the previous store commit failed.
        await self._bound_completing()
        self._raise_failed()
        prepare_began = loop.time()
        await self._finalize(self.shard, self.store, self.pub)
        await self._start_commit()
        stats = self.stats
        prepared = loop.time()
        phases = stats.phase_seconds
        if self._prepared_at:
            phases[_NOT_RUNNING] += max(started - self._prepared_at, 0.0)
        phases[_CONSUMING] += max(closed - started - waited, 0.0)
        # Waiting for the previous commit (or earlier completions) once max_txn_duration
        # closed the transaction is stalling too, as upstream counts it.
        phases[_STALLED] += waited + (prepare_began - closed)
        phases[_PREPARING] += prepared - prepare_began
        self._prepared_at = prepared
        stats.txns += 1
        stats.last_txn_messages = n
        stats.last_txn_seconds = prepared - started

    def _awaits_ack(self) -> bool:
        """Whether the open transaction stays open for the ACK of a span begun in it (the
        caller bounds it by ``max_txn_duration``)."""
        return self.wait_for_ack and not self._ended and self.seq.has_pending()

    async def _bound_completing(self) -> None:
        """Wait while `_MAX_COMPLETING` completions are pending (raising a failed one's
        error)."""
        completing = self._completing
        while completing and completing[0].done():
            completing.popleft().result()
        while len(completing) >= _MAX_COMPLETING:
            await completing.popleft()

    def _raise_failed(self) -> None:
        """Raise the error of an earlier transaction's completion (a failed ACK append)."""
        prev = self._prev
        if prev is not None and prev.done():
            prev.result()

    async def _stall(self, min_at: float | None, max_at: float, prev_done: bool) -> None:
        """Wait for a message, the previous store commit (or a failure of an earlier
        transaction's completion), or the next deadline."""
        loop = asyncio.get_running_loop()
        deadline = max_at if min_at is None else min_at
        waits: set[asyncio.Future[Any]] = set()
        getter = None if self._ended else asyncio.ensure_future(self.readers.queue.get())
        if getter is not None:
            waits.add(getter)
        if not prev_done and self._prev_commit is not None:
            waits.add(self._prev_commit)
        if self._prev is not None and not self._prev.done():
            waits.add(self._prev)
        if not waits:
            return
        try:
            await asyncio.wait(
                waits,
                timeout=max(deadline - loop.time(), 0),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            if getter is not None:
                if getter.done() and not getter.cancelled():
                    self._pending = getter.result()
                else:
                    getter.cancel()

    async def _next_blocking(self) -> Envelope | list[Envelope] | SourceDone | None:
        """Wait until a transaction should begin: a committed envelope (or run) is ready (returned),
        or envelopes were read that commit nothing (None: the transaction checkpoints how
        far they were read, e.g. trailing duplicates). `SOURCE_DONE` once the source ended
        and nothing is left to commit. Raises the previous commit's error if it fails
        meanwhile."""
        read_any = False
        while True:
            got = self._ready()
            if got is _REPLAY:
                await self._replay()
                continue
            if got is not None:
                return got  # type: ignore[return-value]
            moved = self.seq.read_through() != self._last_read_through
            if moved and (read_any or self._ended):
                return None
            if self._ended:
                return SOURCE_DONE
            prev = self._prev
            getter = asyncio.ensure_future(self.readers.queue.get())
            waits: set[asyncio.Future[Any]] = {getter}
            if prev is not None and not prev.done():
                waits.add(prev)
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if getter.done() and not getter.cancelled():
                    self._pending = getter.result()
                    read_any = True
                else:
                    getter.cancel()
            if prev is not None and prev.done():
                prev.result()  # Raises if the previous commit failed.

    def _ready(self) -> Envelope | list[Envelope] | object | None:
        """The next committed envelope, or a run of them that the Sequencer took at once
        (`Sequencer.dequeue_committed`), if ready without waiting, else None; `_REPLAY` when
        the Sequencer needs a replay first. Raises a reader's error."""
        seq = self.seq
        while True:
            try:
                if seq.step():
                    return seq.dequeued
            except MustStartReplay:
                return _REPLAY
            batch, pos = self._batch, self._batch_pos
            if pos < len(batch):
                end = seq.dequeue_committed(batch, pos, pos + self._run_max)
                if end > pos:
                    self._batch_pos = end
                    return batch if pos == 0 and end == len(batch) else batch[pos:end]
                item: SourceItem = batch[pos]
                self._batch_pos = pos + 1
            else:
                got = self._pending
                if got is not None:
                    self._pending = None
                elif self._ended:
                    return None
                else:
                    try:
                        got = self.readers.queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return None
                if got.__class__ is list:
                    self._batch, self._batch_pos = got, 0  # type: ignore[assignment]
                    continue
                item = got
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, SourceDone):
                    self._ended = True
                    return None
            if seq.queue_uncommitted(item) is QueueOutcome.ACK_COMMIT_REPLAY:  # type: ignore[arg-type]
                return _REPLAY

    async def _replay(self) -> None:
        journal, begin, end = self.seq.replay_range()
        self.seq.start_replay(await self.readers.replay(journal, begin, end))

    def _handle(self, got: Envelope | list[Envelope]) -> Awaitable[Any] | None:
        """Pass an envelope, or a run of them, to the application; returns what must be
        awaited, if anything."""
        stats = self.stats
        if got.__class__ is list:
            # A run the Sequencer took at once: committed messages of one source journal,
            # contiguous, none an acknowledgement.
            run: list[Envelope] = got  # type: ignore[assignment]
            stats.read_bytes += run[-1].end - run[0].begin
            stats.messages += len(run)
            if self._consume_batch is not None:
                return self._awaitable(self._consume_batch(self.shard, self.store, run, self.pub))
            return self._consume_each(run)
        env: Envelope = got  # type: ignore[assignment]
        uuid = env.message.get_uuid()
        stats.read_bytes += env.end - env.begin
        # The flags are bits 48-57 of the UUID (message.uuid.get_flags, without validation:
        # the Sequencer checked the UUID already).
        if uuid is not None and (uuid.int >> 48) & 0x3FF == _ACK_TXN:
            stats.acks += 1
            return None
        stats.messages += 1
        if self._consume_batch is not None:
            return self._awaitable(self._consume_batch(self.shard, self.store, [env], self.pub))
        out = self._awaitable(self._consume(self.shard, self.store, env, self.pub))
        if out is not None:
            self._run_max = 1
        return out

    @staticmethod
    def _awaitable(out: Any) -> Awaitable[Any] | None:
        return out if out is not None and inspect.isawaitable(out) else None

    def _consume_each(self, run: list[Envelope]) -> Awaitable[Any] | None:
        consume, shard, store, pub = self._consume, self.shard, self.store, self.pub
        for i, env in enumerate(run):
            out = consume(shard, store, env, pub)
            if out is not None and inspect.isawaitable(out):
                self._run_max = 1
                return self._consume_rest(out, run, i + 1)
        return None

    async def _consume_rest(self, first: Awaitable[Any], run: list[Envelope], i: int) -> None:
        """An async `consume_message` returned an awaitable for run[i - 1]: await it, then
        consume the rest of the run in order."""
        await first
        consume, shard, store, pub = self._consume, self.shard, self.store, self.pub
        for env in run[i:]:
            out = consume(shard, store, env, pub)
            if out is not None and inspect.isawaitable(out):
                await out

    async def _start_commit(self) -> None:
        """Checkpoint, start the store commit, and schedule the ACKs behind it."""
        pub = self.pub
        pub.flush()  # The transaction's messages are appends in flight from here on.
        svc = self.shard.append_service
        if svc.tracks_released:
            # Every append of the transaction, also those done already (one that failed must
            # fail the commit).
            appends = svc.take_released(self.recovery_log)
        else:
            appends = svc.pending_except(self.recovery_log)
        wait_for = [asyncio.ensure_future(a.done()) for a in appends]
        self.seq.mark_processed()  # The last message consumed is in this commit.
        read_through = self._last_read_through = self.seq.read_through()
        states = self.seq.checkpoint(PRODUCER_PRUNE_HORIZON_NS)
        intents = pub.build_ack_intents()
        unacked = self._unacked
        published = {i.journal for i in intents}
        # Earlier intents whose appends may not have landed, in journals this transaction
        # did not publish to: a recovery from this checkpoint must still append them.
        carried = [i for j, i in unacked.items() if j not in published]
        for intent in intents:
            unacked[intent.journal] = intent
        cp = _build_checkpoint(read_through, states, intents + carried)
        try:
            started = self.store.start_commit(self.shard, cp, wait_for)
        except BaseException as err:
            pub.abort_ack_intents(intents, err)  # Else their gates block their journals.
            raise
        committed = asyncio.ensure_future(started)
        self._prev_commit = committed
        self._commits += 1
        self._prev = asyncio.ensure_future(
            self._complete(committed, self._commits, cp, intents, read_through, self._prev)
        )
        self._completing.append(self._prev)
        if svc.tracks_released:
            svc.take_released()  # The ACK appends just queued belong to this transaction.
        self._notify_finished(committed)
        if asyncio.iscoroutine(started):
            # Let the store's coroutine run to its first suspension before the next
            # transaction mutates the store: stores must capture the transaction by then.
            await asyncio.sleep(0)

    def _notify_finished(self, committed: asyncio.Future[Any]) -> None:
        if self._finished is not None and self._begun:
            self._begun = False
            self._finished(self.shard, self.store, committed)

    async def _complete(
        self,
        committed: Awaitable[Any],
        n: int,
        cp: pb.Checkpoint,
        intents: list[AckIntent],
        read_through: dict[str, int],
        earlier: asyncio.Future[None] | None,
    ) -> None:
        """Once the store commit (the `n`-th, of `cp`) is durable, append the ACKs; then,
        once the earlier transaction completed too (raising its error), report progress."""
        if earlier is not None:
            # Its outcome is retrieved even if this one fails first (`run` waits for both).
            earlier.add_done_callback(lambda f: f.cancelled() or f.exception())
        t0 = time.monotonic()
        try:
            await committed
        except BaseException as err:
            self.pub.abort_ack_intents(intents, err)
            raise
        if n > self._last_committed_n:  # Commits complete in order; never go back anyway.
            self._last_committed_n = n
            self.last_committed = cp
        t1 = time.monotonic()
        acks = self.pub.publish_ack_intents(intents)
        publish_at: dict[str, int] = {}
        unacked = self._unacked
        for intent, aa in zip(intents, acks, strict=True):
            resp = await aa.done()
            publish_at[aa.journal] = max(publish_at.get(aa.journal, 0), resp.commit.end)
            if unacked.get(intent.journal) is intent:
                del unacked[intent.journal]
        t2 = time.monotonic()
        if earlier is not None:
            await earlier  # Progress in order; an earlier failure is this one's too.
        stats = self.stats
        stats.last_commit_seconds = t1 - t0
        stats.last_acks_seconds = t2 - t1
        stats.phase_seconds[_COMMITTING] += t1 - t0
        stats.phase_seconds[_ACKNOWLEDGING] += t2 - t1
        if t2 - t0 > 1.0:
            log.warning(
                "slow commit shard=%s store_commit=%.3fs acks=%.3fs",
                self.shard.id,
                t1 - t0,
                t2 - t1,
            )
        await self.shard._set_progress(read_through, publish_at)
