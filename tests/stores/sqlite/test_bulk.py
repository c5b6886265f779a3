"""A bulk load in one transaction (LiteFS's known failure case): the whole load streams to the
recovery log while it is written, commits, and plays back into a fresh directory intact.

The 1 GB load is opt-in (`make chaos`); the default suite loads 100 MB the same way.
"""

from __future__ import annotations

import hashlib
import os
import random
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from broker.client import AppendService, JournalClient
from stores.sqlite import SQLiteStore, recover
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

MB = 1_000_000
ROW_BYTES = 1000  # Four rows to a 4 KiB page: the database is about the size of the data.


def _rows(n: int, seed: int, digest: hashlib._Hash) -> Iterator[tuple[int, bytes]]:
    rnd = random.Random(seed)
    for k in range(n):
        v = rnd.randbytes(ROW_BYTES)
        digest.update(v)
        yield k, v


def _load(conn: apsw.Connection, n: int, seed: int) -> str:
    conn.execute("CREATE TABLE bulk (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
    digest = hashlib.sha256()
    conn.executemany("INSERT INTO bulk (k, v) VALUES (?, ?)", _rows(n, seed, digest))
    return digest.hexdigest()


def _content(conn: apsw.Connection) -> tuple[int, str]:
    digest = hashlib.sha256()
    n = 0
    for k, v in conn.execute("SELECT k, v FROM bulk ORDER BY k"):
        assert k == n
        digest.update(v)
        n += 1
    return n, digest.hexdigest()


def _integrity(conn: apsw.Connection) -> str:
    return str(conn.execute("PRAGMA integrity_check").fetchall()[0][0])


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux.


async def _bulk_load_recovers(
    client: JournalClient,
    service: AppendService,
    make_log: MakeLog,
    tmp_path: Path,
    total_bytes: int,
) -> None:
    rows = total_bytes // ROW_BYTES
    log = await make_log("bulk")
    rec = await new_recorder(service, log, tmp_path / "primary", 0xB01C)
    store = await SQLiteStore.open(rec)

    t0 = time.perf_counter()
    expected = await store.transact(_load, rows, 7)  # One SQL transaction, begun on demand.
    t_load = time.perf_counter() - t0
    await store.start_commit(None, labeled("bulk-loaded"), [])
    t_commit = time.perf_counter() - t0
    db_size = os.path.getsize(tmp_path / "primary" / "primary.db")
    hints = await rec.build_hints()
    log_size = rec.write_head
    stats = store.stats()
    await store.close()

    t1 = time.perf_counter()
    played = await recover(client, service, log, tmp_path / "played", hints=hints)
    t_recover = time.perf_counter() - t1
    try:
        assert await played.restore_checkpoint() == labeled("bulk-loaded")
        assert await played.run(_integrity) == "ok"
        assert await played.run(_content) == (rows, expected)
    finally:
        await played.close()
    t_total = time.perf_counter() - t0
    print(
        f"\nbulk load {total_bytes / MB:.0f} MB ({rows} rows) in one transaction: "
        f"load {t_load:.1f} s, committed at {t_commit:.1f} s, recover {t_recover:.1f} s, "
        f"total {t_total:.1f} s; db {db_size / MB:.0f} MB, log {log_size / MB:.0f} MB, "
        f"barriers {stats['barriers']}, compactions {stats['compactions']}, "
        f"peak RSS {_peak_rss_mib():.0f} MiB"
    )


async def test_bulk_load_100mb_in_one_transaction_recovers(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    await _bulk_load_recovers(client, service, make_log, tmp_path, 100 * MB)


@pytest.mark.chaos
async def test_bulk_load_1gb_in_one_transaction_recovers(
    client: JournalClient, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    await _bulk_load_recovers(client, service, make_log, tmp_path, 1000 * MB)
