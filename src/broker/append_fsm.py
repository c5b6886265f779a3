"""The Append RPC as a state machine: an append's steps and failures, apart from gRPC.

An append moves through named states (`AppendState`). Each state is a short step that does
one kind of work through what the machine was given: the broker (`AppendBroker`: resolution,
the replication pipeline, offset reservations), the journal's replica and spool, the
pipeline to its peers (`AppendPipeline`), and the client's request stream. Deciding is kept
apart from doing where it can be: which status a request's preconditions call for
(`precondition_status`), the registers a commit leaves (`next_registers`), and how a failed
content stream is answered (`stream_failure`) are functions of values alone.

    RESOLVE -> CHECK_JOURNAL -> ACQUIRE_PIPELINE -> CHECK_PRECONDITIONS -> [ROLL_SPOOL]
      -> STREAM_CONTENT -> RESERVE_OFFSETS -> REPLICATE_COMMIT -> COMMIT -> RESPOND -> FINISHED

- RESOLVE ends in PROXY when another broker is primary, FINISHED when the journal cannot be
  appended here (its status), FAILED when the keyspace or replica is not ready.
- CHECK_JOURNAL and CHECK_PRECONDITIONS end in FINISHED with a status (NOT_ALLOWED,
  SUSPENDED, INSUFFICIENT_JOURNAL_BROKERS, WRONG_APPEND_OFFSET, REGISTER_MISMATCH).
- STREAM_CONTENT goes straight to RESPOND for an append without content, and to ROLLBACK if
  the stream fails (ended early, stalled, broke the protocol, a peer or the spool failed,
  the RPC was cancelled). ROLLBACK discards the content here and at the peers, then ends in
  FAILED, or lets the error propagate (cancellation, anything unforeseen).
- RESERVE_OFFSETS, REPLICATE_COMMIT and COMMIT roll the append back themselves if they
  fail, and end in FAILED (or FINISHED with FRAGMENT_STORE_UNHEALTHY for a reservation the
  store refused).

The terminal states hold the outcome: FINISHED a `response`, FAILED a `failure` (the gRPC
status to end the RPC with), PROXY a `resolution` naming the primary to forward the stream
to. The replica's lock is held from ACQUIRE_PIPELINE until a terminal state is reached, or
an error leaves `step()`: appends of a journal run one at a time, content to commit.
`broker.append_api` drives the machine with `run()`; tests drive it one `step()` at a time.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from gazette.auth.claims import Claims
from gazette.broker.fragment.coverset import FragmentEntry
from gazette.broker.protocol import labels
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.selector import matches
from gazette.broker.protocol.sha1sum import sha1sum_from_digest
from gazette.broker.protocol.validation import validate_later_append_request
from gazette.broker.replica import JournalReplica
from gazette.broker.replication import ReplicationError
from gazette.broker.request_guard import drain_requests
from gazette.broker.reservation import ReservationError, ReservationStoreError
from gazette.broker.resolver import Resolution
from gazette.broker.serving import (
    UNLIMITED,
    Resolver,
    RpcFailure,
    resolve,
    spool_failure,
    was_proxied,
)
from gazette.broker.spool import PendingAppend, Spool, SpoolError

log = logging.getLogger(__name__)

__all__ = [
    "AppendBroker",
    "AppendMessage",
    "AppendFSM",
    "AppendPipeline",
    "AppendProtocolError",
    "AppendState",
    "ContentChunk",
    "next_registers",
    "precondition_status",
    "registers_match",
    "stream_failure",
]


@dataclass(frozen=True, slots=True)
class ContentChunk:
    """A later message of an Append stream that carries content alone (or nothing: the
    commit message), as ``AppendRequest(content=content)`` would, without a protobuf message
    around it: the direct-append listener hands these over from its frames without parsing
    or copying them, and they need no validation. Forwarded to a primary, each becomes the
    AppendRequest it stands for."""

    content: bytes | memoryview

    def request(self) -> pb.AppendRequest:
        return pb.AppendRequest(content=bytes(self.content))


AppendMessage = pb.AppendRequest | ContentChunk
"""A message of an Append stream after its first."""


class AppendProtocolError(Exception):
    """The client broke the Append stream protocol (e.g. content after the commit marker)."""


class AppendState(enum.Enum):
    RESOLVE = "resolve"
    """Where the journal is served: here, by proxy, or not at all."""
    CHECK_JOURNAL = "check journal"
    """The journal's spec and route allow appends here (before waiting for the journal)."""
    ACQUIRE_PIPELINE = "acquire pipeline"
    """The replica's lock, and its replication pipeline opened and synchronised."""
    CHECK_PRECONDITIONS = "check preconditions"
    """The route is still large enough; the request's offset and registers hold."""
    ROLL_SPOOL = "roll spool"
    """The spool is complete (full, old, another codec): roll it, and the peers with us."""
    STREAM_CONTENT = "stream content"
    """The client's content to the spool and the peers, up to its commit message."""
    ROLLBACK = "rollback"
    """The content stream failed: discard its content here and at the peers."""
    RESERVE_OFFSETS = "reserve offsets"
    """A replication-1 journal reserves offsets beyond the append before acknowledging."""
    REPLICATE_COMMIT = "replicate commit"
    """Every peer commits the append."""
    COMMIT = "commit"
    """The spool commits; the registers, index and write head are published."""
    RESPOND = "respond"
    """The OK response: the committed fragment, registers and chunk counts."""
    FINISHED = "finished"
    """Terminal: `response` is the answer."""
    FAILED = "failed"
    """Terminal: `failure` is the gRPC status to end the RPC with."""
    PROXY = "proxy"
    """Terminal: `resolution.proxy_to` is the primary to forward the stream to."""


TERMINAL = frozenset({AppendState.FINISHED, AppendState.FAILED, AppendState.PROXY})


class AppendPipeline(Protocol):
    """What an append uses of the replication pipeline to the journal's peers
    (`broker.replication.Pipeline`)."""

    @property
    def peers(self) -> Sequence[tuple[str, str]]: ...

    @property
    def broken(self) -> bool: ...

    def check(self) -> None:
        """Raise ReplicationError if the pipeline is broken."""

    def close(self) -> None: ...

    async def send_content(self, data: bytes, delta: int) -> None:
        """Send content to every peer, past `delta` bytes of the append. Raises
        ReplicationError (and the pipeline breaks) if a peer cannot take it."""

    async def propose(self, proposal: pb.Fragment, registers: pb.LabelSet) -> None:
        """Have every peer agree to `proposal`, or raise ReplicationError."""


class AppendBroker(Resolver, Protocol):
    """What an append uses of its broker (`broker.Broker`)."""

    persist_queue: asyncio.Queue[tuple[JournalReplica, FragmentEntry]]

    def header(self, journal: str) -> pb.Header: ...

    async def ensure_pipeline(self, replica: JournalReplica) -> AppendPipeline:
        """The journal's synchronised pipeline (the caller holds the replica's lock). Raises
        ReplicationError if this broker is not the primary or the peers cannot be reached."""

    async def reserve(self, replica: JournalReplica, end: int) -> None:
        """Reserve offsets beyond `end` before acknowledging content up to it, or raise
        ReservationError."""

    def reserve_ahead(self, replica: JournalReplica) -> None: ...

    def relieve_disk(self) -> None: ...


def registers_match(check: pb.LabelSelector, registers: pb.LabelSet) -> bool:
    """Empty registers match any selector (so a fence can be established on a new journal)."""
    return not registers.labels or matches(check, registers)


def precondition_status(
    first: pb.AppendRequest, replica: JournalReplica, peers: int
) -> pb.Status.ValueType:
    """OK, or the status answering an append `first` to `replica` whose pipeline has `peers`
    peers: the route shrank below the journal's replication while the append waited, the
    request's offset is not the write head, or its register check fails."""
    if 1 + peers < replica.spec.replication:
        return pb.INSUFFICIENT_JOURNAL_BROKERS
    if first.offset and first.offset != replica.write_head:
        return pb.WRONG_APPEND_OFFSET
    if first.HasField("check_registers") and not registers_match(
        first.check_registers, replica.registers
    ):
        return pb.REGISTER_MISMATCH
    return pb.OK


def next_registers(first: pb.AppendRequest, current: pb.LabelSet) -> pb.LabelSet:
    """The registers once append `first` commits: `current` itself if it changes none, else
    `current` less its subtracted labels, then its union labels (which replace a name's
    current values)."""
    if first.union_registers.labels or first.subtract_registers.labels:
        return labels.union(
            first.union_registers, labels.subtract(current, first.subtract_registers)
        )
    return current


def stream_failure(
    err: BaseException, journal: str, chunk_timeout: float
) -> tuple[RpcFailure, bool] | None:
    """How an append whose content stream failed with `err` is answered: the status, and
    whether to read the rest of the client's stream first (a gRPC Python client still
    sending when the stream is answered reports INTERNAL instead of the answer). None: `err`
    propagates (cancellation, or a failure not of the stream). A spool failure is answered
    by `serving.spool_failure`."""
    if isinstance(err, ReplicationError):
        return RpcFailure(grpc.StatusCode.UNAVAILABLE, str(err)), False
    if isinstance(err, StopAsyncIteration):
        return RpcFailure(
            grpc.StatusCode.ABORTED,
            "append stream ended without the empty commit message: rolled back",
        ), False
    if isinstance(err, AppendProtocolError):
        return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(err)), True
    if isinstance(err, TimeoutError):
        return RpcFailure(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"append stalled for over {chunk_timeout}s: rolled back",
        ), False
    return None


class _StallTimer:
    """Cancels the current task once it has waited `timeout` seconds for one message of the
    stream (between `waiting` and `received`), as an asyncio.timeout rearmed before each
    message and disarmed while the content is written would; but with one timer for the
    whole stream, rearmed only when it comes due, in place of two per message."""

    def __init__(self, timeout: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.fired = False
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout
        self._since: float | None = None  # When the wait for a message began.
        self._timer = self._loop.call_at(self._loop.time() + timeout, self._check)

    def waiting(self) -> None:
        self._since = self._loop.time()

    def received(self) -> None:
        self._since = None

    def cancel(self) -> None:
        self._timer.cancel()

    def _check(self) -> None:
        now, since = self._loop.time(), self._since
        if since is not None and now >= since + self._timeout:
            self.fired = True
            self.task.cancel()
        else:
            due = (now if since is None else since) + self._timeout
            self._timer = self._loop.call_at(due, self._check)


class AppendFSM:
    """One append, from its first request to its outcome (see the module's docstring).

    `first` is the stream's first request (validated), `requests` the rest of the stream
    (AppendRequest messages, or ContentChunks).
    A client that stalls for `chunk_timeout` seconds between messages is answered
    DEADLINE_EXCEEDED, and a stream that must be read to its end before an answer is read
    for at most that long.
    """

    def __init__(
        self,
        broker: AppendBroker,
        first: pb.AppendRequest,
        requests: AsyncIterator[AppendMessage],
        *,
        chunk_timeout: float,
        claims: Claims = UNLIMITED,
    ) -> None:
        self.broker = broker
        self.claims = claims
        self.first = first
        self.requests = requests
        self.chunk_timeout = chunk_timeout
        self.state = AppendState.RESOLVE
        self.response: pb.AppendResponse | None = None
        self.failure: RpcFailure | None = None
        self.resolution: Resolution | None = None
        self.header = pb.Header()
        self.total_chunks = 1  # the first message counts, as upstream
        self.delayed_chunks = 0
        self._replica: JournalReplica | None = None
        self._locked = False
        self._pipeline: AppendPipeline | None = None
        self._replicating = False
        self._spool: Spool | None = None
        self._pending: PendingAppend | None = None
        self._registers = pb.LabelSet()
        self._digest = b""
        self._error: BaseException | None = None

    @property
    def replica(self) -> JournalReplica:
        assert self._replica is not None, f"no replica in state {self.state.name}"
        return self._replica

    @property
    def pipeline(self) -> AppendPipeline:
        assert self._pipeline is not None, f"no pipeline in state {self.state.name}"
        return self._pipeline

    @property
    def spool(self) -> Spool:
        assert self._spool is not None, f"no spool in state {self.state.name}"
        return self._spool

    @property
    def pending(self) -> PendingAppend:
        assert self._pending is not None, f"no pending append in state {self.state.name}"
        return self._pending

    async def run(self) -> AppendState:
        """Step until a terminal state, which is returned. Cancellation and unforeseen
        errors propagate, after the append's content is rolled back and the lock released.
        The same steps as `step()` would take, without its call per state."""
        state = self.state
        try:
            while state not in TERMINAL:
                state = self.state = await _STEPS[state](self)
        finally:
            self._release()
        return state

    async def step(self) -> AppendState:
        """Run the current state's step; returns the state it leads to."""
        try:
            self.state = await _STEPS[self.state](self)
        except BaseException:
            self._release()
            raise
        if self.state in TERMINAL:
            self._release()
        return self.state

    def _release(self) -> None:
        if self._locked:
            self._locked = False
            self.replica.lock.release()

    def _finish(
        self, status: pb.Status.ValueType, registers: pb.LabelSet | None = None
    ) -> AppendState:
        self.response = pb.AppendResponse(status=status, header=self.header, registers=registers)
        return AppendState.FINISHED

    def _fail(self, failure: RpcFailure) -> AppendState:
        self.failure = failure
        return AppendState.FAILED

    # --- steps ------------------------------------------------------------------------
    async def _on_resolve(self) -> AppendState:
        first = self.first
        try:
            res = await resolve(
                self.broker,
                first.journal,
                first.min_etcd_revision,
                require_primary=True,
                may_proxy=not first.do_not_proxy and not was_proxied(first.header),
                claims=self.claims,
                header=first.header,
            )
        except RpcFailure as failure:
            return self._fail(failure)
        self.resolution = res
        self.header = res.header
        if res.status != pb.OK:
            return self._finish(res.status)
        if res.proxy_to:
            return AppendState.PROXY
        assert res.replica is not None
        self._replica = res.replica
        return AppendState.CHECK_JOURNAL

    async def _on_check_journal(self) -> AppendState:
        replica = self.replica
        if not replica.writable():
            return self._finish(pb.NOT_ALLOWED)
        if replica.spec.suspend.level == pb.JournalSpec.Suspend.FULL:
            return self._finish(pb.SUSPENDED)
        if len(self.header.route.members) < replica.spec.replication:
            return self._finish(pb.INSUFFICIENT_JOURNAL_BROKERS)
        return AppendState.ACQUIRE_PIPELINE

    async def _on_acquire_pipeline(self) -> AppendState:
        replica = self.replica
        await replica.lock.acquire()
        self._locked = True
        try:
            self._pipeline = await self.broker.ensure_pipeline(replica)
        except ReplicationError as err:
            log.warning("append refused journal=%s err=%s", replica.name, err)
            return self._fail(RpcFailure(grpc.StatusCode.UNAVAILABLE, str(err)))
        self.header = self.broker.header(replica.name)
        return AppendState.CHECK_PRECONDITIONS

    async def _on_check_preconditions(self) -> AppendState:
        replica = self.replica
        status = precondition_status(self.first, replica, len(self.pipeline.peers))
        if status == pb.INSUFFICIENT_JOURNAL_BROKERS:
            return self._finish(status)
        if status != pb.OK:
            return self._finish(status, registers=replica.registers)
        if replica.should_roll(time.time()):
            return AppendState.ROLL_SPOOL
        return AppendState.STREAM_CONTENT

    async def _on_roll_spool(self) -> AppendState:
        replica = self.replica
        for entry in replica.roll():
            self.broker.persist_queue.put_nowait((replica, entry))
        try:  # peers roll with us
            await self.pipeline.propose(replica.ensure_spool().fragment(), replica.registers)
        except ReplicationError as err:
            return self._fail(RpcFailure(grpc.StatusCode.UNAVAILABLE, str(err)))
        return AppendState.STREAM_CONTENT

    async def _on_stream_content(self) -> AppendState:
        replica = self.replica
        self._spool = replica.ensure_spool()
        self._pending = self._spool.begin_append()
        self._replicating = bool(self.pipeline.peers)
        content = self.first.content
        try:
            if content and await replica.throttle(len(content)):
                self.delayed_chunks += 1
            await self._write(content)
            await self._receive()
        except BaseException as err:  # also cancellation: the content is rolled back
            self._error = err
            return AppendState.ROLLBACK
        if self.pending.end > self.pending.begin:
            return AppendState.RESERVE_OFFSETS
        return AppendState.RESPOND

    async def _write(self, data: bytes | memoryview) -> None:
        pending = self.pending
        delta = len(pending)
        pending.write(data)
        if self._replicating:
            await self.pipeline.send_content(data if type(data) is bytes else bytes(data), delta)
        else:
            self.pipeline.check()  # no peers: nothing to send, but not if it broke

    async def _receive(self) -> None:
        """Write content messages until the empty commit message, then require the stream's
        end. Raises StopAsyncIteration if the stream ends before the commit message,
        TimeoutError if the client stalls, and AppendProtocolError if a message carries
        more than content (another journal, parameters) or anything follows the commit
        message."""
        it, replica = self.requests, self.replica
        stall = _StallTimer(self.chunk_timeout)
        try:
            while True:
                stall.waiting()
                msg = await anext(it)
                stall.received()
                self.total_chunks += 1
                if not isinstance(msg, ContentChunk):
                    try:
                        validate_later_append_request(msg)
                    except ValidationError as err:
                        # As upstream: even its own journal's name is not content.
                        raise AppendProtocolError(
                            f"Append message {self.total_chunks} of journal {replica.name}: {err}"
                        ) from None
                content = msg.content  # A new bytes object at each access: taken once.
                if not content:
                    break
                if await replica.throttle(len(content)):
                    self.delayed_chunks += 1
                await self._write(content)
            stall.waiting()
            try:
                extra = await anext(it)
            except StopAsyncIteration:
                return
        except asyncio.CancelledError:
            if stall.fired and stall.task.uncancel() == 0:
                raise TimeoutError from None
            raise
        finally:
            stall.cancel()
        raise AppendProtocolError(
            f"unexpected message after the commit message (content {len(extra.content)} bytes)"
        )

    async def _on_rollback(self) -> AppendState:
        err, replica, pipeline = self._error, self.replica, self.pipeline
        assert err is not None
        self.pending.rollback()
        if not pipeline.broken:
            try:  # peers discard the append's content too
                await pipeline.propose(self.spool.fragment(), replica.registers)
            except ReplicationError:
                pass
        if isinstance(err, SpoolError):
            failure, drain = spool_failure(err, self.broker.relieve_disk), True
        else:
            answer = stream_failure(err, replica.name, self.chunk_timeout)
            if answer is None:
                raise err
            failure, drain = answer
            if isinstance(err, ReplicationError):
                log.warning("append failed journal=%s err=%s", replica.name, err)
        if drain:
            await drain_requests(self.requests, self.chunk_timeout)
        return self._fail(failure)

    async def _on_reserve_offsets(self) -> AppendState:
        replica, pending = self.replica, self.pending
        self._registers = next_registers(self.first, replica.registers)
        try:  # offsets of a replication-1 journal are reserved before acknowledged
            await self.broker.reserve(replica, pending.end)
        except BaseException as err:
            pending.rollback()
            if not isinstance(err, ReservationError):
                raise
            log.warning("append refused journal=%s err=%s", replica.name, err)
            if isinstance(err, ReservationStoreError):
                self.response = pb.AppendResponse(
                    status=pb.FRAGMENT_STORE_UNHEALTHY,
                    header=self.header,
                    store_health_error=str(err),
                )
                return AppendState.FINISHED
            return self._fail(RpcFailure(grpc.StatusCode.UNAVAILABLE, str(err)))
        return AppendState.REPLICATE_COMMIT

    async def _on_replicate_commit(self) -> AppendState:
        pipeline, pending = self.pipeline, self.pending
        try:  # every peer commits before we do
            if self._replicating:
                await pipeline.propose(pending.proposal(), self._registers)
            else:
                pipeline.check()
        except BaseException as err:
            # Also when cancelled: no bytes past the spool's end, and no pipeline whose
            # peers may hold the append pending, or committed.
            pending.rollback()
            pipeline.close()
            if not isinstance(err, ReplicationError):
                raise
            log.warning("append commit failed journal=%s err=%s", self.replica.name, err)
            return self._fail(RpcFailure(grpc.StatusCode.UNAVAILABLE, str(err)))
        return AppendState.COMMIT

    async def _on_commit(self) -> AppendState:
        replica, regs = self.replica, self._registers
        try:
            self._digest = self.pending.commit()
        except SpoolError as err:
            return self._fail(spool_failure(err, self.broker.relieve_disk))
        if regs is not replica.registers and not labels.label_set_equal(regs, replica.registers):
            replica.store_registers(regs)
        replica.committed(self.spool)
        self.broker.reserve_ahead(replica)
        return AppendState.RESPOND

    async def _on_respond(self) -> AppendState:
        replica, pending = self.replica, self.pending
        resp = self.response = pb.AppendResponse(
            status=pb.OK,
            header=self.header,
            registers=replica.registers,
            total_chunks=self.total_chunks,
            delayed_chunks=self.delayed_chunks,
            store_health_error=replica.store_health_error,
        )
        commit = resp.commit  # Filled in place: a Fragment built apart would be copied in.
        commit.journal = replica.name
        commit.begin = pending.begin
        commit.end = pending.end
        commit.compression_codec = replica.codec
        if self._digest:
            commit.sum.CopyFrom(sha1sum_from_digest(self._digest))
        return AppendState.FINISHED


_STEPS: dict[AppendState, Callable[[AppendFSM], Awaitable[AppendState]]] = {
    AppendState.RESOLVE: AppendFSM._on_resolve,
    AppendState.CHECK_JOURNAL: AppendFSM._on_check_journal,
    AppendState.ACQUIRE_PIPELINE: AppendFSM._on_acquire_pipeline,
    AppendState.CHECK_PRECONDITIONS: AppendFSM._on_check_preconditions,
    AppendState.ROLL_SPOOL: AppendFSM._on_roll_spool,
    AppendState.STREAM_CONTENT: AppendFSM._on_stream_content,
    AppendState.ROLLBACK: AppendFSM._on_rollback,
    AppendState.RESERVE_OFFSETS: AppendFSM._on_reserve_offsets,
    AppendState.REPLICATE_COMMIT: AppendFSM._on_replicate_commit,
    AppendState.COMMIT: AppendFSM._on_commit,
    AppendState.RESPOND: AppendFSM._on_respond,
}
