"""The Read RPC: a journal's content from an offset, fragment by fragment, as it is written.

Each fragment is announced by a metadata response (its spec, and a signed URL when it is in
a store) followed by its content in chunks of `READ_CHUNK` bytes, from the local spool or
the fragment cache. A blocking read waits at the write head for more; a non-blocking one
ends there with OFFSET_NOT_YET_AVAILABLE. Where the index has no fragment for the offset,
the read looks at the stores again (a range another replica persisted after a failover)
before jumping to the next fragment; in the offsets a fresh primary skipped (here, or at
an earlier primary of a replication-1 journal), a blocking read waits for the old primary to
publish what it acknowledged (`broker.reservation`). A
fragment that is corrupted or shorter than indexed ends the read with DATA_LOSS and is
never served.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator
from typing import Any

import grpc

from gazette.auth.claims import Claims
from gazette.broker.broker import Broker
from gazette.broker.fragment.coverset import FragmentEntry
from gazette.broker.fragment.store import FragmentCorrupted, FragmentStoreError, store_for_url
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.validation import validate_read_request
from gazette.broker.replica import JournalReplica
from gazette.broker.serving import (
    UNLIMITED,
    RpcFailure,
    abort_invalid,
    proxy_failure,
    resolve,
    was_proxied,
)

log = logging.getLogger(__name__)

__all__ = ["GAP_RECHECKS", "HOLE_RECHECK", "READ_CHUNK", "gap_delay", "read"]

READ_CHUNK = 1 << 18  # content bytes per ReadResponse
GAP_RECHECKS = 4  # store listings a read takes at a hole in the index before jumping over it
HOLE_RECHECK = 1.0  # seconds between listings while a blocking read waits in a fresh hole
SYNC_WAIT = 10.0  # the longest a read waits for a new primary to synchronise its route
GAP_RECHECK_MAX = 5.0  # the longest a blocking read waits between listings at a gap


def gap_delay(checks: int) -> float:
    """Seconds a blocking read waits (or until an append) before listing the stores again,
    at its `checks`-th look at a gap whose content may still arrive: quick at first, as a
    hand-over's spool is persisted within moments, then backing off."""
    return min(0.25 * 2.0 ** (checks - 2), GAP_RECHECK_MAX)


async def read(
    broker: Broker, request: pb.ReadRequest, context: Any, claims: Claims = UNLIMITED
) -> AsyncGenerator[pb.ReadResponse, None]:
    """Serve one Read on `broker`, here or forwarded to the primary."""
    try:
        validate_read_request(request)
    except ValidationError as err:
        await abort_invalid(context, err)
    try:
        res = await resolve(
            broker,
            request.journal,
            request.min_etcd_revision,
            require_primary=False,
            may_proxy=not request.do_not_proxy and not was_proxied(request.header),
            claims=claims,
            header=request.header,
        )
    except RpcFailure as failure:
        await failure.abort(context)
    if res.status != pb.OK:
        yield pb.ReadResponse(status=res.status, header=res.header)
        return
    if res.proxy_to:
        forwarded = pb.ReadRequest()
        forwarded.CopyFrom(request)
        forwarded.header.CopyFrom(res.header)
        await broker.peer_connected(res.proxy_to)
        try:
            async for resp in broker.peer_stub(res.proxy_to).Read(forwarded):
                yield resp
        except grpc.aio.AioRpcError as err:
            await proxy_failure(res.proxy_to, err).abort(context)
        return
    replica = res.replica
    assert replica is not None
    header = res.header
    if not replica.readable():
        yield pb.ReadResponse(status=pb.NOT_ALLOWED, header=header)
        return
    if not replica.leading and broker.resolver.is_primary(replica.name):
        # A new primary that has not synchronised its route yet (as a hand-over's takes the
        # old primary's content) may be behind what was acknowledged: its write head and
        # index are no answer until then. Its pipeline does so within moments.
        await replica.wait_until_leading(SYNC_WAIT)
    offset = replica.write_head if request.offset == -1 else request.offset
    told = request.offset  # the offset the client reads from, as far as it was told
    first = True
    gap_checks = head_checks = 0

    def position(status: pb.Status.ValueType) -> pb.ReadResponse:
        """A response saying where the read is (`offset`) and the write head."""
        return pb.ReadResponse(
            status=status,
            header=header if first else None,
            offset=offset,
            write_head=replica.write_head,
        )

    while True:
        if request.end_offset and offset >= request.end_offset:
            if offset > told:
                # The rest of the range is missing (a gap, or the head beyond it): say where
                # content resumes, or the client would retry the same range forever.
                yield position(pb.OK)
            return
        if replica.dropped and not replica.deleted:
            return  # Unassigned here meanwhile: the client reads on at the current brokers.
        entry, found = replica.index.find(offset)
        if not found:
            if offset < replica.write_head and request.block and replica.in_hole(offset):
                # Skipped by this fresh primary: the old one may be back soon to publish
                # what it acknowledged here (broker.reservation).
                await asyncio.sleep(HOLE_RECHECK)
                await replica.relist_shared()
                continue
            gap_end = replica.write_head if entry is None else entry.begin
            if (
                offset < replica.write_head
                and request.block
                and replica.awaits_content(offset, gap_end, broker.cfg.hole_wait)
            ):
                # An earlier primary's skipped offsets, maybe handed over since: its
                # content may still be published (broker.reservation).
                await asyncio.sleep(HOLE_RECHECK)
                await replica.relist_shared()
                continue
            if entry is not None and offset < replica.write_head:
                if gap_checks < GAP_RECHECKS and replica.has_stores:
                    # After a failover, a range may be persisted by another replica but
                    # not yet listed here: look at the stores again before jumping.
                    gap_checks += 1
                    await asyncio.sleep(0.5 * (gap_checks - 1))
                    await replica.relist()
                    continue
                offset = entry.begin  # history before this was removed: an offset jump
                continue
            if offset < replica.write_head and not replica.gap_is_gone(offset):
                # Up to the head, content that the primary or a store holds and this replica
                # has not (a peer rolled to its primary's head, a listing not caught up):
                # look at the stores again, and never jump over it.
                head_checks += 1
                if head_checks > 1 and not request.block:
                    yield position(pb.OFFSET_NOT_YET_AVAILABLE)
                    return
                if head_checks > 1:
                    await replica.wait_for_head_beyond(replica.write_head, gap_delay(head_checks))
                    if replica.deleted:
                        yield pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND, header=broker.header())
                        return
                await replica.relist_shared()
                continue
            if offset < replica.write_head:
                offset = replica.write_head
                if request.end_offset and offset >= request.end_offset:
                    continue  # Nothing of the range is left to wait for.
            if not request.block:
                yield position(pb.OFFSET_NOT_YET_AVAILABLE)
                return
            if await replica.wait_for_head_beyond(offset):
                continue
            if replica.deleted:
                yield pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND, header=broker.header())
            return
        assert entry is not None
        meta = pb.ReadResponse(
            status=pb.OK, offset=offset, write_head=replica.write_head, fragment=entry.spec
        )
        if first:
            meta.header.CopyFrom(header)
            first = False
        remote = entry.local_path is None
        if remote and entry.spec.backing_store:
            try:
                meta.fragment_url = await store_for_url(entry.spec.backing_store).sign_get_url(
                    entry.spec, 3600.0
                )
            except FragmentStoreError as err:
                log.warning("cannot sign fragment URL journal=%s err=%s", replica.name, err)
        yield meta
        told = offset
        gap_checks = head_checks = 0
        if request.metadata_only or (remote and request.do_not_proxy):
            return
        end = entry.end if not request.end_offset else min(entry.end, request.end_offset)
        fd = await _open_content(broker, replica, entry, context)
        if fd is None:
            continue  # the local spool was persisted and removed meanwhile: look again
        try:
            while offset < end:
                n = min(READ_CHUNK, end - offset)
                data = os.pread(fd, n, offset - entry.begin)
                if len(data) != n:
                    log.error("short fragment read journal=%s offset=%d", replica.name, offset)
                    await context.abort(
                        grpc.StatusCode.DATA_LOSS,
                        f"fragment of {replica.name} is shorter than indexed at offset {offset}",
                    )
                yield pb.ReadResponse(offset=offset, content=data)
                offset += n
                told = offset
        finally:
            os.close(fd)


async def _open_content(
    broker: Broker, replica: JournalReplica, entry: FragmentEntry, context: Any
) -> int | None:
    """A descriptor of `entry`'s content: its local spool, or its file in the fragment
    cache (fetched from its store). None if the spool was removed meanwhile (persisted)."""
    if entry.local_path is not None:
        try:
            return os.open(entry.local_path, os.O_RDONLY)
        except FileNotFoundError:
            return None
    try:
        path = await broker.cache.get(entry.spec)
        return os.open(path, os.O_RDONLY)
    except FragmentCorrupted as err:
        log.error(
            "corrupted fragment journal=%s fragment=[%d,%d) err=%s",
            replica.name,
            entry.begin,
            entry.end,
            err,
        )
        await context.abort(grpc.StatusCode.DATA_LOSS, f"corrupted fragment: {err}")
    except (FragmentStoreError, FileNotFoundError) as err:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"fragment store: {err}")
    return None
