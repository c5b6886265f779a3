"""The bounded recovery horizon: after the whole database is rewritten many times, playback
with hints reads a small multiple of the database size, not its write history."""

from __future__ import annotations

import os
from pathlib import Path

import apsw
import pytest

from gazette.broker.client import AppendService, JournalClient
from gazette.stores.sqlite import SQLiteStore
from gazette.stores.sqlite.store import rebuild_played
from tests.stores.checkpoints import labeled
from tests.stores.sqlite.support import (
    MakeLog,
    client,
    dump,
    integrity,
    make_log,
    new_recorder,
    play,
    service,
    store_broker,
)

__all__ = ["client", "make_log", "service", "store_broker"]  # Fixtures used here.

ROWS = 2000
VALUE = 2000  # ~4 MiB of rows, plus the table b-tree.


def _fill(conn: apsw.Connection, n: int) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
    conn.executemany(
        "INSERT OR REPLACE INTO kv (k, v) VALUES (?, randomblob(?))",
        ((k, VALUE) for k in range(n)),
    )


def _rewrite(conn: apsw.Connection) -> None:
    conn.execute("UPDATE kv SET v = randomblob(?)", (VALUE,))


@pytest.mark.parametrize(("journal_mode", "rewrites"), [("wal", 100), ("truncate", 20)])
async def test_playback_reads_a_bounded_multiple_of_the_database(
    client: JournalClient,
    service: AppendService,
    make_log: MakeLog,
    tmp_path: Path,
    journal_mode: str,
    rewrites: int,
) -> None:
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "primary", 0xA11CE)
    store = await SQLiteStore.open(rec, journal_mode=journal_mode)
    await store.transact(_fill, ROWS)
    await store.start_commit(None, labeled("filled"), [])
    for i in range(rewrites):
        # Each rewrite in several transactions, as a consumer would commit them.
        for _ in range(4):
            await store.transact(_rewrite)
        await store.start_commit(None, labeled(f"rewrite-{i}"), [])
    expected = await store.run(lambda c: list(c.execute("SELECT k, v FROM kv ORDER BY k")))
    hints = await rec.build_hints()
    db_size = os.path.getsize(tmp_path / "primary" / "primary.db")
    log_size = rec.write_head

    player, fsm = await play(client, log, tmp_path / "played", hints)
    rebuild_played(tmp_path / "played", dict(fsm.links))
    assert integrity(tmp_path / "played" / "primary.db") == "ok"
    assert [r[1:] for r in dump(tmp_path / "played" / "primary.db") if r[0] == "kv"] == expected
    ratio = player.bytes_read / db_size
    compactions = sum(p.compactions for p in store.vfs.page_stores.values())
    print(
        f"\nhorizon journal_mode={journal_mode} rewrites={rewrites} db={db_size} "
        f"log={log_size} ({log_size / db_size:.1f}x) playback_read={player.bytes_read} "
        f"({ratio:.2f}x the database) compactions={compactions}"
    )
    assert log_size > rewrites * db_size  # The history is long...
    assert ratio <= 3.0  # ...but playback reads a bounded multiple of the live database.
    await store.close()
