"""A test consumer application, the first stage of a chain: each `Add` it consumes is
published at once, uncommitted, to the journal named by env RELAY_OUTPUT, so a downstream
reader sees the transaction's messages as they are consumed and their ACK only once the
relay's transaction commits. Its store (a JSONFileStore) counts the Adds relayed per key.

Run by `gazette-consumer tests.consumer.relay_app:Relay` in the wait-for-ACK tests, upstream
of the counter application (tests/consumer/counter_app.py)."""

from __future__ import annotations

import os
from typing import Any

from gazette.consumer.application import Shard
from gazette.consumer.store import RecoveredLog
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.envelope import Envelope
from gazette.message.publisher import Publisher
from gazette.stores.jsonfile import JSONFileStore
from tests.consumer.counter_app import Add

__all__ = ["Add", "Relay"]


class Relay:
    def __init__(self) -> None:
        self.output = os.environ["RELAY_OUTPUT"]

    async def new_store(self, shard: Shard, recovered: RecoveredLog | None) -> JSONFileStore:
        assert recovered is not None, "the relay needs a recovery log"
        return await JSONFileStore.open(recovered)

    def new_message(self, spec: Any) -> Add:
        return Add()

    def consume_message(
        self, shard: Shard, store: JSONFileStore, env: Envelope, pub: Publisher
    ) -> None:
        msg: Add = env.message
        store.state[msg.key] = store.state.get(msg.key, 0) + 1
        out = (self.output, CONTENT_TYPE_JSON_LINES)
        pub.publish_uncommitted(lambda _m: out, Add(msg.key, msg.n))

    def finalize_txn(self, shard: Shard, store: JSONFileStore, pub: Publisher) -> None:
        pass  # Each Add was published as it was consumed.
