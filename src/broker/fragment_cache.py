"""A bounded local cache of remote fragments, fetched, decompressed and SHA1-verified.

The broker serves reads of persisted fragments from this cache so that a corrupted fragment
is detected (by its SHA1) before any of its bytes leave the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import OrderedDict
from pathlib import Path

from gazette.broker.fragment.store import store_for_url
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.fragment_name import content_name

log = logging.getLogger(__name__)


class FragmentCache:
    """LRU of verified, decompressed fragment files under `directory`, at most `max_bytes`."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._files: OrderedDict[str, tuple[Path, int]] = OrderedDict()
        self._inflight: dict[str, asyncio.Task[Path]] = {}
        self._size = 0
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*"):
            stale.unlink(missing_ok=True)

    def _key(self, f: pb.Fragment) -> str:
        return f"{f.backing_store}|{f.journal}|{f.path_postfix}|{content_name(f)}"

    async def get(self, fragment: pb.Fragment) -> Path:
        """Path of the verified content of `fragment`, fetching it if needed.

        Raises broker.fragment.store.FragmentCorrupted when the stored fragment does not
        match its SHA1 or length, and FragmentStoreError when the store fails. Concurrent
        callers share one fetch, owned by the cache: cancelling one caller cancels neither
        the fetch nor the others. The returned file may be evicted later: open it promptly
        (an open descriptor stays valid).
        """
        key = self._key(fragment)
        hit = self._files.get(key)
        if hit is not None:
            if hit[0].exists():
                self._files.move_to_end(key)
                return hit[0]
            self._forget(key)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch(key, fragment))
            self._inflight[key] = task
            task.add_done_callback(lambda _t: self._inflight.pop(key, None))
        return await asyncio.shield(task)

    async def _fetch(self, key: str, fragment: pb.Fragment) -> Path:
        name = f"{abs(hash(key)):x}-{content_name(fragment)}"
        dest = self.directory / name
        await store_for_url(fragment.backing_store).fetch(fragment, dest)
        size = fragment.end - fragment.begin
        self._files[key] = (dest, size)
        self._size += size
        self._evict(keep=key)
        return dest

    def _forget(self, key: str) -> None:
        entry = self._files.pop(key, None)
        if entry is not None:
            self._size -= entry[1]

    def clear(self) -> int:
        """Remove every cached file (e.g. to free a full spool disk); returns bytes freed.
        Open descriptors stay valid; later reads fetch again."""
        freed = self._size
        for path, _size in self._files.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._files.clear()
        self._size = 0
        return freed

    async def close(self) -> None:
        """Cancel in-flight fetches (their callers see CancelledError)."""
        for task in list(self._inflight.values()):
            task.cancel()

    def _evict(self, keep: str) -> None:
        """Drop least recently used files beyond `max_bytes`, never the one just fetched."""
        while self._size > self.max_bytes and len(self._files) > 1:
            key, (path, size) = next(iter(self._files.items()))
            if key == keep:
                self._files.move_to_end(key)
                continue
            del self._files[key]
            self._size -= size
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
