"""The peer side of replication (Follower) against real spools: proposals commit exactly the
content whose digest matches, roll forward on empty proposals, and answer PROPOSAL_MISMATCH
(never committing) otherwise."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from broker.fragment.coverset import FragmentEntry
from broker.protocol import protocol_pb2 as pb
from broker.protocol.sha1sum import sha1sum_from_digest
from broker.replica import JournalReplica
from broker.replication import (
    Follower,
    ReplicationProtocolError,
    route_key,
    same_fragment,
)


def _spec(name: str = "a/journal") -> pb.JournalSpec:
    return pb.JournalSpec(
        name=name, replication=2, fragment=pb.JournalSpec.Fragment(length=1 << 20)
    )


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
