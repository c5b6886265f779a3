"""The HTTP side of a consumer process: operator endpoints and the application's handlers.

Served with aiohttp on ``--http-port`` (same host as ``--listen``) next to the gRPC server:

- ``GET /healthz``: 200 ``{"status": "ok", ...}`` once this process's member is registered
  in etcd and its keyspace loaded; 503 with ``"starting"`` before, ``"draining"`` once it
  was told to exit (it is handing its shards over), ``"stopped"`` once that is over. For
  load balancers and probes.
- ``GET /debug/shards``: JSON of this process's shard replicas: status, errors, whether
  primary, committed progress and transaction counters.
- ``GET /debug/metrics``: Prometheus metrics of those replicas (`consumer.metrics`; upstream
  Gazette's names and path).
- Whatever the Application adds in ``register_http(app, runtime)``: `app` is the
  `aiohttp.web.Application` (add routes to ``app.router``); `runtime` the `ConsumerRuntime`,
  whose ``resolver`` (`consumer.resolver`) finds a shard's primary. Until the member is
  registered, and again once the drain is over (the runtime is about to shut down),
  requests to the application's routes are answered 503 (the runtime cannot resolve
  anything then).

Forwarding: the server's URL (the host of the advertised gRPC endpoint, the bound port) is
announced in the process's ConsumerSpec (``http_endpoint``), so that a handler on another
process can hand a request for a shard primary here over (`forward`, through
``Resolution.forward_http``). The forwarded request carries `HTTP_PROXY_HEADER`; one that
does is never forwarded again. It carries the caller's headers too (its ``Authorization``
among them): the primary's handler decides on the caller's credentials, not on the
forwarding process's.

With the server's TLS on (``--server-cert-file``), the server is HTTPS with the same
certificate, announced as ``https://``, and requests forwarded to such a primary go over
TLS with this process's peer certificate (`forwarding_session`).

On exit the server is closed before the runtime shuts down; `close` waits
``shutdown_timeout`` (2 s) for requests in flight, then cancels their handlers (a few
seconds in all, where aiohttp's default would wait a minute).

The socket is bound before the process registers in etcd, so a port in use fails the start
(`HTTPAddressInUse`) before anything is announced.
"""

from __future__ import annotations

from gazette._extras import require

require("the consumer's HTTP server", "consumer", "aiohttp")

import base64
import errno
import inspect
import logging
from collections.abc import Awaitable, Callable
from ssl import SSLContext
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer import metrics
from gazette.consumer.protocol import pb
from gazette.consumer.resolver import HTTP_PROXY_HEADER, http_endpoint

if TYPE_CHECKING:
    from gazette.consumer.runtime import ConsumerRuntime

__all__ = [
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "ConsumerHTTP",
    "HTTPAddressInUse",
    "HTTPStartError",
    "forward",
    "forwarding_session",
    "status_response",
]

log = logging.getLogger(__name__)

_BUILTIN = ("/healthz", "/debug/")
_GATED = {  # States in which the application's routes answer 503, and why.
    "starting": "the consumer is starting: not registered yet",
    "stopped": "the consumer is stopping: its shards were handed over",
}
DEFAULT_SHUTDOWN_TIMEOUT = 2.0
"""aiohttp's ``shutdown_timeout`` of `ConsumerHTTP` (its default is 60 s): `close` waits that
long for requests in flight, then cancels their handlers and waits up to that long again."""


class HTTPStartError(Exception):
    """The HTTP server cannot start (address in use, bad host, failing register_http)."""


class HTTPAddressInUse(HTTPStartError):
    """Another process listens on the HTTP port."""


class ConsumerHTTP:
    """The HTTP server of one consumer process (module docs): `start`, `set_ready`,
    `set_draining`, `set_stopped`, then `close` (at most `shutdown_timeout` seconds)."""

    def __init__(
        self,
        runtime: ConsumerRuntime,
        host: str,
        port: int,
        *,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        ssl: SSLContext | None = None,
    ) -> None:
        self.runtime = runtime
        self.host = host
        self.port = port
        self.shutdown_timeout = shutdown_timeout
        self.ssl = ssl
        self.state = "starting"
        self.web = web.Application(middlewares=[self._gate])
        self.web.router.add_get("/healthz", self._healthz)
        self.web.router.add_get("/debug/shards", self._debug_shards)
        self.web.router.add_get("/debug/metrics", self._debug_metrics)
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        return f"{'http' if self.ssl is None else 'https'}://{self.host}:{self.port}"

    async def start(self, register: Callable[..., Any] | None = None) -> None:
        """Let the application add its handlers (``register(web_app, runtime)``; may be a
        coroutine function), then bind and serve. Raises HTTPAddressInUse or HTTPStartError;
        nothing is left running then."""
        if register is not None:
            try:
                out = register(self.web, self.runtime)
                if inspect.isawaitable(out):
                    await out
            except Exception as err:
                raise HTTPStartError(f"register_http failed: {err!r}") from err
        runner = web.AppRunner(
            self.web,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=self.shutdown_timeout,
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, ssl_context=self.ssl)
        try:
            await site.start()
        except OSError as err:
            await runner.cleanup()
            where = f"{self.host}:{self.port}"
            if err.errno == errno.EADDRINUSE:
                raise HTTPAddressInUse(
                    f"cannot serve HTTP on {where}: address already in use "
                    "(choose another with --http-port / CONSUMER_HTTP_PORT, 0 disables HTTP)"
                ) from err
            raise HTTPStartError(f"cannot serve HTTP on {where}: {err}") from err
        self._runner = runner
        if self.port == 0 and runner.addresses:  # An ephemeral port: report the one bound.
            self.port = int(runner.addresses[0][1])
        # Announced with the member (registered after this start): other processes forward
        # requests for shards primary here to it.
        self.runtime.spec.http_endpoint = http_endpoint(self.runtime.cfg.endpoint, self.port)

    def set_ready(self) -> None:
        self.state = "ok"

    def set_draining(self) -> None:
        self.state = "draining"

    def set_stopped(self) -> None:
        """The drain is over: the application's routes answer 503 from now on."""
        self.state = "stopped"

    async def close(self) -> None:
        """Stop serving: waits up to `shutdown_timeout` for requests in flight, then cancels
        their handlers (and waits up to as long for them to end). Idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # --- handlers ---------------------------------------------------------------------------
    @web.middleware
    async def _gate(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self.state in _GATED and not request.path.startswith(_BUILTIN):
            return web.json_response({"error": _GATED[self.state]}, status=503)
        return await handler(request)

    async def _healthz(self, request: web.Request) -> web.Response:
        rt = self.runtime
        body = {
            "status": self.state,
            "member": f"{rt.cfg.zone}#{rt.cfg.suffix}",
            "endpoint": rt.cfg.endpoint,
            "etcd_revision": rt.keyspace.revision if self.state != "starting" else 0,
        }
        return web.json_response(body, status=200 if self.state == "ok" else 503)

    async def _debug_metrics(self, request: web.Request) -> web.Response:
        body = metrics.render(self.runtime.replicas)
        return web.Response(body=body.encode(), headers={"Content-Type": metrics.CONTENT_TYPE})

    async def _debug_shards(self, request: web.Request) -> web.Response:
        rt = self.runtime
        shards = []
        for shard_id, replica in sorted(rt.replicas.items()):
            read_through, publish_at = replica.shard.progress()
            stats = replica.stats
            shards.append(
                {
                    "id": shard_id,
                    "status": pb.ReplicaStatus.Code.Name(replica.status.code),
                    "errors": list(replica.status.errors),
                    "primary": replica.is_primary,
                    "read_through": read_through,
                    "publish_at": publish_at,
                    "transactions": stats.txns,
                    "messages": stats.messages,
                    "acks": stats.acks,
                    "last_txn_messages": stats.last_txn_messages,
                    "last_commit_seconds": round(stats.last_commit_seconds, 6),
                    "producer_restarts": replica.producer_restarts,
                }
            )
        return web.json_response(
            {"member": f"{rt.cfg.zone}#{rt.cfg.suffix}", "state": self.state, "shards": shards}
        )


# --- forwarding to a shard's primary --------------------------------------------------------
_NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        HTTP_PROXY_HEADER.lower(),
    }
)
"""Headers a forwarded request or response does not carry along (hop by hop, or set anew)."""


def status_response(status: pb.Status.ValueType, shard: str, error: str) -> web.Response:
    """A resolution's failure as JSON ``{"status", "shard", "error"}``: 404 for
    SHARD_NOT_FOUND, 503 otherwise (no primary, not primary, stopped, unreachable: the
    client may retry, here or on another process)."""
    name = pb.Status.Name(status)
    body = {"status": name, "shard": shard, "error": error}
    return web.json_response(body, status=404 if status == pb.SHARD_NOT_FOUND else 503)


def _unavailable(shard: str, error: str) -> web.Response:
    body = {"status": "UNAVAILABLE", "shard": shard, "error": error}
    return web.json_response(body, status=503)


FORWARD_CONNECT_TIMEOUT = 10.0
"""Seconds a forwarded request may take to connect to the primary."""
FORWARD_READ_TIMEOUT = 300.0
"""Seconds a forwarded request may wait for the primary's next bytes (its response headers,
or the next chunk of a streamed body) before it fails: a primary that hangs does not hold the
caller, and this process's connection, forever. Long-polling handlers send something more
often than this."""


def forwarding_session(
    *,
    read_timeout: float = FORWARD_READ_TIMEOUT,
    connect_timeout: float = FORWARD_CONNECT_TIMEOUT,
    ssl: SSLContext | None = None,
) -> aiohttp.ClientSession:
    """The client session `forward` uses (bodies passed on as they are, encoded or not). It
    keeps no cookies: one session forwards every caller's requests, and a cookie a primary
    set for one must never ride along with another's. A forwarded request has no overall
    deadline (a streamed response may be long), but fails after `read_timeout` seconds
    without a byte from the primary. ``https://`` primaries are reached with `ssl` (the
    peer TLS: its CA, its certificate), else with the system's CAs."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ssl if ssl is not None else True),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=read_timeout
        ),
    )


async def forward(
    session: aiohttp.ClientSession,
    request: web.Request,
    target: str,
    header: bpb.Header,
    shard: str,
) -> web.StreamResponse:
    """Send `request` (method, path and query, headers, body) to the HTTP server at `target`
    with `header` (a resolution's) in `HTTP_PROXY_HEADER`, and stream its response back as
    the answer. A request that was itself forwarded, a primary serving no HTTP (`target`
    empty) and one that cannot be reached are answered 503 UNAVAILABLE (JSON). A failure once
    the response started streaming raises (the connection is closed: the client sees a
    truncated response, not a wrong one)."""
    if HTTP_PROXY_HEADER in request.headers:
        return _unavailable(shard, "a forwarded request is not forwarded again")
    if not target:
        return _unavailable(shard, f"the primary of shard {shard} serves no HTTP")
    headers: CIMultiDict[str] = CIMultiDict(
        (k, v) for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED
    )
    headers[HTTP_PROXY_HEADER] = base64.b64encode(header.SerializeToString()).decode()
    body = await request.read()
    try:
        # The primary's origin with the request's own path and query: never the raw request
        # target, which may be an absolute URL naming another host.
        origin, rel = URL(target), request.rel_url
        url = URL.build(
            scheme=origin.scheme,
            host=origin.raw_host or "",
            port=origin.port,
            path=rel.raw_path,
            query_string=rel.raw_query_string,
            encoded=True,
        )
    except ValueError as err:
        return _unavailable(shard, f"cannot forward to {target}: {err}")
    out: web.StreamResponse | None = None
    try:
        async with session.request(
            request.method, url, headers=headers, data=body or None, allow_redirects=False
        ) as resp:
            out = web.StreamResponse(status=resp.status, reason=resp.reason)
            for k, v in resp.headers.items():
                if k.lower() not in _NOT_FORWARDED:
                    out.headers.add(k, v)
            if resp.content_length is not None:
                out.content_length = resp.content_length
            await out.prepare(request)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out
    except (aiohttp.ClientError, TimeoutError, OSError) as err:
        if out is not None and out.prepared:
            raise
        log.warning("forwarding to a shard's primary failed shard=%s to=%s err=%r", shard, url, err)
        return _unavailable(shard, f"request to primary {target} failed: {err!r}")
