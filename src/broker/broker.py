"""The Broker: a process's etcd session, keyspace mirror, journal replicas and background work.

The broker announces itself at `{root}/members/{zone}#{suffix}` under its lease and runs the
shared allocator (allocator.Allocator): the leader among the brokers assigns each journal to
`replication` brokers, writing `{root}/assign/{journal}#{zone}#{suffix}#{slot}` keys (slot 0 =
primary) under each broker's lease (upstream's etcd layout). A broker keeps a JournalReplica for
every journal assigned to it and advertises the journal's Route as its assignment's value: a peer as
soon as it sees the route, the primary once its replication pipeline has synchronised every
peer under that route (broker.replication). The allocator counts a replica as consistent when
its advertised route equals the current one, and removes replicas only while enough remain
consistent, so a route change never leaves committed content on too few brokers.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from gazette.allocator.allocator import Allocator, wait_until_no_assignments
from gazette.allocator.member import Member
from gazette.allocator.model import (
    Assignment,
    Item,
    MemberID,
    assignments_prefix,
    item_key,
    items_prefix,
    member_key,
    members_prefix,
    parse_assignment_key,
)
from gazette.allocator.session import MemberExistsError, MemberSession
from gazette.broker.client.route_cache import endpoint_to_target
from gazette.broker.config import BrokerConfig
from gazette.broker.fragment.coverset import FragmentEntry
from gazette.broker.fragment.store import FragmentStoreError, store_for_url
from gazette.broker.fragment_cache import FragmentCache
from gazette.broker.metrics import COUNTERS
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.broker.protocol.validation import split_journal_meta
from gazette.broker.quarantine import WAIT_LIMIT, Comparison, Verdict, quarantine
from gazette.broker.replica import JournalReplica
from gazette.broker.replication import Pipeline, ReplicationError, RouteKey, route_key
from gazette.broker.reservation import (
    ReservationError,
    ReservationStoreError,
    is_marker,
    marker,
    span_for,
)
from gazette.broker.spool import COMMITS_SUFFIX, SPOOL_SUFFIX, SpoolError
from gazette.keyspace.etcd import Etcd, EtcdError
from gazette.keyspace.keyspace import KeySpace, KeyValue
from gazette.mainboilerplate.process import StartupError

PEER_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

log = logging.getLogger(__name__)

PENDING_RETRY = 2.0
"""Seconds before a spool of an unserved journal that must wait is judged again."""

RELIEF_INTERVAL = 2.0
"""Seconds between two reliefs of a full spool disk."""

RESERVE_RETRIES = (0.2, 0.5, 1.0)
"""Delays between attempts to write a reservation marker before the append is refused."""

LEASE_MARGIN = 0.5
"""Seconds of certain lease left that reserving offsets requires (clock-rate slack)."""


class SpoolPending(Exception):
    """A spool of a journal this broker no longer serves cannot be judged yet (retried)."""


class BrokerStartupError(StartupError):
    """The broker cannot start (etcd unreachable, duplicate member id, locked spool dir)."""


@dataclass(frozen=True)
class Keys:
    """The etcd key layout (upstream's) under one root (allocator.model's helpers)."""

    root: str

    @property
    def items(self) -> str:
        return items_prefix(self.root)

    @property
    def members(self) -> str:
        return members_prefix(self.root)

    @property
    def assign(self) -> str:
        return assignments_prefix(self.root)

    def item(self, journal: str) -> str:
        return item_key(self.root, journal)

    def member(self, zone: str, suffix: str) -> str:
        return member_key(self.root, MemberID(zone, suffix))


@dataclass
class Resolution:
    """Where a journal request is served: here (`replica`), by proxy (`proxy_to`), or not
    at all (`status` != OK). `header` is this broker's view of the journal's route."""

    status: pb.Status.ValueType
    header: pb.Header
    replica: JournalReplica | None = None
    proxy_to: str = ""


def route_from_assignments(assignments: list[Assignment]) -> RouteKey:
    """The route key of an item's assignments (members sorted by (zone, suffix))."""
    ordered = sorted((a.member.zone, a.member.suffix, a.slot) for a in assignments)
    primary = next((i for i, (_, _, slot) in enumerate(ordered) if slot == 0), -1)
    return (tuple((z, s) for z, s, _ in ordered), primary)


class Broker:
    """A broker process's state. `run()` serves until cancelled or `stop()` is called."""

    def __init__(self, cfg: BrokerConfig) -> None:
        self.cfg = cfg
        self.keys = Keys(cfg.root)
        self.process_id = pb.ProcessSpec.ID(zone=cfg.zone, suffix=cfg.suffix)
        self.member_id = MemberID(cfg.zone, cfg.suffix)
        self.spec = pb.BrokerSpec(
            process_spec=pb.ProcessSpec(id=self.process_id, endpoint=cfg.endpoint),
            journal_limit=cfg.journal_limit,
        )
        self.member = Member(
            etcd_endpoint=cfg.etcd,
            root=cfg.root,
            member_id=self.member_id,
            spec=self.spec,
            decode_spec=pb.BrokerSpec.FromString,
            keyspace=KeySpace(cfg.root + "/", self._decode),
            lease_ttl=cfg.lease_ttl,
            reconcile=lambda: self._reconcile_once(),
            item_replication=lambda spec: int(spec.replication),
            member_limit=lambda spec: int(spec.journal_limit),
            is_consistent=self._is_consistent,
        )
        self.replicas: dict[str, JournalReplica] = {}
        self._ready: dict[str, asyncio.Event] = {}
        self.persist_queue: asyncio.Queue[tuple[JournalReplica, FragmentEntry]] = asyncio.Queue()
        self.cache = FragmentCache(cfg.spool_dir / "cache", cfg.cache_bytes)
        self._lock_fd: int | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, Any] = {}
        self._pulses: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._dropping: dict[str, asyncio.Task[None]] = {}
        # Spools of unserved journals waiting for the journal to pass them (broker.quarantine).
        self._pending_since: dict[tuple[str, int], float] = {}
        self._reserving: set[str] = set()  # journals with a reservation being extended
        self._relieved_at = -RELIEF_INTERVAL
        # How long judging a spool may read the journal's primary: short while starting
        # (the lease is not kept alive yet), then as an append's chunk.
        self._judging_timeout = cfg.chunk_timeout
        # Per-journal routing derived from the keyspace, valid while its generation holds
        # (every request consults them several times; each is a scan of the assignments).
        self._routing_generation = -1
        self._routes: dict[str, tuple[pb.Route, RouteKey]] = {}
        self._mine: dict[str, tuple[KeyValue[Any], int] | None] = {}
        self._headers: dict[str, pb.Header] = {}

    # --- the member (`allocator.member`) ---------------------------------------------------
    @property
    def keyspace(self) -> KeySpace:
        """The mirror of the broker keyspace (journals, brokers, assignments)."""
        return self.member.keyspace

    @property
    def etcd(self) -> Etcd | None:
        return self.member.etcd

    @property
    def session(self) -> MemberSession | None:
        return self.member.session

    @property
    def allocator(self) -> Allocator | None:
        return self.member.allocator

    @property
    def lease_id(self) -> int:
        return self.member.lease_id

    # --- decoding of the keyspace ---------------------------------------------------------
    def _decode(self, key: str, raw: bytes) -> Any:
        if key.startswith(self.keys.items):
            return pb.JournalSpec.FromString(raw)
        if key.startswith(self.keys.members):
            return pb.BrokerSpec.FromString(raw)
        if key.startswith(self.keys.assign):
            parse_assignment_key(self.cfg.root, key)
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

    def _routing_current(self) -> None:
        """Drop the cached routing if the keyspace changed since it was derived."""
        generation = self.keyspace.generation
        if generation != self._routing_generation:
            self._routes.clear()
            self._mine.clear()
            self._headers.clear()
            self._routing_generation = generation

    def route_of(self, journal: str) -> pb.Route:
        """The journal's Route from the assignments in the keyspace, with endpoints.

        Cached until the keyspace changes: callers must not modify it.
        """
        return self.route_and_key(journal)[0]

    def route_and_key(self, journal: str) -> tuple[pb.Route, RouteKey]:
        """The journal's Route (as `route_of`) and its `route_key`."""
        self._routing_current()
        cached = self._routes.get(journal)
        if cached is not None:
            return cached
        members: list[tuple[MemberID, int]] = []
        for kv in self.keyspace.prefixed(f"{self.keys.assign}{journal}#"):
            item, member_id, slot = parse_assignment_key(self.cfg.root, kv.key)
            if item == journal:
                members.append((member_id, slot))
        members.sort()
        route = pb.Route(primary=-1)
        for i, (member_id, slot) in enumerate(members):
            route.members.add(zone=member_id.zone, suffix=member_id.suffix)
            member = self.keyspace.get(member_key(self.cfg.root, member_id))
            route.endpoints.append(member.value.process_spec.endpoint if member else "")
            if slot == 0:
                route.primary = i
        cached = self._routes[journal] = (route, route_key(route))
        return cached

    def my_assignment(self, journal: str) -> tuple[KeyValue[Any], int] | None:
        """This broker's assignment of `journal` and its slot, if it has one."""
        self._routing_current()
        try:
            return self._mine[journal]
        except KeyError:
            pass
        found: tuple[KeyValue[Any], int] | None = None
        for kv in self.keyspace.prefixed(f"{self.keys.assign}{journal}#"):
            item, member_id, slot = parse_assignment_key(self.cfg.root, kv.key)
            if item == journal and member_id == self.member_id:
                if found is None or slot < found[1]:
                    found = (kv, slot)
        self._mine[journal] = found
        return found

    def header(self, journal: str | None = None, route: pb.Route | None = None) -> pb.Header:
        """This broker's response Header: its id, the etcd header and `route` (or the
        journal's route, or none). Without `route` it is cached until the keyspace changes:
        callers must not modify it (response constructors and CopyFrom copy it)."""
        if route is not None:
            return pb.Header(process_id=self.process_id, route=route, etcd=self.etcd_header())
        self._routing_current()
        key = journal or ""
        header = self._headers.get(key)
        if header is None:
            route = self.route_of(journal) if journal else pb.Route(primary=-1)
            header = pb.Header(process_id=self.process_id, route=route, etcd=self.etcd_header())
            self._headers[key] = header
        return header

    def peer_stub(self, endpoint: str) -> Any:
        """A `protocol.Journal` stub on another broker (channels are kept and reused)."""
        target = endpoint_to_target(endpoint)
        stub = self._stubs.get(target)
        if stub is None:
            channel = grpc.aio.insecure_channel(target, options=PEER_CHANNEL_OPTIONS)
            self._channels[target] = channel
            stub = self._stubs[target] = pb_grpc.JournalStub(channel)
        return stub

    # --- request resolution -------------------------------------------------------------
    async def resolve(
        self,
        journal: str,
        *,
        min_etcd_revision: int = 0,
        require_primary: bool = False,
        may_proxy: bool = True,
        timeout: float = 10.0,
    ) -> Resolution:
        """Decide where a request of `journal` is served.

        Appends (`require_primary`) are served by the primary; reads are served by the
        primary too, or by any assigned replica when the request may not be proxied. A
        broker that cannot serve a request proxies it to the primary when `may_proxy`.
        Waits (up to `timeout`) for the keyspace to reach `min_etcd_revision`, for a journal
        without a primary to get one, and for a just-assigned replica to finish recovery;
        raises TimeoutError if the keyspace or the replica is not ready in time.
        """
        name, _meta = split_journal_meta(journal)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if min_etcd_revision > self.keyspace.revision:
            await self.keyspace.wait_for_revision(min_etcd_revision, timeout=timeout)
        confirmed_absent = False
        while True:
            revision = self.keyspace.revision
            if self.keyspace.get(self.keys.item(name)) is None:
                if confirmed_absent:
                    return Resolution(pb.JOURNAL_NOT_FOUND, self.header())
                # Our mirror may lag a journal created through another broker a moment ago:
                # JOURNAL_NOT_FOUND is final for clients, so confirm it against etcd first.
                confirmed_absent = await self._await_item(name, deadline - loop.time())
                continue
            route = self.route_of(name)
            header = self.header(name)
            mine = self.my_assignment(name)
            is_primary = mine is not None and mine[1] == 0
            has_primary = route.primary >= 0
            primary_ep = route.endpoints[route.primary] if has_primary else ""
            if is_primary or (mine is not None and not require_primary and not may_proxy):
                replica = await self._ready_replica(name, deadline - loop.time())
                if replica is not None:
                    return Resolution(pb.OK, header, replica)
            elif has_primary:
                if may_proxy and primary_ep:
                    return Resolution(pb.OK, header, proxy_to=primary_ep)
                if require_primary:
                    return Resolution(pb.NOT_JOURNAL_PRIMARY_BROKER, header)
                return Resolution(pb.NOT_JOURNAL_BROKER, header)
            elif not may_proxy and mine is None:
                return Resolution(pb.NOT_JOURNAL_BROKER, header)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return Resolution(pb.NO_JOURNAL_PRIMARY_BROKER, header)
            try:
                async with asyncio.timeout(remaining):
                    await self.keyspace.wait_for_change(revision)
            except TimeoutError:
                return Resolution(pb.NO_JOURNAL_PRIMARY_BROKER, self.header(name))

    async def _await_item(self, name: str, timeout: float) -> bool:
        """Catch the mirror up to etcd for journal `name`'s spec. Returns True if etcd has no
        such journal (the mirror is then authoritative for it)."""
        if self.etcd is None:
            return True
        try:
            resp = await self.etcd.get(self.keys.item(name).encode())
        except EtcdError as err:  # not final: the client retries on UNAVAILABLE
            raise TimeoutError(f"cannot confirm journal {name} with etcd: {err}") from err
        if not resp.kvs:
            return True
        await self.keyspace.wait_for_revision(
            int(resp.kvs[0].mod_revision), timeout=max(timeout, 0.001)
        )
        return False

    async def _ready_replica(self, name: str, timeout: float) -> JournalReplica | None:
        ready = self._ready.get(name)
        if ready is not None and ready.is_set():
            return self.replicas.get(name)  # recovered already: nothing to wait for
        if ready is None:
            ready = self._ready[name] = asyncio.Event()
        self.member.reconcile_soon()
        async with asyncio.timeout(max(timeout, 0.001)):
            await ready.wait()
        return self.replicas.get(name)

    # --- lifecycle ------------------------------------------------------------------------
    def _lock_spool_dir(self) -> None:
        self.cfg.spool_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.cfg.spool_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            os.close(fd)
            raise BrokerStartupError(
                f"spool directory {self.cfg.spool_dir} is in use by another broker"
            ) from err
        self._lock_fd = fd

    async def start(self) -> None:
        """Lock the spool dir, then start the member (`Member.start`: open etcd, announce,
        load the keyspace), then persist the spools a previous run left.

        Holding the spool directory's lock, no live broker uses this spool dir: an
        announcement of our endpoint is our previous incarnation (e.g. after SIGKILL),
        which the member replaces at once instead of waiting out its lease.
        """
        self._lock_spool_dir()
        try:
            await self.member.start()
        except MemberExistsError as err:
            raise BrokerStartupError(
                f"member key {self.member.key} exists: another broker runs as "
                f"{self.cfg.zone}#{self.cfg.suffix} (or its lease has not expired yet)"
            ) from err
        except EtcdError as err:
            raise BrokerStartupError(f"etcd {self.cfg.etcd}: {err}") from err
        await self._persist_leftover_spools()

    async def _persist_leftover_spools(self) -> None:
        """Persist the committed spools a previous run left in the spool directory.

        They hold acknowledged content, but the journal they belong to may not be assigned
        to this broker any more (with replication 1 it moved elsewhere when our previous
        lease went): persisting them to the journal's store now, before serving, makes
        that content readable wherever the journal lives. Each is judged against the
        journal's content first (broker.quarantine): one that conflicts is set aside, one
        that must wait for the journal is queued. Spools of journals without stores (or
        whose spec is gone) stay, for the journal's replica here to recover.
        """
        root = self.cfg.spool_dir / "journals"
        if not root.is_dir():
            return
        self._judging_timeout = min(self.cfg.chunk_timeout, self.cfg.lease_ttl / 4)
        try:
            await self._persist_leftovers(root)
        finally:
            self._judging_timeout = self.cfg.chunk_timeout

    async def _persist_leftovers(self, root: Path) -> None:
        journals = sorted({str(p.parent.relative_to(root)) for p in root.rglob("*" + SPOOL_SUFFIX)})
        for name in journals:
            kv = self.keyspace.get(self.keys.item(name))
            if kv is None or not kv.value.fragment.stores:
                log.info("leaving spools of journal=%s (no spec or no stores)", name)
                continue
            replica = JournalReplica(kv.value, kv.mod_revision, self.cfg.spool_dir)
            try:
                for entry in await replica.recover():
                    try:
                        await self._persist(replica, entry)
                    except SpoolPending as err:
                        log.info("leftover spool of journal=%s waits: %s", name, err)
                        self.persist_queue.put_nowait((replica, entry))
            except (FragmentStoreError, OSError, SpoolError) as err:
                log.error(
                    "cannot persist leftover spools journal=%s err=%s; they stay for its "
                    "replica to retry",
                    name,
                    err,
                )
            finally:
                replica.close()

    @staticmethod
    def _is_consistent(item: Item, assignment: Assignment, assignments: list[Assignment]) -> bool:
        """A broker replica is consistent when it advertises the item's current route."""
        value = assignment.value
        return isinstance(value, pb.Route) and route_key(value) == route_from_assignments(
            assignments
        )

    async def run_background(self) -> None:
        """Background loops; runs until cancelled. Any loop failing fails the broker."""
        await self.member.run(("persist", self._persist_loop), ("flush", self._flush_loop))

    def _enqueue(self, replica: JournalReplica, entries: list[FragmentEntry]) -> None:
        for entry in entries:
            self.persist_queue.put_nowait((replica, entry))

    def assigned_count(self) -> int:
        mine = f"#{self.cfg.zone}#{self.cfg.suffix}#"
        return sum(1 for kv in self.keyspace.prefixed(self.keys.assign) if mine in kv.key)

    async def drain(self, timeout: float) -> bool:
        """Graceful exit: mark this member `exiting` and wait (up to `timeout`) until the
        allocator has moved every journal away. Returns whether it got there."""
        try:
            await self.member.mark_exiting()
        except EtcdError as err:
            log.error("cannot mark this broker exiting err=%s", err)
            return False
        others = [
            kv
            for kv in self.keyspace.prefixed(self.keys.members)
            if kv.key != self.keys.member(self.cfg.zone, self.cfg.suffix) and not kv.value.exiting
        ]
        if not others:
            log.info("exiting: no other broker to hand journals to")
            return False
        log.info("exiting: waiting for journals to move away count=%d", self.assigned_count())
        try:
            async with asyncio.timeout(timeout):
                await wait_until_no_assignments(self.keyspace, self.cfg.root, self.member_id)
        except TimeoutError:
            log.warning("drain timed out with %d journals still assigned", self.assigned_count())
            return False
        log.info("drained: no journals assigned")
        return True

    def end_streams(self) -> None:
        """Before the server stops: end peers' Replicate streams into us and our pipelines,
        so the server's grace period is not spent waiting on idle long-lived streams."""
        for replica in self.replicas.values():
            replica.set_route(())
            if isinstance(replica.pipeline, Pipeline):
                replica.pipeline.close()
                replica.pipeline = None

    async def shutdown(self, persist_timeout: float = 30.0) -> None:
        """Roll and persist spools of journals with stores (bounded), then release the lease.

        Spools of journals without stores stay on disk, to be recovered at the next start.
        """
        for task in [*self._pulses.values(), *self._tasks]:
            task.cancel()
        # From here on no replica is served: spools are persisted as those of unserved
        # journals, after judging them against the journal (a lost lease may mean that
        # another broker is primary already; broker.quarantine).
        closing, self.replicas = list(self.replicas.values()), {}
        for replica in closing:
            if isinstance(replica.pipeline, Pipeline):
                replica.pipeline.close()
            if replica.has_stores:
                async with replica.lock:
                    self._enqueue(replica, replica.roll())
        deadline = time.monotonic() + persist_timeout
        while not self.persist_queue.empty() and time.monotonic() < deadline:
            replica, entry = self.persist_queue.get_nowait()
            try:
                await asyncio.wait_for(self._persist(replica, entry), deadline - time.monotonic())
            except SpoolPending as err:
                log.info(
                    "spool stays for the next start journal=%s fragment=[%d,%d): %s",
                    replica.name,
                    entry.begin,
                    entry.end,
                    err,
                )
            except (FragmentStoreError, OSError, TimeoutError) as err:
                log.error(
                    "persist at shutdown failed journal=%s fragment=[%d,%d) err=%s; "
                    "its spool stays for the next start",
                    replica.name,
                    entry.begin,
                    entry.end,
                    err,
                )
        for replica in closing:
            replica.close()
        await self.cache.close()
        for channel in self._channels.values():
            await channel.close(None)
        await self.member.release()
        if self._lock_fd is not None:
            os.close(self._lock_fd)

    # --- reconciliation of replicas and assignments ---------------------------------------
    async def _reconcile_once(self) -> None:
        """Make local replicas follow this broker's assignments and advertise routes."""
        assert self.etcd is not None
        specs = {
            kv.key[len(self.keys.items) :]: kv for kv in self.keyspace.prefixed(self.keys.items)
        }
        mine = {item: a for item, a in self.member.assignments().items() if item in specs}
        for name, (akv, slot) in mine.items():
            spec_kv = specs[name]
            replica = self.replicas.get(name)
            if replica is None and name in self._dropping:
                continue  # its files are the old replica's until that drop ends (then again)
            if replica is None:
                replica = JournalReplica(
                    spec_kv.value,
                    spec_kv.mod_revision,
                    self.cfg.spool_dir,
                    sync=self.cfg.spool_sync,
                )
                try:
                    self._enqueue(replica, await replica.recover())
                except Exception:  # noqa: BLE001 - one journal must not take the broker down
                    log.exception("recovery failed journal=%s; retrying", name)
                    replica.close()
                    asyncio.get_running_loop().call_later(2.0, self.member.reconcile_soon)
                    continue
                self.replicas[name] = replica
            elif spec_kv.mod_revision != replica.mod_revision:
                replica.spec, replica.mod_revision = spec_kv.value, spec_kv.mod_revision
            route, key = self.route_and_key(name)
            replica.set_route(key)
            self._ready.setdefault(name, asyncio.Event()).set()
            if slot == 0:
                p = replica.pipeline
                synced = isinstance(p, Pipeline) and p.key == key and not p.broken
                if not synced:
                    self._start_pulse(name)
                    continue
            elif isinstance(replica.pipeline, Pipeline):
                replica.pipeline.close()  # no longer primary: peers follow someone else
                replica.pipeline = None
            if route_key(akv.value) != key:
                await self.member.advertise(akv, route)
        for name in list(self.replicas):
            if name not in mine:
                replica = self.replicas.pop(name)
                ready = self._ready.pop(name, None)
                if ready is not None:
                    ready.set()  # wake waiters: they find no replica and look again
                self._spawn_drop(replica, deleted=name not in specs)

    def _spawn_drop(self, replica: JournalReplica, *, deleted: bool) -> None:
        task = asyncio.create_task(self._drop(replica, deleted=deleted))
        self._tasks.add(task)
        self._dropping[replica.name] = task

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if self._dropping.get(replica.name) is t:
                del self._dropping[replica.name]
                self.member.reconcile_soon()  # the journal may be assigned here again

        task.add_done_callback(done)

    def _start_pulse(self, name: str) -> None:
        if name in self._pulses:
            return
        task = asyncio.create_task(self._pulse(name), name=f"pulse-{name}")
        self._pulses[name] = task
        task.add_done_callback(lambda _t: self._pulses.pop(name, None))

    async def _pulse(self, name: str) -> None:
        """As primary, synchronise the peers of the current route, then let the reconcile
        loop advertise it. Retries while this broker stays primary."""
        backoff = 0.1
        while True:
            replica = self.replicas.get(name)
            mine = self.my_assignment(name)
            if replica is None or mine is None or mine[1] != 0:
                return
            try:
                async with replica.lock:
                    await self.ensure_pipeline(replica)
                self.member.reconcile_soon()
                return
            except ReplicationError as err:
                log.warning("replication sync failed journal=%s err=%s; retrying", name, err)
            except Exception:  # noqa: BLE001 - a journal must not stay unsynchronised
                log.exception("replication sync failed journal=%s; retrying", name)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def ensure_pipeline(self, replica: JournalReplica) -> Pipeline:
        """The replication pipeline of the journal's current route, opened and synchronised
        if needed. The caller holds `replica.lock` and is the primary."""
        route, key = self.route_and_key(replica.name)
        p = replica.pipeline
        if isinstance(p, Pipeline):
            if p.key == key and not p.broken:
                return p
            p.close()
            replica.pipeline = None
        if route.primary < 0 or key[0][route.primary] != (self.cfg.zone, self.cfg.suffix):
            raise ReplicationError(f"this broker is not the primary of {replica.name}")
        if not replica.continuity:
            await self._start_fresh(replica)
        replica.reservations.tenure = 0  # a new tenure (or route): it writes its own marker
        p = Pipeline(
            replica,
            route,
            self.header(route=route),
            self.peer_stub,
            timeout=self.cfg.chunk_timeout,
        )
        await p.open(
            lambda entries: self._enqueue(replica, entries),
            lambda endpoint, begin, end: self._catch_up(replica, endpoint, begin, end),
        )
        replica.pipeline = p
        log.info("replication synchronised journal=%s peers=%d", replica.name, len(p.peers))
        return p

    async def _start_fresh(self, replica: JournalReplica) -> None:
        """Where the spool of a primary that did not follow the previous primary starts.

        A replication-1 journal starts beyond every offset reservation but our own
        (broker.reservation), so offsets an unreachable old primary acknowledged are never
        handed out again. Other journals synchronise with their peers instead."""
        if replica.spec.replication == 1 and replica.has_stores:
            reservations = replica.reservations
            # A listing from now, not from when this replica was made: the previous primary
            # may have reserved more since (we hold the lock: no append runs meanwhile).
            listing = await replica.list_stores()
            if listing.reserved is None:
                raise ReplicationError(
                    f"{replica.name}: the fragment store cannot be listed, so the offsets an "
                    f"earlier primary reserved are unknown: {'; '.join(listing.errors)}"
                )
            replica.apply_listing(listing)
            start = reservations.fresh_start(replica.write_head)
            if start > replica.write_head:
                log.warning(
                    "new primary of replication-1 journal=%s starts at %d, not %d: an earlier "
                    "primary reserved [%d, %d) and may have acknowledged content there that is "
                    "not persisted yet (it is published when that broker returns)",
                    replica.name,
                    start,
                    replica.write_head,
                    replica.write_head,
                    start,
                )
                COUNTERS.reservation_rolls += 1
                hole_from = replica.write_head
                self._enqueue(replica, replica.roll_to(start))
                replica.open_hole(hole_from, start, self.cfg.hole_wait)
        replica.continuity = True

    async def reserve(self, replica: JournalReplica, end: int) -> None:
        """Reserve offsets beyond `end` of a replication-1 journal before content up to `end`
        is acknowledged (broker.reservation). The caller holds `replica.lock`.

        Raises ReservationError if our lease may have ended (a paused or partitioned broker
        must not reserve what a new primary may already be writing) or the store fails.
        """
        if replica.spec.replication != 1 or not replica.has_stores:
            return
        reservations = replica.reservations
        # Every commit, not only those needing a marker: a primary cut off from etcd past
        # its lease may have a successor already.
        if self.session is None or self.session.lease_valid_for() <= LEASE_MARGIN:
            raise ReservationError(
                f"{replica.name}: this broker's etcd lease may have expired; another broker "
                "may be primary"
            )
        if reservations.covers(end):
            return
        offset = reservations.next_marker(end, span_for(replica.fragment_length))
        store = store_for_url(replica.spec.fragment.stores[0])
        for delay in (*RESERVE_RETRIES, None):
            try:
                await store.persist(marker(replica.name, offset), self._empty_file())
                break
            except (FragmentStoreError, OSError) as err:
                if delay is None:
                    replica.store_health_error = str(err)
                    raise ReservationStoreError(
                        f"{replica.name}: cannot reserve offsets up to {offset} (replication 1 "
                        f"reserves offsets in its first store before acknowledging): {err}"
                    ) from err
                await asyncio.sleep(delay)
        if self.session.lease_valid_for() <= LEASE_MARGIN:
            raise ReservationError(
                f"{replica.name}: this broker's etcd lease may have expired while reserving "
                "offsets; another broker may be primary"
            )
        reservations.wrote(offset, sync=replica.sync)
        COUNTERS.reservations += 1
        replaced = reservations.replaced()
        if replaced:
            self._spawn(self._remove_markers(store.url, replica.name, replaced))

    def relieve_disk(self) -> None:
        """The spool disk is full: drop the fragment cache and roll every spool this broker
        writes as primary, so the persist loop uploads them and removes their files. At most
        once per `RELIEF_INTERVAL` (appends failing meanwhile just retry)."""
        now = time.monotonic()
        if now - self._relieved_at < RELIEF_INTERVAL:
            return
        self._relieved_at = now
        COUNTERS.spool_disk_full += 1
        freed = self.cache.clear()
        rolling = [
            r
            for r in self.replicas.values()
            if r.has_stores and r.spool is not None and len(r.spool) and self._is_primary(r.name)
        ]
        log.error(
            "spool disk full dir=%s: dropped %d bytes of cached fragments, rolling %d spools "
            "to persist and remove them (%d already queued)",
            self.cfg.spool_dir,
            freed,
            len(rolling),
            self.persist_queue.qsize(),
        )
        for replica in rolling:
            self._spawn(self._roll_primary(replica))

    def reserve_ahead(self, replica: JournalReplica) -> None:
        """After a commit: once the head is within half a span of the furthest reservation,
        extend it in the background, so appends rarely wait for a marker write."""
        if replica.spec.replication != 1 or not replica.has_stores:
            return
        half = span_for(replica.fragment_length) // 2
        if replica.reservations.tenure - replica.write_head > half:
            return
        if replica.name in self._reserving:
            return
        self._reserving.add(replica.name)

        async def extend() -> None:
            try:
                if self.replicas.get(replica.name) is replica and self._is_primary(replica.name):
                    await self.reserve(replica, replica.write_head + half + 1)
            except ReservationError as err:
                log.warning("reserving ahead failed journal=%s err=%s", replica.name, err)
            finally:
                self._reserving.discard(replica.name)

        self._spawn(extend())

    async def _remove_markers(self, url: str, journal: str, offsets: list[int]) -> None:
        """Remove reservations that a newer one replaced (best effort: a marker left behind
        only reserves offsets below the newer one)."""
        for offset in offsets:
            try:
                await store_for_url(url).remove(marker(journal, offset))
            except (FragmentStoreError, OSError) as err:
                log.warning(
                    "cannot remove old reservation journal=%s at=%d err=%s", journal, offset, err
                )

    def _empty_file(self) -> Path:
        path = self.cfg.spool_dir / "empty"
        if not path.exists() or path.stat().st_size:
            path.write_bytes(b"")
        return path

    def _spawn(self, coro: Any) -> None:
        """Run background work owned by the broker (cancelled at shutdown)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _catch_up(self, replica: JournalReplica, endpoint: str, begin: int, end: int) -> None:
        """Copy committed content [begin, end) that a peer holds beyond our head into our
        spool (caller holds the lock). Content the peer can no longer serve from its spools
        is left to the fragment stores: we then roll forward to `end`, logging the gap."""
        spool = replica.ensure_spool()
        pending = spool.begin_append()
        offset = begin
        req = pb.ReadRequest(
            journal=replica.name, offset=begin, end_offset=end, block=False, do_not_proxy=True
        )
        try:
            async with asyncio.timeout(self.cfg.chunk_timeout):
                async for resp in self.peer_stub(endpoint).Read(req):
                    if resp.status != pb.OK or resp.offset != offset:
                        break
                    if resp.content:
                        pending.write(resp.content)
                        offset += len(resp.content)
                    if offset >= end:
                        break
        except BaseException as err:
            pending.rollback()  # also when cancelled: no bytes past the spool's end
            if isinstance(err, grpc.aio.AioRpcError | TimeoutError | SpoolError):
                raise ReplicationError(
                    f"catching up {replica.name} from {endpoint}: {err}"
                ) from err
            raise
        if len(pending):
            pending.commit()
            replica.committed(spool)
        else:
            pending.rollback()
        if offset < end:
            log.error(
                "peer %s could not serve [%d, %d) of %s from its spools; rolling forward "
                "(the content is expected in the fragment stores)",
                endpoint,
                offset,
                end,
                replica.name,
            )
            self._enqueue(replica, replica.roll_to(end))
            replica.last_refresh = 0.0  # list the stores at the next flush tick

    def _is_primary(self, name: str) -> bool:
        mine = self.my_assignment(name)
        return mine is not None and mine[1] == 0

    async def _roll_primary(self, replica: JournalReplica) -> None:
        """Roll the primary's spool (length or flush interval) and have its peers roll too.
        Peers never roll on their own: their spools follow the primary's proposals."""
        async with replica.lock:
            self._enqueue(replica, replica.roll())
            p = replica.pipeline
            if isinstance(p, Pipeline) and not p.broken:
                try:
                    await p.propose(replica.ensure_spool().fragment(), replica.registers)
                except ReplicationError as err:
                    log.warning("peers did not roll journal=%s err=%s", replica.name, err)

    async def _drop(self, replica: JournalReplica, *, deleted: bool) -> None:
        """Stop serving a journal no longer assigned here (or deleted): persist its spool."""
        replica.set_route(())
        if isinstance(replica.pipeline, Pipeline):
            replica.pipeline.close()
        async with replica.lock:
            self._enqueue(replica, replica.roll())
            if deleted:
                replica.delete()
                log.info("journal deleted journal=%s", replica.name)
            else:
                replica.close()
                log.info("journal unassigned journal=%s", replica.name)

    # --- persistence ------------------------------------------------------------------------
    async def _persist_loop(self) -> None:
        while True:
            replica, entry = await self.persist_queue.get()
            backoff = 0.5
            while True:
                try:
                    await self._persist(replica, entry)
                    break
                except SpoolPending as err:
                    # Judged again later, without holding up other journals' spools.
                    log.info(
                        "spool of unserved journal=%s fragment=[%d,%d) waits: %s",
                        replica.name,
                        entry.begin,
                        entry.end,
                        err,
                    )
                    asyncio.get_running_loop().call_later(
                        PENDING_RETRY, self.persist_queue.put_nowait, (replica, entry)
                    )
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
        if not entry.local_path.exists():
            # Persisted already, by an earlier replica object of this journal on this broker.
            log.info("spool already gone journal=%s path=%s", replica.name, entry.local_path)
            replica.mark_persisted(entry, None)
            COUNTERS.spool_persisted += 1
            return
        stores = list(replica.spec.fragment.stores)
        current = self.replicas.get(replica.name)
        if stores and current is not replica:
            if current is not None:
                # Served here again: the current replica recovered these spool files as
                # its own and persists them.
                return
            # Not ours to serve (any more): publish only what cannot fork the journal.
            if not await self._publishable(replica, entry):
                return
            unowned = True
        else:
            unowned = False
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
        if persisted is not None:  # Else a journal without stores dropped it.
            COUNTERS.spool_persisted += 1
        stem = entry.local_path.name[: -len(SPOOL_SUFFIX)]
        for p in (entry.local_path, entry.local_path.with_name(stem + COMMITS_SUFFIX)):
            p.unlink(missing_ok=True)
        if unowned and replica.spec.replication == 1 and entry.end >= replica.local_end:
            await self._close_hole(replica, entry.end)

    async def _close_hole(self, replica: JournalReplica, end: int) -> None:
        """Our last spool of a replication-1 journal we no longer serve is published: a
        marker at its end tells the journal's new primary that nothing more of ours will
        come, so its readers stop waiting in the hole it left (broker.reservation)."""
        try:
            await store_for_url(replica.spec.fragment.stores[0]).persist(
                marker(replica.name, end), self._empty_file()
            )
        except (FragmentStoreError, OSError) as err:
            log.warning(
                "cannot mark our content's end journal=%s at=%d err=%s", replica.name, end, err
            )

    async def _publishable(self, replica: JournalReplica, entry: FragmentEntry) -> bool:
        """Judge a spool of a journal this broker does not serve (broker.quarantine): True
        to persist it; else it was dropped as redundant or quarantined. Raises SpoolPending
        while it must wait for the journal."""
        assert entry.local_path is not None
        verdict = await self._judge(replica, entry)
        key = (replica.name, entry.begin)
        if verdict.action == "wait":
            since = self._pending_since.setdefault(key, time.monotonic())
            if time.monotonic() - since < WAIT_LIMIT:
                raise SpoolPending(f"spool [{entry.begin}, {entry.end}): {verdict.reason}")
            verdict = Verdict("quarantine", f"{verdict.reason} (for over {WAIT_LIMIT:.0f}s)")
        self._pending_since.pop(key, None)
        stem = entry.local_path.name[: -len(SPOOL_SUFFIX)]
        commits = entry.local_path.with_name(stem + COMMITS_SUFFIX)
        if verdict.action == "publish":
            log.info(
                "publishing spool of unserved journal=%s range=[%d,%d): %s",
                replica.name,
                entry.begin,
                entry.end,
                verdict.reason,
            )
            return True
        if verdict.action == "redundant":
            log.info(
                "dropping spool of unserved journal=%s range=[%d,%d): %s",
                replica.name,
                entry.begin,
                entry.end,
                verdict.reason,
            )
            COUNTERS.spools_redundant += 1
            entry.local_path.unlink(missing_ok=True)
            commits.unlink(missing_ok=True)
            if replica.spec.replication == 1 and entry.end >= replica.local_end:
                await self._close_hole(replica, entry.end)  # e.g. published before a crash
        else:
            quarantine(self.cfg.spool_dir, entry.spec, entry.local_path, commits, verdict.reason)
        replica.mark_persisted(entry, None)
        return False

    async def _judge(self, replica: JournalReplica, entry: FragmentEntry) -> Verdict:
        """Compare a spool with the journal's content over its range (broker.quarantine)."""
        assert entry.local_path is not None
        cmp = Comparison(entry.local_path, entry.begin, entry.end)
        for url in replica.spec.fragment.stores:
            store = store_for_url(url)
            try:
                listed = await store.list(replica.name)
            except FragmentStoreError as err:
                raise SpoolPending(f"cannot list {url} to compare: {err}") from err
            for f in listed:
                if is_marker(f) or f.end <= entry.begin or f.begin >= entry.end:
                    continue
                try:
                    with tempfile.TemporaryDirectory(dir=self.cfg.spool_dir) as tmp:
                        dest = Path(tmp) / "fragment"
                        await store.fetch(f, dest)
                        data = await asyncio.to_thread(dest.read_bytes)
                except (FragmentStoreError, OSError) as err:
                    raise SpoolPending(f"cannot read [{f.begin}, {f.end}) of {url}: {err}") from err
                cmp.observe(f.begin, data, f"fragment [{f.begin}, {f.end}) in {url}")
        own = replica.reservations.own if replica.spec.replication == 1 else 0
        if cmp.mismatch or own >= entry.end:
            # Below our own reservation no other primary writes (broker.reservation): what
            # the stores hold is all that can differ.
            return cmp.verdict(own)
        route = self.route_of(replica.name)
        if route.primary < 0 or route.members[route.primary] == self.process_id:
            return cmp.verdict(None)  # no primary elsewhere: nobody writes there now
        head = await self._read_primary(
            cmp, route.endpoints[route.primary], replica.name, entry.begin, entry.end
        )
        return cmp.verdict(None if head is None else max(head, own))

    async def _read_primary(
        self, cmp: Comparison, endpoint: str, journal: str, begin: int, end: int
    ) -> int | None:
        """Feed `cmp` what the journal's primary serves over [begin, end); returns its write
        head (None if the journal is gone). Raises SpoolPending if it cannot be read."""
        req = pb.ReadRequest(journal=journal, offset=begin, end_offset=end, block=False)
        head = begin
        try:
            async with asyncio.timeout(self._judging_timeout):
                async for resp in self.peer_stub(endpoint).Read(req):
                    if resp.status == pb.JOURNAL_NOT_FOUND:
                        return None
                    if resp.status not in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
                        raise SpoolPending(f"primary {endpoint}: {pb.Status.Name(resp.status)}")
                    head = max(head, resp.write_head)
                    if resp.content:
                        cmp.observe(resp.offset, resp.content, f"primary {endpoint}")
                        head = max(head, resp.offset + len(resp.content))
        except (grpc.aio.AioRpcError, TimeoutError) as err:
            raise SpoolPending(f"reading {journal} from primary {endpoint}: {err}") from err
        return head

    async def _flush_loop(self) -> None:
        """Roll spools due to length or flush interval; refresh indexes from the stores."""
        while True:
            await asyncio.sleep(1.0)
            now = time.time()
            for replica in list(self.replicas.values()):
                try:
                    if (
                        replica.should_roll(now)
                        and not replica.lock.locked()
                        and self._is_primary(replica.name)
                    ):
                        await self._roll_primary(replica)
                    if (
                        time.monotonic() - replica.last_refresh >= replica.refresh_interval
                        and not replica.lock.locked()
                    ):
                        await replica.relist(wait=False)  # never block the loop here
                except Exception:  # noqa: BLE001 - keep serving; retried next tick
                    log.exception("flush/refresh failed journal=%s", replica.name)
