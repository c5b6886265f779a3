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

By default a shard reads the journals of its ShardSpec's sources. An Application that also
implements `MessageProducer` decides itself which messages the shard processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import pb
from gazette.consumer.store import OpFuture, RecoveredLog, Store

if TYPE_CHECKING:
    from gazette.broker.client import AppendService, JournalClient
    from gazette.consumer.message_producer import MessageSink
    from gazette.message.envelope import Envelope
    from gazette.message.publisher import Publisher
    from gazette.recoverylog import recoverylog_pb2 as rpb

__all__ = [
    "MESSAGE_PRODUCER_METHODS",
    "Application",
    "BatchConsumer",
    "BeginFinisher",
    "IncompleteMessageProducer",
    "MessageProducer",
    "ResolveArgs",
    "Shard",
    "check_message_producer",
]


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
class BatchConsumer(Protocol):
    """Optional: an Application that consumes messages in batches.

    The runtime then calls `consume_messages` instead of `consume_message`, with every run of
    read-committed messages it has ready at once (up to a few hundred, of one source journal,
    in order; a single one where a message's transaction needed sequencing). It is the same
    as calling `consume_message` for each, in order, minus a Python call per message.
    """

    def consume_messages(
        self, shard: Shard, store: Store, envs: list[Envelope], pub: Publisher
    ) -> None | Awaitable[None]:
        """Consume read-committed messages, in order, within the current transaction."""
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


@dataclass(frozen=True)
class ResolveArgs:
    """A request to resolve a shard (`consumer.resolver.Resolver.resolve`), as handed to
    `MessageProducer.read_through`.

    `read_through`: journals and offsets the caller wants processed (committed) before it is
    answered ("read your writes"). `proxy_header` is set when another consumer process
    forwarded the request (it may then not be proxied again).
    """

    shard: str
    read_through: dict[str, int] = field(default_factory=dict)
    may_proxy: bool = True
    proxy_header: bpb.Header | None = None


@runtime_checkable
class MessageProducer(Protocol):
    """Optional: an Application that produces the messages its shards process, instead of
    the runtime reading the journals of the ShardSpec's sources.

    Contract:

    - `start_reading_messages` is a coroutine function. The runtime runs it in a task of the
      shard (never concurrently with itself for one shard) and it delivers envelopes with
      ``await into.put(env)``, in the order they must be sequenced; envelopes of one journal
      must be in increasing offset order. Every envelope still goes through the shard's
      `Sequencer` (exactly-once: duplicates dropped, uncommitted messages held until their
      acknowledgement), and the Checkpoint records, per journal, the offset read through
      and the producers' states. Start each journal at the offset `checkpoint` read through
      (``checkpoint.sources[journal].read_through``; use `consumer.txn.checkpoint_offsets`).
    - Returning normally means "no more for now": the current transaction (if any) completes
      and commits, and `start_reading_messages` is called again with the checkpoint of that
      commit (the store's `restore_checkpoint` is not called again). Use it to change what
      the shard reads at a transaction boundary. A producer returning at once without
      producing anything is restarted at once: pace it.
    - Raising is a terminal error: the shard fails (FAILED, with that error as the cause),
      also for a CancelledError the runtime did not cause (`ProducerCancelled`).
      Cancellation (the shard stops, is moved, or fails) cancels the coroutine.
    - `replay_range` must produce again exactly the envelopes of journal `journal` within
      [begin, end) that `start_reading_messages` produced before (the same messages in the
      same order); the Sequencer asks for it when an acknowledgement commits messages it no
      longer holds (they left its ring, or were read before a restart or recovery). It may
      return an iterable, an async iterable, or an awaitable of either; errors fail the shard.
      `consumer.message_producer.read_journal_range` does it for journals read as they are.
    - `read_through` picks the offsets a resolution (e.g. Stat with ``read_through``) must
      wait for: usually the journals of ``args.read_through`` this producer reads. Journals
      it never reads must be left out, or the caller waits until its deadline.
    """

    def start_reading_messages(
        self, shard: Shard, store: Store, checkpoint: pb.Checkpoint, into: MessageSink
    ) -> Awaitable[None]:
        """Produce the shard's messages into `into` until done (return) or failed (raise)."""
        ...

    def replay_range(
        self, shard: Shard, store: Store, journal: str, begin: int, end: int
    ) -> (
        Iterable[Envelope]
        | AsyncIterable[Envelope]
        | Awaitable[Iterable[Envelope] | AsyncIterable[Envelope]]
    ):
        """The envelopes produced before from [begin, end) of `journal`, again."""
        ...

    def read_through(
        self, shard: Shard, store: Store, args: ResolveArgs
    ) -> dict[str, int] | Awaitable[dict[str, int]]:
        """Offsets, per journal, to be read through before resolving `args` completes."""
        ...


MESSAGE_PRODUCER_METHODS = ("start_reading_messages", "replay_range", "read_through")
"""The methods of `MessageProducer`."""


class IncompleteMessageProducer(TypeError):
    """An Application defines some MessageProducer methods, not all of them."""


def check_message_producer(app: object) -> None:
    """Raise `IncompleteMessageProducer`, naming the missing methods, if `app` defines
    ``start_reading_messages`` or ``replay_range`` but is not a complete `MessageProducer`
    (it would otherwise be taken for an application reading its shards' sources, and a
    producer's shard, without sources, would process nothing and report no error)."""
    present = [m for m in MESSAGE_PRODUCER_METHODS if hasattr(app, m)]
    if not any(m in present for m in MESSAGE_PRODUCER_METHODS[:2]):
        return
    missing = [m for m in MESSAGE_PRODUCER_METHODS if m not in present]
    if missing:
        raise IncompleteMessageProducer(
            f"{type(app).__name__} defines {', '.join(present)} but lacks "
            f"{', '.join(missing)}: a MessageProducer needs all of "
            f"{', '.join(MESSAGE_PRODUCER_METHODS)}"
        )


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
