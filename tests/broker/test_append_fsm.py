"""The append state machine (`broker.append_fsm`) alone: a real replica and spool on disk, a
fake broker and replication pipeline, requests from a list. Every state and failure, without
gRPC; then how the Append handler (`broker.append_api`) answers each outcome. The
integration tests (test_append_read, test_registers, test_replication*, test_cluster,
test_direct, test_bad_requests) cover the same path through real brokers."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from gazette.broker import spool as spool_module
from gazette.broker.append_api import append
from gazette.broker.append_fsm import (
    AppendFSM,
    AppendMessage,
    AppendProtocolError,
    AppendState,
    ContentChunk,
    next_registers,
    precondition_status,
    stream_failure,
)
from gazette.broker.broker import Resolution
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.sha1sum import sha1sum_from_digest
from gazette.broker.replica import JournalReplica
from gazette.broker.replication import ReplicationError
from gazette.broker.reservation import ReservationError, ReservationStoreError
from gazette.broker.serving import RpcFailure
from tests.kit.specs import journal_spec

S = AppendState
JOURNAL = "a/journal"
CHUNK_TIMEOUT = 0.2


def label_set(**kv: str) -> pb.LabelSet:
    out = pb.LabelSet()
    for k, v in sorted(kv.items()):
        out.labels.add(name=k, value=v)
    return out


def selector(**kv: str) -> pb.LabelSelector:
    return pb.LabelSelector(include=label_set(**kv))


class FakePipeline:
    """The pipeline to `peers` peers, recording what it sends; fails as told."""

    def __init__(self, peers: int = 0) -> None:
        self.peers: Sequence[tuple[str, str]] = [(f"z#peer{i}", f"ep{i}") for i in range(peers)]
        self.broken = False
        self.sent: list[tuple[bytes, int]] = []
        self.proposals: list[tuple[pb.Fragment, pb.LabelSet]] = []
        self.fail_send = False
        self.fail_proposal: int | None = None  # which proposal (0: the first) fails
        self.proposing = asyncio.Event()
        self.hold = False  # proposals wait for their answers until cancelled

    def check(self) -> None:
        if self.broken:
            raise ReplicationError("pipeline broken")

    def close(self) -> None:
        self.broken = True

    async def send_content(self, data: bytes, delta: int) -> None:
        self.check()
        if self.fail_send:
            self.close()
            raise ReplicationError("peer z#peer0 left")
        if data:  # as the real pipeline: nothing to send
            self.sent.append((data, delta))

    async def propose(self, proposal: pb.Fragment, registers: pb.LabelSet) -> None:
        self.check()
        if self.hold:
            self.proposing.set()
            await asyncio.Event().wait()
        if self.fail_proposal == len(self.proposals):
            self.close()
            raise ReplicationError("peer z#peer0 answered PROPOSAL_MISMATCH")
        fragment, regs = pb.Fragment(), pb.LabelSet()
        fragment.CopyFrom(proposal)
        regs.CopyFrom(registers)
        self.proposals.append((fragment, regs))


class FakeBroker:
    """Resolves the journal to `replica` here (or as told), hands out `pipeline`, records
    reservations and disk reliefs."""

    def __init__(self, replica: JournalReplica, pipeline: FakePipeline, members: int = 1) -> None:
        self.replica = replica
        self.pipeline = pipeline
        self.route = pb.Route(
            members=[pb.ProcessSpec.ID(zone="z", suffix=f"b{i}") for i in range(members)],
            primary=0,
        )
        self.persist_queue: asyncio.Queue[Any] = asyncio.Queue()
        self.status: pb.Status.ValueType = pb.OK
        self.proxy_to = ""
        self.not_ready = False
        self.resolved: dict[str, Any] = {}
        self.pipeline_error: Exception | None = None
        self.reserve_error: Exception | None = None
        self.reserved: list[int] = []
        self.reserved_ahead = 0
        self.relieved = 0

    def header(self, journal: str | None = None) -> pb.Header:
        return pb.Header(route=self.route, etcd=pb.Header.Etcd(revision=7))

    async def resolve(
        self,
        journal: str,
        *,
        min_etcd_revision: int = 0,
        require_primary: bool = False,
        may_proxy: bool = True,
        covered: Any = None,
        proxy_header: pb.Header | None = None,
    ) -> Resolution:
        self.resolved = {
            "journal": journal,
            "min_etcd_revision": min_etcd_revision,
            "require_primary": require_primary,
            "may_proxy": may_proxy,
            "proxy_header": proxy_header,
        }
        if self.not_ready:
            raise TimeoutError
        if self.status != pb.OK:
            return Resolution(self.status, self.header(journal))
        if self.proxy_to:
            return Resolution(pb.OK, self.header(journal), proxy_to=self.proxy_to)
        return Resolution(pb.OK, self.header(journal), self.replica)

    async def ensure_pipeline(self, replica: JournalReplica) -> FakePipeline:
        assert replica.lock.locked()
        if self.pipeline_error is not None:
            raise self.pipeline_error
        return self.pipeline

    async def reserve(self, replica: JournalReplica, end: int) -> None:
        if self.reserve_error is not None:
            raise self.reserve_error
        self.reserved.append(end)

    def reserve_ahead(self, replica: JournalReplica) -> None:
        self.reserved_ahead += 1

    def relieve_disk(self) -> None:
        self.relieved += 1


class Requests:
    """The rest of an Append stream: `messages`, then its end (or a stall, if `stall`)."""

    def __init__(self, messages: Sequence[AppendMessage], *, stall: bool = False) -> None:
        self.messages = list(messages)
        self.stall = stall
        self.waiting = asyncio.Event()

    def __aiter__(self) -> Requests:
        return self

    async def __anext__(self) -> AppendMessage:
        if self.messages:
            return self.messages.pop(0)
        if self.stall:
            self.waiting.set()
            await asyncio.Event().wait()
        raise StopAsyncIteration


def content(*chunks: bytes) -> list[pb.AppendRequest]:
    """Content messages, then the commit message."""
    return [pb.AppendRequest(content=c) for c in chunks] + [pb.AppendRequest()]


async def make(
    tmp_path: Path,
    first: pb.AppendRequest | None = None,
    rest: list[pb.AppendRequest] | Requests | None = None,
    *,
    peers: int = 0,
    spec: pb.JournalSpec | None = None,
    members: int | None = None,
) -> tuple[AppendFSM, FakeBroker, FakePipeline, JournalReplica]:
    spec = spec or journal_spec(JOURNAL, replication=1 + peers)
    replica = JournalReplica(spec, 1, tmp_path / "spool")
    await replica.recover()
    pipeline = FakePipeline(peers)
    broker = FakeBroker(replica, pipeline, members=1 + peers if members is None else members)
    first = first or pb.AppendRequest(journal=JOURNAL)
    if rest is None:
        rest = content(b"hello ", b"world")
    requests = rest if isinstance(rest, Requests) else Requests(rest)
    fsm = AppendFSM(broker, first, requests, chunk_timeout=CHUNK_TIMEOUT)
    return fsm, broker, pipeline, replica


async def steps(fsm: AppendFSM) -> list[AppendState]:
    """Step `fsm` to a terminal state: the states it went through."""
    seen = [fsm.state]
    while fsm.state not in (S.FINISHED, S.FAILED, S.PROXY):
        seen.append(await fsm.step())
    return seen


def committed_bytes(replica: JournalReplica) -> bytes:
    assert replica.spool is not None
    return replica.spool.content_path.read_bytes()[: len(replica.spool)]


def spool_file_size(replica: JournalReplica) -> int:
    assert replica.spool is not None
    return replica.spool.content_path.stat().st_size


# --- the path of a committed append ----------------------------------------------------


async def test_an_append_commits_through_every_state(tmp_path: Path) -> None:
    fsm, broker, pipeline, replica = await make(tmp_path)
    assert await steps(fsm) == [
        S.RESOLVE,
        S.CHECK_JOURNAL,
        S.ACQUIRE_PIPELINE,
        S.CHECK_PRECONDITIONS,
        S.STREAM_CONTENT,
        S.RESERVE_OFFSETS,
        S.REPLICATE_COMMIT,
        S.COMMIT,
        S.RESPOND,
        S.FINISHED,
    ]
    resp = fsm.response
    assert resp is not None and resp.status == pb.OK
    assert (resp.commit.journal, resp.commit.begin, resp.commit.end) == (JOURNAL, 0, 11)
    assert resp.commit.sum == sha1sum_from_digest(hashlib.sha1(b"hello world").digest())
    assert (resp.total_chunks, resp.delayed_chunks) == (4, 0)  # first, 2 content, commit
    assert resp.header.etcd.revision == 7
    assert committed_bytes(replica) == b"hello world"
    assert replica.write_head == 11
    assert broker.reserved == [11] and broker.reserved_ahead == 1
    assert broker.resolved["require_primary"] and broker.resolved["may_proxy"]
    assert not replica.lock.locked()
    assert pipeline.sent == [] and pipeline.proposals == []  # no peers: nothing sent


async def test_content_and_the_commit_go_to_the_peers(tmp_path: Path) -> None:
    fsm, _broker, pipeline, replica = await make(
        tmp_path, rest=content(b"ab", b"cd", b"ef"), peers=2
    )
    assert await fsm.run() is S.FINISHED
    assert pipeline.sent == [(b"ab", 0), (b"cd", 2), (b"ef", 4)]
    ((proposal, _regs),) = pipeline.proposals
    assert (proposal.begin, proposal.end) == (0, 6)
    assert committed_bytes(replica) == b"abcdef"


async def test_an_append_without_content_commits_nothing(tmp_path: Path) -> None:
    fsm, broker, _pipeline, replica = await make(tmp_path, rest=[pb.AppendRequest()])
    seen = await steps(fsm)
    assert seen[-3:] == [S.STREAM_CONTENT, S.RESPOND, S.FINISHED]
    resp = fsm.response
    assert resp is not None and resp.status == pb.OK
    assert (resp.commit.begin, resp.commit.end) == (0, 0) and not resp.commit.HasField("sum")
    assert broker.reserved == [] and replica.write_head == 0


async def test_a_complete_spool_rolls_first_and_the_peers_with_it(tmp_path: Path) -> None:
    spec = journal_spec(JOURNAL, replication=2, length=4)
    fsm, broker, pipeline, replica = await make(tmp_path, peers=1, spec=spec)
    assert await fsm.run() is S.FINISHED
    fsm2 = AppendFSM(
        broker, pb.AppendRequest(journal=JOURNAL), Requests(content(b"!")), chunk_timeout=1
    )
    assert (await steps(fsm2))[3:6] == [S.CHECK_PRECONDITIONS, S.ROLL_SPOOL, S.STREAM_CONTENT]
    rolled, entry = broker.persist_queue.get_nowait()
    assert rolled is replica and (entry.begin, entry.end) == (0, 11)
    roll, _ = pipeline.proposals[1]  # after the first append's commit
    assert (roll.begin, roll.end) == (11, 11)
    assert fsm2.response is not None and fsm2.response.commit.begin == 11


async def test_registers_are_updated_on_commit(tmp_path: Path) -> None:
    first = pb.AppendRequest(
        journal=JOURNAL, union_registers=label_set(owner="b"), subtract_registers=label_set()
    )
    fsm, _broker, _pipeline, replica = await make(tmp_path, first)
    replica.store_registers(label_set(owner="a", epoch="1"))
    assert await fsm.run() is S.FINISHED
    assert replica.registers == label_set(epoch="1", owner="b")
    assert fsm.response is not None and fsm.response.registers == replica.registers


# --- answered with a status ------------------------------------------------------------


def _not_ready(b: FakeBroker) -> None:
    b.not_ready = True


def _primary_elsewhere(b: FakeBroker) -> None:
    b.status = pb.NOT_JOURNAL_PRIMARY_BROKER


def _proxied(b: FakeBroker) -> None:
    b.proxy_to = "primary:8080"


@pytest.mark.parametrize(
    ("setup", "state", "status"),
    [
        (_not_ready, S.FAILED, None),
        (_primary_elsewhere, S.FINISHED, pb.NOT_JOURNAL_PRIMARY_BROKER),
        (_proxied, S.PROXY, None),
    ],
)
async def test_resolution(
    tmp_path: Path, setup: Callable[[FakeBroker], None], state: AppendState, status: Any
) -> None:
    fsm, broker, _pipeline, _replica = await make(tmp_path)
    setup(broker)
    assert await fsm.step() is state
    if state is S.FAILED:
        assert fsm.failure == RpcFailure(
            grpc.StatusCode.UNAVAILABLE,
            f"journal {JOURNAL} not ready (etcd revision 0 or its recovery)",
        )
    elif state is S.PROXY:
        assert fsm.resolution is not None and fsm.resolution.proxy_to == "primary:8080"
        assert fsm.header.etcd.revision == 7  # forwarded with the request
    else:
        assert fsm.response is not None and fsm.response.status == status


async def test_a_proxied_request_is_not_proxied_again(tmp_path: Path) -> None:
    first = pb.AppendRequest(
        journal=JOURNAL, header=pb.Header(process_id=pb.ProcessSpec.ID(zone="z", suffix="x"))
    )
    fsm, broker, _pipeline, _replica = await make(tmp_path, first)
    await fsm.step()
    assert broker.resolved["may_proxy"] is False


@pytest.mark.parametrize("forwarded", [True, False], ids=["forwarded", "from-a-client"])
async def test_the_resolver_gets_the_header_of_a_forwarded_request(
    tmp_path: Path, forwarded: bool
) -> None:
    """A forwarded request's header (the forwarding broker's route and revision) goes to
    the resolver, which may wait for that revision; a client's request has none."""
    header = pb.Header(etcd=pb.Header.Etcd(revision=9))
    if forwarded:
        header.process_id.CopyFrom(pb.ProcessSpec.ID(zone="z", suffix="x"))
    first = pb.AppendRequest(journal=JOURNAL, header=header, min_etcd_revision=3)
    fsm, broker, _pipeline, _replica = await make(tmp_path, first)
    await fsm.step()
    assert broker.resolved["min_etcd_revision"] == 3
    assert broker.resolved["proxy_header"] == (header if forwarded else None)


@pytest.mark.parametrize(
    ("spec", "members", "status"),
    [
        (journal_spec(JOURNAL), 1, None),
        (
            pb.JournalSpec(name=JOURNAL, replication=1, flags=pb.JournalSpec.O_RDONLY),
            1,
            pb.NOT_ALLOWED,
        ),
        (journal_spec(JOURNAL, replication=3), 2, pb.INSUFFICIENT_JOURNAL_BROKERS),
    ],
)
async def test_the_journal_must_take_appends_here(
    tmp_path: Path, spec: pb.JournalSpec, members: int, status: Any
) -> None:
    fsm, _broker, _pipeline, _replica = await make(tmp_path, spec=spec, members=members)
    assert await fsm.step() is S.CHECK_JOURNAL
    state = await fsm.step()
    if status is None:
        assert state is S.ACQUIRE_PIPELINE
    else:
        assert state is S.FINISHED and fsm.response is not None
        assert fsm.response.status == status


async def test_a_suspended_journal_is_answered_suspended(tmp_path: Path) -> None:
    spec = journal_spec(JOURNAL)
    spec.suspend.level = pb.JournalSpec.Suspend.FULL
    fsm, _broker, _pipeline, _replica = await make(tmp_path, spec=spec)
    assert await fsm.run() is S.FINISHED
    assert fsm.response is not None and fsm.response.status == pb.SUSPENDED


@pytest.mark.parametrize(
    ("first", "status"),
    [
        (pb.AppendRequest(journal=JOURNAL, offset=11), pb.OK),
        (pb.AppendRequest(journal=JOURNAL, offset=5), pb.WRONG_APPEND_OFFSET),
        (pb.AppendRequest(journal=JOURNAL, check_registers=selector(owner="a")), pb.OK),
        (
            pb.AppendRequest(journal=JOURNAL, check_registers=selector(owner="b")),
            pb.REGISTER_MISMATCH,
        ),
    ],
)
async def test_offset_and_registers_are_checked_under_the_lock(
    tmp_path: Path, first: pb.AppendRequest, status: Any
) -> None:
    fsm, broker, _pipeline, replica = await make(tmp_path)
    assert await fsm.run() is S.FINISHED  # the journal now ends at 11
    replica.store_registers(label_set(owner="a"))
    fsm = AppendFSM(broker, first, Requests(content(b"x")), chunk_timeout=1)
    for _ in range(3):
        await fsm.step()
    assert replica.lock.locked()
    state = await fsm.step()
    if status == pb.OK:
        assert state is S.STREAM_CONTENT
        assert await fsm.run() is S.FINISHED
    else:
        assert state is S.FINISHED and fsm.response is not None
        assert fsm.response.status == status
        assert fsm.response.registers == label_set(owner="a")
        assert replica.write_head == 11
    assert not replica.lock.locked()


async def test_a_route_that_shrank_meanwhile_is_insufficient(tmp_path: Path) -> None:
    fsm, _broker, pipeline, replica = await make(tmp_path, peers=1)
    pipeline.peers = []
    assert await fsm.run() is S.FINISHED
    assert fsm.response is not None
    assert fsm.response.status == pb.INSUFFICIENT_JOURNAL_BROKERS
    assert not replica.lock.locked()


async def test_a_pipeline_that_cannot_be_opened_fails_unavailable(tmp_path: Path) -> None:
    fsm, broker, _pipeline, replica = await make(tmp_path)
    broker.pipeline_error = ReplicationError("this broker is not the primary of a/journal")
    assert (await steps(fsm))[-2:] == [S.ACQUIRE_PIPELINE, S.FAILED]
    assert fsm.failure == RpcFailure(
        grpc.StatusCode.UNAVAILABLE, "this broker is not the primary of a/journal"
    )
    assert not replica.lock.locked()


# --- failures while streaming: rolled back, here and at the peers -----------------------


def _ends_early() -> Requests:
    return Requests([pb.AppendRequest(content=b"partial")])


def _stalls() -> Requests:
    return Requests([pb.AppendRequest(content=b"partial")], stall=True)


def _content_after_commit() -> Requests:
    return Requests([*content(b"data"), pb.AppendRequest(content=b"more"), *content(b"rest")])


def _another_journal() -> Requests:
    return Requests(
        [pb.AppendRequest(content=b"data"), pb.AppendRequest(journal="other", content=b"x")]
    )


@pytest.mark.parametrize(
    ("requests", "code", "details"),
    [
        (
            _ends_early,
            grpc.StatusCode.ABORTED,
            "append stream ended without the empty commit message: rolled back",
        ),
        (
            _stalls,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"append stalled for over {CHUNK_TIMEOUT}s: rolled back",
        ),
        (
            _content_after_commit,
            grpc.StatusCode.INVALID_ARGUMENT,
            "unexpected message after the commit message (content 4 bytes)",
        ),
        (
            _another_journal,
            grpc.StatusCode.INVALID_ARGUMENT,
            f"Append message 3 of journal {JOURNAL}",
        ),
    ],
)
async def test_a_failed_stream_is_rolled_back(
    tmp_path: Path,
    requests: Callable[[], Requests],
    code: grpc.StatusCode,
    details: str,
) -> None:
    fsm, broker, pipeline, replica = await make(tmp_path, peers=1)
    assert await fsm.run() is S.FINISHED  # an earlier append: [0, 11)
    rest = requests()
    fsm = AppendFSM(broker, pb.AppendRequest(journal=JOURNAL), rest, chunk_timeout=CHUNK_TIMEOUT)
    seen = await steps(fsm)
    assert seen[-3:] == [S.STREAM_CONTENT, S.ROLLBACK, S.FAILED]
    assert fsm.failure is not None
    assert (fsm.failure.code, fsm.failure.details[: len(details)]) == (code, details)
    assert committed_bytes(replica) == b"hello world" and spool_file_size(replica) == 11
    assert replica.write_head == 11
    rollback, _ = pipeline.proposals[-1]  # the peers discard the content too
    assert replica.spool is not None and rollback == replica.spool.fragment()
    assert (rollback.begin, rollback.end) == (0, 11)
    assert not replica.lock.locked()
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert rest.messages == []  # read to its end before the answer


class SlowRequests(Requests):
    """Messages that each take `delay` seconds to arrive."""

    def __init__(self, messages: list[pb.AppendRequest], delay: float) -> None:
        super().__init__(messages)
        self.delay = delay

    async def __anext__(self) -> AppendMessage:
        await asyncio.sleep(self.delay)
        return await super().__anext__()


class SlowPipeline(FakePipeline):
    """A pipeline to one peer that takes `delay` seconds to send each content message."""

    def __init__(self, delay: float) -> None:
        super().__init__(1)
        self.delay = delay

    async def send_content(self, data: bytes, delta: int) -> None:
        await asyncio.sleep(self.delay)
        await super().send_content(data, delta)


async def test_a_stall_is_a_wait_for_one_message_not_the_stream_nor_a_write(
    tmp_path: Path,
) -> None:
    # Four messages 0.6 timeouts apart: the stream takes 2.4 timeouts, and no wait one.
    rest = SlowRequests(content(b"a", b"b", b"c"), delay=0.6 * CHUNK_TIMEOUT)
    fsm, broker, _, replica = await make(tmp_path, rest=rest)
    assert await fsm.run() is S.FINISHED and fsm.response is not None
    assert fsm.response.status == pb.OK and committed_bytes(replica) == b"abc"
    # Writes of 1.5 timeouts each, between messages that are there at once.
    broker.pipeline = SlowPipeline(1.5 * CHUNK_TIMEOUT)
    fsm = AppendFSM(
        broker,
        pb.AppendRequest(journal=JOURNAL),
        Requests(content(b"d", b"e")),
        chunk_timeout=CHUNK_TIMEOUT,
    )
    assert await fsm.run() is S.FINISHED and fsm.response is not None
    assert fsm.response.status == pb.OK and committed_bytes(replica) == b"abcde"


async def test_a_peer_failing_mid_stream_fails_unavailable(tmp_path: Path) -> None:
    fsm, _broker, pipeline, replica = await make(tmp_path, peers=1)
    pipeline.fail_send = True
    assert (await steps(fsm))[-3:] == [S.STREAM_CONTENT, S.ROLLBACK, S.FAILED]
    assert fsm.failure == RpcFailure(grpc.StatusCode.UNAVAILABLE, "peer z#peer0 left")
    assert pipeline.proposals == []  # a broken pipeline is not used to roll back
    assert spool_file_size(replica) == 0 and replica.write_head == 0


async def test_a_client_that_leaves_mid_stream_rolls_the_append_back(tmp_path: Path) -> None:
    rest = Requests([pb.AppendRequest(content=b"partial")], stall=True)
    fsm, _broker, pipeline, replica = await make(tmp_path, rest=rest, peers=1)
    fsm.chunk_timeout = 30.0
    task = asyncio.create_task(fsm.run())
    await asyncio.wait_for(rest.waiting.wait(), 5)
    assert fsm.state is S.STREAM_CONTENT and spool_file_size(replica) == 7
    task.cancel()  # as gRPC cancels the handler of a client that left
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fsm.state is S.ROLLBACK
    assert spool_file_size(replica) == 0 and replica.write_head == 0
    rollback, _ = pipeline.proposals[-1]
    assert (rollback.begin, rollback.end) == (0, 0)
    assert not replica.lock.locked()


async def test_a_full_disk_is_relieved_and_the_client_told_to_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rest = Requests([pb.AppendRequest(content=b"more"), *content(b"rest")])
    fsm, broker, _pipeline, replica = await make(tmp_path, rest=rest)

    def no_space(*_args: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(spool_module.os, "pwrite", no_space)
    assert (await steps(fsm))[-3:] == [S.STREAM_CONTENT, S.ROLLBACK, S.FAILED]
    assert fsm.failure is not None
    assert fsm.failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert fsm.failure.details.endswith(
        ": the broker is persisting its spools to free the disk; retry"
    )
    assert broker.relieved == 1
    assert rest.messages == []  # read to its end before the answer
    assert replica.write_head == 0 and not replica.lock.locked()


# --- failures while committing ---------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "state", "status"),
    [
        (ReservationStoreError("cannot reserve"), S.FINISHED, pb.FRAGMENT_STORE_UNHEALTHY),
        (ReservationError("lease may have expired"), S.FAILED, None),
    ],
)
async def test_a_refused_reservation_rolls_back(
    tmp_path: Path, error: Exception, state: AppendState, status: Any
) -> None:
    fsm, broker, _pipeline, replica = await make(tmp_path)
    broker.reserve_error = error
    assert (await steps(fsm))[-2:] == [S.RESERVE_OFFSETS, state]
    if status is None:
        assert fsm.failure == RpcFailure(grpc.StatusCode.UNAVAILABLE, str(error))
    else:
        assert fsm.response is not None and fsm.response.status == status
        assert fsm.response.store_health_error == str(error)
    assert spool_file_size(replica) == 0 and replica.write_head == 0
    assert not replica.lock.locked()


async def test_a_commit_the_peers_refuse_rolls_back_and_breaks_the_pipeline(
    tmp_path: Path,
) -> None:
    fsm, _broker, pipeline, replica = await make(tmp_path, peers=1)
    pipeline.fail_proposal = 0
    assert (await steps(fsm))[-2:] == [S.REPLICATE_COMMIT, S.FAILED]
    assert fsm.failure == RpcFailure(
        grpc.StatusCode.UNAVAILABLE, "peer z#peer0 answered PROPOSAL_MISMATCH"
    )
    assert pipeline.broken
    assert spool_file_size(replica) == 0 and replica.write_head == 0


async def test_a_client_that_leaves_during_the_commit_breaks_the_pipeline(
    tmp_path: Path,
) -> None:
    """The peers may hold the append pending, or committed: the pipeline is not used again."""
    fsm, _broker, pipeline, replica = await make(tmp_path, peers=1)
    pipeline.hold = True
    task = asyncio.create_task(fsm.run())
    await asyncio.wait_for(pipeline.proposing.wait(), 5)
    assert fsm.state is S.REPLICATE_COMMIT
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pipeline.broken
    assert spool_file_size(replica) == 0 and replica.write_head == 0
    assert not replica.lock.locked()


async def test_an_unforeseen_error_propagates_after_the_rollback(tmp_path: Path) -> None:
    fsm, broker, _pipeline, replica = await make(tmp_path)
    broker.reserve_error = RuntimeError("bug")
    with pytest.raises(RuntimeError, match="bug"):
        await fsm.run()
    assert fsm.state is S.RESERVE_OFFSETS
    assert spool_file_size(replica) == 0 and not replica.lock.locked()


# --- the decisions, as functions of values ---------------------------------------------


async def test_precondition_status(tmp_path: Path) -> None:
    replica = JournalReplica(journal_spec(JOURNAL, replication=2), 1, tmp_path)
    replica.write_head = 10
    replica.registers = label_set(owner="a")
    req = pb.AppendRequest
    assert precondition_status(req(journal=JOURNAL), replica, 1) == pb.OK
    assert precondition_status(req(journal=JOURNAL), replica, 0) == (
        pb.INSUFFICIENT_JOURNAL_BROKERS
    )
    assert precondition_status(req(offset=10), replica, 1) == pb.OK
    assert precondition_status(req(offset=9), replica, 1) == pb.WRONG_APPEND_OFFSET
    check = req(check_registers=selector(owner="b"))
    assert precondition_status(check, replica, 1) == pb.REGISTER_MISMATCH
    replica.registers = pb.LabelSet()  # empty registers match any check
    assert precondition_status(check, replica, 1) == pb.OK


def test_next_registers() -> None:
    current = label_set(epoch="1", owner="a")
    assert next_registers(pb.AppendRequest(), current) is current
    union = pb.AppendRequest(union_registers=label_set(owner="b"))
    assert next_registers(union, current) == label_set(epoch="1", owner="b")
    subtract = pb.AppendRequest(subtract_registers=label_set(epoch="1"))
    assert next_registers(subtract, current) == label_set(owner="a")


@pytest.mark.parametrize(
    ("err", "code", "drain"),
    [
        (ReplicationError("x"), grpc.StatusCode.UNAVAILABLE, False),
        (StopAsyncIteration(), grpc.StatusCode.ABORTED, False),
        (AppendProtocolError("x"), grpc.StatusCode.INVALID_ARGUMENT, True),
        (TimeoutError(), grpc.StatusCode.DEADLINE_EXCEEDED, False),
        (asyncio.CancelledError(), None, False),
        (RuntimeError("x"), None, False),
    ],
)
def test_stream_failure(err: BaseException, code: grpc.StatusCode | None, drain: bool) -> None:
    answer = stream_failure(err, JOURNAL, 1.0)
    if code is None:
        assert answer is None
    else:
        assert answer is not None and (answer[0].code, answer[1]) == (code, drain)


# --- the handler: outcomes to answers --------------------------------------------------


class Aborted(Exception):
    pass


class Context:
    """What the Append handler uses of a gRPC servicer context."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


class PeerStub:
    """The primary's Journal stub: answers a forwarded Append, or fails with `error`."""

    def __init__(self, error: grpc.aio.AioRpcError | None = None) -> None:
        self.error = error
        self.received: list[pb.AppendRequest] = []

    async def Append(self, requests: AsyncIterator[pb.AppendRequest]) -> pb.AppendResponse:  # noqa: N802
        async for req in requests:
            self.received.append(req)
        if self.error is not None:
            raise self.error
        return pb.AppendResponse(status=pb.OK, commit=pb.Fragment(journal=JOURNAL, end=3))


async def _stream(*messages: AppendMessage) -> AsyncIterator[AppendMessage]:
    for m in messages:
        yield m


async def _handler_broker(tmp_path: Path, stub: PeerStub | None = None) -> FakeBroker:
    _fsm, broker, _pipeline, _replica = await make(tmp_path)
    broker.cfg = SimpleNamespace(chunk_timeout=CHUNK_TIMEOUT)  # type: ignore[attr-defined]
    broker.peer_stub = lambda _endpoint: stub  # type: ignore[attr-defined]

    async def connected(_endpoint: str) -> None:
        pass

    broker.peer_connected = connected  # type: ignore[attr-defined]
    return broker


async def test_the_handler_answers_a_commit(tmp_path: Path) -> None:
    broker = await _handler_broker(tmp_path)
    stream = _stream(pb.AppendRequest(journal=JOURNAL), *content(b"abc"))
    resp = await append(broker, stream, Context())  # type: ignore[arg-type]
    assert resp.status == pb.OK and resp.commit.end == 3


@pytest.mark.parametrize(
    ("messages", "code", "details"),
    [
        ([], grpc.StatusCode.INVALID_ARGUMENT, "empty Append stream"),
        ([pb.AppendRequest()], grpc.StatusCode.INVALID_ARGUMENT, "Journal: "),
        (
            [pb.AppendRequest(journal=JOURNAL), pb.AppendRequest(content=b"x")],
            grpc.StatusCode.ABORTED,
            "append stream ended without the empty commit message: rolled back",
        ),
    ],
)
async def test_the_handler_aborts_a_bad_or_failed_append(
    tmp_path: Path, messages: list[pb.AppendRequest], code: grpc.StatusCode, details: str
) -> None:
    broker = await _handler_broker(tmp_path)
    with pytest.raises(Aborted) as raised:
        await append(broker, _stream(*messages), Context())  # type: ignore[arg-type]
    assert raised.value.args[0] == code
    assert raised.value.args[1].startswith(details)


async def test_the_handler_forwards_to_the_primary_with_its_header(tmp_path: Path) -> None:
    stub = PeerStub()
    broker = await _handler_broker(tmp_path, stub)
    broker.proxy_to = "primary:8080"
    stream = _stream(pb.AppendRequest(journal=JOURNAL), *content(b"abc"))
    resp = await append(broker, stream, Context())  # type: ignore[arg-type]
    assert resp.status == pb.OK and resp.commit.end == 3
    assert [m.content for m in stub.received] == [b"", b"abc", b""]
    assert stub.received[0].header.etcd.revision == 7  # not forwarded again by the primary


async def test_content_chunks_are_forwarded_as_the_requests_they_stand_for(
    tmp_path: Path,
) -> None:
    stub = PeerStub()
    broker = await _handler_broker(tmp_path, stub)
    broker.proxy_to = "primary:8080"
    chunk = ContentChunk(memoryview(b"xabc")[1:])
    stream = _stream(pb.AppendRequest(journal=JOURNAL), chunk, ContentChunk(b""))
    resp = await append(broker, stream, Context())  # type: ignore[arg-type]
    assert resp.status == pb.OK
    assert stub.received[1:] == [pb.AppendRequest(content=b"abc"), pb.AppendRequest()]


async def test_content_chunks_are_content_here_and_at_the_peers(tmp_path: Path) -> None:
    rest = Requests([ContentChunk(memoryview(b"hello world")[:6]), *content(b"world")])
    fsm, _, pipeline, replica = await make(tmp_path, rest=rest, peers=1)
    assert await fsm.run() is S.FINISHED and fsm.response is not None
    assert fsm.response.commit.sum == sha1sum_from_digest(hashlib.sha1(b"hello world").digest())
    assert committed_bytes(replica) == b"hello world"
    assert pipeline.sent == [(b"hello ", 0), (b"world", 6)]
    assert all(type(data) is bytes for data, _ in pipeline.sent)


async def test_a_failed_forward_is_answered_with_the_primarys_status(tmp_path: Path) -> None:
    error = grpc.aio.AioRpcError(
        grpc.StatusCode.UNKNOWN, grpc.aio.Metadata(), grpc.aio.Metadata(), details="boom"
    )
    broker = await _handler_broker(tmp_path, PeerStub(error))
    broker.proxy_to = "primary:8080"
    stream = _stream(pb.AppendRequest(journal=JOURNAL), pb.AppendRequest())
    with pytest.raises(Aborted) as raised:
        await append(broker, stream, Context())  # type: ignore[arg-type]
    # The primary may be gone: an unknown failure is UNAVAILABLE.
    assert raised.value.args == (grpc.StatusCode.UNAVAILABLE, "proxy to primary primary:8080: boom")
