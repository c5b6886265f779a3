"""Fakes of the consumer's unit tests (the transaction loop, replicas, the runtime): an
input journal of numbered messages outside transactions, the readers' queue, and an
in-memory store whose commits snapshot its state."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from gazette.consumer.protocol import pb
from gazette.message.envelope import Envelope
from gazette.message.uuid import Flags, ProducerID, build_uuid

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
    clock = BASE_CLOCK + 16 * (i + 1)
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
