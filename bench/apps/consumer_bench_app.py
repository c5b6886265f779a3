"""The application of bench/consumer.py (run by `gazette-consumer consumer_bench_app:Echo` with
this directory on PYTHONPATH).

`Echo` consumes `Ping` messages (in batches: it is a BatchConsumer), counts them per key in a
RocksDB store (one read-modify-write per key per transaction, like word-count), and
republishes each as a `Pong` carrying the ping's send time with `publish_uncommitted` to the
journal of env ECHO_OUTPUT (if set): a
downstream read-committed reader sees a Pong only once the transaction committed, so the
Pong's arrival measures the whole exactly-once pipeline."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gazette.message import CONTENT_TYPE_JSON_LINES, JSONMessage
from gazette.stores.rocksdb.store import RocksDBStore


@dataclass
class Ping(JSONMessage):
    key: str = ""
    sent_ns: int = 0


@dataclass
class Pong(JSONMessage):
    key: str = ""
    sent_ns: int = 0


class Echo:
    def __init__(self) -> None:
        self.output = os.environ.get("ECHO_OUTPUT", "")
        # The current transaction's counts, per shard: one instance serves every shard of
        # its process, and their transactions interleave on the event loop.
        self.counts: dict[str, dict[str, int]] = {}

    async def new_store(self, shard: Any, recovered: Any) -> RocksDBStore:
        self.counts.pop(shard.id, None)  # A previous replica's uncommitted counts.
        return await RocksDBStore.from_recovered(recovered)

    def new_message(self, spec: Any) -> Ping:
        return Ping()

    def consume_message(self, shard: Any, store: RocksDBStore, env: Any, pub: Any) -> None:
        msg: Ping = env.message
        counts = self.counts.setdefault(shard.id, {})
        n = counts.get(msg.key)
        if n is None:
            raw = store.get(b"c" + msg.key.encode())
            n = int(raw) if raw is not None else 0
        counts[msg.key] = n + 1
        if self.output:
            out = (self.output, CONTENT_TYPE_JSON_LINES)
            pub.publish_uncommitted(lambda _m: out, Pong(msg.key, msg.sent_ns))

    def consume_messages(self, shard: Any, store: RocksDBStore, envs: list[Any], pub: Any) -> None:
        """The batch form (consumer.application.BatchConsumer): the runtime hands over every
        run of messages it has ready at once."""
        if self.output:
            for env in envs:
                self.consume_message(shard, store, env, pub)
            return
        counts = self.counts.setdefault(shard.id, {})
        for env in envs:
            key = env.message.key
            n = counts.get(key)
            if n is None:
                raw = store.get(b"c" + key.encode())
                n = int(raw) if raw is not None else 0
            counts[key] = n + 1

    def finalize_txn(self, shard: Any, store: RocksDBStore, pub: Any) -> None:
        for key, n in self.counts.pop(shard.id, {}).items():
            store.put(b"c" + key.encode(), str(n).encode())
