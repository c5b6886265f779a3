"""RocksDBStore end to end against a real broker and a real FUSE mount: transactions with
checkpoints, reads of uncommitted writes, recovery into a fresh directory, key validation,
and a fenced old primary."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.client import JournalClient
from broker.testing.broker import BrokerProcess
from fusefs import is_mounted
from recoverylog.player import Player
from stores.rocksdb import InvalidKey, RocksDBStore, StoreFailed
from tests.fusefs.support import MakeLog, client, fuse_broker, make_log, no_stale_mounts, tree
from tests.stores.rocksdb.crash_writer import options

__all__ = ["client", "fuse_broker", "make_log", "no_stale_mounts"]


async def test_commit_recover_continue(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log("rocks")
    root = no_stale_mounts
    store = await RocksDBStore.open(fuse_broker.endpoint, log, root / "w1", options=options())
    try:
        assert await store.restore_checkpoint(None) == b""
        for n in range(30):
            for j in range(500):
                store.put(b"\x01%04d" % ((n * 500 + j) % 7000), b"%d" % n * 20)
            store.put(b"\x05%04d" % n, b"x")
            store.delete(b"\x05%04d" % (n - 1))
            fut = store.start_commit(None, b"cp%d" % n, [])
            store.put(b"\x02next", b"%d" % n)  # The next transaction's, read while pending.
            assert store.get(b"\x02next") == b"%d" % n
            await fut
        await store.compact()
        assert await store.restore_checkpoint(None) == b"cp29"
        assert store.get(b"\x050028") is None and store.get(b"\x050029") == b"x"
        want = dict(store.items())
        assert len(want) == 7000 + 2
        assert list(want) == sorted(want)
        assert dict(store.items(b"\x05")) == {b"\x050029": b"x"}
        with pytest.raises(InvalidKey):
            store.put(b"\x00mine", b"x")
        with pytest.raises(InvalidKey):
            store.delete(b"")
        await store.start_commit(None, b"final", [])
        hints = await store.build_hints()
        stats = await store.mount.stats()
        assert stats["error"] is None and stats["refused"] == 0
    finally:
        result = await store.close()
    assert result is not None
    assert not is_mounted(root / "w1" / "mnt")

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
        assert await store2.restore_checkpoint(None) == b"final"
        assert dict(store2.items()) == want
        store2.put(b"\x03more", b"yes")
        await store2.start_commit(None, b"after", [])
    finally:
        await store2.close()
    store3 = await RocksDBStore.open(fuse_broker.endpoint, log, root / "w3")
    try:
        assert await store3.restore_checkpoint(None) == b"after"
        assert store3.get(b"\x03more") == b"yes"
    finally:
        await store3.close()


async def test_wait_for_failure_fails_commit(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log("rocks")
    store = await RocksDBStore.open(fuse_broker.endpoint, log, no_stale_mounts / "w")
    try:
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        failed.set_exception(RuntimeError("upstream append failed"))
        store.put(b"\x01k", b"v")
        with pytest.raises(StoreFailed):
            await store.start_commit(None, b"cp", [failed])
        with pytest.raises(StoreFailed):
            store.put(b"\x01k", b"v")
    finally:
        await store.close()


async def test_fenced_primary_fails(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log("rocks")
    root = no_stale_mounts
    old = await RocksDBStore.open(fuse_broker.endpoint, log, root / "old")
    try:
        old.put(b"\x01a", b"1")
        await old.start_commit(None, b"one", [])
        new = await RocksDBStore.open(fuse_broker.endpoint, log, root / "new")
        try:
            assert await new.restore_checkpoint(None) == b"one"
            old.put(b"\x01a", b"zombie")
            with pytest.raises(StoreFailed):
                await old.start_commit(None, b"two", [])
            new.put(b"\x01a", b"2")
            await new.start_commit(None, b"two", [])
        finally:
            await new.close()
    finally:
        old.destroy()
    assert not is_mounted(root / "old" / "mnt")
    check = await RocksDBStore.open(fuse_broker.endpoint, log, root / "check")
    try:
        assert await check.restore_checkpoint(None) == b"two"
        assert check.get(b"\x01a") == b"2"
    finally:
        await check.close()
