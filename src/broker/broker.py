"""The Broker: a process's etcd session, keyspace mirror, journal replicas and background work.

In this version every broker that sees a journal serves it as primary with replication 1:
multi-broker assignment and replication come with the allocator. The broker announces
itself at `{root}/members/{zone}#{suffix}` and advertises each journal's Route at
`{root}/assign/{journal}#{zone}#{suffix}#0`, both under its lease (reference §4).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from allocator.etcd import Compare, Etcd, EtcdError, op_delete, op_put
from allocator.keyspace import KeySpace
from broker.config import BrokerConfig
from broker.fragment.coverset import FragmentEntry
from broker.fragment.store import FragmentStoreError, store_for_url
from broker.fragment_cache import FragmentCache
from broker.protocol import protocol_pb2 as pb
from broker.protocol.validation import split_journal_meta
from broker.replica import JournalReplica
from broker.spool import COMMITS_SUFFIX, SPOOL_SUFFIX

log = logging.getLogger(__name__)


class BrokerStartupError(RuntimeError):
    """The broker cannot start (etcd unreachable, duplicate member id, locked spool dir)."""


@dataclass(frozen=True)
class Keys:
    """The etcd key layout of reference §4 under one root."""

    root: str

    @property
    def items(self) -> str:
        return f"{self.root}/items/"

    @property
    def members(self) -> str:
        return f"{self.root}/members/"

    @property
    def assign(self) -> str:
        return f"{self.root}/assign/"

    def item(self, journal: str) -> str:
        return f"{self.items}{journal}"

    def member(self, zone: str, suffix: str) -> str:
        return f"{self.members}{zone}#{suffix}"

    def assignment(self, journal: str, zone: str, suffix: str, slot: int) -> str:
        return f"{self.assign}{journal}#{zone}#{suffix}#{slot}"


def parse_assignment_key(keys: Keys, key: str) -> tuple[str, str, str, int]:
    """`{root}/assign/{item}#{zone}#{suffix}#{slot}` -> (item, zone, suffix, slot)."""
    rest = key[len(keys.assign) :]
    item, zone, suffix, slot = rest.rsplit("#", 3)
    return item, zone, suffix, int(slot)


class Broker:
    """A broker process's state. `run()` serves until cancelled or `stop()` is called."""

    def __init__(self, cfg: BrokerConfig) -> None:
        self.cfg = cfg
        self.keys = Keys(cfg.root)
        self.process_id = pb.ProcessSpec.ID(zone=cfg.zone, suffix=cfg.suffix)
        self.keyspace = KeySpace(cfg.root + "/", self._decode)
        self.replicas: dict[str, JournalReplica] = {}
        self._ready: dict[str, asyncio.Event] = {}
        self.persist_queue: asyncio.Queue[tuple[JournalReplica, FragmentEntry]] = asyncio.Queue()
        self.cache = FragmentCache(cfg.spool_dir / "cache", cfg.cache_bytes)
        self.etcd: Etcd | None = None
        self.lease_id = 0
        self._reconcile = asyncio.Event()
        self._lock_fd: int | None = None

    # --- decoding of the keyspace ---------------------------------------------------------
    def _decode(self, key: str, raw: bytes) -> Any:
        if key.startswith(self.keys.items):
            return pb.JournalSpec.FromString(raw)
        if key.startswith(self.keys.members):
            return pb.BrokerSpec.FromString(raw)
        if key.startswith(self.keys.assign):
            parse_assignment_key(self.keys, key)
            return pb.Route.FromString(raw)
        return raw

    # --- headers and routes -------------------------------------------------------------
    def etcd_header(self) -> pb.Header.Etcd:
        h = self.keyspace.header
        return pb.Header.Etcd(
            cluster_id=h.cluster_id,
            member_id=h.member_id,
            revision=h.revision,
            raft_term=h.raft_term,
        )

    def route_of(self, journal: str) -> pb.Route:
        """The journal's Route from the assignments in the keyspace, with endpoints."""
        members: list[tuple[str, str, int]] = []
        for kv in self.keyspace.prefixed(f"{self.keys.assign}{journal}#"):
            item, zone, suffix, slot = parse_assignment_key(self.keys, kv.key)
            if item == journal:
                members.append((zone, suffix, slot))
        members.sort()
        route = pb.Route(primary=-1)
        for i, (zone, suffix, slot) in enumerate(members):
            route.members.add(zone=zone, suffix=suffix)
            member = self.keyspace.get(self.keys.member(zone, suffix))
            route.endpoints.append(member.value.process_spec.endpoint if member else "")
            if slot == 0:
                route.primary = i
        return route

    def header(self, journal: str | None = None) -> pb.Header:
        return pb.Header(
            process_id=self.process_id,
            route=self.route_of(journal) if journal else pb.Route(primary=-1),
            etcd=self.etcd_header(),
        )

    # --- request resolution -------------------------------------------------------------
    async def resolve(
        self, journal: str, min_etcd_revision: int = 0, timeout: float = 10.0
    ) -> JournalReplica | None:
        """The ready replica of `journal`, or None if no such journal exists.

        Waits (up to `timeout`) for the keyspace to reach `min_etcd_revision` and for a
        just-created journal's replica to finish recovery.
        """
        name, _meta = split_journal_meta(journal)
        if min_etcd_revision > self.keyspace.revision:
            await self.keyspace.wait_for_revision(min_etcd_revision, timeout=timeout)
        if self.keyspace.get(self.keys.item(name)) is None:
            return None
        ready = self._ready.setdefault(name, asyncio.Event())
        self._reconcile.set()
        async with asyncio.timeout(timeout):
            await ready.wait()
        return self.replicas.get(name)

    # --- lifecycle ------------------------------------------------------------------------
    def _lock_spool_dir(self) -> None:
        self.cfg.spool_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.cfg.spool_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            os.close(fd)
            raise BrokerStartupError(
                f"spool directory {self.cfg.spool_dir} is in use by another broker"
            ) from err
        self._lock_fd = fd

    async def start(self) -> None:
        """Lock the spool dir, open etcd, announce this member and load the keyspace."""
        self._lock_spool_dir()
        self.etcd = Etcd(self.cfg.etcd)
        try:
            self.lease_id = await self.etcd.grant_lease(self.cfg.lease_ttl)
            spec = pb.BrokerSpec(
                process_spec=pb.ProcessSpec(id=self.process_id, endpoint=self.cfg.endpoint),
                journal_limit=self.cfg.journal_limit,
            )
            key = self.keys.member(self.cfg.zone, self.cfg.suffix).encode()
            await self._clear_previous_instance(key)
            resp = await self.etcd.txn(
                [Compare(key, "create", 0)],
                [op_put(key, spec.SerializeToString(), self.lease_id)],
            )
            if not resp.succeeded:
                raise BrokerStartupError(
                    f"member key {key.decode()} exists: another broker runs as "
                    f"{self.cfg.zone}#{self.cfg.suffix} (or its lease has not expired yet)"
                )
            await self.keyspace.load(self.etcd)
        except EtcdError as err:
            raise BrokerStartupError(f"etcd {self.cfg.etcd}: {err}") from err
        self.keyspace.observe(self._reconcile.set)
        self._reconcile.set()

    async def _clear_previous_instance(self, key: bytes) -> None:
        """Revoke the lease of a crashed previous instance of this same broker.

        We hold the spool directory's lock, so no live broker uses this spool dir; if the
        existing announcement advertises our endpoint it is our own previous incarnation
        (e.g. after SIGKILL), and revoking its lease removes its member and assignment keys
        at once instead of waiting out the TTL.
        """
        assert self.etcd is not None
        resp = await self.etcd.get(key)
        if not resp.kvs:
            return
        kv = resp.kvs[0]
        try:
            previous = pb.BrokerSpec.FromString(kv.value)
        except Exception:  # noqa: BLE001
            return
        if previous.process_spec.endpoint == self.cfg.endpoint and kv.lease:
            log.info("revoking lease of previous instance lease=%x", kv.lease)
            await self.etcd.revoke_lease(kv.lease)

    async def run_background(self) -> None:
        """Background loops; runs until cancelled. Any loop failing fails the broker."""
        assert self.etcd is not None
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.keyspace.watch(self.etcd), name="keyspace-watch")
            tg.create_task(self.etcd.keep_alive(self.lease_id, self.cfg.lease_ttl), name="lease")
            tg.create_task(self._reconcile_loop(), name="reconcile")
            tg.create_task(self._persist_loop(), name="persist")
            tg.create_task(self._flush_loop(), name="flush")

    def _enqueue(self, replica: JournalReplica, entries: list[FragmentEntry]) -> None:
        for entry in entries:
            self.persist_queue.put_nowait((replica, entry))

    async def shutdown(self, persist_timeout: float = 30.0) -> None:
        """Roll and persist spools of journals with stores (bounded), then release the lease.

        Spools of journals without stores stay on disk, to be recovered at the next start.
        """
        for replica in list(self.replicas.values()):
            if replica.has_stores:
                async with replica.lock:
                    self._enqueue(replica, replica.roll())
        deadline = time.monotonic() + persist_timeout
        while not self.persist_queue.empty() and time.monotonic() < deadline:
            replica, entry = self.persist_queue.get_nowait()
            try:
                await asyncio.wait_for(self._persist(replica, entry), deadline - time.monotonic())
            except (FragmentStoreError, OSError, TimeoutError) as err:
                log.error(
                    "persist at shutdown failed journal=%s fragment=[%d,%d) err=%s; "
                    "its spool stays for the next start",
                    replica.name,
                    entry.begin,
                    entry.end,
                    err,
                )
        for replica in self.replicas.values():
            replica.close()
        await self.cache.close()
        if self.etcd is not None:
            await self.etcd.revoke_lease(self.lease_id)
            await self.etcd.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)

    # --- reconciliation of replicas and assignments ---------------------------------------
    async def _reconcile_loop(self) -> None:
        while True:
            await self._reconcile.wait()
            self._reconcile.clear()
            try:
                await self._reconcile_once()
            except EtcdError as err:
                log.warning("assignment update failed err=%s; retrying", err)
                await asyncio.sleep(0.5)
                self._reconcile.set()

    async def _reconcile_once(self) -> None:
        assert self.etcd is not None
        specs = {
            kv.key[len(self.keys.items) :]: kv for kv in self.keyspace.prefixed(self.keys.items)
        }
        for name, kv in specs.items():
            replica = self.replicas.get(name)
            if replica is None:
                replica = JournalReplica(
                    kv.value, kv.mod_revision, self.cfg.spool_dir, sync=self.cfg.spool_sync
                )
                try:
                    self._enqueue(replica, await replica.recover())
                except Exception:  # noqa: BLE001 - one journal must not take the broker down
                    log.exception("recovery failed journal=%s; retrying", name)
                    replica.close()
                    asyncio.get_running_loop().call_later(2.0, self._reconcile.set)
                    continue
                self.replicas[name] = replica
            elif kv.mod_revision != replica.mod_revision:
                replica.spec, replica.mod_revision = kv.value, kv.mod_revision
            key = self.keys.assignment(name, self.cfg.zone, self.cfg.suffix, 0)
            if self.keyspace.get(key) is None:
                route = pb.Route(
                    members=[self.process_id], primary=0, endpoints=[self.cfg.endpoint]
                )
                await self.etcd.put(key.encode(), route.SerializeToString(), lease=self.lease_id)
            else:
                self._ready.setdefault(name, asyncio.Event()).set()
        for name in list(self.replicas):
            if name not in specs:
                replica = self.replicas.pop(name)
                self._ready.pop(name, None)
                async with replica.lock:
                    self._enqueue(replica, replica.roll())
                replica.delete()
                log.info("journal deleted journal=%s", name)
        mine = f"#{self.cfg.zone}#{self.cfg.suffix}#"
        for kv in list(self.keyspace.prefixed(self.keys.assign)):
            item, *_ = parse_assignment_key(self.keys, kv.key)
            if mine in kv.key and item not in specs:
                await self.etcd.txn(
                    [Compare(kv.key.encode(), "mod", kv.mod_revision)], [op_delete(kv.key.encode())]
                )

    # --- persistence ------------------------------------------------------------------------
    async def _persist_loop(self) -> None:
        while True:
            replica, entry = await self.persist_queue.get()
            backoff = 0.5
            while True:
                try:
                    await self._persist(replica, entry)
                    break
                except Exception as err:  # noqa: BLE001 - retried; the spool stays readable
                    replica.store_health_error = str(err)
                    if not isinstance(err, FragmentStoreError | OSError):
                        log.exception("unexpected persist failure journal=%s", replica.name)
                    log.error(
                        "persist failed journal=%s fragment=[%d,%d) err=%s; retrying",
                        replica.name,
                        entry.begin,
                        entry.end,
                        err,
                    )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)

    async def _persist(self, replica: JournalReplica, entry: FragmentEntry) -> None:
        """Persist a rolled spool to the journal's first store, then remove its files.

        A journal without stores keeps no history beyond its current spool (as upstream):
        its rolled spools are dropped.
        """
        assert entry.local_path is not None
        stores = list(replica.spec.fragment.stores)
        persisted = None
        if stores:
            persisted = await store_for_url(stores[0]).persist(entry.spec, entry.local_path)
            replica.store_health_error = ""
            log.info(
                "persisted journal=%s fragment=[%d,%d) store=%s",
                replica.name,
                entry.begin,
                entry.end,
                stores[0],
            )
        replica.mark_persisted(entry, persisted)
        stem = entry.local_path.name[: -len(SPOOL_SUFFIX)]
        for p in (entry.local_path, entry.local_path.with_name(stem + COMMITS_SUFFIX)):
            p.unlink(missing_ok=True)

    async def _flush_loop(self) -> None:
        """Roll spools due to length or flush interval; refresh indexes from the stores."""
        while True:
            await asyncio.sleep(1.0)
            now = time.time()
            for replica in list(self.replicas.values()):
                try:
                    if replica.should_roll(now) and not replica.lock.locked():
                        async with replica.lock:
                            self._enqueue(replica, replica.roll())
                    if time.monotonic() - replica.last_refresh >= replica.refresh_interval:
                        listing = await replica.list_stores()
                        async with replica.lock:
                            replica.apply_listing(listing)
                except Exception:  # noqa: BLE001 - keep serving; retried next tick
                    log.exception("flush/refresh failed journal=%s", replica.name)
