"""SQLiteStore recording through a RemoteRecorder (``from_recovered(recorder_process=True)``)
against a real broker: commits, pipelined or waited, play back; hand-offs fence it; a dead
recorder process fails the store's commits; close and destroy end the process."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import warnings
from pathlib import Path
from typing import Any

import apsw
import pytest

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.protocol import pb
from gazette.recoverylog.recorder import RecordingFailed
from gazette.recoverylog.remote import RemoteRecorder, RemoteRecordingFailed
from gazette.stores.sqlite import SQLiteStore
from gazette.testing.broker import BrokerProcess
from tests.stores.checkpoints import labeled, rich
from tests.stores.recovery import recovered_log
from tests.stores.sqlite.support import (
    MakeLog,
    client,
    make_log,
    service,
    store_broker,
)

__all__ = ["client", "make_log", "service", "store_broker"]  # Fixtures used here.

A, B, C = 0xA11CE, 0xB0B, 0xC


def _schema(conn: apsw.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")


def _upsert(conn: apsw.Connection, rows: list[tuple[int, bytes]]) -> None:
    conn.executemany("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", rows)


def _rows(conn: apsw.Connection) -> list[tuple[int, bytes]]:
    return list(conn.execute("SELECT k, v FROM kv ORDER BY k"))


def _remote(store: SQLiteStore) -> RemoteRecorder:
    assert isinstance(store.recorder, RemoteRecorder)
    return store.recorder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _committed_store(
    client: JournalClient,
    service: AppendService,
    endpoint: str,
    log: str,
    directory: Path,
    rows: list[tuple[int, bytes]],
    **options: Any,
) -> SQLiteStore:
    """A store recovered from `log` (as author A) into `directory`, recording through a
    recorder process, which committed the schema and `rows` with checkpoint ``rich(1)``."""
    recovered = await recovered_log(client, service, endpoint, log, directory, A)
    store = await SQLiteStore.from_recovered(recovered, recorder_process=True, **options)
    await store.transact(_schema)
    if rows:
        await store.transact(_upsert, rows)
    await store.start_commit(None, rich(1), [])
    return store


async def _expect_log(
    client: JournalClient,
    service: AppendService,
    endpoint: str,
    log: str,
    directory: Path,
    checkpoint: pb.Checkpoint,
    rows: list[tuple[int, bytes]],
) -> None:
    """Recover `log` in process (as author C) into `directory`: it holds `checkpoint` and
    `rows`."""
    recovered = await recovered_log(client, service, endpoint, log, directory, C)
    store = await SQLiteStore.from_recovered(recovered)
    try:
        assert await store.restore_checkpoint() == checkpoint
        assert await store.run(_rows) == rows
    finally:
        store.destroy()


@pytest.mark.parametrize("sync_waits", [True, False])
async def test_commits_through_a_recorder_process_play_back(
    client: JournalClient,
    service: AppendService,
    store_broker: BrokerProcess,
    make_log: MakeLog,
    tmp_path: Path,
    sync_waits: bool,
) -> None:
    log, endpoint = await make_log(), store_broker.endpoint
    recovered = await recovered_log(client, service, endpoint, log, tmp_path / "a", A)
    first = await SQLiteStore.from_recovered(
        recovered, recorder_process=True, sync_waits=sync_waits, wal_checkpoint_pages=50
    )
    remote = _remote(first)
    assert remote.author == A and remote.pid != os.getpid()
    await first.transact(_schema)
    # As the consumer runtime commits: the next transaction works while the last commits.
    pending: asyncio.Future[None] | None = None
    for t in range(20):
        await first.transact(_upsert, [(t * 100 + i, os.urandom(300)) for i in range(100)])
        if pending is not None:
            await pending
        pending = first.start_commit(None, labeled(f"cp-{t}"), [])
    assert pending is not None
    await pending
    assert first.stats()["compactions"] + first.stats()["wal_bytes_kept"] > 0
    expected = await first.run(_rows)
    hints = await first.build_hints()
    await first.close()
    assert remote.proc.returncode == 0  # Stopped cleanly by close.

    # The next primary, from the hints, records through a process of its own too.
    recovered = await recovered_log(client, service, endpoint, log, tmp_path / "b", B, hints)
    second = await SQLiteStore.from_recovered(recovered, recorder_process=True)
    assert await second.restore_checkpoint() == labeled("cp-19")
    assert await second.run(_rows) == expected
    await second.transact(_upsert, [(-1, b"second")])
    await second.start_commit(None, rich(2), [])
    await second.close()

    # A third, in process, from the whole log.
    await _expect_log(
        client, service, endpoint, log, tmp_path / "c", rich(2), [(-1, b"second"), *expected]
    )


async def test_a_hand_off_fences_the_recorder_process(
    client: JournalClient,
    service: AppendService,
    store_broker: BrokerProcess,
    make_log: MakeLog,
    tmp_path: Path,
) -> None:
    log, endpoint = await make_log(), store_broker.endpoint
    first = await _committed_store(client, service, endpoint, log, tmp_path / "a", [(1, b"one")])

    recovered = await recovered_log(client, service, endpoint, log, tmp_path / "b", B)
    second = await SQLiteStore.from_recovered(recovered)
    assert await second.restore_checkpoint() == rich(1)
    # The zombie's commit fails (its xSync waits for the log by default), and so does
    # every later one.
    await first.transact(_upsert, [(2, b"zombie")])
    with pytest.raises(apsw.IOError, match="RecorderFenced"):
        await first.start_commit(None, labeled("zombie"), [])
    with pytest.raises((apsw.IOError, RecordingFailed)):
        await first.transact(_upsert, [(3, b"zombie")])
        await first.start_commit(None, labeled("zombie-2"), [])
    pid = _remote(first).pid
    first.destroy()
    assert not _alive(pid)
    assert await second.run(_rows) == [(1, b"one")]
    second.destroy()


async def test_a_dead_recorder_process_fails_the_stores_commits(
    client: JournalClient,
    service: AppendService,
    store_broker: BrokerProcess,
    make_log: MakeLog,
    tmp_path: Path,
) -> None:
    log, endpoint = await make_log(), store_broker.endpoint
    store = await _committed_store(
        client, service, endpoint, log, tmp_path / "a", [], sync_waits=False
    )
    remote = _remote(store)
    os.kill(remote.pid, signal.SIGKILL)
    remote.proc.wait()
    await store.transact(_upsert, [(1, b"lost")])
    # The commit's sync finds the child gone.
    with pytest.raises(apsw.IOError, match="recorder process"):
        await store.start_commit(None, rich(2), [])
    with pytest.raises((apsw.IOError, RecordingFailed)):
        await store.transact(_upsert, [(2, b"lost")])
        await store.start_commit(None, rich(3), [])
    store.destroy()
    assert not (tmp_path / "a").exists()

    # What was committed before is what the log holds.
    await _expect_log(client, service, endpoint, log, tmp_path / "b", rich(1), [])


async def test_a_store_that_fails_to_open_kills_its_recorder_process(
    client: JournalClient,
    service: AppendService,
    store_broker: BrokerProcess,
    make_log: MakeLog,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log, endpoint = await make_log(), store_broker.endpoint
    recovered = await recovered_log(client, service, endpoint, log, tmp_path / "a", A)
    started: list[RemoteRecorder] = []
    start = RemoteRecorder.start

    async def recording_start(*args: Any, **kwargs: Any) -> RemoteRecorder:
        started.append(await start(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(RemoteRecorder, "start", recording_start)
    # Refused before the store opens anything, and while opening the connection.
    with pytest.raises(ValueError, match="journal_mode"):
        await SQLiteStore.from_recovered(recovered, recorder_process=True, journal_mode="off")
    with pytest.raises(apsw.SQLError):
        await SQLiteStore.from_recovered(
            recovered, recorder_process=True, bootstrap_sql="CREATE TABLE broken ("
        )
    assert len(started) == 2
    assert all(r.proc.returncode is not None for r in started)


async def test_a_store_dropped_without_close_abandons_its_recorder_process(
    client: JournalClient,
    service: AppendService,
    store_broker: BrokerProcess,
    make_log: MakeLog,
    tmp_path: Path,
) -> None:
    log, endpoint = await make_log(), store_broker.endpoint
    store = await _committed_store(client, service, endpoint, log, tmp_path / "a", [(1, b"kept")])
    await store.transact(_upsert, [(2, b"not committed")])
    remote = _remote(store)
    await asyncio.wrap_future(store._thread.submit(int))  # The thread lets go of the store.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del store
        gc.collect()
    assert any("was not closed" in str(w.message) for w in caught)
    assert await asyncio.get_running_loop().run_in_executor(None, remote.proc.wait, 10) is not None
    assert remote.error is not None and "dropped without close" in str(remote.error)
    with pytest.raises(RemoteRecordingFailed, match="dropped without close"):
        await remote.barrier()

    # The log holds the last commit, as after a crash.
    await _expect_log(client, service, endpoint, log, tmp_path / "b", rich(1), [(1, b"kept")])
