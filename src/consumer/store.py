"""The Store contract: durable, transactional state committed together with Checkpoints.

A `Store` holds a shard's application state and the ``consumer.Checkpoint`` (offsets read
through, producer states, pending ACK intents) that produced it; both commit atomically.
Recorded stores (RocksDB, SQLite, JSON files) keep their files in a directory played back
from the shard's recovery log and record every change into it: the runtime hands them a
`RecoveredLog`. Remote stores (SQLStore) ignore it.

A store recorded by a process of its own (RocksDB's fusefs process) may lose it: that is no
fault of the application, and nothing acknowledged is lost (every commit reported durable is
in the log). Such a store answers `recording_lost()`; the runtime then hands the shard to
another replica, which recovers it from the log, instead of leaving it FAILED
(docs/consumer.md, "Shard lifecycle").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from gazette.consumer.protocol import pb
from gazette.recoverylog.recorder import RecorderFenced

if TYPE_CHECKING:
    from gazette.broker.client import AppendService, JournalClient
    from gazette.consumer.store_hooks import StoreHook
    from gazette.recoverylog import recoverylog_pb2 as rpb
    from gazette.recoverylog.fsm import FSM
    from gazette.recoverylog.recorder import Recorder

__all__ = [
    "Checkpoint",
    "OpFuture",
    "RecordingFenced",
    "RecordingLost",
    "RecoveredLog",
    "Shard",
    "Store",
    "fenced_by",
    "recording_fenced",
    "recording_lost",
]

Checkpoint: TypeAlias = pb.Checkpoint
"""A ``consumer.Checkpoint`` (the empty message is the checkpoint of a new store)."""

Shard: TypeAlias = Any
"""The processing context of a shard (`consumer.Shard`); stores rarely need it."""

OpFuture: TypeAlias = Awaitable[Any]
"""An operation in flight (an append, a commit): awaiting it raises if the operation failed."""


class RecordingLost(Exception):
    """The process recording a store into its recovery log died while the store was open
    (e.g. the fusefs process of a RocksDB store was killed): the store can record nothing
    more. Not the application's fault, and nothing acknowledged is lost; the shard recovers
    from its log on another replica (module docs)."""


class RecordingFenced(RecordingLost):
    """The store's Recorder was fenced (its recovery log's registers name another author)
    while this replica may still hold the shard's assignment: e.g. the log's brokers
    restarted on registers older than its route's. Handled as a lost recording: the shard is
    handed to a replica assigned anew, whose playback fences the log to its own author; a
    true zombie's hand-over finds its assignment gone and changes nothing."""


def fenced_by(err: BaseException) -> RecordingFenced | None:
    """A `RecordingFenced` if `err` came of the Recorder being fenced (`RecorderFenced`
    anywhere in its causes or, for exception groups, their members), else None."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [err]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, RecorderFenced):
            return RecordingFenced(str(e))
        stack += [e.__cause__, e.__context__]
        if isinstance(e, BaseExceptionGroup):
            stack += e.exceptions
    return None


async def recording_fenced(store: object, timeout: float = 5.0) -> RecordingFenced | None:
    """`store`'s `RecordingFenced` if the process recording it says its Recorder was fenced,
    else None (also for a store without ``recording_fenced()``, or that does not answer
    within `timeout` seconds)."""
    ask = getattr(store, "recording_fenced", None)
    if ask is None:
        return None
    try:
        async with asyncio.timeout(timeout):
            fenced = await ask()
    except Exception:  # noqa: BLE001 - a process that cannot answer is not known fenced
        return None
    return fenced if isinstance(fenced, RecordingFenced) else None


def recording_lost(store: object) -> RecordingLost | None:
    """`store`'s `RecordingLost` if its recording process died, else None (also for a store
    with no recording process: one without a ``recording_lost()`` method)."""
    check = getattr(store, "recording_lost", None)
    if check is None:
        return None
    lost = check()
    return lost if isinstance(lost, RecordingLost) else None


@dataclass
class RecoveredLog:
    """A shard's recovery log, played back into `directory` and handed off to `author`.

    A recorded store opens its files in `directory` and records every change onwards from
    `fsm`: through `recorder()` (an in-process Recorder), or by handing `fsm` to a fusefs
    process (RocksDB), which needs `broker_endpoint` to reach the brokers itself.
    """

    log: str
    """The recovery log journal."""
    directory: Path
    """The played-back files: the store's directory."""
    fsm: FSM
    """The FSM of the played log; recording continues from it."""
    author: int
    """This process's author: the log's fence register now names it."""
    write_head: int
    """The offset through which playback read (the hand-off's end): a lower bound of the
    offsets of every op recorded from now on."""
    client: JournalClient
    append_service: AppendService
    broker_endpoint: str
    hints: rpb.FSMHints | None = None
    """The hints playback started from (None: the whole log was read)."""
    store_hooks: Sequence[StoreHook] = ()
    """The process's hooks of the store kinds its application uses (`consumer.store_hooks`):
    a store finds its own kind's there (RocksDB: fusefs processes started ahead of need)."""

    def recorder(self) -> Recorder:
        """A Recorder of `directory` into `log`, continuing the played FSM."""
        from gazette.recoverylog.recorder import Recorder

        return Recorder(
            self.fsm,
            self.author,
            self.directory,
            self.append_service,
            self.log,
            write_head=self.write_head,
        )


class Store(Protocol):
    """A durable, transactional store of application state and the Checkpoint producing it.

    Exactly-once processing requires that the application's mutations of one consumer
    transaction and the Checkpoint passed to `start_commit` commit atomically: either both are
    recovered, or neither.

    Ordering and concurrency, as upstream:

    - `start_commit` is never called while the future returned by the previous call is
      pending; the application may however keep mutating the store (the next transaction)
      while it is. A store must keep those mutations out of the committing transaction.
    - `restore_checkpoint` is called once per store, at shard start-up, before any
      `start_commit` (it may take a fence, as SQLStore's does).
    - `destroy` is called once nothing uses the store any more.

    Optionally, a store recorded by a process of its own defines ``recording_lost() ->
    RecordingLost | None``: checked when the shard fails, before `destroy` (module docs); and
    ``async recording_fenced() -> RecordingFenced | None``, which asks that process whether
    its Recorder was fenced (its own failure reaches the store only as an I/O error).
    """

    def start_commit(
        self, shard: Shard, checkpoint: Checkpoint, wait_for: Sequence[OpFuture]
    ) -> OpFuture:
        """Start committing the current transaction together with `checkpoint`.

        The commit must not become durable before every future of `wait_for` succeeded; a
        failure of one of them fails the commit. Returns a future which resolves once the
        commit is durable (for recorded stores: committed to the recovery log), and raises if
        it failed (the store is then unusable: crash-only).
        """
        ...

    async def restore_checkpoint(self, shard: Shard) -> Checkpoint:
        """The most recently committed Checkpoint (an empty one for a new store)."""
        ...

    def destroy(self) -> None:
        """Release every resource of the store, including its local files."""
        ...
