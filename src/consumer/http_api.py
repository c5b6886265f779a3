"""The HTTP side of a consumer process: operator endpoints and the application's handlers.

Served with aiohttp on ``--http-port`` (same host as ``--listen``) next to the gRPC server:

- ``GET /healthz``: 200 ``{"status": "ok", ...}`` once this process's member is registered
  in etcd and its keyspace loaded; 503 with ``"starting"`` before, ``"draining"`` once it
  was told to exit (it is handing its shards over). For load balancers and probes.
- ``GET /debug/shards``: JSON of this process's shard replicas: status, errors, whether
  primary, committed progress and transaction counters.
- Whatever the Application adds in ``register_http(app, runtime)``: `app` is the
  `aiohttp.web.Application` (add routes to ``app.router``); `runtime` the `ConsumerRuntime`,
  whose ``resolve`` finds a shard's primary. Until the member is registered, requests to the
  application's routes are answered 503 (the runtime cannot resolve anything yet).

The socket is bound before the process registers in etcd, so a port in use fails the start
(`HTTPAddressInUse`) before anything is announced.
"""

from __future__ import annotations

import errno
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from consumer.protocol import pb

if TYPE_CHECKING:
    from consumer.runtime import ConsumerRuntime

__all__ = ["ConsumerHTTP", "HTTPAddressInUse", "HTTPStartError"]

log = logging.getLogger(__name__)

_BUILTIN = ("/healthz", "/debug/")


class HTTPStartError(Exception):
    """The HTTP server cannot start (address in use, bad host, failing register_http)."""


class HTTPAddressInUse(HTTPStartError):
    """Another process listens on the HTTP port."""


class ConsumerHTTP:
    """The HTTP server of one consumer process (module docs): `start`, `set_ready`,
    `set_draining`, then `close`."""

    def __init__(self, runtime: ConsumerRuntime, host: str, port: int) -> None:
        self.runtime = runtime
        self.host = host
        self.port = port
        self.state = "starting"
        self.web = web.Application(middlewares=[self._gate])
        self.web.router.add_get("/healthz", self._healthz)
        self.web.router.add_get("/debug/shards", self._debug_shards)
        self._runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

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
        runner = web.AppRunner(self.web, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
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

    def set_ready(self) -> None:
        self.state = "ok"

    def set_draining(self) -> None:
        self.state = "draining"

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # --- handlers ---------------------------------------------------------------------------
    @web.middleware
    async def _gate(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self.state == "starting" and not request.path.startswith(_BUILTIN):
            return web.json_response(
                {"error": "the consumer is starting: not registered yet"}, status=503
            )
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
