"""KeySpace against a real etcd: load, watch, decode errors, wait_for_revision."""

from __future__ import annotations

import asyncio
import contextlib
import os

from gazette.keyspace.etcd import Compare, Etcd, op_put, prefix_range_end
from gazette.keyspace.keyspace import KeySpace
from gazette.testing.etcd import EtcdServer


def test_prefix_range_end() -> None:
    assert prefix_range_end(b"/a/") == b"/a0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"\xff\xff") == b"\x00"


def _decode(key: str, raw: bytes) -> int:
    return int(raw)  # raises on non-integers


async def test_load_watch_and_wait(etcd_server: EtcdServer) -> None:
    prefix = f"/ks-test/{os.getpid()}/"
    async with Etcd(etcd_server.endpoint) as etcd:
        await etcd.put(f"{prefix}a".encode(), b"1")
        await etcd.put(f"{prefix}bad".encode(), b"not-a-number")
        ks = KeySpace(prefix, _decode)
        await ks.load(etcd)
        assert [kv.value for kv in ks.prefixed(prefix)] == [1]
        assert ks.get(f"{prefix}bad") is None, "undecodable values stay out of the mirror"

        watcher = asyncio.create_task(ks.watch(etcd))
        try:
            resp = await etcd.put(f"{prefix}b".encode(), b"2")
            await ks.wait_for_revision(resp.header.revision, timeout=5)
            assert [kv.value for kv in ks.prefixed(prefix)] == [1, 2]
            kv = ks.get(f"{prefix}b")
            assert kv is not None and kv.mod_revision == resp.header.revision

            txn = await etcd.txn(
                [Compare(f"{prefix}a".encode(), "mod", 0)], [op_put(f"{prefix}a".encode(), b"9")]
            )
            assert not txn.succeeded, "guard on an existing key's mod revision 0 must fail"

            resp = await etcd.delete(f"{prefix}a".encode())
            await ks.wait_for_revision(resp.header.revision, timeout=5)
            assert [kv.key for kv in ks.prefixed(prefix)] == [f"{prefix}b"]
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
