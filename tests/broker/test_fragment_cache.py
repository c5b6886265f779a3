"""FragmentCache: shared fetches survive the cancellation of one waiter."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

import gazette.broker.fragment_cache as fc
from gazette.broker.protocol import protocol_pb2 as pb
from tests.kit.eventually import eventually


class SlowStore:
    def __init__(self) -> None:
        self.fetches = 0

    async def fetch(self, fragment: pb.Fragment, dest: Path) -> None:
        self.fetches += 1
        # Long enough for a test to act while the fetch is in flight.
        await asyncio.sleep(0.3)
        dest.write_bytes(b"x" * (fragment.end - fragment.begin))


async def test_cancelling_one_waiter_spares_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SlowStore()
    monkeypatch.setattr(fc, "store_for_url", lambda url: store)
    cache = fc.FragmentCache(tmp_path / "cache", max_bytes=1 << 20)
    frag = pb.Fragment(
        journal="a/b", begin=0, end=10, backing_store="file:///x/", compression_codec=pb.NONE
    )
    first: Any = asyncio.create_task(cache.get(frag))
    second: Any = asyncio.create_task(cache.get(frag))
    await eventually(lambda: store.fetches == 1, what="the fetch", timeout=5)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    path = await second
    assert path.read_bytes() == b"x" * 10
    assert store.fetches == 1
    assert await cache.get(frag) == path and store.fetches == 1, "served from the cache"


async def test_eviction_keeps_the_size_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SlowStore()
    monkeypatch.setattr(fc, "store_for_url", lambda url: store)
    cache = fc.FragmentCache(tmp_path / "cache", max_bytes=25)
    paths = []
    for i in range(4):
        frag = pb.Fragment(
            journal="a/b",
            begin=i * 10,
            end=(i + 1) * 10,
            backing_store="file:///x/",
            compression_codec=pb.NONE,
        )
        paths.append(await cache.get(frag))
    assert [p.exists() for p in paths] == [False, False, True, True]
