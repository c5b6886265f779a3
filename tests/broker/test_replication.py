"""The peer side of replication (Follower) against real spools: proposals commit exactly the
content whose digest matches, roll forward on empty proposals, and answer PROPOSAL_MISMATCH
(never committing) otherwise."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest

from gazette.broker.fragment.coverset import FragmentEntry
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.sha1sum import sha1sum_from_digest
from gazette.broker.replica import JournalReplica
from gazette.broker.replication import (
    Follower,
    Pipeline,
    ReplicationError,
    ReplicationProtocolError,
    route_key,
    same_fragment,
)
from tests.kit.specs import journal_spec


def _spec(name: str = "a/journal") -> pb.JournalSpec:
    return journal_spec(name, replication=2, refresh=0)


async def _replica(tmp_path: Path) -> JournalReplica:
    r = JournalReplica(_spec(), 1, tmp_path)
    await r.recover()
    return r


def _frag(begin: int, content: bytes, name: str = "a/journal") -> pb.Fragment:
    f = pb.Fragment(journal=name, begin=begin, end=begin + len(content), compression_codec=pb.NONE)
    if content:
        f.sum.CopyFrom(sha1sum_from_digest(hashlib.sha1(content).digest()))
    return f


def _regs(**kv: str) -> pb.LabelSet:
    return pb.LabelSet(labels=[pb.Label(name=k, value=v) for k, v in sorted(kv.items())])


async def test_commit_matching_proposal(tmp_path: Path) -> None:
    r = await _replica(tmp_path)
    rolled: list[FragmentEntry] = []
    f = Follower(r, rolled.extend)
    assert f.proposal(_frag(0, b""), pb.LabelSet()).status == pb.OK
    f.content(b"hello ", 0)
    f.content(b"world", 6)
    assert r.write_head == 0  # not visible before the proposal
    resp = f.proposal(_frag(0, b"hello world"), _regs(owner="p1"))
    assert resp.status == pb.OK
    assert r.write_head == 11
    assert [lbl.value for lbl in r.registers.labels] == ["p1"]
    assert r.spool is not None and r.spool.content_path.read_bytes() == b"hello world"
    # A second append extends the same fragment: the digest covers the whole fragment.
    f.content(b"!", 0)
    assert f.proposal(_frag(0, b"hello world!"), _regs(owner="p1")).status == pb.OK
    assert r.write_head == 12
    assert rolled == []


async def test_wrong_digest_is_a_mismatch_and_commits_nothing(tmp_path: Path) -> None:
    r = await _replica(tmp_path)
    f = Follower(r, lambda _e: None)
    f.content(b"abc", 0)
    resp = f.proposal(_frag(0, b"abd"), pb.LabelSet())
    assert resp.status == pb.PROPOSAL_MISMATCH
    assert same_fragment(resp.fragment, _frag(0, b""))
    assert r.write_head == 0
    # The discarded bytes are gone: the next append starts again at 0.
    f.content(b"xyz", 0)
    assert f.proposal(_frag(0, b"xyz"), pb.LabelSet()).status == pb.OK
    assert r.spool is not None and r.spool.content_path.read_bytes() == b"xyz"


async def test_rollback_proposal(tmp_path: Path) -> None:
    r = await _replica(tmp_path)
    f = Follower(r, lambda _e: None)
    f.content(b"abc", 0)
    assert f.proposal(_frag(0, b"abc"), pb.LabelSet()).status == pb.OK
    f.content(b"def", 0)
    # The primary rolled the append back: it proposes the unchanged fragment.
    assert f.proposal(_frag(0, b"abc"), pb.LabelSet()).status == pb.OK
    assert r.write_head == 3
    assert r.spool is not None and r.spool.content_path.read_bytes() == b"abc"


async def test_empty_proposal_rolls_forward_never_back(tmp_path: Path) -> None:
    r = await _replica(tmp_path)
    rolled: list[FragmentEntry] = []
    f = Follower(r, rolled.extend)
    f.content(b"abc", 0)
    assert f.proposal(_frag(0, b"abc"), pb.LabelSet()).status == pb.OK
    # Behind our head: refused, with our fragment so the primary can catch up.
    resp = f.proposal(_frag(2, b""), pb.LabelSet())
    assert resp.status == pb.PROPOSAL_MISMATCH
    assert same_fragment(resp.fragment, _frag(0, b"abc"))
    # At or beyond our head: roll (the old spool goes to the persister).
    assert f.proposal(_frag(10, b""), _regs(x="1")).status == pb.OK
    assert r.write_head == 10
    assert [e.spec.end for e in rolled] == [3]
    assert r.spool is not None and r.spool.begin == 10
    f.content(b"zz", 0)
    assert f.proposal(_frag(10, b"zz"), _regs(x="1")).status == pb.OK
    assert r.write_head == 12


async def test_content_delta_out_of_sequence(tmp_path: Path) -> None:
    r = await _replica(tmp_path)
    f = Follower(r, lambda _e: None)
    f.content(b"abc", 0)
    with pytest.raises(ReplicationProtocolError, match="delta 5"):
        f.content(b"def", 5)


def test_route_key_ignores_endpoints() -> None:
    a = pb.Route(members=[pb.ProcessSpec.ID(zone="z", suffix="1")], primary=0, endpoints=["h:1"])
    b = pb.Route(members=[pb.ProcessSpec.ID(zone="z", suffix="1")], primary=0)
    c = pb.Route(members=[pb.ProcessSpec.ID(zone="z", suffix="1")], primary=-1)
    assert route_key(a) == route_key(b) != route_key(c)


# --- Pipeline against Followers on real replicas, over an in-memory transport ---------------


class _Call:
    """A Replicate stream to one Follower: requests are applied as they are written; the
    answers queue until read. `hold` (when set) keeps reads waiting; `fail_proposals` makes
    writes of proposals fail like a stream the peer has ended."""

    def __init__(self, follower: Follower) -> None:
        self.follower = follower
        self.answers: asyncio.Queue[pb.ReplicateResponse] = asyncio.Queue()
        self.hold: asyncio.Event | None = None
        self.fail_proposals = False
        self.cancelled = False

    async def write(self, req: pb.ReplicateRequest) -> None:
        if self.cancelled or (self.fail_proposals and req.HasField("proposal")):
            raise asyncio.InvalidStateError("RPC already finished.")
        if req.content:
            self.follower.content(req.content, req.content_delta)
        if req.HasField("proposal"):
            resp = self.follower.proposal(req.proposal, req.registers)
            if req.acknowledge:
                self.answers.put_nowait(resp)

    async def read(self) -> pb.ReplicateResponse:
        if self.hold is not None:
            await self.hold.wait()
        if self.cancelled:
            raise asyncio.CancelledError()  # as grpc.aio does for a locally cancelled call
        return await self.answers.get()

    def cancel(self) -> None:
        self.cancelled = True
        self.follower.rollback()
        if self.hold is not None:
            self.hold.set()


class _Peers:
    """Peer replicas by endpoint, and the calls a Pipeline opened to them."""

    def __init__(self, replicas: dict[str, JournalReplica]) -> None:
        self.replicas = replicas
        self.calls: dict[str, list[_Call]] = {ep: [] for ep in replicas}

    def stub_for(self, endpoint: str) -> Any:
        peers = self

        class _Stub:
            def Replicate(self) -> _Call:  # noqa: N802
                call = _Call(Follower(peers.replicas[endpoint], lambda _e: None))
                peers.calls[endpoint].append(call)
                return call

        return _Stub()

    def last(self, endpoint: str) -> _Call:
        return self.calls[endpoint][-1]


def _route(primary: str, *peers: str) -> pb.Route:
    names = [primary, *peers]
    return pb.Route(
        members=[pb.ProcessSpec.ID(zone="z", suffix=n) for n in names],
        endpoints=names,
        primary=0,
    )


async def _replicas(tmp_path: Path, *names: str) -> list[JournalReplica]:
    out = []
    for n in names:
        r = JournalReplica(_spec(), 1, tmp_path / n)
        await r.recover()
        out.append(r)
    return out


async def _open(primary: JournalReplica, peers: _Peers, *names: str) -> Pipeline:
    p = Pipeline(primary, _route("p", *names), pb.Header(), peers.stub_for, timeout=5.0)

    async def no_catch_up(_ep: str, _b: int, _e: int) -> None:
        raise AssertionError("no catch-up expected")

    await p.open(lambda _e: None, no_catch_up)
    return p


async def _append(p: Pipeline, primary: JournalReplica, data: bytes) -> None:
    """An append as service.Append commits it: content to the peers, then the proposal."""
    spool = primary.ensure_spool()
    pending = spool.begin_append()
    pending.write(data)
    await p.send_content(data, 0)
    try:
        await p.propose(pending.proposal(), primary.registers)
    except BaseException:
        pending.rollback()
        raise
    pending.commit()
    primary.committed(spool)


def _content(r: JournalReplica) -> bytes:
    assert r.spool is not None
    return r.spool.content_path.read_bytes()[: len(r.spool)]


async def test_cancelled_proposal_breaks_the_pipeline(tmp_path: Path) -> None:
    """A proposal cancelled while waiting for answers (the client went away) leaves answers
    unread in the streams: the pipeline must not be used again, or the next proposal would
    be 'acknowledged' by the stale answer of the previous one."""
    primary, a = await _replicas(tmp_path, "p", "a")
    peers = _Peers({"a": a})
    p = await _open(primary, peers, "a")
    await _append(p, primary, b"first ")
    call = peers.last("a")
    call.hold = asyncio.Event()
    task = asyncio.create_task(_append(p, primary, b"cancelled"))
    await asyncio.sleep(0.01)  # a has committed it; its answer is not read yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    call.hold.set()
    assert p.broken
    with pytest.raises(ReplicationError):
        await _append(p, primary, b"next")
    # Nothing was committed on the primary that the peer does not hold at the same offsets.
    assert _content(primary) == b"first "
    assert _content(a).startswith(_content(primary))


async def test_pipeline_closed_under_a_proposal_is_a_replication_error(tmp_path: Path) -> None:
    """The reconcile loop (no longer primary), a drop or end_streams may close the pipeline
    while an append waits for answers: the append sees a ReplicationError (UNAVAILABLE to
    its client), not a CancelledError of a task nobody cancelled."""
    primary, a = await _replicas(tmp_path, "p", "a")
    peers = _Peers({"a": a})
    p = await _open(primary, peers, "a")
    peers.last("a").hold = asyncio.Event()
    task = asyncio.create_task(_append(p, primary, b"data"))
    await asyncio.sleep(0.01)  # The append waits for the held peer's answer.
    p.close()
    with pytest.raises(ReplicationError):
        await task
    assert len(primary.spool or b"") == 0


async def test_failed_open_closes_its_streams(tmp_path: Path) -> None:
    primary, a = await _replicas(tmp_path, "p", "a")
    f = Follower(a, lambda _e: None)
    f.content(b"ahead", 0)
    assert f.proposal(_frag(0, b"ahead"), pb.LabelSet()).status == pb.OK
    peers = _Peers({"a": a})
    p = Pipeline(primary, _route("p", "a"), pb.Header(), peers.stub_for, timeout=5.0)

    async def failing_catch_up(_ep: str, _b: int, _e: int) -> None:
        raise ReplicationError("peer unreachable")

    with pytest.raises(ReplicationError):
        await p.open(lambda _e: None, failing_catch_up)
    assert p.broken and all(c.cancelled for c in peers.calls["a"])


async def test_offsets_a_peer_may_have_committed_are_never_reused(tmp_path: Path) -> None:
    """A commit proposal that fails after some peer committed it: the primary rolls the
    append back. If the next route no longer holds that peer (it died, or was removed), the
    primary must not write other content at those offsets: the peer's spool (persisted at
    its drop, or recovered and persisted at its restart) holds the failed append there."""
    primary, a, b = await _replicas(tmp_path, "p", "a", "b")
    peers = _Peers({"a": a, "b": b})
    p = await _open(primary, peers, "a", "b")
    await _append(p, primary, b"acked ")
    peers.last("b").fail_proposals = True
    with pytest.raises(ReplicationError):
        await _append(p, primary, b"failed")
    assert _content(a) == b"acked failed"  # a committed it; b and the primary did not
    # a leaves the route; the primary synchronises b alone and appends again.
    p2 = await _open(primary, peers, "b")
    await _append(p2, primary, b"retry")
    assert primary.write_head >= a.write_head
    # Every byte the primary and a both hold at an offset is the same byte.
    assert primary.spool is not None and a.spool is not None
    assert primary.spool.begin >= a.write_head or _content(a).startswith(_content(primary))


async def test_roll_adopts_the_proposed_codec(tmp_path: Path) -> None:
    """A peer whose spec lags the primary's (a codec change) rolls to an empty spool of the
    old codec; the primary's empty proposal of the new codec must still make it roll to the
    proposed codec, or every later commit proposal mismatches and the journal is stuck."""
    r = await _replica(tmp_path)
    f = Follower(r, lambda _e: None)
    f.content(b"abc", 0)
    assert f.proposal(_frag(0, b"abc"), pb.LabelSet()).status == pb.OK
    gz = _frag(3, b"")
    gz.compression_codec = pb.GZIP
    assert f.proposal(gz, pb.LabelSet()).status == pb.OK  # rolled, with our (old) codec...
    assert f.proposal(gz, pb.LabelSet()).status == pb.OK  # ...and synchronised again
    f.content(b"def", 0)
    commit = _frag(3, b"def")
    commit.compression_codec = pb.GZIP
    assert f.proposal(commit, pb.LabelSet()).status == pb.OK
    assert r.write_head == 6


async def test_failed_append_leaves_no_hole_when_every_recipient_resynchronises(
    tmp_path: Path,
) -> None:
    """When every peer a failed commit proposal went to answers the next synchronisation,
    their answers say who committed it: nobody did here, so the primary goes on at its head
    (rolling forward would leave readers a hole that no broker can ever fill)."""
    primary, a, b = await _replicas(tmp_path, "p", "a", "b")
    peers = _Peers({"a": a, "b": b})
    p = await _open(primary, peers, "a", "b")
    await _append(p, primary, b"acked ")
    for ep in ("a", "b"):
        peers.last(ep).fail_proposals = True
    with pytest.raises(ReplicationError):
        await _append(p, primary, b"failed")
    p2 = await _open(primary, peers, "a", "b")
    await _append(p2, primary, b"next")
    assert _content(primary) == _content(a) == _content(b) == b"acked next"
