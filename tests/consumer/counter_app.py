"""A test consumer application: sums `Add` messages per key in a RocksDB store and publishes
each key's new total (exactly once) to the journal named by env COUNTER_OUTPUT, if set. An
Add of key `POISON` fails the shard (tests of FAILED shards).

Run by `gazette-consumer tests.consumer.counter_app:Counter` in the runtime tests;
`BatchCounter` is the same application consuming through the batch API (`BatchConsumer`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from gazette.consumer.application import Shard
from gazette.consumer.store import RecoveredLog
from gazette.message import CONTENT_TYPE_JSON_LINES, JSONMessage
from gazette.message.envelope import Envelope
from gazette.message.publisher import Publisher
from gazette.stores.rocksdb.store import RocksDBStore

POISON = "poison"

log = logging.getLogger(__name__)


class PoisonMessage(Exception):
    """An Add of key `POISON` was consumed."""


@dataclass
class Add(JSONMessage):
    key: str = ""
    n: int = 0


@dataclass
class Total(JSONMessage):
    key: str = ""
    total: int = 0
    shard: str = ""


class Counter:
    def __init__(self) -> None:
        self.output = os.environ.get("COUNTER_OUTPUT", "")
        self.pending: dict[str, dict[str, int]] = {}

    async def new_store(self, shard: Shard, recovered: RecoveredLog | None) -> RocksDBStore:
        assert recovered is not None, "the counter needs a recovery log"
        # A replica of the shard may have failed here mid-transaction: its sums are void.
        self.pending.pop(shard.id, None)
        return await RocksDBStore.from_recovered(recovered)

    def new_message(self, spec: Any) -> Add:
        return Add()

    def consume_message(
        self, shard: Shard, store: RocksDBStore, env: Envelope, pub: Publisher
    ) -> None:
        self._add(self.pending.setdefault(shard.id, {}), store, env.message)

    def _add(self, pending: dict[str, int], store: RocksDBStore, msg: Add) -> None:
        if msg.key == POISON:
            raise PoisonMessage(f"consumed an Add of key {POISON!r} (it fails the shard)")
        current = pending.get(msg.key)
        if current is None:
            raw = store.get(b"k" + msg.key.encode())
            current = int(raw) if raw is not None else 0
        pending[msg.key] = current + msg.n

    def finalize_txn(self, shard: Shard, store: RocksDBStore, pub: Publisher) -> None:
        pending = self.pending.pop(shard.id, {})
        out = (self.output, CONTENT_TYPE_JSON_LINES)
        for key, total in sorted(pending.items()):
            store.put(b"k" + key.encode(), str(total).encode())
            if self.output:
                pub.publish_uncommitted(lambda _m: out, Total(key, total, shard.id))


class BatchCounter(Counter):
    """The counter, handed runs of messages (`consume_messages`) instead of one at a time.
    Logs ``largest_run=N`` each time a run is longer than any before (tests check that runs
    of several messages were consumed)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest_run = 0

    def consume_messages(
        self, shard: Shard, store: RocksDBStore, envs: list[Envelope], pub: Publisher
    ) -> None:
        pending = self.pending.setdefault(shard.id, {})
        for env in envs:
            self._add(pending, store, env.message)
        if len(envs) > self.largest_run:
            self.largest_run = len(envs)
            log.info("counter consume_messages shard=%s largest_run=%d", shard.id, len(envs))
