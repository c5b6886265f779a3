"""The Replicate RPC: a peer's side of replication, the primary's appends applied here.

The stream's first request proposes the journal's current fragment under the route the
primary resolved; a peer that is not assigned the journal answers NOT_JOURNAL_BROKER, one
that sees another route WRONG_ROUTE. Then content and proposals are applied to the replica
(`broker.replication.Follower`) while the route stays the one the stream was opened for.
The replica's lock is held from an append's first content to the proposal that resolves
it, and given back if the primary goes silent meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc

from gazette.auth.claims import Claims
from gazette.broker.broker import Broker
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.selector import journal_labels_with_meta
from gazette.broker.replication import Follower, ReplicationProtocolError, route_key
from gazette.broker.serving import UNLIMITED, spool_failure
from gazette.broker.spool import SpoolError

log = logging.getLogger(__name__)

__all__ = ["acquire_unless", "next_unless", "replicate"]


async def replicate(
    broker: Broker,
    request_iterator: AsyncIterator[pb.ReplicateRequest],
    context: Any,
    claims: Claims = UNLIMITED,
) -> AsyncGenerator[pb.ReplicateResponse, None]:
    """Serve one Replicate stream on `broker`. An append the stream leaves unresolved (it
    ends, fails or is cancelled mid-append) is rolled back. A journal the caller's `claims`
    do not cover is JOURNAL_NOT_FOUND."""
    it = request_iterator.__aiter__()
    try:
        first = await anext(it)
    except StopAsyncIteration:
        return
    if not first.HasField("proposal") or not first.proposal.journal:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, "Replicate: the first request needs a Proposal"
        )
    name = first.proposal.journal
    try:
        if first.header.etcd.revision > broker.keyspace.revision:
            await broker.keyspace.wait_for_revision(first.header.etcd.revision, timeout=10)
    except TimeoutError:
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"etcd revision {first.header.etcd.revision} not reached within 10s",
        )
    if claims.selector.ByteSize():
        item = broker.keyspace.get(broker.keys.item(name))
        if item is None or not claims.covers(journal_labels_with_meta(item.value)):
            yield pb.ReplicateResponse(status=pb.JOURNAL_NOT_FOUND, header=broker.header())
            return
    mine = broker.my_assignment(name)
    route = broker.route_of(name)
    header = broker.header(route=route)
    if mine is None or mine[1] == 0:
        yield pb.ReplicateResponse(status=pb.NOT_JOURNAL_BROKER, header=header)
        return
    key = route_key(route)
    if key != route_key(first.header.route):
        yield pb.ReplicateResponse(status=pb.WRONG_ROUTE, header=header)
        return
    try:
        replica = await broker.resolver.ready_replica(name, 10.0)
    except TimeoutError:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"replica of {name} not ready")
    if replica is None:
        yield pb.ReplicateResponse(status=pb.NOT_JOURNAL_BROKER, header=header)
        return
    # The replica's lock is held from an append's first content to the proposal that
    # resolves it (and while applying a proposal), never while the stream idles: the
    # broker's own flush loop and a promotion of this replica need it too.
    if route_key(broker.route_of(name)) != key:
        # The route moved on while the replica became ready. Waiting for the lock now
        # could wait forever: under the new route this broker may be the primary, its
        # pipeline holding the lock while it waits for the primary of the old route,
        # which holds its own lock while it waits for this answer.
        yield pb.ReplicateResponse(status=pb.WRONG_ROUTE, header=broker.header(name))
        return
    # Our reconcile loop may not have recorded this route yet: when it does, that is no
    # route change for this stream.
    replica.set_route(key)
    route_change = asyncio.ensure_future(replica.route_changed())
    follower = Follower(replica, lambda entries: broker.persister.enqueue(replica, entries))
    held = False
    try:
        msg: pb.ReplicateRequest | None = first
        while msg is not None:
            if not held:
                held = await acquire_unless(replica.lock, route_change)
                if not held or route_key(broker.route_of(name)) != key or replica.deleted:
                    if held:
                        replica.lock.release()  # never held while the answer is sent
                        held = False
                    yield pb.ReplicateResponse(status=pb.WRONG_ROUTE, header=broker.header(name))
                    return
            if msg.content:
                follower.content(msg.content, msg.content_delta)
            if msg.HasField("proposal"):
                resp = follower.proposal(msg.proposal, msg.registers)
                replica.lock.release()
                held = False
                if msg is first:
                    resp.header.CopyFrom(header)
                if msg.acknowledge:
                    yield resp
            # Mid-transaction (lock held), a primary silent for longer than it lets its
            # own clients stall is gone (partitioned): give the lock back.
            msg = await next_unless(
                it, route_change, broker.cfg.chunk_timeout * 1.5 if held else None
            )
            if msg is None and held:
                log.warning("replication stream ended mid-append journal=%s: rolled back", name)
    except ReplicationProtocolError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    except SpoolError as err:
        await spool_failure(err, broker.relieve_disk).abort(context)
    finally:
        route_change.cancel()
        follower.rollback()
        if held:
            replica.lock.release()


async def acquire_unless(lock: asyncio.Lock, stop: asyncio.Future[None]) -> bool:
    """Acquire `lock` (True), or give up once `stop` is done first (False). The lock's
    holder may be waiting for a peer that waits for this stream: a route change is what
    ends such a wait. A cancelled acquisition never holds the lock."""
    if stop.done():
        return False
    acquiring = asyncio.ensure_future(lock.acquire())
    either: set[asyncio.Future[Any]] = {acquiring, stop}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        if acquiring.done() and not acquiring.cancelled():
            lock.release()
        else:
            acquiring.cancel()
        raise
    if not acquiring.done():
        acquiring.cancel()
        await asyncio.wait({acquiring})
    if acquiring.cancelled():
        return False
    if stop.done():  # acquired as the route changed: the route change wins
        lock.release()
        return False
    return True


async def next_unless(
    it: AsyncIterator[pb.ReplicateRequest],
    stop: asyncio.Future[None],
    timeout: float | None = None,
) -> pb.ReplicateRequest | None:
    """The next request, or None at EOF, after `timeout`, or once `stop` is done (the
    route changed)."""
    nxt: asyncio.Future[pb.ReplicateRequest] = asyncio.ensure_future(anext(it))
    waiting: set[asyncio.Future[Any]] = {nxt, stop}
    try:
        await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not nxt.done():
            nxt.cancel()
        # Retrieve its outcome whenever it lands, so nothing is logged as lost.
        nxt.add_done_callback(lambda f: f.cancelled() or f.exception())
    if not nxt.done() or nxt.cancelled():
        return None
    try:
        return nxt.result()
    except StopAsyncIteration:
        return None
