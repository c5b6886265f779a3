"""A transaction spilling SQLite's page cache alternates writes between the database and its
journal: every one of those writes must reach the log (a buffering bug once recorded them
empty, leaving an unplayable log), mid-transaction and after commit, in every journal mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw
import pytest

from gazette.broker.client import AppendService, JournalClient
from gazette.recoverylog.op_batch import WRITE
from gazette.recoverylog.op_queue import OpQueue
from gazette.stores.sqlite import SQLiteStore
from gazette.stores.sqlite.store import rebuild_played
from tests.stores.checkpoints import labeled
from tests.stores.sqlite.support import (
    MakeLog,
    client,
    make_log,
    new_recorder,
    play,
    service,
    store_broker,
)

__all__ = ["client", "make_log", "service", "store_broker"]


@pytest.mark.parametrize("commit", [False, True], ids=["mid-txn", "committed"])
@pytest.mark.parametrize("mode", ["delete", "truncate", "persist", "wal"])
async def test_cache_spill_records_every_write(
    client: JournalClient,
    service: AppendService,
    make_log: MakeLog,
    tmp_path: Path,
    mode: str,
    commit: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    empty_writes: list[Any] = []
    apply = OpQueue.apply

    def spy(self: Any, ops: list[Any], record: Any) -> Any:
        empty_writes.extend(o for o in ops if o[0] == WRITE and not o[3])
        return apply(self, ops, record)

    monkeypatch.setattr(OpQueue, "apply", spy)
    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "p", 1)
    store = await SQLiteStore.open(rec, journal_mode=mode, bootstrap_sql="PRAGMA cache_size=10")
    try:
        await store.transact(lambda c: c.execute("CREATE TABLE kv(k INTEGER PRIMARY KEY, v BLOB)"))
        await store.transact(
            lambda c: c.executemany(
                "INSERT INTO kv VALUES(?, randomblob(1000))", [(i,) for i in range(3000)]
            )
        )
        await store.start_commit(None, labeled("cp1"), [])
        # Spills the 10-page cache; left open unless `commit` (a crash mid-transaction).
        await store.transact(lambda c: c.execute("UPDATE kv SET v = randomblob(1000)"))
        if commit:
            await store.start_commit(None, labeled("cp2"), [])
        await rec.barrier()
        _, fsm = await play(client, log, tmp_path / "played")
        rebuild_played(tmp_path / "played", dict(fsm.links))
        conn = apsw.Connection(str(tmp_path / "played" / "primary.db"))
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert conn.execute("SELECT count(*) FROM kv").fetchall() == [(3000,)]
        finally:
            conn.close()
        assert empty_writes == []
    finally:
        store.destroy()


async def test_destroy_while_a_commit_waits_does_not_deadlock(
    service: AppendService, make_log: MakeLog, tmp_path: Path
) -> None:
    import asyncio
    import faulthandler

    log = await make_log()
    rec = await new_recorder(service, log, tmp_path / "p", 1)
    store = await SQLiteStore.open(rec)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    # The SQLite thread waits on the loop.
    committed = store.start_commit(None, labeled("x"), [never])
    await asyncio.sleep(0.2)
    faulthandler.dump_traceback_later(20, exit=True)  # a deadlock fails the run, not hangs it
    try:
        store.destroy()  # called on the loop: must not wait on a thread that waits on the loop
    finally:
        faulthandler.cancel_dump_traceback_later()
    with pytest.raises(BaseException):  # noqa: B017 - any failure: the commit never happened
        await asyncio.wait_for(committed, 5)
    never.cancel()
