"""A consumer process: its member session, the allocator, and the shards assigned to it.

The process is a member of the application's keyspace (`allocator.member.Member`): it
announces ``{root}/members/{zone}#{suffix}`` (a ConsumerSpec, under its lease), mirrors the
keyspace, runs the shared allocator and reconciles its replicas at each change. Each shard
gets ``1 + hot_standbys`` replicas (at most ``--max-hot-standbys`` standbys); a replica
counts as consistent once it reports STANDBY or PRIMARY, so the allocator moves a primary
away only after its successor caught up with the recovery log (zero-downtime hand-off, even
without standbys).

For every assignment of this process a `ShardReplica` runs (standby, then primary when its
slot becomes 0); its ReplicaStatus is written as the assignment's value, guarded by the
assignment's mod revision. `resolver` (`consumer.resolver`) answers where a shard is served,
for Stat and for the application's own APIs: here (holding the replica), or the primary's
endpoints for forwarding.

Graceful exit (`drain`): the member marks itself exiting, the allocator moves its shards
away (each successor reaching STANDBY first), and the process returns once none is left that
another member could take: a FAILED replica is not waited for (it serves nothing; its shard
is assigned anew once this process is gone), nor a shard the allocator can place nowhere
else (no other live member with room).

A replica FAILED because its store lost its recording process (`consumer.store.RecordingLost`,
e.g. the process recording a RocksDB store died) gives its assignment up (`_give_up`): the
allocator promotes a standby, or assigns the shard anew, and the log has everything
acknowledged. So does a replica whose Recorder was fenced (`RecordingFenced`): a zombie's
assignment is gone already, and a primary still assigned was fenced by registers gone stale
(a log's brokers restarted). Not twice within `RECORDING_LOST_INTERVAL` for one shard here: a
recording process that keeps dying leaves the replica FAILED, for the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from typing import Any

import grpc
import grpc.aio

from gazette.allocator.allocator import Allocator
from gazette.allocator.member import Member
from gazette.allocator.model import Assignment, Item, MemberID
from gazette.allocator.session import MemberSession
from gazette.auth.claims import Claims
from gazette.auth.grpc_auth import authorized, verify_call
from gazette.broker.client import JournalClient
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.application import Application, MessageProducer, ResolveArgs
from gazette.consumer.config import ConsumerConfig
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.consumer.replica import ReplicaContext, ShardReplica
from gazette.consumer.resolver import Resolution, Resolver
from gazette.consumer.spec import ShardKeys, decode_consumer_value, desired_replication
from gazette.consumer.store import RecordingFenced
from gazette.consumer.store_hooks import StoreHook, registered
from gazette.keyspace.etcd import Compare, Etcd, EtcdError, op_delete
from gazette.keyspace.keyspace import KeySpace, KeyValue

__all__ = ["ConsumerRuntime", "Resolution"]

log = logging.getLogger(__name__)

Code = pb.ReplicaStatus.Code

RECORDING_LOST_INTERVAL = 60.0
"""Seconds within which a shard's replica here gives its assignment up for a lost recording
process only once (module docs)."""


class ConsumerRuntime:
    """A consumer process's state (module docs)."""

    def __init__(self, cfg: ConsumerConfig, app: Application) -> None:
        self.cfg = cfg
        self.app = app
        self.member_id = MemberID(cfg.zone, cfg.suffix)
        self.process_id = bpb.ProcessSpec.ID(zone=cfg.zone, suffix=cfg.suffix)
        self.spec = pb.ConsumerSpec(
            process_spec=bpb.ProcessSpec(id=self.process_id, endpoint=cfg.endpoint),
            shard_limit=cfg.shard_limit,
        )
        self.keys = ShardKeys(cfg.root)
        self.member = Member(
            etcd_endpoint=cfg.etcd,
            etcd_tls=cfg.etcd_tls,
            root=cfg.root,
            member_id=self.member_id,
            spec=self.spec,
            decode_spec=pb.ConsumerSpec.FromString,
            keyspace=KeySpace(self.keys.keyspace_prefix, decode_consumer_value(cfg.root)),
            lease_ttl=cfg.lease_ttl,
            reconcile=lambda: self._reconcile_once(),
            item_replication=lambda spec: desired_replication(spec, cfg.max_hot_standbys),
            member_limit=lambda spec: int(spec.shard_limit),
            is_consistent=self._is_consistent,
            is_failed=self._is_failed,
        )
        self.replicas: dict[str, ShardReplica] = {}
        self.client: JournalClient | None = None
        # Replicas being stopped, by shard: a new replica of the shard waits for its directory.
        self._stopping: dict[str, asyncio.Task[None]] = {}
        # Set (and replaced) whenever a replica is added: `next_replica` waits on it.
        self._replica_added = asyncio.Event()
        self.resolver = Resolver(self)
        """Where shards are served, for Stat and the application (`consumer.resolver`)."""
        # Replicas that lost their store's recording process, by shard: (the replica, whether
        # it gives its assignment up, the create revision of the assignment it failed under);
        # and when one last gave it up (`_give_up`).
        self._lost: dict[str, tuple[ShardReplica, bool, int]] = {}
        self._lost_at: dict[str, float] = {}
        self.store_hooks: list[StoreHook] = []
        """What the application's store kinds keep for the whole process (`store_hooks`),
        from `start_store_hooks` on."""
        self._hooks_started = False

    @property
    def keyspace(self) -> KeySpace:
        """The mirror of the application's keyspace (shards, members, assignments)."""
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

    # --- lifecycle ----------------------------------------------------------------------------
    async def start_store_hooks(self) -> None:
        """Start the store kinds' hooks, once (`start` does, if not done before), as early
        as possible: RocksDB's hook starts a fusefs process, whose interpreter and imports
        (the longest step of a restarted shard's recovery) then overlap the rest of this
        process's start, its announcement, its assignments and the playback of their logs.
        Returns once the tasks the hooks began took their first step (a process is spawned
        there), so that blocking work which follows (an import) does not hold them up."""
        if self._hooks_started:
            return
        self._hooks_started = True
        options = self.cfg.store_options
        self.store_hooks = [kind.start(options.get(kind.name)) for kind in registered()]
        await asyncio.sleep(0)

    async def close_store_hooks(self) -> None:
        """Close the store kinds' hooks (`shutdown` does, once the replicas stopped); for a
        start that failed. Idempotent."""
        hooks, self.store_hooks = self.store_hooks, []
        for hook in hooks:
            await hook.close()

    async def start(self) -> None:
        """Start the store kinds' hooks (`start_store_hooks`), connect to etcd and the
        brokers, announce this member and load the keyspace. Raises `MemberExistsError` or
        `EtcdError` (`Member.start`); the hooks are closed again then."""
        cfg = self.cfg
        await self.start_store_hooks()
        self.client = JournalClient(cfg.brokers, tls=cfg.broker_tls, auth=cfg.broker_auth)
        try:
            await self.member.start()
        except BaseException:
            await self.close_store_hooks()
            raise
        cfg.workdir.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _is_consistent(item: Item, assignment: Assignment, assignments: list[Assignment]) -> bool:
        value = assignment.value
        return isinstance(value, pb.ReplicaStatus) and value.code in (Code.STANDBY, Code.PRIMARY)

    @staticmethod
    def _is_failed(assignment: Assignment) -> bool:
        """A FAILED replica is promoted only if all are: it would stay FAILED as primary."""
        value = assignment.value
        return isinstance(value, pb.ReplicaStatus) and value.code == Code.FAILED

    async def run_background(self) -> None:
        """Background loops (`Member.run`); runs until cancelled. A loop failing fails the
        process."""
        await self.member.run()

    async def drain(self, timeout: float) -> bool:
        """Graceful exit: mark this member exiting; wait (up to `timeout`) until the allocator
        moved away every shard another member can take (module docs). Returns whether it got
        there."""
        try:
            await self.member.mark_exiting()
        except EtcdError as err:
            log.error("cannot mark this consumer exiting err=%s", err)
            return False
        log.info("exiting: waiting for shards to move away count=%d", len(self._mine()))
        try:
            async with asyncio.timeout(timeout):
                while self._movable():
                    await self.keyspace.wait_for_change(self.keyspace.revision)
        except TimeoutError:
            log.warning("drain timed out with %d shards still assigned", len(self._mine()))
            return False
        left = sorted(self._mine())
        if left:
            log.info(
                "drained: no other member can take the shards left (they are released as "
                "this process exits) shards=%s",
                ",".join(left),
            )
        else:
            log.info("drained: no shards assigned")
        return True

    def _movable(self) -> list[str]:
        """Shards assigned here that the allocator can still move to another member: all of
        them until this member's exiting flag is in the keyspace; then those not FAILED here
        which the solver places on some other member."""
        mine = self._mine()
        if not mine:
            return []
        assert self.allocator is not None
        failed = {s for s, r in self.replicas.items() if r.status.code == Code.FAILED}
        return self.allocator.movable(self.member_id, set(mine) - failed)

    async def shutdown(self) -> None:
        """Stop every replica (each once no resolution holds it), release the member session
        and close connections."""
        self.resolver.stop()
        await asyncio.gather(*(r.stop() for r in self.replicas.values()), return_exceptions=True)
        self.replicas.clear()
        if self._stopping:
            await asyncio.gather(*self._stopping.values(), return_exceptions=True)
        await self.close_store_hooks()
        await self.member.release()
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
        await self.resolver.close()

    # --- reconciliation -----------------------------------------------------------------------
    def _mine(self) -> dict[str, tuple[KeyValue[Any], int]]:
        """This process's assignments: shard id -> (assignment, slot)."""
        return self.member.assignments()

    async def _reconcile_once(self) -> None:
        mine = self._mine()
        for shard_id, (akv, slot) in mine.items():
            skv = self.keyspace.get(self.keys.item(shard_id))
            if skv is None:
                continue  # The allocator removes assignments of deleted shards.
            replica = self.replicas.get(shard_id)
            if replica is not None and replica.is_primary and slot != 0:
                continue  # Demoted: stopped below.
            if replica is not None and skv.value != replica.spec:
                if replica.needs_restart(skv.value):
                    continue  # Restarted below, with the new spec.
                replica.update_spec(skv.value)
            if replica is None and shard_id in self._stopping:
                continue  # Its previous replica still releases the directory: wait for it.
            if replica is None:
                replica = ShardReplica(self._context(), skv.value, akv)
                self.replicas[shard_id] = replica
                self._replica_added.set()
                self._replica_added = asyncio.Event()
                replica.start()
                log.info("shard assigned shard=%s slot=%d", shard_id, slot)
            replica.shard.assignment = akv
            if slot == 0 and not replica.is_primary:
                replica.promote()
            if replica.recording_lost is not None and await self._give_up(shard_id, akv, replica):
                continue  # Its FAILED status is not advertised: the assignment goes.
            if not isinstance(akv.value, pb.ReplicaStatus) or akv.value != replica.status:
                await self.member.advertise(akv, replica.status)
        for shard_id in list(self.replicas):
            replica = self.replicas[shard_id]
            demoted = shard_id in mine and mine[shard_id][1] != 0 and replica.is_primary
            skv = self.keyspace.get(self.keys.item(shard_id))
            respec = skv is not None and replica.needs_restart(skv.value)
            if shard_id not in mine or demoted or respec:
                # A demoted primary stops (its successor fences the log anyway) and comes
                # back as a standby once its directory is released; so does a replica whose
                # spec changed its sources, logs or buffers.
                why = "demoted" if demoted else "restarted (spec)" if respec else "unassigned"
                self._stop_replica(shard_id, why)
                if shard_id in mine:
                    # Still assigned: say at once that this replica is not serving any more.
                    await self.member.advertise(mine[shard_id][0], pb.ReplicaStatus(code=Code.IDLE))

    async def next_replica(self, shard_id: str) -> ShardReplica:
        """The shard's replica here, once the runtime has one: a shard assigned here gets
        its replica at the next reconciliation, after its previous replica (a restart for a
        new spec, a demoted primary coming back) has stopped. Wrap in a timeout: none comes
        if the assignment goes meanwhile."""
        while (replica := self.replicas.get(shard_id)) is None:
            await self._replica_added.wait()
        return replica

    def _stop_replica(self, shard_id: str, why: str) -> None:
        """Stop the replica of `shard_id` (in the background: a new replica of the shard
        waits for it in `_stopping`)."""
        replica = self.replicas.pop(shard_id)
        log.info("shard %s shard=%s", why, shard_id)
        task = asyncio.create_task(replica.stop())
        self._stopping[shard_id] = task

        def stopped(_t: asyncio.Task[None]) -> None:
            del self._stopping[shard_id]
            self.member.reconcile_soon()  # It may be assigned here again meanwhile.

        task.add_done_callback(stopped)

    async def _give_up(self, shard_id: str, akv: KeyValue[Any], replica: ShardReplica) -> bool:
        """Whether `replica`, FAILED for a lost recording process, gives its assignment `akv`
        up (module docs). Decided once per replica. If so, the assignment it failed under is
        removed (guarded by its mod revision: a stale view is retried at the next change of
        the keyspace), and the replica is stopped once it is gone: a new assignment of the
        shard here gets a new replica."""
        decided = self._lost.get(shard_id)
        if decided is None or decided[0] is not replica:
            now = time.monotonic()
            last = self._lost_at.get(shard_id)
            give_up = last is None or now - last >= RECORDING_LOST_INTERVAL
            if give_up:
                self._lost_at[shard_id] = now
                log.info("shard gives its assignment up (%s) shard=%s", _why(replica), shard_id)
            else:
                log.error(
                    "shard lost its recording process again within %.0fs: left FAILED, "
                    "for the operator (gazctl shards unassign --failed) shard=%s",
                    RECORDING_LOST_INTERVAL,
                    shard_id,
                )
            decided = self._lost[shard_id] = (replica, give_up, akv.create_revision)
        if not decided[1]:
            return False
        if akv.create_revision == decided[2]:  # Still the assignment it failed under.
            assert self.etcd is not None
            key = akv.key.encode()
            resp = await self.etcd.txn([Compare(key, "mod", akv.mod_revision)], [op_delete(key)])
            if not resp.succeeded:
                return True
            # Until our mirror has the delete, a reconcile would start a new replica for it.
            with contextlib.suppress(TimeoutError):
                await self.keyspace.wait_for_revision(int(resp.header.revision), timeout=10.0)
        self._stop_replica(shard_id, f"gave its assignment up ({_why(replica)})")
        return True

    def _context(self) -> ReplicaContext:
        assert self.etcd is not None and self.client is not None
        return ReplicaContext(
            app=self.app,
            etcd=self.etcd,
            client=self.client,
            broker_endpoint=self.cfg.brokers[0],
            workdir=self.cfg.workdir,
            root=self.cfg.root,
            status_changed=self.member.reconcile_soon,
            hint_interval=self.cfg.hint_interval,
            store_hooks=self.store_hooks,
        )

    # --- resolution ---------------------------------------------------------------------------
    def header(self, shard_id: str = "") -> bpb.Header:
        """A response header of this process (`Resolver.header`)."""
        return self.resolver.header(shard_id)

    def route_of(self, shard_id: str) -> bpb.Route:
        """The shard's route: its assigned members sorted, the primary marked."""
        return self.resolver.route_of(shard_id)

    async def resolve(
        self, shard_id: str, *, min_etcd_revision: int = 0, wait: float = 30.0
    ) -> Resolution:
        """Where `shard_id` is served, holding nothing (`Resolver.locate`): a local PRIMARY
        replica, else its primary's endpoint; SHARD_NOT_FOUND, NO_SHARD_PRIMARY or
        NOT_SHARD_PRIMARY (primary here but not ready after waiting up to `wait` seconds for
        its replica's start and recovery). Applications use ``resolver.resolve``, which
        holds the shard."""
        return await self.resolver.locate(shard_id, min_etcd_revision=min_etcd_revision, wait=wait)

    async def read_through_offsets(
        self, replica: ShardReplica, args: ResolveArgs
    ) -> dict[str, int]:
        """The offsets a resolution of `args` waits for: those of ``args.read_through`` in
        journals the shard reads (its sources; as upstream, offsets of other journals are
        ignored, so one request can name the inputs of several shards); or what the
        Application picks, if it is a MessageProducer."""
        app = self.app
        if isinstance(app, MessageProducer):
            assert replica.store is not None, "a PRIMARY replica has a store"
            got = app.read_through(replica.shard, replica.store, args)
            if inspect.isawaitable(got):
                got = await got
            return dict(got)
        sources = {s.journal for s in replica.shard.spec.sources}
        return {j: offset for j, offset in args.read_through.items() if j in sources}

    def shard_stub(self, endpoint: str) -> Any:
        """A `consumer.Shard` stub of another consumer process (over the resolver's channel
        to it, which is reused; a stub is cheap, and caching one would outlive a channel the
        resolver closed). Its calls are signed by this process (``--auth-keys``), for what
        each asks, as upstream's consumers sign their peer calls."""
        stub = pb_grpc.ShardStub(self.resolver.channel(endpoint))
        return authorized(stub, self.cfg.auth, "consumer.Shard")

    async def verify(self, context: Any, capability: int) -> Claims:
        """The claims of the application's gRPC call of `context` (its servicer context) if
        they grant `capability` (``gazette.auth.claims``: READ, APPEND..., or the
        application's own bits from 1 << 16); else the call ends UNAUTHENTICATED saying why
        (it raises). The claims' selector says what the caller may see: a handler checks it
        against the labels of what it answers for (``claims.covers(labels)``). With
        authorization off (no ``--auth-keys``) every call is granted everything."""
        return await verify_call(context, self.cfg.auth, capability)

    async def stat(self, req: pb.StatRequest, context: Any) -> pb.StatResponse:
        """consumer.Shard/Stat: wait until the shard's committed transactions read through
        `req.read_through`, then report its progress. Proxied once to the primary."""
        try:
            remaining = context.time_remaining() if context is not None else None
            res = await self.resolve(
                req.shard,
                min_etcd_revision=req.header.etcd.revision,
                wait=30.0 if remaining is None else max(remaining - 0.1, 0.0),
            )
        except TimeoutError:
            msg = f"etcd revision {req.header.etcd.revision} not reached in time"
            if context is not None:
                await context.abort(grpc.StatusCode.UNAVAILABLE, msg)
            raise
        if res.status != pb.OK:
            return pb.StatResponse(status=res.status, header=res.header)
        if res.replica is None:
            if req.header.process_id.zone or req.header.process_id.suffix:
                # Proxied once already: the route changed under it. Let the caller retry.
                return pb.StatResponse(status=pb.NOT_SHARD_PRIMARY, header=res.header)
            fwd = pb.StatRequest()
            fwd.CopyFrom(req)
            fwd.header.CopyFrom(res.header)
            timeout = context.time_remaining() if context is not None else None
            resp: pb.StatResponse = await self.shard_stub(res.primary_endpoint).Stat(
                fwd, timeout=timeout
            )
            return resp
        replica = res.replica
        replica.hold()  # An application's read_through may use the store: keep it open.
        try:
            return await self._stat_here(req, context, res, replica)
        finally:
            replica.unhold()

    async def _stat_here(
        self, req: pb.StatRequest, context: Any, res: Resolution, replica: ShardReplica
    ) -> pb.StatResponse:
        """Stat of a primary here, held by the caller: wait for the read-through offsets."""
        shard = replica.shard
        proxied = bool(req.header.process_id.zone or req.header.process_id.suffix)
        args = ResolveArgs(
            shard=req.shard,
            read_through=dict(req.read_through),
            may_proxy=not proxied,
            proxy_header=req.header if proxied else None,
        )
        try:
            offsets = await self.read_through_offsets(replica, args)
        except ValueError as err:
            if context is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise
        reached = asyncio.ensure_future(shard.wait_read_through(offsets))
        stopped = asyncio.ensure_future(shard.stopping.wait())
        try:
            await asyncio.wait({reached, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            reached.cancel()
            stopped.cancel()
        if not reached.done() or reached.cancelled():
            return pb.StatResponse(status=pb.SHARD_STOPPED, header=self.header(req.shard))
        read_through, publish_at = shard.progress()
        return pb.StatResponse(
            status=pb.OK, header=res.header, read_through=read_through, publish_at=publish_at
        )


def _why(replica: ShardReplica) -> str:
    """Why `replica` hands its shard over, for logs."""
    fenced = isinstance(replica.recording_lost, RecordingFenced)
    return "recorder fenced" if fenced else "recording lost"
