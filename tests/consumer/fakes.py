"""Fakes of the consumer's unit tests (the transaction loop, replicas, the runtime): an
input journal of numbered messages outside transactions, the readers' queue, an
in-memory store whose commits snapshot its state, and a runtime over a fake keyspace and
etcd (`make_runtime`)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gazette.allocator.model import MemberID, item_key, member_key
from gazette.consumer.config import ConsumerConfig
from gazette.consumer.protocol import pb
from gazette.consumer.runtime import ConsumerRuntime
from gazette.keyspace.keyspace import EtcdHeader, KeyValue
from gazette.message.envelope import Envelope
from gazette.message.uuid import Clock, Flags, ProducerID, build_uuid

JOURNAL = "review/in"
P = ProducerID(bytes.fromhex("01000000000a"))
BASE_CLOCK = 1 << 60  # Any clock well above zero.


@dataclass(eq=False)
class Msg:
    """A message numbered `n`."""

    uid: uuid.UUID | None
    n: int = 0

    def get_uuid(self) -> uuid.UUID | None:
        return self.uid

    def set_uuid(self, u: uuid.UUID) -> None:
        self.uid = u

    def new_acknowledgement(self, journal: str) -> Msg:
        return Msg(None)


def outside(i: int) -> Envelope:
    """The i-th OUTSIDE_TXN message of producer P (bytes [10*i, 10*i + 10))."""
    clock = Clock(BASE_CLOCK + 16 * (i + 1))
    return Envelope(JOURNAL, 10 * i, 10 * i + 10, Msg(build_uuid(P, clock, Flags.OUTSIDE_TXN), i))


class FakeReaders:
    """The readers the transaction loop takes envelopes from: put them on `queue`."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.iters: dict[str, Any] = {}


@dataclass
class Commit:
    """A commit the store was asked for: its checkpoint and the state it holds."""

    checkpoint: pb.Checkpoint
    state: list[int]  # Message numbers whose effects the commit holds.


@dataclass
class FakeStore:
    """The app's state is `state`; a commit snapshots it with the checkpoint."""

    state: list[int] = field(default_factory=list)
    commits: list[Commit] = field(default_factory=list)
    fail_commits: bool = False

    def start_commit(self, shard: Any, cp: pb.Checkpoint, wait_for: Any) -> asyncio.Future[None]:
        copy = pb.Checkpoint()
        copy.CopyFrom(cp)
        self.commits.append(Commit(copy, list(self.state)))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fail_commits:
            fut.set_exception(RuntimeError("commit failed (e.g. recorder fenced)"))
        else:
            fut.set_result(None)
        return fut

    async def restore_checkpoint(self, shard: Any) -> pb.Checkpoint:
        return self.commits[-1].checkpoint if self.commits else pb.Checkpoint()

    def destroy(self) -> None:
        pass


ROOT = "/review"


class IdleApp:
    def new_store(self, shard: Any, recovered: Any) -> FakeStore:
        return FakeStore()

    def new_message(self, spec: Any) -> Any:
        raise NotImplementedError

    def consume_message(self, shard: Any, store: Any, env: Any, pub: Any) -> None:
        pass

    def finalize_txn(self, shard: Any, store: Any, pub: Any) -> None:
        pass


class IdleReaders(FakeReaders):
    def __init__(self, *args: Any) -> None:
        super().__init__()

    async def run(self) -> None:
        await asyncio.Event().wait()


class FakeKeySpace:
    def __init__(self) -> None:
        self.kvs: dict[str, KeyValue[Any]] = {}
        self.revision = 1
        self.header = EtcdHeader(1, 1, 1, 1)
        self.awaited: list[int] = []  # revisions waited for
        self.bounds: list[float | None] = []  # and the longest each wait was allowed

    async def wait_for_revision(self, revision: int, timeout: float | None = None) -> None:
        self.awaited.append(revision)
        self.bounds.append(timeout)

    def put(self, key: str, value: Any) -> None:
        self.revision += 1
        self.kvs[key] = KeyValue(key, value, b"", self.revision, self.revision, 0)

    def get(self, key: str) -> KeyValue[Any] | None:
        return self.kvs.get(key)

    def prefixed(self, prefix: str) -> list[KeyValue[Any]]:
        return [kv for k, kv in sorted(self.kvs.items()) if k.startswith(prefix)]


TXN_REVISION = 1000


class FakeEtcd:
    async def txn(self, compares: Any, ops: Any) -> Any:
        class Header:
            revision = TXN_REVISION

        class R:
            succeeded = True
            header = Header()

        return R()


def make_runtime(tmp_path: Path) -> tuple[ConsumerRuntime, FakeKeySpace, MemberID]:
    cfg = ConsumerConfig(root=ROOT, zone="z", suffix="me", workdir=tmp_path)
    rt = ConsumerRuntime(cfg, IdleApp())  # type: ignore[arg-type]
    ks = FakeKeySpace()
    rt.member.keyspace = ks  # type: ignore[assignment]
    rt.member.etcd = FakeEtcd()  # type: ignore[assignment]
    rt.client = object()  # type: ignore[assignment]
    me = MemberID("z", "me")
    ks.put(member_key(ROOT, me), pb.ConsumerSpec())
    spec = pb.ShardSpec(id="shard", sources=[pb.ShardSpec.Source(journal=JOURNAL)])
    ks.put(item_key(ROOT, "shard"), spec)
    return rt, ks, me
