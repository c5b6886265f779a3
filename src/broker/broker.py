"""The Broker: a broker process's composition of its member, resolver, replicas and persister.

The broker announces itself at `{root}/members/{zone}#{suffix}` under its lease and runs the
shared allocator (allocator.Allocator): the leader among the brokers assigns each journal to
`replication` brokers, writing `{root}/assign/{journal}#{zone}#{suffix}#{slot}` keys (slot 0 =
primary) under each broker's lease (upstream's etcd layout). A broker keeps a JournalReplica for
every journal assigned to it and advertises the journal's Route as its assignment's value: a peer as
soon as it sees the route, the primary once its replication pipeline has synchronised every
peer under that route (broker.replication). The allocator counts a replica as consistent when
its advertised route equals the current one, and removes replicas only while enough remain
consistent, so a route change never leaves committed content on too few brokers.

Each job is an object the Broker holds, sharing its one mapping of served replicas:

- `member` (allocator.member): the lease, keyspace mirror, allocator and reconcile loop;
- `resolver` (broker.resolver): routes, headers, readiness and where a request is served;
- `replica_set` (broker.replica_set): replicas following the assignments, pipelines, rolls;
- `persister` (broker.persister): the persist queue, leftover spools at start, shutdown;
- `judge` (broker.leftovers): whether a spool of an unserved journal may be published;
- `reserver` (broker.reserver): offset reservations of replication-1 journals;
- `peers` (broker.peers): the channels to other brokers.

The Broker itself keeps what spans them: start and shutdown, drain, relief of a full spool
disk, and the names the Journal service, the HTTP side and main use.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any

from gazette.allocator.allocator import Allocator
from gazette.allocator.member import Member
from gazette.allocator.model import Assignment, Item, MemberID
from gazette.allocator.session import MemberExistsError, MemberSession
from gazette.auth.grpc_auth import authorized
from gazette.auth.keys import NO_AUTH, KeyedAuth, NoAuth
from gazette.broker.config import BrokerConfig
from gazette.broker.fragment.coverset import FragmentEntry
from gazette.broker.fragment_cache import FragmentCache
from gazette.broker.leftovers import LeftoverJudge
from gazette.broker.metrics import COUNTERS
from gazette.broker.peers import Peers
from gazette.broker.persister import Persister
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.replica import JournalReplica
from gazette.broker.replica_set import ReplicaSet
from gazette.broker.replication import Pipeline, RouteKey, route_key
from gazette.broker.reserver import Reserver
from gazette.broker.resolver import Keys, Resolution, Resolver, route_from_assignments
from gazette.keyspace.etcd import Etcd, EtcdError
from gazette.keyspace.keyspace import KeySpace, KeyValue
from gazette.mainboilerplate.process import StartupError

# Resolution and Keys are the resolver's; importing them from here keeps working.
__all__ = ["RELIEF_INTERVAL", "Broker", "BrokerStartupError", "Keys", "Resolution"]

log = logging.getLogger(__name__)

RELIEF_INTERVAL = 2.0
"""Seconds between two reliefs of a full spool disk."""


class BrokerStartupError(StartupError):
    """The broker cannot start (etcd unreachable, duplicate member id, locked spool dir)."""


class Broker:
    """A broker process's state. `run()` serves until cancelled or `stop()` is called."""

    def __init__(self, cfg: BrokerConfig, auth: KeyedAuth | NoAuth = NO_AUTH) -> None:
        self.cfg = cfg
        self.auth = auth
        """Verifies the calls served here, and signs this broker's calls to its peers."""
        self._peer_stubs: dict[str, tuple[Any, Any]] = {}
        self.keys = Keys(cfg.root)
        self.process_id = pb.ProcessSpec.ID(zone=cfg.zone, suffix=cfg.suffix)
        self.member_id = MemberID(cfg.zone, cfg.suffix)
        self.spec = pb.BrokerSpec(
            process_spec=pb.ProcessSpec(id=self.process_id, endpoint=cfg.endpoint),
            journal_limit=cfg.journal_limit,
        )
        self.member = Member(
            etcd_endpoint=cfg.etcd,
            etcd_tls=cfg.etcd_tls,
            root=cfg.root,
            member_id=self.member_id,
            spec=self.spec,
            decode_spec=pb.BrokerSpec.FromString,
            keyspace=KeySpace(cfg.root + "/", self.keys.decode),
            lease_ttl=cfg.lease_ttl,
            reconcile=lambda: self._reconcile_once(),
            item_replication=lambda spec: int(spec.replication),
            member_limit=lambda spec: int(spec.journal_limit),
            is_consistent=self._is_consistent,
        )
        # The journals served here: one mapping, shared by every part (never rebound).
        self.replicas: dict[str, JournalReplica] = {}
        self.cache = FragmentCache(cfg.spool_dir / "cache", cfg.cache_bytes)
        self._lock_fd: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._relieved_at = -RELIEF_INTERVAL
        self.peers = Peers(cfg.peer_tls)
        self.resolver = Resolver(
            self.member, self.keys, self.member_id, self.process_id, self.replicas
        )
        self.reserver = Reserver(
            cfg.spool_dir,
            lambda: self.member.session,
            self.replicas,
            self.resolver.is_primary,
            self._spawn,
        )
        # How long judging a spool may read the journal's primary: as an append's chunk
        # (shorter while starting, so that no unreachable primary holds the start up).
        self.judge = LeftoverJudge(
            cfg.spool_dir,
            self.process_id,
            self.resolver.route_of,
            self.peer_stub,
            self.reserver.close_hole,
            timeout=cfg.chunk_timeout,
        )
        self.persister = Persister(
            cfg.spool_dir, self.replicas, self.judge, self.reserver.close_hole
        )
        self.persist_queue: asyncio.Queue[tuple[JournalReplica, FragmentEntry]] = (
            self.persister.queue
        )
        self.replica_set = ReplicaSet(
            cfg,
            self.member,
            self.keys,
            self.replicas,
            self.resolver,
            self.persister.enqueue,
            self.peer_stub,
            self._spawn,
        )

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

    @staticmethod
    def _is_consistent(item: Item, assignment: Assignment, assignments: list[Assignment]) -> bool:
        """A broker replica is consistent when it advertises the item's current route."""
        value = assignment.value
        return isinstance(value, pb.Route) and route_key(value) == route_from_assignments(
            assignments
        )

    async def _reconcile_once(self) -> None:
        """The member's reconcile step: replicas follow the assignments (`ReplicaSet`)."""
        await self.replica_set.reconcile()

    # --- what the Journal service uses (broker.resolver, .replica_set, .reserver) ---------
    def etcd_header(self) -> pb.Header.Etcd:
        return self.resolver.etcd_header()

    def route_of(self, journal: str) -> pb.Route:
        """The journal's Route (cached until the keyspace changes: do not modify it)."""
        return self.resolver.route_of(journal)

    def route_and_key(self, journal: str) -> tuple[pb.Route, RouteKey]:
        return self.resolver.route_and_key(journal)

    def my_assignment(self, journal: str) -> tuple[KeyValue[Any], int] | None:
        return self.resolver.my_assignment(journal)

    def header(self, journal: str | None = None, route: pb.Route | None = None) -> pb.Header:
        """This broker's response Header (`Resolver.header`: do not modify it)."""
        return self.resolver.header(journal, route)

    def peer_stub(self, endpoint: str) -> Any:
        """A `protocol.Journal` stub on another broker (channels are kept and reused), its
        calls signed by this broker when authorization is on."""
        raw = self.peers.stub(endpoint)  # A new one once the old channel is stuck.
        cached = self._peer_stubs.get(endpoint)
        if cached is None or cached[0] is not raw:
            cached = self._peer_stubs[endpoint] = (raw, authorized(raw, self.auth))
        return cached[1]

    async def peer_connected(self, endpoint: str) -> None:
        """Before forwarding a request to the broker at `endpoint`: give our channel to it a
        moment to connect, if it is not connected (`Peers.connected`)."""
        await self.peers.connected(endpoint)

    async def resolve(
        self,
        journal: str,
        *,
        min_etcd_revision: int = 0,
        require_primary: bool = False,
        may_proxy: bool = True,
        timeout: float = 10.0,
        covered: Callable[[pb.LabelSet], bool] | None = None,
        proxy_header: pb.Header | None = None,
    ) -> Resolution:
        """Where a request of `journal` is served (`Resolver.resolve`). Raises TimeoutError
        if the keyspace or the journal's replica is not ready within `timeout`."""
        return await self.resolver.resolve(
            journal,
            min_etcd_revision=min_etcd_revision,
            require_primary=require_primary,
            may_proxy=may_proxy,
            timeout=timeout,
            covered=covered,
            proxy_header=proxy_header,
        )

    async def ensure_pipeline(self, replica: JournalReplica) -> Pipeline:
        """The journal's synchronised pipeline (`ReplicaSet.ensure_pipeline`)."""
        return await self.replica_set.ensure_pipeline(replica)

    async def reserve(self, replica: JournalReplica, end: int) -> None:
        """Reserve offsets beyond `end` before acknowledging up to it (`Reserver.reserve`)."""
        await self.reserver.reserve(replica, end)

    def reserve_ahead(self, replica: JournalReplica) -> None:
        self.reserver.reserve_ahead(replica)

    async def _persist(self, replica: JournalReplica, entry: FragmentEntry) -> None:
        await self.persister.persist(replica, entry)

    # --- life cycle -----------------------------------------------------------------------
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
        # Not serving yet: judging a leftover spool reads the primary briefly.
        await self.persister.persist_leftover_spools(
            lambda name: self.keyspace.get(self.keys.item(name)),
            min(self.cfg.chunk_timeout, self.cfg.lease_ttl / 4),
        )

    async def run_background(self) -> None:
        """Background loops; runs until cancelled. Any loop failing fails the broker."""
        await self.member.run(
            ("persist", self.persister.run), ("flush", self.replica_set.flush_loop)
        )

    def _movable(self) -> list[str]:
        """Journals assigned here that another broker can still take (`Allocator.movable`):
        when every broker stops at once, none can, and none waits out its drain bound."""
        assert self.member.allocator is not None
        return self.member.allocator.movable(self.member_id, self.member.assignments())

    def assigned_count(self) -> int:
        mine = f"#{self.cfg.zone}#{self.cfg.suffix}#"
        return sum(1 for kv in self.keyspace.prefixed(self.keys.assign) if mine in kv.key)

    async def drain(self, timeout: float) -> bool:
        """Graceful exit: mark this member `exiting` and wait (up to `timeout`) until the
        allocator has moved away every journal another broker can take. Returns whether
        none is left here."""
        try:
            await self.member.mark_exiting()
        except EtcdError as err:
            log.error("cannot mark this broker exiting err=%s", err)
            return False
        log.info("exiting: waiting for journals to move away count=%d", self.assigned_count())
        try:
            async with asyncio.timeout(timeout):
                while True:
                    revision = self.keyspace.revision
                    if not self._movable():
                        break
                    await self.keyspace.wait_for_change(revision)
        except TimeoutError:
            log.warning("drain timed out with %d journals still assigned", self.assigned_count())
            return False
        if self.assigned_count():
            log.info(
                "exiting: no other broker can take the journals left count=%d",
                self.assigned_count(),
            )
            return False
        log.info("drained: no journals assigned")
        return True

    def end_streams(self) -> None:
        """Before the server stops: end peers' Replicate streams into us and our pipelines,
        so the server's grace period is not spent waiting on idle long-lived streams."""
        self.replica_set.end_streams()

    async def shutdown(self, persist_timeout: float = 30.0) -> None:
        """Roll and persist spools of journals with stores (bounded), then release the lease.

        Spools of journals without stores stay on disk, to be recovered at the next start.
        """
        self.replica_set.cancel_pulses()
        for task in list(self._tasks):
            task.cancel()
        # From here on no replica is served: spools are persisted as those of unserved
        # journals, after judging them against the journal (a lost lease may mean that
        # another broker is primary already; broker.leftovers).
        closing = list(self.replicas.values())
        self.replicas.clear()
        for replica in closing:
            if isinstance(replica.pipeline, Pipeline):
                replica.pipeline.close()
            if replica.has_stores:
                async with replica.lock:
                    self.persister.enqueue(replica, replica.roll())
        await self.persister.persist_remaining(persist_timeout)
        for replica in closing:
            replica.close()
        await self.cache.close()
        await self.peers.close()
        await self.member.release()
        if self._lock_fd is not None:
            os.close(self._lock_fd)

    # --- a full spool disk ------------------------------------------------------------------
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
            if r.has_stores
            and r.spool is not None
            and len(r.spool)
            and self.resolver.is_primary(r.name)
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
            self._spawn(self.replica_set.roll_primary(replica))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run background work owned by the broker (cancelled at shutdown)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
