"""Publisher: maps, sequences and appends messages to journals.

A `Publisher` has its own random `ProducerID` and a `Clock`. Each published message is mapped
to a journal (`message.mapping`), given a fresh UUID (producer, next clock tick, flags),
framed with the journal's framing (its ``content-type`` label), and written to that journal
through an `AppendService`.

Two modes, as in Gazette:

- `publish_committed` (flag OUTSIDE_TXN): read-committed readers see the message at once.
- `publish_uncommitted` (flag CONTINUE_TXN): the message belongs to the open transaction, and
  readers see it only once an ACK_TXN message of this producer, with a larger clock, follows it
  in the journal. The publisher remembers every journal the transaction touched;
  `build_ack_intents` returns the framed acknowledgements (one per journal, from
  ``msg.new_acknowledgement(journal)``) and starts a new transaction. A producer that must be
  atomic across journals writes the intents to stable storage before appending them
  (`publish_ack_intents`), and re-appends them after a crash. A producer that dies before its
  ACK leaves the transaction invisible for good (its replacement has a new ProducerID); one
  that restores its ProducerID and re-appends checkpointed intents (an ACK at the last ACK's
  clock, as a recovering consumer does) rolls back what it published after that ACK.

Batching (the reason this is fast). Creating an `AsyncAppend` per message costs ~100 us; the
target is 100k messages/s. So messages of one journal accumulate in that journal's *open
batch*: one `AsyncAppend` plus a bytearray of framed messages. The batch is released (written
into its AsyncAppend and queued on the AppendService) when the running task next yields to the
event loop (a ``call_soon`` callback), when it reaches `max_batch_bytes`, or on `flush()`.
With a `linger` (seconds, like Kafka's ``linger.ms``), open batches are instead released
together `linger` after the first of them opened (so a batch stays open at most that long;
one opened after a `flush()` may go sooner), so that a publisher of a steady trickle of
messages (one every millisecond, say) makes one append per `linger` rather than one per
message: each append
costs ~1-2 ms of CPU across client and broker in Python gRPC, which at 1k appends/s is most
of a core. Messages then wait up to `linger` before their append starts.
Every message of a batch returns the same AsyncAppend, whose `done()` resolves when the batch
commits. Batches of a journal are released in the order they were opened, and the service
commits a journal's appends in release order, so UUIDs (assigned while writing into the batch)
appear in each journal in clock order.

Concurrency: a Publisher belongs to one event loop and is not thread-safe. Its methods are
synchronous and never yield, so tasks of the loop may share it. Before closing the
AppendService, call `flush()` (or await `barrier()`): batches not yet released would otherwise
be released into a closed service and fail.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid as _uuid
from collections import deque
from collections.abc import Iterable
from time import time_ns as _time_ns
from typing import Any, NamedTuple

from gazette.broker.client.append_service import AppendAborted, AppendService, AsyncAppend
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.message.framing import Framing, framing_for
from gazette.message.mapping import MappingFunc
from gazette.message.uuid import (
    _KNOWN,
    GREGORIAN_OFFSET_100NS,
    UUID_SLOTS_VERIFIED,
    Clock,
    Flags,
    ProducerID,
    build_uuid_unchecked,
    new_producer_id,
    uuid_of_int,
)

__all__ = [
    "Publisher",
    "AckIntent",
    "JournalBatcher",
    "Batch",
    "DEFAULT_MAX_BATCH_BYTES",
    "fast_uuid",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_BYTES = 512 << 10
"""A journal's open batch is released once it holds this many bytes.

Below the AppendService's in-memory buffer limit (1 MiB), so a batch never spills to disk.
"""

_OUTSIDE = int(Flags.OUTSIDE_TXN)
_CONTINUE = int(Flags.CONTINUE_TXN)
_ACK = int(Flags.ACK_TXN)

# Building a UUID is on the per-message path: see message.uuid.build_uuid_unchecked.
fast_uuid = build_uuid_unchecked
# `_next_uuid` inlines uuid_of_int's slot assignment (a call costs ~0.45 µs per message), but
# only where message.uuid verified it at import; elsewhere it calls the checked construction.
_new_object = object.__new__
_set_attr = object.__setattr__
_UUID = _uuid.UUID
_SAFE_UNKNOWN = _uuid.SafeUUID.unknown
_SEQ_HEX: dict[int, str] = {}
"""Hex of the UUID fields holding counter and flags (at most 2^15 values; a handful in use):
a lookup is half the cost of formatting them per message."""


class AckIntent(NamedTuple):
    """A framed ACK_TXN message that, appended to `journal`, commits the publisher's pending
    messages there (Gazette's AckIntent)."""

    journal: str
    intent: bytes


class PublisherBroken(Exception):
    """An append of this publisher failed, so it publishes nothing more.

    Crash-only, as the consumer runtime: after a failure, the open transaction's fate is
    unknown, and any later ACK of this producer could commit part of it. Create a new
    Publisher (a new ProducerID) to go on. `__cause__` is the append's error.
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"publisher broken by a failed append: {cause!r}")
        self.__cause__ = cause


class Batch:
    """The open (unreleased) batch of one journal: its AsyncAppend and content so far."""

    __slots__ = ("append", "buf")

    def __init__(self, append: AsyncAppend) -> None:
        self.append = append
        self.buf = bytearray()


class JournalBatcher:
    """Per-journal open batches over an `AppendService` (see "Batching" above).

    `write(journal, data)` adds `data` to the journal's open batch and returns the batch's
    AsyncAppend. Batches are released when the event loop next runs callbacks (or `linger`
    seconds after the first of them opened), at `max_batch_bytes`, or on `flush()`. Raises
    ValueError for a negative `linger`. Also used by ``gazctl journals append`` for records
    that carry no UUID.

    With `chain`, each batch of a journal depends on the journal's previous batch: once one
    fails (e.g. its retries ran out), the journal's later batches fail with
    `DependencyFailed` without being sent, so that none lands after one that did not.
    """

    def __init__(
        self,
        append_service: AppendService,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        linger: float = 0.0,
        *,
        chain: bool = False,
    ) -> None:
        if not linger >= 0:
            raise ValueError(f"linger must be >= 0 seconds, not {linger!r}")
        self.append_service = append_service
        self.max_batch_bytes = max_batch_bytes
        self.linger = linger
        """Seconds a batch stays open after it opened (0: until the task yields)."""
        self.batches: dict[str, Batch] = {}
        self._requests: dict[str, pb.AppendRequest] = {}
        # With `chain`: each journal's last released batch, the next one's dependency.
        self._last: dict[str, AsyncAppend] | None = {} if chain else None
        self._released: deque[AsyncAppend] = deque()
        self._flush_handle: asyncio.Handle | None = None
        # The first failure among released appends dropped from `_released` before a
        # barrier looked at them: the next barrier raises it rather than hide it.
        self._missed_error: BaseException | None = None

    def open(self, journal: str) -> Batch:
        """The open batch of `journal`, started if there is none. Must run in the event loop."""
        batch = self.batches.get(journal)
        if batch is not None:
            return batch
        req = self._requests.get(journal)
        if req is None:
            req = self._requests[journal] = pb.AppendRequest(journal=journal)
        prev = self._last.get(journal) if self._last is not None else None
        deps = () if prev is None else (prev,)
        batch = self.batches[journal] = Batch(self.append_service.start_append(req, deps))
        if self._flush_handle is None:
            loop = asyncio.get_running_loop()
            if self.linger:
                self._flush_handle = loop.call_later(self.linger, self._flush_soon)
            else:
                self._flush_handle = loop.call_soon(self._flush_soon)
        return batch

    def write(self, journal: str, data: bytes | bytearray) -> AsyncAppend:
        """Add `data` to the open batch of `journal`; returns the batch's AsyncAppend."""
        batch = self.batches.get(journal) or self.open(journal)
        batch.buf += data
        if len(batch.buf) >= self.max_batch_bytes:
            self.release(journal, batch)
        return batch.append

    def release(self, journal: str, batch: Batch) -> None:
        """Write `batch` (the open batch of `journal`) into its AsyncAppend and release it."""
        del self.batches[journal]
        aa = batch.append
        if not batch.buf:  # Its first message failed to marshal: nobody holds this append.
            aa.abort()
            return
        aa.write(bytes(batch.buf))
        self._prune_released()
        self._released.append(aa)
        if self._last is not None:
            self._last[journal] = aa
        aa.release()

    def _prune_released(self) -> None:
        released = self._released
        while released and released[0].is_done():
            err = released.popleft().error()
            if err is not None and self._missed_error is None:
                self._missed_error = err

    def _flush_soon(self) -> None:
        self._flush_handle = None
        try:
            self.flush()
        except RuntimeError as err:  # The service closed under us: the appends carry it.
            log.warning("batches released into a closed AppendService err=%s", err)

    def flush(self) -> list[AsyncAppend]:
        """Release every open batch now; returns their AsyncAppends.

        Raises RuntimeError if the AppendService is closed (the appends then fail with it).
        """
        out = []
        err: RuntimeError | None = None
        for journal, batch in list(self.batches.items()):
            try:
                self.release(journal, batch)
            except RuntimeError as e:
                err = e
            out.append(batch.append)
        if err is not None:
            raise err
        return out

    async def barrier(self) -> None:
        """Release open batches and wait until every batch released so far has committed.

        Raises the error of the first failed append (a `BrokerError`, `DependencyFailed`,
        ...). Cancelling the barrier does not cancel the appends.
        """
        self.flush()
        for aa in list(self._released):
            await aa.done()
        self._prune_released()
        if self._missed_error is not None:
            err, self._missed_error = self._missed_error, None
            raise err


class Publisher:
    """Publishes messages to journals through `append_service` (see the module docstring).

    `clock`: None (the default) for a clock that follows wall time (read when a batch opens
    and every 16 ticks, see `_next_uuid`), or an initial Clock that the publisher then only
    ticks; its owner moves it forward with `update_clock` (deterministic, for tests and
    recovery). `producer` defaults to a fresh random ProducerID; a recovering consumer passes
    its checkpointed one, with a clock beyond everything it published before. `linger`:
    seconds a journal's batch stays open for more messages (module docs; default 0).
    """

    def __init__(
        self,
        append_service: AppendService,
        clock: Clock | None = None,
        *,
        producer: ProducerID | None = None,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        linger: float = 0.0,
    ) -> None:
        self.append_service = append_service
        self.batcher = JournalBatcher(append_service, max_batch_bytes, linger)
        self.producer: ProducerID = producer if producer is not None else new_producer_id()
        self._node = int.from_bytes(self.producer, "big")
        self._auto_clock = clock is None
        self._clock = 0 if clock is None else int(clock)
        self._batches = self.batcher.batches
        self._max_batch = max_batch_bytes
        self._ts = -1
        self._hi = 0
        self._str_head = self._str_tail = ""  # Of the canonical string (see _next_uuid).
        self._refresh = True
        self._framings: dict[str, Framing] = {}
        # Journal -> (acknowledgement message, framing), in first-publish order.
        self._intents: dict[str, tuple[Any, Framing]] = {}
        # Appends holding the open transaction's CONTINUE messages (all journals).
        self._txn_appends: list[AsyncAppend] = []
        # ACK appends queued by build_ack_intents, gated until publish_ack_intents.
        self._gated: dict[AckIntent, tuple[asyncio.Future[None], AsyncAppend]] = {}
        self._acks: list[AsyncAppend] = []
        self._error: BaseException | None = None

    # Clock.

    @property
    def clock(self) -> Clock:
        """The clock of the most recently assigned UUID."""
        return Clock(self._clock)

    def update_clock(self, now_ns: int | None = None) -> None:
        """Move the clock forward to the wall time `now_ns` (default: now); never backwards."""
        wall = ((time.time_ns() if now_ns is None else now_ns) // 100 + GREGORIAN_OFFSET_100NS) << 4
        if wall > self._clock:
            self._clock = wall
        self._refresh = True

    # Publishing.

    def publish_committed(self, mapping: MappingFunc, msg: Any) -> AsyncAppend:
        """Publish `msg` for immediate consumption by read-committed readers (OUTSIDE_TXN).

        Returns the AsyncAppend of the batch holding the message; its `done()` resolves when
        the batch committed (or raises the append's error). Raises, before anything is
        written: the message's own `validate()` error, the mapping's error (e.g.
        `NoPartitions`), `UnknownFramingError` for a journal without a known framing, and the
        framing's `MarshalError`. The message's UUID is set before it is marshalled.
        """
        # The hot path of the publisher: kept flat (one call per step) on purpose.
        validate = getattr(msg, "validate", None)
        if validate is not None:
            validate()
        if self._error is not None:
            raise PublisherBroken(self._error)
        journal, content_type = mapping(msg)
        framing = self._framings.get(content_type) or self._framing(content_type)
        batch = self._batches.get(journal) or self._open(journal)
        msg.set_uuid(self._next_uuid(_OUTSIDE))
        buf = batch.buf
        buf += framing.marshal(msg)
        if len(buf) >= self._max_batch:
            self.batcher.release(journal, batch)
        return batch.append

    def publish_uncommitted(self, mapping: MappingFunc, msg: Any) -> AsyncAppend:
        """Publish `msg` as part of the open transaction (CONTINUE_TXN).

        Read-committed readers see it only after the intents of the next `build_ack_intents`
        are appended. Raises as `publish_committed`.
        """
        validate = getattr(msg, "validate", None)
        if validate is not None:
            validate()
        if self._error is not None:
            raise PublisherBroken(self._error)
        journal, content_type = mapping(msg)
        framing = self._framings.get(content_type) or self._framing(content_type)
        if journal not in self._intents:
            # Before anything is written: a message whose ACK cannot be built must not land.
            self._intents[journal] = (msg.new_acknowledgement(journal), framing)
        batch = self._batches.get(journal) or self._open(journal)
        msg.set_uuid(self._next_uuid(_CONTINUE))
        buf = batch.buf
        buf += framing.marshal(msg)
        txn = self._txn_appends
        if not txn or txn[-1] is not batch.append:
            txn.append(batch.append)
        if len(buf) >= self._max_batch:
            self.batcher.release(journal, batch)
        return batch.append

    def _framing(self, content_type: str) -> Framing:
        framing = self._framings[content_type] = framing_for(content_type)
        return framing

    def _open(self, journal: str) -> Batch:
        if self._error is not None:
            raise PublisherBroken(self._error)
        self._refresh = True  # A new batch: likely a new event-loop iteration. Re-read time.
        batch = self.batcher.open(journal)
        batch.append.add_done_callback(self._on_append_done)
        return batch

    def _on_append_done(self, aa: AsyncAppend) -> None:
        err = aa.error()
        if err is None or isinstance(err, AppendAborted) and err.__cause__ is None:
            return  # Committed, or an empty batch discarded by the batcher.
        if self._error is None:
            self._error = err
            log.error(
                "publisher append failed journal=%s err=%r: the publisher is broken; its open "
                "transaction will never be acknowledged",
                aa.journal,
                err,
            )

    @property
    def broken(self) -> BaseException | None:
        """The append failure that broke this publisher, if any (see `PublisherBroken`)."""
        return self._error

    def _next_uuid(self, flags: int) -> _uuid.UUID:
        """Tick the clock; the UUID of the tick.

        An automatic clock reads wall time only when the tick enters a new 100 ns timestamp
        (every 16 ticks) or a batch was opened since: reading time and rebuilding the UUID's
        time fields on every message cost more than the rest of this function. Timestamps may
        so trail wall time by the duration of 16 publishes within one event-loop iteration.
        """
        clock = self._clock + 1
        if clock >> 4 != self._ts or self._refresh:
            self._refresh = False
            if self._auto_clock:
                wall = (_time_ns() // 100 + GREGORIAN_OFFSET_100NS) << 4
                if wall >= clock:
                    clock = wall + 1  # As Gazette: update to wall time, then tick.
            ts = clock >> 4
            if ts != self._ts:
                # Time fields, version and producer: shared by the 16 ticks of a timestamp,
                # as are the canonical string's parts around the clock sequence.
                self._ts = ts
                hi = self._hi = (
                    (ts & 0xFFFFFFFF) << 96
                    | ((ts >> 32) & 0xFFFF) << 80
                    | (((ts >> 48) & 0x0FFF) | 0x1000) << 64
                    | self._node
                )
                h = f"{hi:032x}"
                self._str_head = f"{h[:8]}-{h[8:12]}-{h[12:16]}-"
                self._str_tail = f"-{h[20:]}"
        self._clock = clock
        seq = (clock & 0xF) << 10 | flags | 0x8000
        value = self._hi | seq << 48
        if not UUID_SLOTS_VERIFIED:
            u = uuid_of_int(value)
        else:
            u = _new_object(_UUID)
            _set_attr(u, "int", value)
            _set_attr(u, "is_safe", _SAFE_UNKNOWN)
        seq_hex = _SEQ_HEX.get(seq)
        if seq_hex is None:
            seq_hex = _SEQ_HEX[seq] = f"{seq:04x}"
        _KNOWN[0] = (u, self._str_head + seq_hex + self._str_tail)  # As remember_str.
        return u

    def flush(self) -> list[AsyncAppend]:
        """Release every open batch now (see `JournalBatcher.flush`)."""
        return self.batcher.flush()

    async def barrier(self) -> None:
        """Release open batches and wait until everything published so far has committed.

        Raises the error of the first failed append (a `BrokerError`, `DependencyFailed`,
        ...). Cancelling the barrier does not cancel the appends.
        """
        try:
            await self.batcher.barrier()
            for aa in list(self._acks):
                await aa.done()
        finally:
            self._acks = [aa for aa in self._acks if not aa.is_done()]
        if self._error is not None:
            raise PublisherBroken(self._error)

    # Transactions.

    def build_ack_intents(self) -> list[AckIntent]:
        """Framed ACK_TXN messages for every journal published to (uncommitted) since the last
        call, in first-publish order; the next `publish_uncommitted` opens a new transaction.

        The ACK appends are queued at once, so each takes its place in its journal before
        anything published later (an ACK landing after the next transaction's messages would
        roll them back). They stay gated until `publish_ack_intents(intents)`, which the caller
        may delay until the intents are durable (a consumer's checkpoint), or are cancelled by
        `abort_ack_intents`. Each also depends on every append of the transaction, in every
        journal: if one of those fails, no ACK is appended and the transaction never commits,
        anywhere. Raises `PublisherBroken` after any append of this publisher failed.
        """
        if self._error is not None:
            raise PublisherBroken(self._error)
        self.batcher.flush()  # The transaction's messages precede its ACKs in each journal.
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        deps: list[AsyncAppend | asyncio.Future[Any]] = [gate, *self._txn_appends]
        out = []
        self._refresh = True
        for journal, (ack, framing) in self._intents.items():
            ack.set_uuid(self._next_uuid(_ACK))
            intent = AckIntent(journal, framing.marshal(ack))
            aa = self.append_service.start_append(pb.AppendRequest(journal=journal), deps)
            aa.write(intent.intent)
            aa.add_done_callback(self._on_append_done)
            aa.release()
            self._gated[intent] = (gate, aa)
            out.append(intent)
        self._intents.clear()
        self._txn_appends = []
        return out

    def publish_ack_intents(self, intents: Iterable[AckIntent]) -> list[AsyncAppend]:
        """Let the ACK appends of `intents` proceed (see `build_ack_intents`).

        Intents that were not built by this publisher object (e.g. restored from a checkpoint,
        to be re-appended on recovery) are appended after everything this publisher wrote to
        their journals. Returns one AsyncAppend per intent (await their `done()`, or
        `barrier()`).
        """
        out = []
        for intent in intents:
            gated = self._gated.pop(intent, None)
            if gated is None:
                aa = self.batcher.write(intent.journal, intent.intent)
            else:
                gate, aa = gated
                if not gate.done():
                    gate.set_result(None)
            self._acks.append(aa)
            out.append(aa)
        return out

    def abort_ack_intents(self, intents: Iterable[AckIntent], cause: BaseException) -> None:
        """Never append the ACKs of `intents` (e.g. the store commit failed).

        Their transaction then never commits; the publisher is broken, as a later ACK of this
        producer would otherwise commit the aborted transaction's messages.
        """
        for intent in intents:
            gated = self._gated.pop(intent, None)
            if gated is not None and not gated[0].done():
                gated[0].set_exception(cause)
        if self._error is None:
            self._error = cause

    async def commit(self) -> list[AckIntent]:
        """Acknowledge the open transaction and wait until the ACKs (and every message before
        them) committed. For producers that do not need the intents made durable first.

        Returns the intents that were appended.
        """
        intents = self.build_ack_intents()
        self.publish_ack_intents(intents)
        await self.barrier()
        return intents

    def pending_journals(self) -> list[str]:
        """Journals of the open transaction (published to uncommitted since the last ACK)."""
        return list(self._intents)

    async def __aenter__(self) -> Publisher:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is None:
            await self.barrier()
        else:
            self.flush()
