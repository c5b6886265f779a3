"""The journal replicas a broker keeps for its assignments, and their life cycle.

At each change of the keyspace the member's reconcile loop calls `ReplicaSet.reconcile`:
a journal newly assigned here gets a JournalReplica, recovered from its spools and the
fragment stores, and is marked ready for requests (`Resolver.mark_ready`); a changed spec is
taken on; a replica no longer assigned (or whose journal was deleted) is dropped in the
background, its spool rolled for the persist queue. Each replica advertises the journal's
route as its assignment's value: a peer as soon as it sees the route, the primary once its
replication pipeline has synchronised every peer under that route (a *pulse*, retried while
this broker stays primary; `ensure_pipeline`). A primary that did not follow the previous
one starts its spool where offset reservations allow (`broker.reservation`), and catches
up content a peer holds beyond its head.

The flush loop rolls a primary's spool due to length or flush interval (its peers roll on
its proposal, never on their own) and refreshes each replica's index from the stores.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
import grpc.aio

from gazette.allocator.member import Member
from gazette.broker.config import BrokerConfig
from gazette.broker.fragment.coverset import FragmentEntry
from gazette.broker.metrics import COUNTERS
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.replica import JournalReplica
from gazette.broker.replication import Pipeline, ReplicationError, RouteKey, route_key
from gazette.broker.resolver import Keys, Resolver
from gazette.broker.spool import PendingAppend, Spool, SpoolError

log = logging.getLogger(__name__)


class ReplicaSet:
    """The broker's replicas (`replicas`, shared with the broker: the one mapping of the
    journals served here), made to follow its assignments.

    `enqueue` hands rolled spools to the persist queue (`Persister.enqueue`), `peer_stub`
    reaches other brokers, and `spawn` runs background work the broker owns (cancelled at
    its shutdown) and returns its task.
    """

    def __init__(
        self,
        cfg: BrokerConfig,
        member: Member,
        keys: Keys,
        replicas: dict[str, JournalReplica],
        resolver: Resolver,
        enqueue: Callable[[JournalReplica, list[FragmentEntry]], None],
        peer_stub: Callable[[str], Any],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        self.cfg = cfg
        self.member = member
        self.keys = keys
        self.replicas = replicas
        self.resolver = resolver
        self._enqueue = enqueue
        self._peer_stub = peer_stub
        self._spawn = spawn
        self._pulses: dict[str, asyncio.Task[None]] = {}
        self._dropping: dict[str, asyncio.Task[None]] = {}

    # --- reconciliation of replicas and assignments ---------------------------------------
    async def reconcile(self) -> None:
        """Make local replicas follow this broker's assignments and advertise routes."""
        assert self.member.etcd is not None
        keyspace = self.member.keyspace
        specs = {kv.key[len(self.keys.items) :]: kv for kv in keyspace.prefixed(self.keys.items)}
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
            route, key = self.resolver.route_and_key(name)
            replica.set_route(key)
            self.resolver.mark_ready(name)
            if slot == 0:
                p = replica.pipeline
                synced = isinstance(p, Pipeline) and p.key == key and not p.broken
                if not synced:
                    self._start_pulse(name)
                    continue
            else:
                replica.leading = False
                if isinstance(replica.pipeline, Pipeline):
                    replica.pipeline.close()  # no longer primary: peers follow someone else
                    replica.pipeline = None
            if route_key(akv.value) != key:
                await self.member.advertise(akv, route)
        for name in list(self.replicas):
            if name not in mine:
                replica = self.replicas.pop(name)
                replica.stop_serving(deleted=name not in specs)
                self.resolver.forget(name)
                self._spawn_drop(replica, deleted=replica.deleted)

    def _spawn_drop(self, replica: JournalReplica, *, deleted: bool) -> None:
        task = self._spawn(self._drop(replica, deleted=deleted))
        self._dropping[replica.name] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._dropping.get(replica.name) is t:
                del self._dropping[replica.name]
                self.member.reconcile_soon()  # the journal may be assigned here again

        task.add_done_callback(done)

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

    # --- the primary's pipeline -----------------------------------------------------------
    def _start_pulse(self, name: str) -> None:
        if name in self._pulses:
            return
        task = asyncio.create_task(self._pulse(name), name=f"pulse-{name}")
        self._pulses[name] = task
        task.add_done_callback(lambda _t: self._pulses.pop(name, None))

    def cancel_pulses(self) -> None:
        """At shutdown: stop synchronising peers."""
        for task in list(self._pulses.values()):
            task.cancel()

    async def _pulse(self, name: str) -> None:
        """As primary, synchronise the peers of the current route, then let the reconcile
        loop advertise it. Retries while this broker stays primary."""
        backoff = 0.1
        while True:
            replica = self.replicas.get(name)
            if replica is None or not self.resolver.is_primary(name):
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
        route, key = self.resolver.route_and_key(replica.name)
        p = replica.pipeline
        if isinstance(p, Pipeline):
            if p.key == key and not p.broken:
                return p
            p.close()
            replica.pipeline = None
        if route.primary < 0 or key[0][route.primary] != (self.cfg.zone, self.cfg.suffix):
            raise ReplicationError(f"this broker is not the primary of {replica.name}")
        if not replica.continuity:
            await self._start_fresh(replica, key)
        replica.reservations.tenure = 0  # a new tenure (or route): it writes its own marker
        p = Pipeline(
            replica,
            route,
            self.resolver.header(route=route),
            self._peer_stub,
            timeout=self.cfg.chunk_timeout,
        )
        await p.open(
            lambda entries: self._enqueue(replica, entries),
            lambda endpoint, begin, end: self._catch_up(replica, endpoint, begin, end),
        )
        replica.pipeline = p
        replica.continuity = True  # our spool holds what every peer of the route held
        replica.leading = True
        log.info("replication synchronised journal=%s peers=%d", replica.name, len(p.peers))
        return p

    async def _start_fresh(self, replica: JournalReplica, key: RouteKey) -> None:
        """Where the spool of a primary that did not follow the previous primary starts.

        A replication-1 journal starts beyond every offset reservation but our own
        (broker.reservation), so offsets an unreachable old primary acknowledged are never
        handed out again; unless the previous primary is a peer of the route `key` (a
        hand-off): the pipeline then brings its content here, with no hole, and fails
        while it does not answer (we come back here once the route has dropped it). Other
        journals synchronise with their peers."""
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
            members, _primary = key
            handing_over = replica.previous_primary
            if handing_over in members and handing_over != (self.cfg.zone, self.cfg.suffix):
                log.info(
                    "replication-1 journal=%s handed over by %s: taking its content",
                    replica.name,
                    handing_over,
                )
                return  # `continuity` is set once the pipeline synchronised with it
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

    async def _catch_up(self, replica: JournalReplica, endpoint: str, begin: int, end: int) -> None:
        """Copy committed content [begin, end) that a peer holds beyond our head into our
        spool (caller holds the lock). Where the peer's content jumps (a replication-1
        journal's reservation hole), our spool rolls forward with it. Where the peer has
        persisted it (a returning member persists the spools it recovers), its fragment
        joins our index, served from the store, and our spool rolls past it.

        Content the peer cannot serve at all is rolled forward over as a hole: blocking
        readers wait there (up to `hole_wait`) for it to be published, from the stores or
        from spools that earlier members left (broker.leftovers), instead of jumping over
        content that was acknowledged. A recovery-log player takes such a jump for removed
        history, and would recover without that content."""
        offset = begin
        while offset < end:
            offset, persisted = await self._copy_from_peer(replica, endpoint, offset, end)
            if persisted is None:
                break
            log.info(
                "peer's content of journal=%s [%d, %d) is persisted in %s: indexing it",
                replica.name,
                persisted.begin,
                persisted.end,
                persisted.backing_store,
            )
            replica.index.add(FragmentEntry(spec=persisted))
            replica.index_epoch += 1  # a listing begun before this must not drop it
            self._enqueue(replica, replica.roll_to(max(persisted.end, replica.write_head)))
            offset = persisted.end
        if offset < end:
            log.error(
                "peer %s could not serve [%d, %d) of %s; rolling forward, and readers wait "
                "there up to %.0fs for the content to be published",
                endpoint,
                offset,
                end,
                replica.name,
                self.cfg.hole_wait,
            )
            self._enqueue(replica, replica.roll_to(end))
            replica.open_hole(offset, end, self.cfg.hole_wait)
            replica.last_refresh = 0.0  # list the stores at the next flush tick

    async def _copy_from_peer(
        self, replica: JournalReplica, endpoint: str, begin: int, end: int
    ) -> tuple[int, pb.Fragment | None]:
        """One Read of [begin, end) from the peer's spools into ours (`_catch_up`). Returns
        the offset reached, and the fragment there if the peer answered that it is
        persisted in one of the journal's stores (it does not proxy content from stores)."""
        spool = replica.ensure_spool()
        pending = spool.begin_append()
        offset = begin
        persisted: pb.Fragment | None = None
        req = pb.ReadRequest(
            journal=replica.name, offset=begin, end_offset=end, block=False, do_not_proxy=True
        )
        try:
            async with asyncio.timeout(self.cfg.chunk_timeout):
                async for resp in self._peer_stub(endpoint).Read(req):
                    if resp.status == pb.OK and not resp.content and offset < resp.offset < end:
                        _settle(replica, spool, pending)
                        log.info(
                            "peer's content of journal=%s jumps from %d to %d: rolling with it",
                            replica.name,
                            offset,
                            resp.offset,
                        )
                        self._enqueue(replica, replica.roll_to(resp.offset))
                        offset = resp.offset
                        spool = replica.ensure_spool()
                        pending = spool.begin_append()
                    if resp.status != pb.OK or resp.offset != offset:
                        break
                    persisted = None
                    if resp.content:
                        pending.write(resp.content)
                        offset += len(resp.content)
                    elif resp.fragment.backing_store in replica.spec.fragment.stores:
                        persisted = pb.Fragment()
                        persisted.CopyFrom(resp.fragment)
                    if offset >= end:
                        break
        except BaseException as err:
            pending.rollback()  # also when cancelled: no bytes past the spool's end
            if isinstance(err, grpc.aio.AioRpcError | TimeoutError | SpoolError):
                raise ReplicationError(
                    f"catching up {replica.name} from {endpoint}: {err}"
                ) from err
            raise
        _settle(replica, spool, pending)
        if persisted is not None and not persisted.begin <= offset < persisted.end:
            persisted = None
        return offset, persisted

    def end_streams(self) -> None:
        """End peers' Replicate streams into us and our pipelines."""
        for replica in self.replicas.values():
            replica.set_route(())
            if isinstance(replica.pipeline, Pipeline):
                replica.pipeline.close()
                replica.pipeline = None

    # --- rolling and refreshing -----------------------------------------------------------
    async def roll_primary(self, replica: JournalReplica) -> None:
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

    async def flush_loop(self) -> None:
        """Roll spools due to length or flush interval; refresh indexes from the stores."""
        while True:
            await asyncio.sleep(1.0)
            now = time.time()
            for replica in list(self.replicas.values()):
                try:
                    if (
                        replica.should_roll(now)
                        and not replica.lock.locked()
                        and self.resolver.is_primary(replica.name)
                    ):
                        await self.roll_primary(replica)
                    if (
                        time.monotonic() - replica.last_refresh >= replica.refresh_interval
                        and not replica.lock.locked()
                    ):
                        await replica.relist(wait=False)  # never block the loop here
                except Exception:  # noqa: BLE001 - keep serving; retried next tick
                    log.exception("flush/refresh failed journal=%s", replica.name)


def _settle(replica: JournalReplica, spool: Spool, pending: PendingAppend) -> None:
    """Commit what a catch-up copied into `spool` (publishing it to the index), or roll the
    empty append back."""
    if len(pending):
        pending.commit()
        replica.committed(spool)
    else:
        pending.rollback()
