"""What a small consumer transaction costs in the recovery log: a new database gets the
store's page size (1 KiB), an existing one keeps its own, and the log of a one-row
transaction is a few small pages, not 4 KiB ones (docs/sqlite-app.md)."""

from __future__ import annotations

from pathlib import Path

import apsw

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.protocol import pb
from gazette.stores.sqlite import DEFAULT_PAGE_SIZE, SQLiteStore, recover
from tests.stores.sqlite.support import (
    MakeLog,
    client,
    make_log,
    new_recorder,
    service,
    store_broker,
)

__all__ = ["client", "make_log", "service", "store_broker"]  # Fixtures used here.

SCHEMA = "CREATE TABLE IF NOT EXISTS counts (k INTEGER PRIMARY KEY, n INTEGER NOT NULL);"
TXNS = 50


def _bump(conn: apsw.Connection, k: int) -> None:
    conn.execute(
        "INSERT INTO counts (k, n) VALUES (?, 1) ON CONFLICT (k) DO UPDATE SET n = n + 1", (k,)
    )


def _page_size(conn: apsw.Connection) -> int:
    return int(conn.execute("PRAGMA page_size").fetchall()[0][0])


async def _bytes_per_txn(store: SQLiteStore) -> float:
    """Log bytes of each of `TXNS` transactions of one row (among 500) and a checkpoint."""
    for k in range(500):  # A table of several pages.
        await store.transact(_bump, k)
    await store.start_commit(None, pb.Checkpoint(), [])
    begin = store.recorder.write_head
    for i in range(TXNS):
        await store.transact(_bump, (i * 37) % 500)
        cp = pb.Checkpoint(sources={"rides": pb.Checkpoint.Source(read_through=i)})
        await store.start_commit(None, cp, [])
    return (store.recorder.write_head - begin) / TXNS


async def test_a_small_transaction_records_small_pages(
    make_log: MakeLog, service: AppendService, tmp_path: Path
) -> None:
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "new", 0xA)
    store = await SQLiteStore.open(rec, bootstrap_sql=SCHEMA, on_loop=True)
    try:
        assert await store.run(_page_size) == DEFAULT_PAGE_SIZE == 1024
        per_txn = await _bytes_per_txn(store)
    finally:
        await store.close()
    # Two pages a commit (the row's leaf and the checkpoint's), each a WAL frame of a page
    # and its 24-byte header, and the recorder's ops: with 4 KiB pages this was ~8.4 KB.
    assert per_txn < 2.5 * (DEFAULT_PAGE_SIZE + 24) + 200, per_txn


async def test_an_existing_database_keeps_its_page_size(
    make_log: MakeLog, client: JournalClient, service: AppendService, tmp_path: Path
) -> None:
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "old", 0xA)
    store = await SQLiteStore.open(rec, bootstrap_sql=SCHEMA, page_size=None)
    assert await store.run(_page_size) == 4096  # SQLite's own default.
    await store.transact(_bump, 1)
    await store.start_commit(None, pb.Checkpoint(), [])
    await store.close()

    again = await recover(client, service, log, tmp_path / "again", bootstrap_sql=SCHEMA)
    try:
        assert await again.run(_page_size) == 4096
        rows = await again.run(lambda c: c.execute("SELECT k, n FROM counts").fetchall())
        assert rows == [(1, 1)]
    finally:
        await again.close()
