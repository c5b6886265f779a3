"""What users write: the `Application` protocol, and the `Shard` context it is handed.

An Application consumes read-committed messages of a shard's source journals inside
transactions; each transaction's state changes commit to the shard's `Store` atomically with
a Checkpoint (offsets and producer states of the sources, ACK intents of what the transaction
published). Methods may be plain functions or coroutines: the runtime awaits what returns an
awaitable. Plain methods are cheaper per message; use coroutines when a method must wait.

Ordering, concurrency and failure, as upstream:

- One shard's methods are called from one asyncio task, never concurrently with each other
  for that shard. Different shards of a process run concurrently on the same event loop.
- A transaction begins with the first `consume_message`, after `begin_txn` (BeginFinisher).
  `finalize_txn` ends it: publish what is pending and write in-memory state to the store.
- The next transaction may begin (and consume messages) while the previous one commits; it
  cannot finalize before the previous commit finished.
- An exception from any method fails the shard: its ReplicaStatus becomes FAILED with the
  error, and nothing of the transaction commits. Return normally for anything recoverable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from broker.protocol import protocol_pb2 as bpb
from consumer.protocol import pb
from consumer.store import OpFuture, RecoveredLog, Store

if TYPE_CHECKING:
    from broker.client import AppendService, JournalClient
    from message.envelope import Envelope
    from message.publisher import Publisher
    from recoverylog import recoverylog_pb2 as rpb

__all__ = ["Application", "BeginFinisher", "Shard"]


@runtime_checkable
class Application(Protocol):
    """A consumer application (module docs). Methods may also be `async def`."""

    def new_store(self, shard: Shard, recovered: RecoveredLog | None) -> Store | Awaitable[Store]:
        """The shard's Store. `recovered` is its recovery log, played back into a directory
        and handed off to this process (None when the ShardSpec has no recovery log)."""
        ...

    def new_message(self, spec: bpb.JournalSpec) -> Any:
        """An empty message of the type journal `spec` holds (decoded by its framing)."""
        ...

    def consume_message(
        self, shard: Shard, store: Store, env: Envelope, pub: Publisher
    ) -> None | Awaitable[None]:
        """Consume one read-committed message within the current transaction. Publish with
        ``pub.publish_uncommitted`` so that outputs commit with the transaction."""
        ...

    def finalize_txn(self, shard: Shard, store: Store, pub: Publisher) -> None | Awaitable[None]:
        """The transaction ends: publish pending messages and write in-memory state to the
        store's transaction (starting appends suffices; do not wait for them)."""
        ...


@runtime_checkable
class BeginFinisher(Protocol):
    """Optional: an Application told when each transaction begins and when it finished."""

    def begin_txn(self, shard: Shard, store: Store) -> None | Awaitable[None]:
        """A transaction begins (just before its first `consume_message`)."""
        ...

    def finished_txn(self, shard: Shard, store: Store, committed: OpFuture) -> None:
        """The transaction was finalized and its commit started: `committed` resolves once it
        is durable (or raises if it failed). Must not block."""
        ...


class Shard:
    """The context of one shard replica, handed to every Application method.

    `fqn` is ``{consumer root}/items/{shard id}``: unique across applications sharing etcd.
    """

    def __init__(
        self,
        spec: pb.ShardSpec,
        fqn: str,
        client: JournalClient,
        append_service: AppendService,
        recovered_hints: rpb.FSMHints | None = None,
    ) -> None:
        self.spec = spec
        self.id: str = spec.id
        self.fqn = fqn
        self.journal_client = client
        self.append_service = append_service
        self.recovered_hints = recovered_hints
        self.assignment: Any = None
        """The shard's assignment KeyValue of this process (slot 0: primary)."""
        self.stopping = asyncio.Event()
        """Set when the replica is being stopped (unassigned, process exit, failure)."""
        self._read_through: dict[str, int] = {}
        self._publish_at: dict[str, int] = {}
        self._progress = asyncio.Condition()

    def progress(self) -> tuple[dict[str, int], dict[str, int]]:
        """(read_through, publish_at) of the last committed transaction: per source journal
        the offset read through; per journal published to, the offset through which this
        shard's acknowledgements were appended."""
        return dict(self._read_through), dict(self._publish_at)

    async def _set_progress(self, read_through: dict[str, int], publish_at: dict[str, int]) -> None:
        self._read_through.update(read_through)
        for journal, offset in publish_at.items():
            if offset > self._publish_at.get(journal, 0):
                self._publish_at[journal] = offset
        async with self._progress:
            self._progress.notify_all()

    async def wait_read_through(self, offsets: dict[str, int]) -> None:
        """Return once every journal of `offsets` is read through at least that offset (a
        committed transaction got there). Cancel to stop waiting."""

        def reached() -> bool:
            return all(self._read_through.get(j, 0) >= o for j, o in offsets.items())

        async with self._progress:
            await self._progress.wait_for(reached)

    def __repr__(self) -> str:
        return f"Shard({self.id!r})"
