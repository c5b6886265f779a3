"""The HTTP side of a broker process (``--http-port``; none by default).

- ``GET /healthz``: 200 ``{"status": "ok", "member", "endpoint"}`` while the broker serves
  gRPC; 503 ``"starting"`` before (it registers, recovers spools, then serves) and
  ``"draining"`` once it was told to exit (its journals are moving to other brokers).
- ``GET /debug/metrics``: Prometheus metrics (`broker.metrics`), upstream Gazette's path.

Upstream serves these on its gRPC port; grpc.aio owns its listening socket, so here they
have a port of their own. With the server's TLS on, it is HTTPS with the same certificate
(and the same client certificates required, if any).
"""

from __future__ import annotations

from gazette._extras import require

require("the broker's HTTP server", "broker", "aiohttp")

import errno
import ssl as _ssl
from typing import TYPE_CHECKING

from aiohttp import web

from gazette.broker import metrics
from gazette.mainboilerplate.prometheus import CONTENT_TYPE

if TYPE_CHECKING:
    from gazette.broker.broker import Broker

__all__ = ["BrokerHTTP"]


class BrokerHTTP:
    """`start`, `set_ready`, `set_draining`, then `close`."""

    def __init__(
        self, broker: Broker, host: str, port: int, *, ssl: _ssl.SSLContext | None = None
    ) -> None:
        self.broker = broker
        self.host, self.port = host, port
        self.ssl = ssl
        self.state = "starting"
        self.web = web.Application()
        self.web.router.add_get("/healthz", self._healthz)
        self.web.router.add_get("/debug/metrics", self._metrics)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Bind and serve; raises OSError (with a message naming the address) if it cannot."""
        runner = web.AppRunner(self.web, access_log=None, handle_signals=False, shutdown_timeout=2)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port, ssl_context=self.ssl).start()
        except OSError as err:
            await runner.cleanup()
            why = "address already in use" if err.errno == errno.EADDRINUSE else str(err)
            where = f"{self.host}:{self.port}"
            raise OSError(err.errno, f"cannot serve HTTP on {where}: {why}") from err
        self._runner = runner
        if self.port == 0 and runner.addresses:
            self.port = int(runner.addresses[0][1])

    def set_ready(self) -> None:
        self.state = "ok"

    def set_draining(self) -> None:
        self.state = "draining"

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _healthz(self, request: web.Request) -> web.Response:
        cfg = self.broker.cfg
        member = f"{cfg.zone}#{cfg.suffix}"
        body = {"status": self.state, "member": member, "endpoint": cfg.endpoint}
        return web.json_response(body, status=200 if self.state == "ok" else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        heads = [(name, r.write_head) for name, r in list(self.broker.replicas.items())]
        return web.Response(
            body=metrics.render(heads).encode(), headers={"Content-Type": CONTENT_TYPE}
        )
