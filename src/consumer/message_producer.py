"""The runtime's side of `consumer.application.MessageProducer`.

`ProducedMessages` is the transaction loop's `MessageSource` for an Application that produces
its shard's messages: it runs ``start_reading_messages`` in a task of the shard with a
`MessageSink` over the loop's bounded queue, queues `SOURCE_DONE` when it returns and the
error when it raises, and serves the Sequencer's replays with ``replay_range``.

`read_journal_range` is what most ``replay_range`` implementations need when the producer
passes on envelopes of journals as it read them.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import pb
from gazette.consumer.store import Store
from gazette.consumer.txn import SOURCE_DONE, SourceItem
from gazette.message.envelope import Envelope
from gazette.message.iterators import NewMessageFunc, ReadUncommittedIter

if TYPE_CHECKING:
    from gazette.broker.client import JournalClient
    from gazette.consumer.application import MessageProducer, Shard

__all__ = [
    "MessageSink",
    "ProducedMessages",
    "ProducerCancelled",
    "ProducerFinishedEarly",
    "read_journal_range",
]


class ProducerCancelled(RuntimeError):
    """``start_reading_messages`` raised CancelledError though the runtime did not cancel it
    (e.g. it awaited a future that another task cancelled): the shard fails with this."""


class ProducerFinishedEarly(TypeError):
    """``start_reading_messages`` did not return an awaitable (it must be a coroutine)."""


class MessageSink:
    """Where a MessageProducer delivers the shard's envelopes (``await sink.put(env)``).

    Bounded by the shard's ``read_channel_size``: `put` waits while the transaction loop is
    behind. Not thread-safe: call it from the event loop.
    """

    __slots__ = ("_queue", "delivered")

    def __init__(self, queue: asyncio.Queue[SourceItem]) -> None:
        self._queue = queue
        self.delivered = 0
        """Envelopes delivered through this sink."""

    async def put(self, env: Envelope) -> None:
        """Deliver `env` (waits while the queue is full). Raises TypeError for anything but
        an Envelope."""
        if not isinstance(env, Envelope):
            raise TypeError(f"a MessageProducer delivers Envelopes, not {type(env).__name__}")
        queue = self._queue
        if queue.full():
            await queue.put(env)
        else:
            queue.put_nowait(env)  # No coroutine step per message while there is room.
        self.delivered += 1

    def full(self) -> bool:
        return self._queue.full()


class ProducedMessages:
    """A shard's messages from its Application's MessageProducer (module docs). One instance
    per call of ``start_reading_messages``: restarts make a new one."""

    def __init__(
        self,
        shard: Shard,
        app: MessageProducer,
        store: Store,
        checkpoint: pb.Checkpoint,
        size: int,
    ) -> None:
        self.shard = shard
        self.app = app
        self.store = store
        self.checkpoint = checkpoint
        self.queue: asyncio.Queue[SourceItem] = asyncio.Queue(maxsize=size)
        self.sink = MessageSink(self.queue)

    async def run(self) -> None:
        """Run the producer until it returns (then queue `SOURCE_DONE`) or raises (then
        queue its error). Cancellation cancels the producer; a CancelledError the producer
        raises while this task is not being cancelled is queued as `ProducerCancelled`."""
        try:
            produced = self.app.start_reading_messages(
                self.shard, self.store, self.checkpoint, self.sink
            )
            if not inspect.isawaitable(produced):
                raise ProducerFinishedEarly(
                    "start_reading_messages must be a coroutine function (async def) that "
                    f"returns when done; it returned {type(produced).__name__}"
                )
            await produced
        except asyncio.CancelledError as err:
            task = asyncio.current_task()
            if task is not None and task.cancelling() > 0:
                raise  # The runtime cancels this task: the producer was cancelled with it.
            # The producer's own (it awaited something another task cancelled): an error,
            # or the task would end "cancelled" unseen and the shard wait for nothing.
            failed = ProducerCancelled(
                "start_reading_messages raised CancelledError without its shard being "
                f"stopped: {err!r}"
            )
            failed.__cause__ = err
            await self.queue.put(failed)
            return
        except Exception as err:  # noqa: BLE001 - handed to the transaction loop
            await self.queue.put(err)
            return
        await self.queue.put(SOURCE_DONE)

    async def replay(self, journal: str, begin: int, end: int) -> list[Envelope]:
        """The envelopes of [begin, end) of `journal`, produced again by ``replay_range``."""
        got: Any = self.app.replay_range(self.shard, self.store, journal, begin, end)
        if inspect.isawaitable(got):
            got = await got
        if hasattr(got, "__aiter__"):
            return [env async for env in got]
        return list(got)


async def read_journal_range(
    client: JournalClient,
    journal: str,
    begin: int,
    end: int,
    new_message: NewMessageFunc,
) -> AsyncIterator[Envelope]:
    """The envelopes of `journal` within [begin, end), read (uncommitted) and decoded by the
    journal's framing: a ``replay_range`` for producers that pass on journal envelopes as
    read. Raises the reader's errors; closing the iterator cancels the read."""
    if begin >= end:
        return  # An end_offset of 0 would mean "no end".
    req = bpb.ReadRequest(journal=journal, offset=begin, end_offset=end, block=True)
    it = ReadUncommittedIter(client, req, None, new_message)
    try:
        while True:
            try:
                env = await it.next()
            except StopAsyncIteration:
                return
            yield env
    finally:
        it.close()
