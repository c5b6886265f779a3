"""KeySpace: a local mirror of an etcd prefix, loaded at a revision and kept current by a watch.

Values are decoded once, when they arrive, by a caller-supplied decoder. Readers see a
consistent snapshot at `revision`; `wait_for_revision()` lets a request handler wait until
the mirror has caught up with a revision it learned elsewhere (e.g. from an Apply).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gazette.keyspace.etcd import Etcd, EtcdError

log = logging.getLogger(__name__)

V = TypeVar("V")


@dataclass(frozen=True)
class KeyValue(Generic[V]):
    """One decoded key of the mirror."""

    key: str
    value: V
    raw: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class EtcdHeader:
    cluster_id: int
    member_id: int
    revision: int
    raft_term: int


Decoder = Callable[[str, bytes], Any]


class KeySpace:
    """Mirror of every key under `prefix` (a str ending in '/').

    `decode(key, raw)` turns values into objects; a value it rejects (raises) is logged and
    kept out of the mirror, so one bad key cannot take a process down.
    """

    def __init__(self, prefix: str, decode: Decoder) -> None:
        if not prefix.endswith("/"):
            raise ValueError(f"keyspace prefix must end in '/': {prefix!r}")
        self.prefix = prefix
        self._decode = decode
        self._keys: list[str] = []
        self._kvs: dict[str, KeyValue[Any]] = {}
        self.header = EtcdHeader(0, 0, 0, 0)
        # Bumped by every change to the mirror (a key or the header), so readers can cache
        # what they derive from it and notice when that is stale.
        self.generation = 0
        self._changed = asyncio.Condition()
        self._observers: list[Callable[[], None]] = []

    @property
    def revision(self) -> int:
        return self.header.revision

    def observe(self, fn: Callable[[], None]) -> None:
        """Call `fn` (synchronously, in the watch task) after every applied update."""
        self._observers.append(fn)

    def __len__(self) -> int:
        return len(self._keys)

    def get(self, key: str) -> KeyValue[Any] | None:
        return self._kvs.get(key)

    def prefixed(self, prefix: str) -> Iterator[KeyValue[Any]]:
        """Every key-value whose key starts with `prefix`, in key order."""
        i = bisect.bisect_left(self._keys, prefix)
        while i < len(self._keys) and self._keys[i].startswith(prefix):
            yield self._kvs[self._keys[i]]
            i += 1

    def _set_header(self, h: Any, revision: int | None = None) -> None:
        self.generation += 1
        self.header = EtcdHeader(
            int(h.cluster_id),
            int(h.member_id),
            int(h.revision) if revision is None else revision,
            int(h.raft_term),
        )

    def _put(self, kv: Any) -> None:
        key = kv.key.decode()
        self.generation += 1
        try:
            value = self._decode(key, kv.value)
        except Exception as err:  # noqa: BLE001 - one bad value must not stop the mirror
            log.error("keyspace: cannot decode key=%s err=%s", key, err)
            self._remove(key)
            return
        if key not in self._kvs:
            bisect.insort(self._keys, key)
        self._kvs[key] = KeyValue(
            key,
            value,
            bytes(kv.value),
            int(kv.create_revision),
            int(kv.mod_revision),
            int(kv.lease),
        )

    def _remove(self, key: str) -> None:
        self.generation += 1
        if self._kvs.pop(key, None) is not None:
            i = bisect.bisect_left(self._keys, key)
            del self._keys[i]

    async def load(self, etcd: Etcd) -> None:
        """Replace the mirror with the current contents of the prefix."""
        resp = await etcd.get_prefix(self.prefix.encode())
        self.generation += 1
        self._keys.clear()
        self._kvs.clear()
        for kv in resp.kvs:
            self._put(kv)
        self._set_header(resp.header)
        await self._notify()

    async def watch(self, etcd: Etcd) -> None:
        """Apply watch updates from `revision + 1` until cancelled.

        On a watch failure (etcd restart, compaction) the mirror reloads and resumes,
        retrying with backoff; it never returns normally.
        """
        backoff = 0.1
        while True:
            try:
                async for resp in etcd.watch_prefix(self.prefix.encode(), self.revision + 1):
                    for ev in resp.events:
                        if ev.type == 0:  # PUT
                            self._put(ev.kv)
                        else:
                            self._remove(ev.kv.key.decode())
                    # While catching up, etcd sends the store's *current* revision in every
                    # header, ahead of the events delivered so far: only a response without
                    # events (a progress notification) vouches for its header revision.
                    if resp.events:
                        applied = max(int(ev.kv.mod_revision) for ev in resp.events)
                    else:
                        applied = int(resp.header.revision)
                    if applied > self.revision:
                        self._set_header(resp.header, revision=applied)
                    await self._notify()
                    backoff = 0.1
            except EtcdError as err:
                log.warning("keyspace watch failed prefix=%s err=%s; reloading", self.prefix, err)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                try:
                    await self.load(etcd)
                except EtcdError as err2:
                    log.warning("keyspace reload failed err=%s", err2)

    async def _notify(self) -> None:
        for fn in self._observers:
            try:
                fn()
            except Exception:  # noqa: BLE001
                log.exception("keyspace observer failed")
        async with self._changed:
            self._changed.notify_all()

    async def wait_for_revision(self, revision: int, timeout: float | None = None) -> None:
        """Return once the mirror reflects `revision`. Raises TimeoutError after `timeout`."""
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(lambda: self.revision >= revision)

    async def wait_for_change(self, after_revision: int) -> None:
        """Return once the mirror's revision is greater than `after_revision`."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.revision > after_revision)
