"""The `protocol.Journal` gRPC service of a broker.

Protocol failures the client can act on (unknown journal, wrong offset, register mismatch,
offset not yet available) are returned as `Status` values in responses, as upstream does;
malformed requests abort with INVALID_ARGUMENT and a message naming the bad field (also
bytes that are not the request's message: `add_journal_service` serves it through
`broker.request_guard`), a message over `MAX_MESSAGE_SIZE` with RESOURCE_EXHAUSTED; a
corrupted fragment aborts the read with DATA_LOSS and is never served.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import grpc

from gazette.broker.broker import Broker, Resolution
from gazette.broker.fragment.postfix import PostfixTemplateError, evaluate_postfix_template
from gazette.broker.fragment.store import FragmentCorrupted, FragmentStoreError, store_for_url
from gazette.broker.metrics import counted
from gazette.broker.protocol import labels
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.selector import journal_labels_with_meta, matches
from gazette.broker.protocol.sha1sum import sha1sum_from_digest
from gazette.broker.protocol.validation import (
    validate_apply_request,
    validate_first_append_request,
    validate_fragments_request,
    validate_later_append_request,
    validate_list_request,
    validate_read_request,
)
from gazette.broker.replica import JournalReplica
from gazette.broker.replication import (
    Follower,
    ReplicationError,
    ReplicationProtocolError,
    route_key,
)
from gazette.broker.request_guard import add_guarded_service, drain_requests
from gazette.broker.reservation import ReservationError, ReservationStoreError
from gazette.broker.spool import SpoolDiskFull, SpoolError
from gazette.keyspace.etcd import Compare, EtcdError, op_delete, op_put

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 18  # content bytes per ReadResponse
LIST_PAGE = 25  # journals per ListResponse (reference §1)
DEFAULT_FRAGMENTS_PAGE = 1000
GAP_RECHECKS = 4  # store listings a read takes at a hole in the index before jumping over it
HOLE_RECHECK = 1.0  # seconds between listings while a blocking read waits in a fresh hole
MAX_MESSAGE_SIZE = 64 << 20
"""Largest request message served (64 MiB, as our clients' `broker.client.journal_client`
limit); a larger one is answered RESOURCE_EXHAUSTED naming it. The gRPC server must receive
up to `broker.request_guard.transport_limit` of it."""


class AppendProtocolError(Exception):
    """The client broke the Append stream protocol (e.g. content after the commit marker)."""


def registers_match(check: pb.LabelSelector, registers: pb.LabelSet) -> bool:
    """Empty registers match any selector (so a fence can be established on a new journal)."""
    return not registers.labels or matches(check, registers)


class JournalService(pb_grpc.JournalServicer):
    """Implements `protocol.Journal` over a Broker's state."""

    def __init__(self, broker: Broker) -> None:
        self.b = broker

    async def _invalid(self, context: Any, err: ValidationError) -> None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))

    async def _resolve(
        self,
        journal: str,
        min_revision: int,
        context: Any,
        *,
        require_primary: bool,
        may_proxy: bool,
    ) -> Resolution:
        """Where to serve `journal`; UNAVAILABLE if the keyspace or replica is not ready."""
        try:
            return await self.b.resolve(
                journal,
                min_etcd_revision=min_revision,
                require_primary=require_primary,
                may_proxy=may_proxy,
            )
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"journal {journal} not ready (etcd revision {min_revision} or its recovery)",
            )
        raise AssertionError("unreachable: abort raises")

    @staticmethod
    def _was_proxied(header: pb.Header) -> bool:
        """A request carrying a broker's header was proxied once already: never again."""
        return bool(header.process_id.zone or header.process_id.suffix)

    async def _proxy_error(self, context: Any, target: str, err: grpc.aio.AioRpcError) -> None:
        code = err.code()
        if code == grpc.StatusCode.UNKNOWN:
            code = grpc.StatusCode.UNAVAILABLE
        await context.abort(code, f"proxy to primary {target}: {err.details()}")

    # --- List -------------------------------------------------------------------------------
    @counted("List")
    async def List(self, request: pb.ListRequest, context: Any) -> AsyncIterator[pb.ListResponse]:  # noqa: N802
        try:
            validate_list_request(request)
        except ValidationError as err:
            await self._invalid(context, err)
        ks = self.b.keyspace
        if request.HasField("watch_resume"):
            await ks.wait_for_change(request.watch_resume.etcd.revision)
        sent: list[bytes] | None = None
        while True:
            revision = ks.revision
            journals = []
            for kv in ks.prefixed(self.b.keys.items):
                spec: pb.JournalSpec = kv.value
                if request.selector.ByteSize() and not matches(
                    request.selector, journal_labels_with_meta(spec)
                ):
                    continue
                journals.append(
                    pb.ListResponse.Journal(
                        spec=spec,
                        mod_revision=kv.mod_revision,
                        create_revision=kv.create_revision,
                        route=self.b.route_of(spec.name),
                    )
                )
            if request.watch:
                # A watch sends a snapshot only when the listing changed (not on every
                # keyspace change: routes' advertisements and other journals churn it).
                listing = [j.SerializeToString(deterministic=True) for j in journals]
                if listing == sent:
                    await ks.wait_for_change(revision)
                    continue
                sent = listing
            first = pb.ListResponse(status=pb.OK, header=self.b.header())
            if not journals:
                yield first
            for i in range(0, len(journals), LIST_PAGE):
                resp = first if i == 0 else pb.ListResponse()
                resp.journals.extend(journals[i : i + LIST_PAGE])
                yield resp
            if not request.watch:
                return
            yield pb.ListResponse()  # ends this snapshot
            await ks.wait_for_change(revision)

    # --- Apply ------------------------------------------------------------------------------
    @counted("Apply")
    async def Apply(self, request: pb.ApplyRequest, context: Any) -> pb.ApplyResponse:  # noqa: N802
        try:
            validate_apply_request(request)
        except ValidationError as err:
            await self._invalid(context, err)
        for i, ch in enumerate(request.changes):
            template = ch.upsert.fragment.path_postfix_template
            if ch.HasField("upsert") and template:
                try:
                    evaluate_postfix_template(template, datetime.now(UTC), ch.upsert)
                except PostfixTemplateError as err:
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"Changes[{i}].Upsert.Fragment.PathPostfixTemplate: {err}",
                    )
        assert self.b.etcd is not None
        compares, ops = [], []
        for change in request.changes:
            name = change.upsert.name if change.HasField("upsert") else change.delete
            key = self.b.keys.item(name).encode()
            if change.expect_mod_revision != -1:
                compares.append(Compare(key, "mod", change.expect_mod_revision))
            if change.HasField("upsert"):
                ops.append(op_put(key, change.upsert.SerializeToString()))
            else:
                ops.append(op_delete(key))
        try:
            resp = await self.b.etcd.txn(compares, ops)
        except EtcdError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        if not resp.succeeded:
            return pb.ApplyResponse(status=pb.ETCD_TRANSACTION_FAILED, header=self.b.header())
        try:
            await self.b.keyspace.wait_for_revision(resp.header.revision, timeout=10)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"applied at revision {resp.header.revision}, but this broker's "
                "view of etcd did not catch up within 10s",
            )
        return pb.ApplyResponse(status=pb.OK, header=self.b.header())

    # --- Read -------------------------------------------------------------------------------
    @counted("Read")
    async def Read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.ReadResponse]:  # noqa: N802
        try:
            validate_read_request(request)
        except ValidationError as err:
            await self._invalid(context, err)
        res = await self._resolve(
            request.journal,
            request.min_etcd_revision,
            context,
            require_primary=False,
            may_proxy=not request.do_not_proxy and not self._was_proxied(request.header),
        )
        if res.status != pb.OK:
            yield pb.ReadResponse(status=res.status, header=res.header)
            return
        if res.proxy_to:
            forwarded = pb.ReadRequest()
            forwarded.CopyFrom(request)
            forwarded.header.CopyFrom(res.header)
            try:
                async for resp in self.b.peer_stub(res.proxy_to).Read(forwarded):
                    yield resp
            except grpc.aio.AioRpcError as err:
                await self._proxy_error(context, res.proxy_to, err)
            return
        replica = res.replica
        assert replica is not None
        header = res.header
        if not replica.readable():
            yield pb.ReadResponse(status=pb.NOT_ALLOWED, header=header)
            return
        offset = replica.write_head if request.offset == -1 else request.offset
        first = True
        gap_checks = 0
        while True:
            if request.end_offset and offset >= request.end_offset:
                return
            entry, found = replica.index.find(offset)
            if not found:
                if offset < replica.write_head and request.block and replica.in_hole(offset):
                    # Skipped by this fresh primary: the old one may be back soon to publish
                    # what it acknowledged here (broker.reservation).
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
                if offset < replica.write_head:
                    offset = replica.write_head
                if not request.block:
                    yield pb.ReadResponse(
                        status=pb.OFFSET_NOT_YET_AVAILABLE,
                        header=header if first else None,
                        offset=offset,
                        write_head=replica.write_head,
                    )
                    return
                if not await replica.wait_for_head_beyond(offset):
                    yield pb.ReadResponse(status=pb.JOURNAL_NOT_FOUND, header=self.b.header())
                    return
                continue
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
            if request.metadata_only or (remote and request.do_not_proxy):
                return
            end = entry.end if not request.end_offset else min(entry.end, request.end_offset)
            fd = await self._open_content(replica, entry, context)
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
                            f"fragment of {replica.name} is shorter than indexed "
                            f"at offset {offset}",
                        )
                    yield pb.ReadResponse(offset=offset, content=data)
                    offset += n
            finally:
                os.close(fd)

    async def _open_content(self, replica: JournalReplica, entry: Any, context: Any) -> int | None:
        if entry.local_path is not None:
            try:
                return os.open(entry.local_path, os.O_RDONLY)
            except FileNotFoundError:
                return None
        try:
            path = await self.b.cache.get(entry.spec)
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

    # --- Append -----------------------------------------------------------------------------
    @counted("Append")
    async def Append(
        self, request_iterator: AsyncIterator[pb.AppendRequest], context: Any
    ) -> pb.AppendResponse:  # noqa: N802
        it = request_iterator.__aiter__()
        try:
            first = await anext(it)
        except StopAsyncIteration:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty Append stream")
        try:
            validate_first_append_request(first)
        except ValidationError as err:
            await self._invalid(context, err)
        res = await self._resolve(
            first.journal,
            first.min_etcd_revision,
            context,
            require_primary=True,
            may_proxy=not first.do_not_proxy and not self._was_proxied(first.header),
        )
        if res.status != pb.OK:
            return pb.AppendResponse(status=res.status, header=res.header)
        if res.proxy_to:
            return await self._proxy_append(res, first, it, context)
        replica = res.replica
        assert replica is not None
        header = res.header
        if not replica.writable():
            return pb.AppendResponse(status=pb.NOT_ALLOWED, header=header)
        if replica.spec.suspend.level == pb.JournalSpec.Suspend.FULL:
            return pb.AppendResponse(status=pb.SUSPENDED, header=header)
        if len(header.route.members) < replica.spec.replication:
            return pb.AppendResponse(status=pb.INSUFFICIENT_JOURNAL_BROKERS, header=header)

        async with replica.lock:
            try:
                pipeline = await self.b.ensure_pipeline(replica)
            except ReplicationError as err:
                log.warning("append refused journal=%s err=%s", replica.name, err)
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
            header = self.b.header(replica.name)
            if 1 + len(pipeline.peers) < replica.spec.replication:
                # The route shrank while this append waited for the journal.
                return pb.AppendResponse(status=pb.INSUFFICIENT_JOURNAL_BROKERS, header=header)
            if first.offset and first.offset != replica.write_head:
                return pb.AppendResponse(
                    status=pb.WRONG_APPEND_OFFSET, header=header, registers=replica.registers
                )
            if first.HasField("check_registers") and not registers_match(
                first.check_registers, replica.registers
            ):
                return pb.AppendResponse(
                    status=pb.REGISTER_MISMATCH, header=header, registers=replica.registers
                )
            if replica.should_roll(time.time()):
                for entry in replica.roll():
                    self.b.persist_queue.put_nowait((replica, entry))
                try:  # peers roll with us
                    await pipeline.propose(replica.ensure_spool().fragment(), replica.registers)
                except ReplicationError as err:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
            spool = replica.ensure_spool()
            pending = spool.begin_append()
            chunks, delayed = 1, 0  # the first message counts, as upstream

            replicating = bool(pipeline.peers)

            async def write(data: bytes) -> None:
                delta = len(pending)
                pending.write(data)
                if replicating:
                    await pipeline.send_content(data, delta)
                else:
                    pipeline.check()  # no peers: nothing to send, but not if it broke

            try:
                if first.content and await replica.throttle(len(first.content)):
                    delayed += 1
                await write(first.content)
                received, delayed_more = await self._receive(it, write, replica)
                chunks += received
                delayed += delayed_more
            except BaseException as err:
                pending.rollback()
                if not pipeline.broken:
                    try:  # peers discard the append's content too
                        await pipeline.propose(spool.fragment(), replica.registers)
                    except ReplicationError:
                        pass
                if isinstance(err, ReplicationError):
                    log.warning("append failed journal=%s err=%s", replica.name, err)
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
                if isinstance(err, StopAsyncIteration):
                    await context.abort(
                        grpc.StatusCode.ABORTED,
                        "append stream ended without the empty commit message: rolled back",
                    )
                if isinstance(err, AppendProtocolError):
                    # Read what the client still sends first: a gRPC Python client still
                    # sending when the stream is answered reports INTERNAL instead.
                    await drain_requests(it, self.b.cfg.chunk_timeout)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
                if isinstance(err, TimeoutError):
                    await context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"append stalled for over {self.b.cfg.chunk_timeout}s: rolled back",
                    )
                if isinstance(err, SpoolError):
                    await self._spool_failed(context, err, it)
                raise
            begin, end = pending.begin, pending.end
            digest = b""
            if end > begin:
                # As upstream: the request's union values replace current values of a name.
                if first.union_registers.labels or first.subtract_registers.labels:
                    regs = labels.union(
                        first.union_registers,
                        labels.subtract(replica.registers, first.subtract_registers),
                    )
                else:
                    regs = replica.registers
                try:  # offsets of a replication-1 journal are reserved before acknowledged
                    await self.b.reserve(replica, end)
                except BaseException as err:
                    pending.rollback()
                    if not isinstance(err, ReservationError):
                        raise
                    log.warning("append refused journal=%s err=%s", replica.name, err)
                    if isinstance(err, ReservationStoreError):
                        return pb.AppendResponse(
                            status=pb.FRAGMENT_STORE_UNHEALTHY,
                            header=header,
                            store_health_error=str(err),
                        )
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
                try:  # every peer commits before we do
                    if replicating:
                        await pipeline.propose(pending.proposal(), regs)
                    else:
                        pipeline.check()
                except BaseException as err:
                    # Also when cancelled: no bytes past the spool's end, and no pipeline
                    # whose peers may hold the append pending, or committed.
                    pending.rollback()
                    pipeline.close()
                    if not isinstance(err, ReplicationError):
                        raise
                    log.warning("append commit failed journal=%s err=%s", replica.name, err)
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
                try:
                    digest = pending.commit()
                except SpoolError as err:
                    await self._spool_failed(context, err)
                if regs is not replica.registers and not labels.label_set_equal(
                    regs, replica.registers
                ):
                    replica.store_registers(regs)
                replica.committed(spool)
                self.b.reserve_ahead(replica)
            commit = pb.Fragment(
                journal=replica.name, begin=begin, end=end, compression_codec=replica.codec
            )
            if digest:
                commit.sum.CopyFrom(sha1sum_from_digest(digest))
            return pb.AppendResponse(
                status=pb.OK,
                header=header,
                commit=commit,
                registers=replica.registers,
                total_chunks=chunks,
                delayed_chunks=delayed,
                store_health_error=replica.store_health_error,
            )

    async def _spool_failed(
        self, context: Any, err: SpoolError, unread: AsyncIterator[Any] | None = None
    ) -> None:
        """Answer an append whose spool write failed (after reading the rest of its stream,
        `unread`, so the client gets the answer). A full disk is relieved (spools are rolled
        and persisted, which removes them) and the client told to retry."""
        log.error("spool write failed: %s", err)
        if isinstance(err, SpoolDiskFull):
            self.b.relieve_disk()
        if unread is not None:
            await drain_requests(unread, self.b.cfg.chunk_timeout)
        if isinstance(err, SpoolDiskFull):
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{err}: the broker is persisting its spools to free the disk; retry",
            )
        await context.abort(grpc.StatusCode.INTERNAL, str(err))

    async def _proxy_append(
        self,
        res: Resolution,
        first: pb.AppendRequest,
        it: AsyncIterator[pb.AppendRequest],
        context: Any,
    ) -> pb.AppendResponse:
        """Forward an Append stream to the journal's primary and relay its response."""
        forwarded = pb.AppendRequest()
        forwarded.CopyFrom(first)
        forwarded.header.CopyFrom(res.header)

        async def requests() -> AsyncIterator[pb.AppendRequest]:
            yield forwarded
            async for msg in it:
                yield msg

        try:
            resp: pb.AppendResponse = await self.b.peer_stub(res.proxy_to).Append(requests())
            return resp
        except grpc.aio.AioRpcError as err:
            await self._proxy_error(context, res.proxy_to, err)
        raise AssertionError("unreachable: abort raises")

    async def _receive(
        self,
        it: AsyncIterator[pb.AppendRequest],
        write: Any,
        replica: JournalReplica,
    ) -> tuple[int, int]:
        """Write content chunks until the empty commit message, then require EOF.

        Returns (messages received, chunks delayed by the journal's max_append_rate). Raises
        StopAsyncIteration if the stream ends before the commit message, TimeoutError if
        the client stalls, and AppendProtocolError if a message carries more than content
        (another journal, parameters) or anything follows the commit message.
        """
        timeout = self.b.cfg.chunk_timeout
        loop = asyncio.get_running_loop()
        count = delayed = 0
        # One timeout, rearmed before each message and disarmed while we write.
        async with asyncio.timeout(None) as stall:
            while True:
                stall.reschedule(loop.time() + timeout)
                msg = await anext(it)
                stall.reschedule(None)
                count += 1
                try:
                    validate_later_append_request(msg)
                except ValidationError as err:
                    # As upstream: even its own journal's name is not content.
                    raise AppendProtocolError(
                        f"Append message {count + 1} of journal {replica.name}: {err}"
                    ) from None
                if not msg.content:
                    break
                if await replica.throttle(len(msg.content)):
                    delayed += 1
                await write(msg.content)
            stall.reschedule(loop.time() + timeout)
            try:
                extra = await anext(it)
            except StopAsyncIteration:
                return count, delayed
        raise AppendProtocolError(
            f"unexpected message after the commit message (content {len(extra.content)} bytes)"
        )

    # --- Fragments ----------------------------------------------------------------------------
    @counted("ListFragments")
    async def ListFragments(
        self, request: pb.FragmentsRequest, context: Any
    ) -> pb.FragmentsResponse:  # noqa: N802
        try:
            validate_fragments_request(request)
        except ValidationError as err:
            await self._invalid(context, err)
        res = await self._resolve(
            request.journal,
            0,
            context,
            require_primary=False,
            may_proxy=not request.do_not_proxy and not self._was_proxied(request.header),
        )
        if res.status != pb.OK:
            return pb.FragmentsResponse(status=res.status, header=res.header)
        if res.proxy_to:
            forwarded = pb.FragmentsRequest()
            forwarded.CopyFrom(request)
            forwarded.header.CopyFrom(res.header)
            try:
                proxied: pb.FragmentsResponse = await self.b.peer_stub(res.proxy_to).ListFragments(
                    forwarded
                )
                return proxied
            except grpc.aio.AioRpcError as err:
                await self._proxy_error(context, res.proxy_to, err)
        replica = res.replica
        assert replica is not None
        limit = request.page_limit or DEFAULT_FRAGMENTS_PAGE
        resp = pb.FragmentsResponse(status=pb.OK, header=res.header)
        ttl = (
            request.signatureTTL.seconds + request.signatureTTL.nanos / 1e9
            if request.HasField("signatureTTL")
            else 0.0
        )
        for entry in replica.index:
            f = entry.spec
            if f.begin < request.next_page_token:
                continue
            if request.begin_mod_time and f.mod_time < request.begin_mod_time:
                continue
            if request.end_mod_time and f.mod_time >= request.end_mod_time:
                continue
            if len(resp.fragments) == limit:
                resp.next_page_token = f.begin
                break
            item = resp.fragments.add(spec=f)
            if ttl > 0 and f.backing_store:
                try:
                    item.signed_url = await store_for_url(f.backing_store).sign_get_url(f, ttl)
                except FragmentStoreError as err:
                    log.warning("cannot sign fragment URL err=%s", err)
        return resp

    @counted("FragmentStoreHealth")
    async def FragmentStoreHealth(
        self, request: pb.FragmentStoreHealthRequest, context: Any
    ) -> pb.FragmentStoreHealthResponse:  # noqa: N802
        try:
            store = store_for_url(request.fragment_store)
            await store.health()
        except FragmentStoreError as err:
            return pb.FragmentStoreHealthResponse(
                status=pb.FRAGMENT_STORE_UNHEALTHY,
                header=self.b.header(),
                store_health_error=str(err),
            )
        return pb.FragmentStoreHealthResponse(status=pb.OK, header=self.b.header())

    @counted("Replicate")
    async def Replicate(
        self, request_iterator: Any, context: Any
    ) -> AsyncIterator[pb.ReplicateResponse]:  # noqa: N802
        """Peer side of replication (broker.replication): apply the primary's content and
        proposals to our replica while the route stays the one the stream was opened for."""
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
            if first.header.etcd.revision > self.b.keyspace.revision:
                await self.b.keyspace.wait_for_revision(first.header.etcd.revision, timeout=10)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"etcd revision {first.header.etcd.revision} not reached within 10s",
            )
        mine = self.b.my_assignment(name)
        route = self.b.route_of(name)
        header = self.b.header(route=route)
        if mine is None or mine[1] == 0:
            yield pb.ReplicateResponse(status=pb.NOT_JOURNAL_BROKER, header=header)
            return
        key = route_key(route)
        if key != route_key(first.header.route):
            yield pb.ReplicateResponse(status=pb.WRONG_ROUTE, header=header)
            return
        try:
            replica = await self.b._ready_replica(name, 10.0)
        except TimeoutError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"replica of {name} not ready")
        if replica is None:
            yield pb.ReplicateResponse(status=pb.NOT_JOURNAL_BROKER, header=header)
            return
        # The replica's lock is held from an append's first content to the proposal that
        # resolves it (and while applying a proposal), never while the stream idles: the
        # broker's own flush loop and a promotion of this replica need it too.
        if route_key(self.b.route_of(name)) == key:
            # Our reconcile loop may not have recorded this route yet: when it does, that
            # is no route change for this stream.
            replica.set_route(key)
        route_change = asyncio.ensure_future(replica.route_changed())
        follower = Follower(replica, lambda entries: self.b._enqueue(replica, entries))
        held = False
        try:
            msg: pb.ReplicateRequest | None = first
            while msg is not None:
                if not held:
                    await replica.lock.acquire()
                    held = True
                    if route_key(self.b.route_of(name)) != key or replica.deleted:
                        replica.lock.release()  # never held while the answer is sent
                        held = False
                        yield pb.ReplicateResponse(
                            status=pb.WRONG_ROUTE, header=self.b.header(name)
                        )
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
                msg = await self._next_unless(
                    it, route_change, self.b.cfg.chunk_timeout * 1.5 if held else None
                )
                if msg is None and held:
                    log.warning("replication stream ended mid-append journal=%s: rolled back", name)
        except ReplicationProtocolError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except SpoolError as err:
            await self._spool_failed(context, err)
        finally:
            route_change.cancel()
            follower.rollback()
            if held:
                replica.lock.release()

    @staticmethod
    async def _next_unless(
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


def add_journal_service(server: grpc.aio.Server, service: JournalService) -> None:
    """Serve `service` on `server`: request messages that are not their type's protobuf, or
    are over `MAX_MESSAGE_SIZE`, are answered with a status saying so (`broker.request_guard`;
    the server should receive messages up to `transport_limit(MAX_MESSAGE_SIZE)`)."""
    add_guarded_service(
        server,
        pb.DESCRIPTOR.services_by_name["Journal"],
        service,
        max_message_size=MAX_MESSAGE_SIZE,
        drain_timeout=service.b.cfg.chunk_timeout,
    )
