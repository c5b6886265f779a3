"""The ``consumer.Shard`` gRPC service over a consumer application's keyspace.

`ShardAPI` serves List, Apply, GetHints and Unassign from the application's etcd keys (see
`consumer.spec` for the layout), as upstream's ``consumer/shard_api.go`` does; Stat needs a
running shard, so it is delegated to a callback the consumer runtime supplies.

Failures the caller can act on are `Status` values in responses (SHARD_NOT_FOUND,
ETCD_TRANSACTION_FAILED); malformed requests abort with INVALID_ARGUMENT naming the bad field;
an unreachable etcd aborts with UNAVAILABLE. With a `verifier` (``--auth-keys``), each call
proves its capability as upstream's verified Shard server asks (Stat and GetHints READ, List
LIST, Apply and Unassign APPLY), and its claims' selector limits the shards it sees and
changes (`gazette.auth`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from gazette.allocator.model import parse_assignment_key
from gazette.auth.claims import APPLY, LIST, READ, Claims
from gazette.auth.grpc_auth import refuse, verify_call
from gazette.auth.keys import NO_AUTH, Verifier
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.labels import label_set
from gazette.broker.protocol.selector import matches
from gazette.consumer.hints import encode_hints, load_hints, primary_hints_key
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.consumer.spec import (
    ID_LABEL,
    ShardKeys,
    recovery_log_of,
    shard_labels,
    validate_apply_request,
    validate_get_hints_request,
    validate_list_request,
    validate_stat_request,
    validate_unassign_request,
)
from gazette.keyspace.etcd import Compare, Etcd, EtcdError, op_delete, op_put
from gazette.keyspace.keyspace import KeySpace
from gazette.recoverylog.segments import InvalidHints

__all__ = ["ShardAPI", "StatFunc"]

log = logging.getLogger(__name__)

StatFunc = Callable[[pb.StatRequest, Any], Awaitable[pb.StatResponse]]
"""Serves Stat of an existing shard: ``await stat(request, context) -> StatResponse``."""

# How long Apply and Unassign wait for the keyspace to reflect their own write.
READ_YOUR_WRITE_TIMEOUT = 10.0


def shard_route(
    keyspace: KeySpace, keys: ShardKeys, shard: str
) -> tuple[bpb.Route, list[pb.ReplicaStatus]]:
    """The shard's route (members ordered by zone and suffix, primary = the slot-0 member,
    endpoints from the members' ConsumerSpecs) and each member's status, from `keyspace`."""
    assigned: list[tuple[str, str, int, pb.ReplicaStatus]] = []
    for kv in keyspace.prefixed(keys.shard_assignments(shard)):
        item, member, slot = parse_assignment_key(keys.root, kv.key)
        if item == shard:
            assigned.append((member.zone, member.suffix, slot, kv.value))
    assigned.sort(key=lambda a: (a[0], a[1], a[2]))
    route = bpb.Route(primary=-1)
    statuses = []
    for i, (zone, suffix, slot, status) in enumerate(assigned):
        route.members.add(zone=zone, suffix=suffix)
        member_kv = keyspace.get(f"{keys.members}{zone}#{suffix}")
        route.endpoints.append(member_kv.value.process_spec.endpoint if member_kv else "")
        if slot == 0:
            route.primary = i
        statuses.append(status)
    return route, statuses


def _changed(op: Any) -> bool:
    """Whether an Apply's put or delete (a `ResponseOp` of its transaction) changed etcd. A
    delete of no key does not, nor does it advance etcd's revision past the last write:
    waiting to see the transaction's revision would then wait for some other write under
    the root (or for etcd's progress notification, minutes away)."""
    if op.WhichOneof("response") != "response_delete_range":
        return True
    return int(op.response_delete_range.deleted) > 0


class ShardAPI(pb_grpc.ShardServicer):
    """Implements ``consumer.Shard`` over `keyspace`, a loaded and watched mirror of `root`
    (decoded by `consumer.spec.decode_consumer_value(root)`), writing through `etcd`.

    `process_id` identifies this process in response headers. `stat`, if given, serves Stat
    for shards that exist; without it Stat answers UNIMPLEMENTED.
    """

    def __init__(
        self,
        etcd: Etcd,
        keyspace: KeySpace,
        root: str,
        process_id: bpb.ProcessSpec.ID,
        *,
        stat: StatFunc | None = None,
        verifier: Verifier = NO_AUTH,
    ) -> None:
        self.etcd = etcd
        self.verifier = verifier
        self.keyspace = keyspace
        self.keys = ShardKeys(root)
        if keyspace.prefix != self.keys.keyspace_prefix:
            raise ValueError(f"keyspace of {keyspace.prefix!r} does not mirror root {root!r}")
        self.process_id = process_id
        self._stat = stat

    # --- helpers ----------------------------------------------------------------------------
    def header(self, revision: int | None = None) -> bpb.Header:
        """An unrouted response header: this process, and the keyspace's etcd header (or
        `revision`, that of a write this response reports)."""
        h = self.keyspace.header
        return bpb.Header(
            process_id=self.process_id,
            route=bpb.Route(primary=-1),
            etcd=bpb.Header.Etcd(
                cluster_id=h.cluster_id,
                member_id=h.member_id,
                revision=h.revision if revision is None else revision,
                raft_term=h.raft_term,
            ),
        )

    def spec_of(self, shard: str, claims: Claims | None = None) -> pb.ShardSpec | None:
        """The spec of `shard`; None if there is none, or `claims` do not cover it (as if
        it did not exist, as upstream answers)."""
        kv = self.keyspace.get(self.keys.item(shard))
        if kv is None or (claims is not None and not claims.covers(shard_labels(kv.value))):
            return None
        spec: pb.ShardSpec = kv.value
        return spec

    def route_and_status(self, shard: str) -> tuple[bpb.Route, list[pb.ReplicaStatus]]:
        return shard_route(self.keyspace, self.keys, shard)

    async def _wait_for(self, revision: int, context: Any) -> None:
        try:
            await self.keyspace.wait_for_revision(revision, timeout=READ_YOUR_WRITE_TIMEOUT)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"applied at etcd revision {revision}, but this process's view of etcd "
                f"did not catch up within {READ_YOUR_WRITE_TIMEOUT:.0f}s",
            )

    @staticmethod
    async def _invalid(context: Any, err: ValidationError) -> None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))

    async def _txn(self, compares: list[Compare], ops: list[Any], context: Any) -> Any:
        try:
            return await self.etcd.txn(compares, ops)
        except EtcdError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))

    # --- List -------------------------------------------------------------------------------
    async def List(self, request: pb.ListRequest, context: Any) -> pb.ListResponse:  # noqa: N802
        claims = await verify_call(context, self.verifier, LIST)
        try:
            validate_list_request(request)
        except ValidationError as err:
            await self._invalid(context, err)
        resp = pb.ListResponse(status=pb.OK, header=self.header())
        select = request.selector.ByteSize() != 0 or claims.selector.ByteSize() != 0
        for kv in self.keyspace.prefixed(self.keys.items):
            spec: pb.ShardSpec = kv.value
            if select:
                labels = shard_labels(spec)
                if not matches(request.selector, labels) or not claims.covers(labels):
                    continue
            route, statuses = self.route_and_status(spec.id)
            resp.shards.add(
                spec=spec,
                mod_revision=kv.mod_revision,
                create_revision=kv.create_revision,
                route=route,
                status=statuses,
            )
        return resp

    # --- Apply ------------------------------------------------------------------------------
    async def Apply(self, request: pb.ApplyRequest, context: Any) -> pb.ApplyResponse:  # noqa: N802
        claims = await verify_call(context, self.verifier, APPLY)
        try:
            validate_apply_request(request)
        except ValidationError as err:
            await self._invalid(context, err)
        for change in request.changes:  # every change covered, or none is applied
            if change.HasField("upsert"):
                covered = claims.covers(shard_labels(change.upsert))
                shard = change.upsert.id
            else:
                covered, shard = claims.covers(label_set((ID_LABEL, change.delete))), change.delete
            if not covered:
                await refuse(context, f"not authorized to {shard}")
        compares: list[Compare] = []
        ops: list[Any] = []
        for change in request.changes:
            if change.HasField("upsert"):
                spec = change.upsert
                key = self.keys.item(spec.id).encode()
                ops.append(op_put(key, spec.SerializeToString(deterministic=True)))
                if change.HasField("primary_hints"):
                    hints_key = primary_hints_key(spec.hint_prefix, spec.id).encode()
                    ops.append(op_put(hints_key, encode_hints(change.primary_hints)))
            else:
                key = self.keys.item(change.delete).encode()
                ops.append(op_delete(key))
            # -1 applies regardless of the shard's current revision; 0 requires it be absent.
            if change.expect_mod_revision != -1:
                compares.append(Compare(key, "mod", change.expect_mod_revision))
        resp = await self._txn(compares, ops, context)
        revision = int(resp.header.revision)
        if not resp.succeeded:
            return pb.ApplyResponse(status=pb.ETCD_TRANSACTION_FAILED, header=self.header(revision))
        if any(_changed(r) for r in resp.responses):
            await self._wait_for(revision, context)
        return pb.ApplyResponse(status=pb.OK, header=self.header(revision))

    # --- GetHints ---------------------------------------------------------------------------
    async def GetHints(  # noqa: N802
        self, request: pb.GetHintsRequest, context: Any
    ) -> pb.GetHintsResponse:
        claims = await verify_call(context, self.verifier, READ)
        try:
            validate_get_hints_request(request)
        except ValidationError as err:
            await self._invalid(context, err)
        header = self.header()
        spec = self.spec_of(request.shard, claims)
        if spec is None:
            return pb.GetHintsResponse(status=pb.SHARD_NOT_FOUND, header=header)
        resp = pb.GetHintsResponse(status=pb.OK, header=header)
        log_name = recovery_log_of(spec)
        if not log_name:
            return resp  # No recovery log, so no hints.
        try:
            sets = await load_hints(
                self.etcd,
                spec.hint_prefix,
                spec.id,
                backups=spec.hint_backups,
                log=log_name,
            )
        except EtcdError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        except InvalidHints as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"shard {spec.id}: {err}")
        primary, backups = sets[0], sets[1:]
        if primary is not None:
            resp.primary_hints.hints.CopyFrom(primary)
        for hints in backups:
            entry = resp.backup_hints.add()
            if hints is not None:
                entry.hints.CopyFrom(hints)
        return resp

    # --- Unassign ---------------------------------------------------------------------------
    async def Unassign(  # noqa: N802
        self, request: pb.UnassignRequest, context: Any
    ) -> pb.UnassignResponse:
        """Remove, of each shard, every FAILED assignment and (unless `only_failed`) its
        primary's, so that the allocator assigns them anew. Each removal is guarded on the
        assignment's revision; `dry_run` reports the shards without removing anything."""
        claims = await verify_call(context, self.verifier, APPLY)
        try:
            validate_unassign_request(request)
        except ValidationError as err:
            await self._invalid(context, err)
        for shard in request.shards:
            if not claims.covers(label_set((ID_LABEL, shard))):
                await refuse(context, f"not authorized to {shard}")
        resp = pb.UnassignResponse(status=pb.OK)
        compares: list[Compare] = []
        ops: list[Any] = []
        for shard in dict.fromkeys(request.shards):  # each shard once, in request order
            for kv in self.keyspace.prefixed(self.keys.shard_assignments(shard)):
                item, _member, slot = parse_assignment_key(self.keys.root, kv.key)
                if item != shard:
                    continue
                status: pb.ReplicaStatus = kv.value
                if status.code != pb.ReplicaStatus.FAILED and (request.only_failed or slot != 0):
                    continue
                compares.append(Compare(kv.key.encode(), "mod", kv.mod_revision))
                ops.append(op_delete(kv.key.encode()))
                if not resp.shards or resp.shards[-1] != shard:
                    resp.shards.append(shard)
        if request.dry_run or not ops:
            return resp
        txn = await self._txn(compares, ops, context)
        if not txn.succeeded:
            resp.status = pb.ETCD_TRANSACTION_FAILED
            return resp
        await self._wait_for(int(txn.header.revision), context)
        log.info("unassigned shards=%s removed=%d", ",".join(resp.shards), len(ops))
        return resp

    # --- Stat -------------------------------------------------------------------------------
    async def Stat(self, request: pb.StatRequest, context: Any) -> pb.StatResponse:  # noqa: N802
        claims = await verify_call(context, self.verifier, READ)
        try:
            validate_stat_request(request)
        except ValidationError as err:
            await self._invalid(context, err)
        if self.spec_of(request.shard, claims) is None:
            return pb.StatResponse(status=pb.SHARD_NOT_FOUND, header=self.header())
        if self._stat is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Stat is not served by this process")
        assert self._stat is not None
        return await self._stat(request, context)
