"""A test MessageProducer application: reads `Add`s of the journal named by the shard's
label ``test.gazette.dev/input`` itself (the shard has no sources), returning every
PRODUCER_RESTART_EVERY envelopes so the runtime restarts it at a transaction boundary; sums
them per key in a JSONFileStore and publishes each key's new total (exactly once) to the
journal named by env COUNTER_OUTPUT.

Run by `gazette-consumer tests.consumer.producer_app:ProducedCounter`."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.broker.protocol.labels import value_of
from gazette.consumer.application import ResolveArgs, Shard
from gazette.consumer.message_producer import MessageSink, read_journal_range
from gazette.consumer.protocol import pb
from gazette.consumer.store import RecoveredLog
from gazette.consumer.txn import checkpoint_offsets
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.envelope import Envelope
from gazette.message.iterators import ReadUncommittedIter
from gazette.message.publisher import Publisher
from gazette.stores.jsonfile import JSONFileStore
from tests.consumer.counter_app import Add, Total

__all__ = ["INPUT_LABEL", "Add", "ProducedCounter"]

INPUT_LABEL = "test.gazette.dev/input"

log = logging.getLogger("producer_app")


class ProducedCounter:
    def __init__(self) -> None:
        self.output = os.environ.get("COUNTER_OUTPUT", "")
        self.restart_every = int(os.environ.get("PRODUCER_RESTART_EVERY", "0"))
        self.pending: dict[str, dict[str, int]] = {}

    # --- Application ----------------------------------------------------------------------
    async def new_store(self, shard: Shard, recovered: RecoveredLog | None) -> JSONFileStore:
        assert recovered is not None, "the counter needs a recovery log"
        # A transaction cut off earlier (the shard moved away, or failed) never reached
        # finalize_txn: its partial sums must not carry into this store's transactions.
        self.pending.pop(shard.id, None)
        return await JSONFileStore.open(recovered)

    def new_message(self, spec: Any) -> Add:
        return Add()

    def consume_message(
        self, shard: Shard, store: JSONFileStore, env: Envelope, pub: Publisher
    ) -> None:
        msg: Add = env.message
        pending = self.pending.setdefault(shard.id, {})
        current = pending.get(msg.key)
        if current is None:
            current = int(store.state.get(msg.key, 0))
        pending[msg.key] = current + msg.n

    def finalize_txn(self, shard: Shard, store: JSONFileStore, pub: Publisher) -> None:
        pending = self.pending.pop(shard.id, {})
        out = (self.output, CONTENT_TYPE_JSON_LINES)
        for key, total in sorted(pending.items()):
            store.state[key] = total
            if self.output:
                pub.publish_uncommitted(lambda _m: out, Total(key, total, shard.id))

    # --- MessageProducer ------------------------------------------------------------------
    @staticmethod
    def input_of(shard: Shard) -> str:
        journal = value_of(shard.spec.labels, INPUT_LABEL)
        if not journal:
            raise ValueError(f"shard {shard.id} has no {INPUT_LABEL} label")
        return journal

    async def start_reading_messages(
        self, shard: Shard, store: JSONFileStore, checkpoint: pb.Checkpoint, into: MessageSink
    ) -> None:
        journal = self.input_of(shard)
        offset = checkpoint_offsets(checkpoint).get(journal, 0)
        log.info("producer start journal=%s offset=%d", journal, offset)
        req = bpb.ReadRequest(journal=journal, offset=offset, block=True)
        it = ReadUncommittedIter(shard.journal_client, req, None, self.new_message)
        try:
            n = 0
            while not self.restart_every or n < self.restart_every:
                await into.put(await it.next())
                n += 1
        finally:
            it.close()

    def replay_range(
        self, shard: Shard, store: JSONFileStore, journal: str, begin: int, end: int
    ) -> AsyncIterator[Envelope]:
        log.info("producer replay journal=%s begin=%d end=%d", journal, begin, end)
        return read_journal_range(shard.journal_client, journal, begin, end, self.new_message)

    def read_through(self, shard: Shard, store: JSONFileStore, args: ResolveArgs) -> dict[str, int]:
        journal = self.input_of(shard)
        unknown = sorted(set(args.read_through) - {journal})
        if unknown:
            raise ValueError(f"shard {shard.id} does not read {unknown}")
        return dict(args.read_through)
