"""The Summer consumer application: ``gazette-consumer stream_sum.app:Summer``.

Each shard reads one chunk partition and keeps the running sum of every open stream of it in
its SQLite store (`SQLiteStore`, recorded to the shard's recovery log), table ``sums``: one
row per open stream, its last chunk's number and the sum so far. Within a transaction the
sums touched live in memory (read from the store the first time the transaction meets a
stream); `finalize_txn` writes them back, and deletes the rows of streams that ended.

When a stream's last chunk arrives its `Sum` is published to the sums journal with
``publish_uncommitted``, as upstream publishes final sums (not each update): readers that
read committed see it exactly when the transaction's checkpoint commits with the store's
rows. A summer killed mid-transaction leaves neither, and its successor consumes the chunks
again from the last checkpoint, so each stream's sum is published once.

A chunk out of sequence (`ChunkOutOfSequence`) fails the shard: exactly-once delivery never
makes one, and the verifier then finds that stream's sum missing. A last chunk whose expected
total differs from the sum is logged, and the sum published as computed, for the verifier to
report.
"""

from __future__ import annotations

import logging

import apsw

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.application import Shard
from gazette.consumer.store import RecoveredLog
from gazette.message.envelope import Envelope
from gazette.message.publisher import Publisher
from gazette.stores.sqlite import SQLiteStore
from stream_sum.messages import CONTENT_TYPE, SUMS, Chunk, RunningSum, Sum

__all__ = ["SCHEMA", "Summer"]

log = logging.getLogger("stream_sum")

SCHEMA = """
CREATE TABLE IF NOT EXISTS sums (
    stream TEXT PRIMARY KEY NOT NULL,
    seq INTEGER NOT NULL,
    total INTEGER NOT NULL
) WITHOUT ROWID;
"""
"""The store's table: the running sum of each open stream through chunk `seq`."""


def _sums_mapping(_msg: Sum) -> tuple[str, str]:
    return SUMS, CONTENT_TYPE


def _load(conn: apsw.Connection, stream: str) -> RunningSum:
    for seq, total in conn.execute("SELECT seq, total FROM sums WHERE stream = ?", (stream,)):
        return RunningSum(stream, int(seq), int(total))
    return RunningSum(stream)


def _write(conn: apsw.Connection, sums: list[RunningSum]) -> None:
    conn.executemany("DELETE FROM sums WHERE stream = ?", [(s.stream,) for s in sums if s.ended])
    conn.executemany(
        "INSERT INTO sums (stream, seq, total) VALUES (?, ?, ?) "
        "ON CONFLICT (stream) DO UPDATE SET seq = excluded.seq, total = excluded.total",
        [(s.stream, s.seq, s.total) for s in sums if not s.ended],
    )


class Summer:
    """The application (module docs). One instance serves every shard of its process."""

    def __init__(self) -> None:
        # Shard id -> stream -> its sum as of the open transaction.
        self._pending: dict[str, dict[str, RunningSum]] = {}

    async def new_store(self, shard: Shard, recovered: RecoveredLog | None) -> SQLiteStore:
        if recovered is None:
            raise ValueError(f"shard {shard.id}: stream-sum needs a recovery log")
        self._pending.pop(shard.id, None)
        # On the loop: a consumer's transactions are short (docs/sqlite-store.md).
        return await SQLiteStore.from_recovered(recovered, bootstrap_sql=SCHEMA, on_loop=True)

    def new_message(self, spec: bpb.JournalSpec) -> Chunk:
        return Chunk()

    async def consume_message(
        self, shard: Shard, store: SQLiteStore, env: Envelope, pub: Publisher
    ) -> None:
        chunk: Chunk = env.message
        pending = self._pending.setdefault(shard.id, {})
        running = pending.get(chunk.stream)
        if running is None:
            running = pending[chunk.stream] = await store.transact(_load, chunk.stream)
        if running.add(chunk):
            final = running.final()
            if final.total != chunk.total:
                log.error(
                    "stream sum differs from its expected total shard=%s stream=%s sum=%d "
                    "expected=%d journal=%s offset=%d",
                    *(shard.id, chunk.stream, final.total, chunk.total, env.journal, env.begin),
                )
            pub.publish_uncommitted(_sums_mapping, final)

    async def finalize_txn(self, shard: Shard, store: SQLiteStore, pub: Publisher) -> None:
        pending = self._pending.pop(shard.id, None)
        if pending:
            await store.transact(_write, list(pending.values()))
