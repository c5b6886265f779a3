"""RocksDBStore end to end against a real broker and a real FUSE mount: transactions with
checkpoints, reads of uncommitted writes, recovery into a fresh directory, key validation,
a fenced old primary, and opening from a RecoveredLog as the consumer runtime does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer import StoreFailed
from gazette.consumer.protocol import pb
from gazette.fusefs import force_unmount, is_mounted
from gazette.recoverylog.player import Player
from gazette.stores.rocksdb import InvalidKey, RocksDBStore
from gazette.testing.broker import BrokerProcess
from tests.fusefs.support import MakeLog, client, fuse_broker, make_log, no_stale_mounts, tree
from tests.stores.checkpoints import labeled, rich
from tests.stores.recovery import recovered_log
from tests.stores.rocksdb.crash_writer import options

__all__ = ["client", "fuse_broker", "make_log", "no_stale_mounts"]


async def test_commit_recover_continue(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log("rocks")
    root = no_stale_mounts
    store = await RocksDBStore.open(fuse_broker.endpoint, log, root / "w1", options=options())
    try:
        assert await store.restore_checkpoint(None) == pb.Checkpoint()
        for n in range(30):
            for j in range(500):
                store.put(b"\x01%04d" % ((n * 500 + j) % 7000), b"%d" % n * 20)
            store.put(b"\x05%04d" % n, b"x")
            store.delete(b"\x05%04d" % (n - 1))
            fut = store.start_commit(None, labeled(f"cp{n}"), [])
            store.put(b"\x02next", b"%d" % n)  # The next transaction's, read while pending.
            assert store.get(b"\x02next") == b"%d" % n
            await fut
        await store.compact()
        assert await store.restore_checkpoint(None) == labeled("cp29")
        assert store.get(b"\x050028") is None and store.get(b"\x050029") == b"x"
        want = dict(store.items())
        assert len(want) == 7000 + 2
        assert list(want) == sorted(want)
        assert dict(store.items(b"\x05")) == {b"\x050029": b"x"}
        with pytest.raises(InvalidKey):
            store.put(b"\x00mine", b"x")
        with pytest.raises(InvalidKey):
            store.delete(b"")
        await store.start_commit(None, rich(1), [])
        hints = await store.build_hints()
        stats = await store.mount.stats()
        assert stats["error"] is None and stats["refused"] == 0
    finally:
        result = await store.close()
    assert result is not None
    assert not is_mounted(root / "w1" / "backing.mnt")

    full = Player(client, log, None, root / "play")
    await full.play()
    assert tree(root / "play") == tree(root / "w1" / "backing")
    # Playback guided by hints built before close plays the same tree. (It reads about as
    # much: this log is shorter than a MANIFEST's life, which spans it.)
    hinted = Player(client, log, hints, root / "hinted")
    await hinted.play()
    assert tree(root / "hinted") == tree(root / "play")
    assert hinted.bytes_read <= full.bytes_read

    # A new primary plays the log back, and continues.
    store2 = await RocksDBStore.open(fuse_broker.endpoint, log, root / "w2")
    try:
        assert await store2.restore_checkpoint(None) == rich(1)
        assert dict(store2.items()) == want
        store2.put(b"\x03more", b"yes")
        await store2.start_commit(None, rich(2), [])
    finally:
        await store2.close()
    store3 = await RocksDBStore.open(fuse_broker.endpoint, log, root / "w3")
    try:
        assert await store3.restore_checkpoint(None) == rich(2)
        assert store3.get(b"\x03more") == b"yes"
    finally:
        await store3.close()


async def test_a_commits_wal_write_is_one_fuse_request(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    """A commit's WAL write (~120 KB here) reaches fusefs as one request: WAL files are
    written with direct I/O (`WAL_SUFFIXES`). Through the page cache, each after the first
    would come as two, as it begins inside the page where the one before ended."""
    log = await make_log("rocks")
    store = await RocksDBStore.open(fuse_broker.endpoint, log, no_stale_mounts / "w")
    try:
        writes = (await store.mount.stats())["writes"]
        for n in range(5):
            for j in range(1000):
                store.put(b"\x04%d%04d" % (n, j), b"v" * 100)
            await store.start_commit(None, labeled(f"cp{n}"), [])
        assert (await store.mount.stats())["writes"] - writes == 5
    finally:
        assert await store.close() is not None
    await Player(client, log, None, no_stale_mounts / "play").play()
    assert tree(no_stale_mounts / "play") == tree(no_stale_mounts / "w" / "backing")


async def test_wait_for_failure_fails_commit(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log("rocks")
    store = await RocksDBStore.open(fuse_broker.endpoint, log, no_stale_mounts / "w")
    try:
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failed.set_exception(RuntimeError("upstream append failed"))
        store.put(b"\x01k", b"v")
        with pytest.raises(TypeError, match="consumer.Checkpoint"):
            store.start_commit(None, b"cp", [])  # type: ignore[arg-type]
        assert store.get(b"\x01k") == b"v"  # Still the current transaction's.
        with pytest.raises(StoreFailed):
            await store.start_commit(None, labeled("cp"), [failed])
        with pytest.raises(StoreFailed):
            store.put(b"\x01k", b"v")
    finally:
        await store.close()


async def test_pipelined_commits(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    """Commits started before earlier ones resolve: written in the order started (even when a
    later one's dependencies resolve first), resolved in order, several covered by one sync;
    one whose predecessor failed fails without writing anything."""
    log = await make_log("rocks")
    root = no_stale_mounts
    loop = asyncio.get_running_loop()
    store = await RocksDBStore.open(fuse_broker.endpoint, log, root / "w1")
    try:
        gate: asyncio.Future[None] = loop.create_future()
        done: list[int] = []
        futs = []
        for n in range(40):
            store.put(b"\x01k", b"%d" % n)
            store.put(b"\x02%03d" % n, b"x")
            fut = store.start_commit(None, labeled(f"cp{n}"), [gate] if n == 0 else [])
            fut.add_done_callback(lambda _, n=n: done.append(n))
            futs.append(fut)
        await asyncio.sleep(0.2)
        assert done == []  # Everything waits behind the first commit's dependency.
        gate.set_result(None)
        await asyncio.gather(*futs)
        assert done == list(range(40))
        assert store.commits == 40
        assert store._wal.syncs < 40  # Some syncs covered several commits.
        failed: asyncio.Future[None] = loop.create_future()
        store.put(b"\x01k", b"lost")
        first = store.start_commit(None, labeled("bad"), [failed])
        store.put(b"\x03after", b"lost too")
        second = store.start_commit(None, labeled("after-bad"), [])
        failed.set_exception(RuntimeError("upstream append failed"))
        with pytest.raises(StoreFailed):
            await first
        with pytest.raises(StoreFailed):
            await second
    finally:
        await store.close()
    store2 = await RocksDBStore.open(fuse_broker.endpoint, log, root / "w2")
    try:
        assert await store2.restore_checkpoint(None) == labeled("cp39")
        assert store2.get(b"\x01k") == b"39"
        assert store2.get(b"\x03after") is None
        assert len(dict(store2.items(b"\x02"))) == 40
    finally:
        await store2.close()


async def test_a_commit_cancelled_with_its_owner_ends_cancelled(
    fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    """A task awaiting a commit that is cancelled (a shard being stopped) cancels the commit,
    which then ends cancelled, not with StoreFailed: the owner's cancellation must not turn
    into a store failure (a stopped zombie logged "shard failed ... commit failed:
    CancelledError()"). The store has failed all the same: a later commit fails."""
    loop = asyncio.get_running_loop()
    log = await make_log("rocks")
    store = await RocksDBStore.open(fuse_broker.endpoint, log, no_stale_mounts / "w")
    try:
        gate: asyncio.Future[None] = loop.create_future()
        store.put(b"\x01a", b"1")
        commit = store.start_commit(None, labeled("c1"), [gate])

        async def owner() -> None:
            await commit

        task = asyncio.ensure_future(owner())
        await asyncio.sleep(0.01)  # The owner awaits the commit.
        task.cancel()
        await asyncio.wait([task])
        assert task.cancelled()
        assert commit.cancelled()  # type: ignore[attr-defined]
        with pytest.raises(StoreFailed):
            await store.start_commit(None, labeled("c2"), [])
    finally:
        await store.close()


async def test_commit_failures_cancellations_and_close(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    """Edge cases of pipelined commits (found in review): a commit cancelled before its first
    step fails the store instead of blocking its successors; futures resolve in order even
    when a later commit fails first, and a written, durable commit is not failed by a later
    one; pending commits never show the store's checkpoint key in `items`; closing with a
    commit in flight leaves no WAL descriptor open."""
    loop = asyncio.get_running_loop()
    log = await make_log("rocks")
    store = await RocksDBStore.open(fuse_broker.endpoint, log, no_stale_mounts / "w1")
    try:
        store.put(b"\x01a", b"1")
        first = store.start_commit(None, labeled("cp1"), [])
        first.cancel()  # Before its first step: its coroutine never runs.
        store.put(b"\x01b", b"2")
        second = store.start_commit(None, labeled("cp2"), [])
        with pytest.raises(StoreFailed):
            await asyncio.wait_for(second, 5)
        assert store.get(b"\x01a") is None  # The cancelled transaction is gone.
        assert first.cancelled() and store._committing == []
    finally:
        await store.close()

    store = await RocksDBStore.open(fuse_broker.endpoint, log, no_stale_mounts / "w2")
    try:
        order: list[str] = []
        store.put(b"\x01a", b"1")
        c1 = store.start_commit(None, labeled("c1"), [])
        c1.add_done_callback(lambda f: order.append("c1"))
        assert b"\x00checkpoint" not in dict(store.items(b""))
        bad: asyncio.Future[None] = loop.create_future()
        store.put(b"\x01b", b"2")
        c2 = store.start_commit(None, labeled("c2"), [bad])
        c2.add_done_callback(lambda f: order.append("c2"))
        bad.set_exception(RuntimeError("c2's append failed"))
        await asyncio.wait([c1, c2])
        assert order == ["c1", "c2"]
        assert c1.exception() is None and isinstance(c2.exception(), StoreFailed)
    finally:
        await store.close()

    # A dependency's CancelledError is a failure like another: still resolved in order.
    store = await RocksDBStore.open(fuse_broker.endpoint, log, no_stale_mounts / "w2b")
    try:
        order.clear()
        gate: asyncio.Future[None] = loop.create_future()
        c1 = store.start_commit(None, labeled("c1b"), [gate])
        c1.add_done_callback(lambda f: order.append("c1"))
        cancelled: asyncio.Future[None] = loop.create_future()
        c2 = store.start_commit(None, labeled("c2b"), [cancelled])
        c2.add_done_callback(lambda f: order.append("c2"))
        await asyncio.sleep(0.01)  # Both commits wait on their dependencies.
        cancelled.cancel()
        await asyncio.sleep(0.05)  # c2 would complete meanwhile, were it not ordered.
        gate.set_result(None)
        await asyncio.wait([c1, c2])
        assert order == ["c1", "c2"]
        # c1 was not written yet when c2 failed: the store had failed, so c1 fails too.
        assert isinstance(c1.exception(), StoreFailed)
        assert isinstance(c2.exception(), StoreFailed)
    finally:
        await store.close()

    store = await RocksDBStore.open(fuse_broker.endpoint, log, no_stale_mounts / "w3")
    assert await store.restore_checkpoint(None) == labeled("c1")
    await store.start_commit(None, labeled("c3"), [])
    for j in range(20000):
        store.put(b"\x02%06d" % j, b"x" * 200)
    in_flight = store.start_commit(None, labeled("c4"), [])
    await asyncio.sleep(0)
    await store.close()
    with contextlib.suppress(StoreFailed):
        await in_flight  # Closed under it: it may or may not have made it.
    assert store._wal._fds == {}
    mnt = str(store.mount.mountpoint)
    assert not [
        fd
        for fd in os.listdir("/proc/self/fd")
        if os.path.realpath(f"/proc/self/fd/{fd}").startswith(mnt + "/")
    ]


async def test_write_stalls_keep_the_event_loop_running(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    """Options that make RocksDB stall writes until compactions catch up: the store retries
    refused writes from the event loop (which keeps running), and loses or repeats nothing."""
    log = await make_log("rocks")
    root = no_stale_mounts
    opt = options()
    opt.set_level_zero_slowdown_writes_trigger(2)
    opt.set_level_zero_stop_writes_trigger(3)
    opt.set_ratelimiter(512 << 10, 10_000, 10)  # Slow flushes and compactions: long stalls.
    store = await RocksDBStore.open(fuse_broker.endpoint, log, root / "w1", options=opt)
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = loop.time()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    try:
        for n in range(25):
            for j in range(300):
                store.put(b"\x01%03d-%03d" % (n, j), b"v" * 400)
            await store.start_commit(None, labeled(f"cp{n}"), [])
        assert store.stalls > 0  # The options did stall writes.
    finally:
        stop.set()
        await tick
        await store.close()
    # A write left to stall inside RocksDB holds the GIL until compactions catch up: the loop
    # then stood still for 0.34-0.40 s at a time here (0.01 s with the retries).
    assert max(gaps) < 0.2, sorted(gaps)[-5:]
    store2 = await RocksDBStore.open(fuse_broker.endpoint, log, root / "w2")
    try:
        assert await store2.restore_checkpoint(None) == labeled("cp24")
        assert len(dict(store2.items())) == 25 * 300
    finally:
        await store2.close()


async def test_fenced_primary_fails(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log("rocks")
    root = no_stale_mounts
    old = await RocksDBStore.open(fuse_broker.endpoint, log, root / "old")
    try:
        old.put(b"\x01a", b"1")
        await old.start_commit(None, labeled("one"), [])
        new = await RocksDBStore.open(fuse_broker.endpoint, log, root / "new")
        try:
            assert await new.restore_checkpoint(None) == labeled("one")
            old.put(b"\x01a", b"zombie")
            with pytest.raises(StoreFailed):
                await old.start_commit(None, labeled("two"), [])
            new.put(b"\x01a", b"2")
            await new.start_commit(None, labeled("two"), [])
        finally:
            await new.close()
    finally:
        old.destroy()
    assert not is_mounted(root / "old" / "backing.mnt")
    assert not (root / "old").exists()
    check = await RocksDBStore.open(fuse_broker.endpoint, log, root / "check")
    try:
        assert await check.restore_checkpoint(None) == labeled("two")
        assert check.get(b"\x01a") == b"2"
    finally:
        await check.close()


async def test_from_recovered(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log("rocks")
    root = no_stale_mounts
    async with AppendService(client) as service:
        # A new store, of a log never written to.
        recovered = await recovered_log(client, service, fuse_broker.endpoint, log, root / "a", 0xA)
        store = await RocksDBStore.from_recovered(recovered, options=options())
        try:
            assert store.directory == root / "a.mnt"
            assert store.author == 0xA
            assert await store.restore_checkpoint(None) == pb.Checkpoint()
            for n in range(1, 6):
                for j in range(200):
                    store.put(b"\x01%04d" % j, b"%d" % n * 50)
                await store.start_commit(None, rich(n), [])
            hints = await store.build_hints()
            assert (root / "a.info-log").is_dir()
            assert any(
                f.name.endswith(".sst") or f.name == "CURRENT" for f in (root / "a").iterdir()
            )
        finally:
            assert await store.close() is not None
        assert not is_mounted(root / "a.mnt")

        # The next primary, from hints: the checkpoint round-trips through the log.
        recovered = await recovered_log(
            client, service, fuse_broker.endpoint, log, root / "b", 0xB, hints
        )
        assert tree(root / "b") == tree(root / "a")
        store = await RocksDBStore.from_recovered(recovered)
        try:
            assert await store.restore_checkpoint(None) == rich(5)
            assert store.get(b"\x010007") == b"5" * 50
            store.put(b"\x02more", b"yes")
            await store.start_commit(None, rich(6), [])
        finally:
            store.destroy()
        assert not is_mounted(root / "b.mnt")
        for gone in ("b", "b.mnt", "b.info-log"):
            assert not (root / gone).exists(), gone

        # A third, from the whole log: the destroyed store had committed.
        recovered = await recovered_log(client, service, fuse_broker.endpoint, log, root / "c", 0xC)
        store = await RocksDBStore.from_recovered(recovered)
        try:
            assert await store.restore_checkpoint(None) == rich(6)
            assert store.get(b"\x02more") == b"yes"
        finally:
            await store.close()


@pytest.mark.parametrize("writeback", [True, False])
async def test_commit_lets_the_event_loop_run_while_the_log_commits(
    fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path, writeback: bool
) -> None:
    """The process's other work (a consumer's event loop: reading, consuming the next
    transaction) goes on while a commit waits for the log: the store fsyncs the WAL itself,
    with the GIL released, rather than writing with RocksDB's sync=True, which holds the GIL
    for the whole log round trip.

    The broker is paused for `PAUSE` from each commit on, and resumed by another process (a
    write holding the GIL would stop any timer of this one). The batch's write, which holds
    the GIL (rocksdict), must not wait for the log; the sync after it must, with the loop
    ticking meanwhile."""
    log = await make_log("rocks-gil")
    # Default options: a 64 MiB memtable, so that no flush (whose syncs would wait for the
    # paused broker too) can stall the writes.
    store = await RocksDBStore.open(
        fuse_broker.endpoint, log, no_stale_mounts / "w", writeback=writeback
    )
    loop = asyncio.get_running_loop()
    assert fuse_broker.proc is not None
    pause = 0.4
    try:
        for n in range(3):
            for j in range(4000):  # ~4 MB.
                store.put(b"\x01%06d" % j, b"%d" % n * 1000)
            fuse_broker.pause()
            resumer = subprocess.Popen(
                ["sh", "-c", f"sleep {pause}; kill -CONT {fuse_broker.proc.pid}"]
            )
            try:
                t0 = loop.time()
                commit = store.start_commit(None, labeled(f"cp{n}"), [])
                written = store._last_written
                assert written is not None
                marks: list[float] = []
                written.add_done_callback(lambda _, m=marks: m.append(loop.time()))
                ticks = 0
                while not commit.done():
                    if written.done():
                        ticks += 1
                    await asyncio.sleep(0.001)
                t_end = loop.time()
                await commit
            finally:
                resumer.wait()
                fuse_broker.resume()
            write_took, sync_took = marks[0] - t0, t_end - marks[0]
            # Written without waiting for the log; then the sync waited for it, and the loop
            # ran meanwhile (at least once per 10 ms even on a loaded machine).
            assert write_took < pause / 2, (write_took, sync_took)
            assert sync_took > pause / 4, (write_took, sync_took)
            assert ticks >= sync_took / 0.010, (ticks, write_took, sync_took)
        assert await store.restore_checkpoint(None) == labeled("cp2")
    finally:
        fuse_broker.resume()
        await store.close()


async def test_a_wal_off_the_mount_fails_commits(
    fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    """A WAL moved off the mount (options' wal_dir) is never recorded: commits fail loudly
    instead of being reported durable."""
    log = await make_log("rocks-waldir")
    opts = options()
    elsewhere = no_stale_mounts / "wal-elsewhere"
    elsewhere.mkdir()
    opts.set_wal_dir(str(elsewhere))
    store = await RocksDBStore.open(fuse_broker.endpoint, log, no_stale_mounts / "w", options=opts)
    try:
        store.put(b"\x01k", b"v")
        with pytest.raises(StoreFailed, match="WAL must be on the mount"):
            await store.start_commit(None, labeled("cp"), [])
    finally:
        store.destroy()


@pytest.mark.parametrize("kill_fusefs, reopen_wal", [(False, True), (True, True), (False, False)])
async def test_no_commit_is_acknowledged_once_the_mount_is_detached(
    client: JournalClient,
    fuse_broker: BrokerProcess,
    make_log: MakeLog,
    no_stale_mounts: Path,
    kill_fusefs: bool,
    reopen_wal: bool,
) -> None:
    """Found by the chaos crash trials: once the mount was detached (its fusefs process
    killed, the guardian detaching it), RocksDB went on creating files in the plain directory
    beneath, and a WAL not opened for syncing yet was 'not found' on the mount, taken for one
    RocksDB had deleted: commits were acknowledged with nothing synced (6 lost in a trial)."""
    log = await make_log("rocks")
    root = no_stale_mounts
    store = await RocksDBStore.open(fuse_broker.endpoint, log, root / "w")
    try:
        store.put(b"\x01a", b"1")
        await store.start_commit(None, labeled("one"), [])
        assert store._wal is not None
        if reopen_wal:
            store._wal.close_files()  # As for a WAL not synced yet (e.g. just created).
        if kill_fusefs:
            os.kill(store.mount.pid, signal.SIGKILL)
        force_unmount(store.mount.mountpoint)  # What the guardian does.
        store.put(b"\x01a", b"2")
        with pytest.raises(StoreFailed):
            await store.start_commit(None, labeled("two"), [])
    finally:
        store.destroy()
    assert not Path(store.mount.config.fsm_in).parent.exists()  # Nothing left in /tmp.
    check = await RocksDBStore.open(fuse_broker.endpoint, log, root / "check")
    try:
        restored = await check.restore_checkpoint(None)
        # Never older than what was acknowledged; the failed commit may have been recorded
        # if the fusefs process lived on (a failed commit's outcome is unknown).
        assert restored == labeled("one") or (not kill_fusefs and restored == labeled("two"))
    finally:
        await check.close()
