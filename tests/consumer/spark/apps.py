"""Test consumer applications for the Spark shards export: the counter of
tests/consumer/counter_app.py (sums `Add` messages per key) over a SQLite store
(`SQLiteCounter`: table ``totals``) and a JSON file store (`JSONCounter`: ``{key: total}``).

Run by ``gazette-consumer tests.consumer.spark.apps:SQLiteCounter`` (PYTHONPATH=repo root).
`decode_total` is a RocksDB decoder for the export (key: the counter key, value: its total).
"""

from __future__ import annotations

from typing import Any

import apsw

from gazette.consumer.application import Shard
from gazette.consumer.store import RecoveredLog
from gazette.message.envelope import Envelope
from gazette.message.publisher import Publisher
from gazette.stores.jsonfile.store import JSONFileStore
from gazette.stores.sqlite.store import SQLiteStore
from tests.consumer.counter_app import Add

SQLITE_DDL = (
    "CREATE TABLE IF NOT EXISTS totals (key TEXT PRIMARY KEY, total INTEGER NOT NULL, "
    "ratio REAL, tag BLOB)"
)


def decode_total(key: bytes, value: bytes) -> dict[str, Any]:
    """Decoder of the RocksDB counter's rows (key without its ``k`` prefix)."""
    return {"name": key.decode(), "total": int(value)}


def _upsert(conn: apsw.Connection, totals: dict[str, int]) -> None:
    conn.executemany(
        "INSERT INTO totals (key, total, ratio, tag) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (key) DO UPDATE SET total = excluded.total, ratio = excluded.ratio",
        [(k, v, v / 2, k.encode()) for k, v in sorted(totals.items())],
    )


class SQLiteCounter:
    def __init__(self) -> None:
        self.pending: dict[str, dict[str, int]] = {}

    async def new_store(self, shard: Shard, recovered: RecoveredLog | None) -> SQLiteStore:
        assert recovered is not None
        self.pending.pop(shard.id, None)
        # On the loop, as docs/sqlite-store.md advises for a consumer's short transactions.
        return await SQLiteStore.from_recovered(recovered, bootstrap_sql=SQLITE_DDL, on_loop=True)

    def new_message(self, spec: Any) -> Add:
        return Add()

    async def consume_message(
        self, shard: Shard, store: SQLiteStore, env: Envelope, pub: Publisher
    ) -> None:
        msg: Add = env.message
        pending = self.pending.setdefault(shard.id, {})
        current = pending.get(msg.key)
        if current is None:

            def get(conn: apsw.Connection) -> int:
                rows = list(conn.execute("SELECT total FROM totals WHERE key = ?", (msg.key,)))
                return int(rows[0][0]) if rows else 0

            current = await store.transact(get)
        pending[msg.key] = current + msg.n

    async def finalize_txn(self, shard: Shard, store: SQLiteStore, pub: Publisher) -> None:
        pending = self.pending.pop(shard.id, {})
        if pending:
            await store.transact(_upsert, pending)


class JSONCounter:
    async def new_store(self, shard: Shard, recovered: RecoveredLog | None) -> JSONFileStore:
        assert recovered is not None
        return await JSONFileStore.open(recovered)

    def new_message(self, spec: Any) -> Add:
        return Add()

    def consume_message(
        self, shard: Shard, store: JSONFileStore, env: Envelope, pub: Publisher
    ) -> None:
        msg: Add = env.message
        store.state[msg.key] = store.state.get(msg.key, 0) + msg.n

    def finalize_txn(self, shard: Shard, store: JSONFileStore, pub: Publisher) -> None:
        pass
