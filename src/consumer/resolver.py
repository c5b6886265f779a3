"""The Resolver of a consumer process: which process serves a shard, for the application.

An application's own APIs (its gRPC services and HTTP handlers, added by ``register_grpc``
and ``register_http``) answer from a shard's store, which only the shard's primary holds.
`Resolver.resolve` maps a shard id to that primary. Used as an async context manager, the
`Resolution` it yields is one of:

- **local**: this process is the primary. ``res.shard`` and ``res.store`` are valid inside the
  ``async with``: the replica's teardown (the shard moved away, failed, or the process exits)
  waits until every resolution holding it has exited, so a handler never reads a destroyed
  store. A holder should finish promptly once ``res.shard.stopping`` is set: the shard's
  successor runs meanwhile, and this store no longer changes.
- **elsewhere** (``may_proxy=True`` only): ``res.primary_endpoint`` and ``res.primary_http``
  name the primary's gRPC and HTTP endpoints, and ``res.forward_unary`` / ``res.forward_http``
  hand the caller's request to it, marked as forwarded (`GRPC_PROXY_METADATA`,
  `HTTP_PROXY_HEADER`: the resolution's header, which carries the etcd revision the primary
  must reach first). A forwarded request is never forwarded again: resolving it with
  ``incoming=`` the request or gRPC context makes ``may_proxy`` false, so a route that
  changed in between answers NOT_SHARD_PRIMARY instead of bouncing between processes.
  A forwarded request carries the caller's credentials (gRPC ``authorization`` metadata,
  the HTTP ``Authorization`` header), never this process's: the primary's handler decides
  on what the caller may do, as it would had the caller reached it. Primaries that
  advertise ``https://`` are reached over TLS with this process's peer certificate.
- **not OK**: SHARD_NOT_FOUND, NO_SHARD_PRIMARY, NOT_SHARD_PRIMARY (the primary is elsewhere
  and the caller may not proxy, or the primary here is not ready), SHARD_STOPPED (it stopped
  while the caller waited for ``read_through``). ``res.error`` says so in words;
  ``forward_http`` answers it as a JSON error with a real HTTP status (404, 503), and
  ``forward_unary`` aborts the call (NOT_FOUND, UNAVAILABLE).

``read_through`` offsets make a local resolution wait until committed transactions read the
shard's sources through them ("read your own writes"); `ResolveArgs` hands them to a
`MessageProducer`. `shards_with_source` maps a journal (e.g. from a message mapping of the
application's key) to the specs of the shards reading it.

After `stop` (the runtime shuts down) a resolution whose primary is here raises
`ResolverStopped`; shards elsewhere still resolve. `stopping` is set once the process has
handed its shards over and is about to stop serving (upstream's ``Service.Stopping``): a
long-lived call (a server stream, a long poll) should end when it is set, or it is cut off
once the servers' grace runs out.

Not to be confused with `gazette.broker.resolver.Resolver`, which maps journals to brokers
inside a broker process; this one maps shards to consumer processes, for applications.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import grpc
import grpc.aio

from gazette.auth.tls import ClientTLS, endpoint_target
from gazette.broker.client.stuck_channels import StuckChannels, connected
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.application import ResolveArgs, Shard
from gazette.consumer.protocol import pb
from gazette.consumer.shard_api import shard_route
from gazette.consumer.store import Store

if TYPE_CHECKING:
    from aiohttp import ClientSession, web

    from gazette.consumer.replica import ShardReplica
    from gazette.consumer.runtime import ConsumerRuntime

__all__ = [
    "GRPC_PROXY_METADATA",
    "HTTP_PROXY_HEADER",
    "Resolution",
    "Resolver",
    "ResolverStopped",
    "grpc_code",
    "http_endpoint",
]

GRPC_PROXY_METADATA = "gazette-proxy-header-bin"
"""gRPC metadata of a forwarded call: the forwarding process's resolution header."""
HTTP_PROXY_HEADER = "Gazette-Proxy-Header"
"""HTTP header of a forwarded request: that header, serialized and base64-encoded."""

DEFAULT_TIMEOUT = 30.0
"""Seconds `Resolver.resolve` waits (etcd revision, recovery, read-through) by default."""
REVISION_TIMEOUT = 10.0
"""Seconds a resolution waits for this process's view of etcd to reach a revision."""
CHANNEL_CLOSE_GRACE = 30.0
"""Seconds calls in flight on the channel to a departed process may take before it closes."""
CHANNEL_OPTIONS = [
    # As brokers' channels to their peers: a process back after a restart is reached again
    # within a second (gRPC's defaults back off up to 2 minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

Code = pb.ReplicaStatus.Code


class ResolverStopped(Exception):
    """The process stopped serving its shards: a shard whose primary is here cannot be
    resolved any more (upstream's ``ErrResolverStopped``)."""

    def __init__(self, shard: str) -> None:
        super().__init__(f"shard {shard}: the resolver of this consumer process is stopped")
        self.shard = shard


def grpc_code(status: pb.Status.ValueType) -> grpc.StatusCode:
    """The gRPC code a non-OK resolution aborts a call with."""
    if status == pb.SHARD_NOT_FOUND:
        return grpc.StatusCode.NOT_FOUND
    if status in (pb.NO_SHARD_PRIMARY, pb.NOT_SHARD_PRIMARY, pb.SHARD_STOPPED):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.UNKNOWN


def http_endpoint(advertised: str, port: int) -> str:
    """The HTTP endpoint another process reaches this one at: the host of its advertised
    gRPC endpoint, and the HTTP server's port; ``https://`` if the gRPC endpoint is (the
    server's TLS covers both)."""
    scheme = "https" if advertised.startswith("https://") else "http"
    host = urlsplit(advertised if "://" in advertised else f"http://{advertised}").hostname
    host = host or "127.0.0.1"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


class Resolution:
    """Where a shard is served, as of `header` (module docs). Local only inside the
    ``async with`` of `Resolver.resolve`."""

    def __init__(
        self,
        status: pb.Status.ValueType,
        header: bpb.Header,
        *,
        shard_id: str = "",
        spec: pb.ShardSpec | None = None,
        replica: ShardReplica | None = None,
        primary_endpoint: str = "",
        primary_http: str = "",
        proxied: bool = False,
        resolver: Resolver | None = None,
    ) -> None:
        self.status = status
        self.header = header
        """etcd revision and route of the resolution; its process is the primary when OK."""
        self.shard_id = shard_id
        self.spec = spec
        self.replica = replica
        """The primary replica here (local resolutions only)."""
        self.primary_endpoint = primary_endpoint
        """gRPC endpoint of the primary, when it is another process."""
        self.primary_http = primary_http
        """HTTP endpoint of that primary ('' if it serves no HTTP)."""
        self.proxied = proxied
        """The request resolved was forwarded by another process (it is not forwarded on)."""
        self._resolver = resolver

    @property
    def local(self) -> bool:
        """This process is the primary: `shard` and `store` are valid."""
        return self.replica is not None

    @property
    def shard(self) -> Shard | None:
        return self.replica.shard if self.replica is not None else None

    @property
    def store(self) -> Store | None:
        return self.replica.store if self.replica is not None else None

    @property
    def error(self) -> str:
        """What a non-OK resolution means, in words ('' when OK)."""
        if self.status == pb.OK:
            return ""
        name = pb.Status.Name(self.status)
        why: str = {
            pb.SHARD_NOT_FOUND: "no such shard",
            pb.NO_SHARD_PRIMARY: "no consumer process is its primary",
            pb.NOT_SHARD_PRIMARY: (
                "its primary is another process, and a forwarded request is not forwarded again"
                if self.proxied
                else "this process is not its ready primary"
            ),
            pb.SHARD_STOPPED: "it stopped while the request waited",
        }.get(self.status, "")
        return f"shard {self.shard_id}: {name}" + (f" ({why})" if why else "")

    def _forwardable(self) -> bool:
        return self.status == pb.OK and self.replica is None and not self.proxied

    async def forward_unary(
        self,
        method: str,
        request: Any,
        context: grpc.aio.ServicerContext[Any, Any] | None = None,
        *,
        response_deserializer: Callable[[bytes], Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Call unary `method` (``/package.Service/Method``) of the primary with `request`
        and return its response: raw bytes (a generic handler's), or a message of
        `response_deserializer` (e.g. ``Reply.FromString``) for a request message. The call
        carries the resolution's header (`GRPC_PROXY_METADATA`), the caller's metadata, and
        the deadline of `context` (else `timeout`).

        With `context` (the handler's), a resolution that is not OK, and a failed call,
        abort it with the matching code (`grpc_code`; the primary's own code). Without it,
        ValueError for a resolution that cannot be forwarded, `grpc.aio.AioRpcError` for a
        failed call. Cancellation cancels the forwarded call."""
        if context is not None and proxy_header_of(context)[0] and self._forwardable():
            # Resolved without `incoming`: still, a forwarded call is never forwarded again
            # (two processes that disagree on the route would pass it back and forth).
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"shard {self.shard_id}: a forwarded request is not forwarded again",
            )
        if not self._forwardable():
            why = self.error or "the shard is served here: nothing to forward"
            if context is not None:
                await context.abort(grpc_code(self.status), why)
            raise ValueError(why)
        assert self._resolver is not None
        metadata: list[tuple[str, str | bytes]] = [
            (GRPC_PROXY_METADATA, self.header.SerializeToString())
        ]
        if context is not None:
            metadata += [
                (k, v) for k, v in context.invocation_metadata() or () if _forwarded_metadata(k)
            ]
            timeout = context.time_remaining()
        serializer = None if isinstance(request, bytes) else type(request).SerializeToString
        channel = self._resolver.channel(self.primary_endpoint)
        await connected(channel)  # A primary just restarted: our channel may still back off.
        call = channel.unary_unary(
            method, request_serializer=serializer, response_deserializer=response_deserializer
        )
        try:
            return await call(request, timeout=timeout, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            if context is not None:
                await context.abort(
                    err.code(), f"forwarded to {self.primary_endpoint}: {err.details()}"
                )
            raise

    async def forward_http(self, request: web.Request) -> web.StreamResponse:
        """The answer to `request` for this resolution when it is not local: the primary's
        response to the same request (method, path, query, headers, body; streamed back),
        or a JSON error ``{"status", "shard", "error"}`` with a real HTTP status: 404
        SHARD_NOT_FOUND, else 503 (also UNAVAILABLE when the primary cannot be reached or
        serves no HTTP). See `consumer.http_api.forward`."""
        from gazette.consumer import http_api

        if not self._forwardable():
            if self.status == pb.OK:
                raise ValueError("the shard is served here: nothing to forward")
            return http_api.status_response(self.status, self.shard_id, self.error)
        assert self._resolver is not None
        return await http_api.forward(
            self._resolver.http_session(), request, self.primary_http, self.header, self.shard_id
        )

    def __repr__(self) -> str:
        where = "here" if self.local else self.primary_endpoint or "-"
        return f"Resolution({self.shard_id!r}, {pb.Status.Name(self.status)}, {where})"


def _forwarded_metadata(key: str) -> bool:
    """Whether the caller's metadata `key` goes along with a forwarded call (not gRPC's own,
    nor a proxy header it carried)."""
    return not (
        key.startswith((":", "grpc-"))
        or key in ("user-agent", "content-type", "te", "host", GRPC_PROXY_METADATA)
    )


def proxy_header_of(incoming: Any) -> tuple[bool, bpb.Header | None]:
    """Whether `incoming` (an aiohttp request or a gRPC servicer context) was forwarded by
    another consumer process, and the header it carries (None if unreadable)."""
    raw: bytes | None = None
    if hasattr(incoming, "invocation_metadata"):
        for key, value in incoming.invocation_metadata() or ():
            if key == GRPC_PROXY_METADATA:
                raw = value if isinstance(value, bytes) else value.encode()
    elif hasattr(incoming, "headers"):
        text = incoming.headers.get(HTTP_PROXY_HEADER)
        if text is not None:
            try:
                raw = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                return True, None
    else:
        raise TypeError(f"incoming is neither an aiohttp request nor a gRPC context: {incoming!r}")
    if raw is None:
        return False, None
    try:
        return True, bpb.Header.FromString(raw)
    except Exception:  # noqa: BLE001 - a malformed header is still a forwarded request
        return True, None


class Resolver:
    """Resolves shards of `runtime`'s application (module docs). One per consumer process:
    ``runtime.resolver``."""

    def __init__(self, runtime: ConsumerRuntime) -> None:
        self._runtime = runtime
        self.stopping = asyncio.Event()
        """Set when the process is about to stop serving (module docs). Wait on it; do not
        set it."""
        self._stopped = False
        self._closed = False
        self._channels: dict[tuple[str, bool], grpc.aio.Channel] = {}
        self._stuck = StuckChannels()
        self._credentials: grpc.ChannelCredentials | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._session: ClientSession | None = None
        self._sources: tuple[int, dict[str, list[pb.ShardSpec]]] = (-1, {})

    # --- life cycle ---------------------------------------------------------------------------
    def begin_stopping(self) -> None:
        """Tell long-lived calls to end: the process stops serving next."""
        self.stopping.set()

    def stop(self) -> None:
        """Stop resolving to shards here (`ResolverStopped`); sets `stopping` too."""
        self._stopped = True
        self.stopping.set()

    async def close(self) -> None:
        """Close the connections made to forward requests; forwarding afterwards raises
        RuntimeError. Idempotent."""
        self._closed = True
        channels, self._channels = self._channels, {}
        await self._stuck.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        for ch in channels.values():
            await ch.close(None)
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def channel(self, endpoint: str) -> grpc.aio.Channel:
        """A channel to another consumer process's gRPC `endpoint` (reused until `close`, or
        until that process leaves the application, or until it has failed for 10 s:
        `gazette.broker.client.stuck_channels`): TLS with this process's peer TLS if
        `endpoint` is ``https://``. RuntimeError after `close`; `TLSConfigError` if the peer
        TLS files cannot be read (they are checked at the process's start)."""
        if self._closed:
            raise RuntimeError("the resolver is closed: it forwards nothing more")
        key = endpoint_target(endpoint)
        ch = self._channels.get(key)
        if ch is not None and self._stuck.stuck(key, ch):  # (`stuck_channels`)
            self._stuck.retire(self._channels.pop(key))
            ch = None
        if ch is None:
            self._prune_channels()
            target, secure = key
            if secure:
                if self._credentials is None:
                    tls = self._runtime.cfg.peer_tls or ClientTLS()
                    self._credentials = tls.grpc_credentials()
                ch = grpc.aio.secure_channel(target, self._credentials, options=CHANNEL_OPTIONS)
            else:
                ch = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
            self._channels[key] = ch
        return ch

    def _prune_channels(self) -> None:
        """Close the channels to processes no longer members of the application (members
        come and go with every restart under a new address: their channels would pile up)."""
        rt = self._runtime
        live = {
            endpoint_target(kv.value.process_spec.endpoint)
            for kv in rt.keyspace.prefixed(rt.keys.members)
        }
        for key in [k for k in self._channels if k not in live]:
            ch = self._channels.pop(key)
            task = asyncio.get_running_loop().create_task(ch.close(CHANNEL_CLOSE_GRACE))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def http_session(self) -> ClientSession:
        """The HTTP client session forwarded requests go through (made at first use).
        RuntimeError after `close`."""
        if self._closed:
            raise RuntimeError("the resolver is closed: it forwards nothing more")
        if self._session is None:
            from gazette.consumer import http_api

            tls = self._runtime.cfg.peer_tls
            self._session = http_api.forwarding_session(
                ssl=None if tls is None else tls.ssl_context()
            )
        return self._session

    # --- resolution ---------------------------------------------------------------------------
    def header(self, shard_id: str = "") -> bpb.Header:
        """A response header of this process: its id, its etcd view, `shard_id`'s route."""
        rt = self._runtime
        h = rt.keyspace.header
        header = bpb.Header(
            process_id=rt.process_id,
            etcd=bpb.Header.Etcd(
                cluster_id=h.cluster_id,
                member_id=h.member_id,
                revision=h.revision,
                raft_term=h.raft_term,
            ),
        )
        header.route.CopyFrom(self.route_of(shard_id) if shard_id else bpb.Route(primary=-1))
        return header

    def route_of(self, shard_id: str) -> bpb.Route:
        """The shard's route: its assigned members sorted, the primary marked."""
        return shard_route(self._runtime.keyspace, self._runtime.keys, shard_id)[0]

    async def locate(
        self,
        shard_id: str,
        *,
        may_proxy: bool = True,
        proxy_header: bpb.Header | None = None,
        min_etcd_revision: int = 0,
        wait: float = DEFAULT_TIMEOUT,
    ) -> Resolution:
        """Where `shard_id` is served, holding nothing (`resolve` holds a local shard). A
        local primary still recovering, or restarting, is waited for up to `wait` seconds.
        Raises TimeoutError if this process's etcd view does not reach the revision asked
        for (or the proxy header's) within `REVISION_TIMEOUT` (or `wait`, if less), and
        `ResolverStopped` after `stop` for a shard whose primary is here."""
        rt = self._runtime
        proxied = proxy_header is not None
        if proxied:
            may_proxy = False
            assert proxy_header is not None
            min_etcd_revision = max(min_etcd_revision, proxy_header.etcd.revision)
        if min_etcd_revision > rt.keyspace.revision:
            bound = min(REVISION_TIMEOUT, wait) if wait > 0 else REVISION_TIMEOUT
            await rt.keyspace.wait_for_revision(min_etcd_revision, timeout=bound)
        kv = rt.keyspace.get(rt.keys.item(shard_id))
        if kv is None:
            return self._failed(pb.SHARD_NOT_FOUND, shard_id, self.header(), proxied)
        spec: pb.ShardSpec = kv.value
        header = self.header(shard_id)
        route = header.route
        if route.primary < 0:
            return self._failed(pb.NO_SHARD_PRIMARY, shard_id, header, proxied, spec)
        primary = route.members[route.primary]
        if (primary.zone, primary.suffix) != (rt.cfg.zone, rt.cfg.suffix):
            if not may_proxy:
                return self._failed(pb.NOT_SHARD_PRIMARY, shard_id, header, proxied, spec)
            header.process_id.CopyFrom(primary)
            member = rt.keyspace.get(f"{rt.keys.members}{primary.zone}#{primary.suffix}")
            return Resolution(
                pb.OK,
                header,
                shard_id=shard_id,
                spec=spec,
                primary_endpoint=route.endpoints[route.primary],
                primary_http=member.value.http_endpoint if member is not None else "",
                resolver=self,
            )
        if self._stopped:
            raise ResolverStopped(shard_id)
        replica = rt.replicas.get(shard_id)
        if replica is None and wait > 0:
            # Assigned here, its replica not started yet (a restart for a new spec stops the
            # old one first): answer from the next one, as from one still recovering. The
            # route is looked at again then.
            started = time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await rt.next_replica(shard_id)
            return await self.locate(
                shard_id,
                may_proxy=may_proxy,
                proxy_header=proxy_header,
                min_etcd_revision=min_etcd_revision,
                wait=max(0.0, wait - (time.monotonic() - started)),
            )
        if replica is not None and not replica.settled.is_set() and wait > 0:
            # Our primary is still recovering: answer once it is ready (or failed).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await replica.settled.wait()
        if replica is None or replica.status.code != Code.PRIMARY:
            return self._failed(pb.NOT_SHARD_PRIMARY, shard_id, header, proxied, spec)
        return Resolution(
            pb.OK, header, shard_id=shard_id, spec=spec, replica=replica, proxied=proxied
        )

    def _failed(
        self,
        status: pb.Status.ValueType,
        shard_id: str,
        header: bpb.Header,
        proxied: bool,
        spec: pb.ShardSpec | None = None,
    ) -> Resolution:
        header.process_id.CopyFrom(self._runtime.process_id)  # We authored the error.
        return Resolution(
            status, header, shard_id=shard_id, spec=spec, proxied=proxied, resolver=self
        )

    @contextlib.asynccontextmanager
    async def resolve(
        self,
        shard: str,
        *,
        may_proxy: bool = False,
        read_through: dict[str, int] | None = None,
        proxy_header: bpb.Header | None = None,
        incoming: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> AsyncIterator[Resolution]:
        """``async with resolver.resolve(shard, ...) as res:`` where `shard` is served (module
        docs); a local shard and its store are held until the block exits.

        `may_proxy`: whether the primary may be another process (else NOT_SHARD_PRIMARY).
        `read_through`: offsets of the shard's sources that committed transactions must have
        read through first (a `MessageProducer` picks them from `ResolveArgs`). `incoming`:
        the aiohttp request or gRPC servicer context being answered: a request another
        process forwarded is resolved with its `proxy_header` and never forwarded again, and
        a gRPC deadline bounds the wait. `proxy_header`: that header, given directly.

        Waits at most `timeout` seconds in all (TimeoutError). Raises `ResolverStopped`
        (module docs), and what a `MessageProducer`'s ``read_through`` raises. Cancellation
        while waiting holds nothing."""
        if incoming is not None:
            forwarded, found = proxy_header_of(incoming)
            if forwarded:
                may_proxy = False
                proxy_header = found if found is not None else bpb.Header()
            remaining = getattr(incoming, "time_remaining", None)
            left = remaining() if callable(remaining) else None
            if left is not None:
                timeout = min(timeout, left)
        res = await self._resolve(
            ResolveArgs(
                shard=shard,
                read_through=dict(read_through or {}),
                may_proxy=may_proxy,
                proxy_header=proxy_header,
            ),
            timeout,
        )
        replica = res.replica
        if replica is None:
            yield res
            return
        replica.hold()
        try:
            yield res
        finally:
            replica.unhold()

    async def _resolve(self, args: ResolveArgs, timeout: float) -> Resolution:
        """`locate`, then wait for ``args.read_through`` on a local primary; the replica is
        still serving when this returns it (nothing awaited since the check)."""
        deadline = asyncio.get_running_loop().time() + timeout
        res = await self.locate(
            args.shard, may_proxy=args.may_proxy, proxy_header=args.proxy_header, wait=timeout
        )
        replica = res.replica
        if replica is None:
            return res
        stopping = replica.shard.stopping
        async with asyncio.timeout_at(deadline):
            offsets = await self._runtime.read_through_offsets(replica, args)
            if offsets and not stopping.is_set():
                reached = asyncio.ensure_future(replica.shard.wait_read_through(offsets))
                stopped = asyncio.ensure_future(stopping.wait())
                try:
                    await asyncio.wait({reached, stopped}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    reached.cancel()
                    stopped.cancel()
        if stopping.is_set() or replica.store is None:
            return self._failed(
                pb.SHARD_STOPPED, args.shard, self.header(args.shard), res.proxied, res.spec
            )
        return res

    def shards_with_source(self, journal: str) -> list[pb.ShardSpec]:
        """The specs of shards reading `journal` (a source), ordered by shard id. Which one
        is responsible for a key mapped to `journal` is the application's choice; one
        shard per source journal is the common case."""
        ks = self._runtime.keyspace
        revision, index = self._sources
        if revision != ks.revision:
            index = {}
            for kv in ks.prefixed(self._runtime.keys.items):
                spec: pb.ShardSpec = kv.value
                for src in spec.sources:
                    index.setdefault(src.journal, []).append(spec)
            for specs in index.values():
                specs.sort(key=lambda s: s.id)
            self._sources = (ks.revision, index)
        return list(index.get(journal, ()))
