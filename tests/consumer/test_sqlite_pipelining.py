"""Review test: SQLiteStore.start_commit and the pipelined next transaction (real broker)."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from gazette.broker.client import AppendService, JournalClient
from gazette.stores.sqlite import SQLiteStore, recover
from tests.stores.checkpoints import labeled
from tests.stores.sqlite.support import (
    MakeLog,
    client,
    make_log,
    new_recorder,
    service,
    store_broker,
)

__all__ = ["client", "make_log", "service", "store_broker"]  # Fixtures used here.
A, B = 0xA11CE, 0xB0B


def _schema(conn: apsw.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")


def _put(conn: apsw.Connection, k: int) -> None:
    conn.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", (k, b"v"))


@pytest.mark.parametrize("on_loop", [False, True], ids=["thread", "on_loop"])
async def test_next_transactions_write_is_not_committed_with_the_previous_checkpoint(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path, on_loop: bool
) -> None:
    """What consumer.txn does: start_commit(cp-1) and, without yielding, the next
    transaction's (async) consume_message awaits `store.transact(...)`. The store documents
    "The commit job is queued at once, so later `transact` calls belong to the next
    transaction", but start_commit returns ensure_future(self._start_commit(...))
    (stores/sqlite/store.py) and the job is submitted only when that task first runs:
    after the next transaction's write. That write then commits with cp-1, and a recovery
    from cp-1 re-applies the message that made it (exactly-once violation)."""
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "a", A)
    store = await SQLiteStore.open(rec, on_loop=on_loop)
    await store.transact(_schema)
    await store.transact(_put, 1)
    committed = store.start_commit(None, labeled("cp-1"), [])
    # The next transaction begins at once (no yield in between, as in consumer.txn).
    await store.transact(_put, 2)
    await committed
    await rec.barrier()

    second = await recover(client, service, log, tmp_path / "b", author=B)
    try:
        assert await second.restore_checkpoint() == labeled("cp-1")
        rows = await second.run(lambda c: [k for (k,) in c.execute("SELECT k FROM kv ORDER BY k")])
        assert rows == [1], f"the commit of cp-1 holds the next transaction's write: {rows}"
    finally:
        await second.close()
        store.destroy()
