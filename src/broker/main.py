"""`gazette-broker`: run a broker process until SIGTERM/SIGINT (graceful) or SIGKILL.

The life cycle is the one every member process shares (`mainboilerplate.process`); the
broker's parts are `BrokerProcess`: its HTTP server (bound before the broker announces
itself), the gRPC server of protocol.Journal and the direct-append listener. With
``--server-cert-file`` gRPC, HTTP and the direct-append listener are served over TLS only
(docs/security.md). A graceful stop
keeps serving (and proxying) while the allocator moves the broker's journals away, then ends
long-lived Replicate streams and gives appends in progress `STOP_GRACE` on both transports.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from gazette.allocator.session import LeaseLostError
from gazette.auth.tls import TLSConfigError
from gazette.broker.broker import Broker, BrokerStartupError
from gazette.broker.config import BrokerConfig, parse_args
from gazette.broker.direct_listener import DirectAppendServer, port_handler
from gazette.broker.http_api import BrokerHTTP
from gazette.broker.request_guard import transport_limit
from gazette.broker.service import MAX_MESSAGE_SIZE, JournalService, add_journal_service
from gazette.mainboilerplate import process

log = logging.getLogger("broker")

GRPC_OPTIONS = [
    # Above the service's own limit, which answers a larger message with a clear status.
    ("grpc.max_receive_message_length", transport_limit(MAX_MESSAGE_SIZE)),
    ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
    ("grpc.so_reuseport", 0),
]
STOP_GRACE = 5.0
"""Seconds appends in progress get to finish once the broker stops serving."""
LEASE_LOST_EXIT = process.EXIT_LEASE_LOST
"""Exit status of a broker whose etcd lease was lost."""


class BrokerProcess:
    """The broker's parts of a member process's life cycle (`process.MemberProcess`)."""

    def __init__(self, cfg: BrokerConfig) -> None:
        self.cfg = cfg
        try:  # The files are read now: a bad one fails the start, not the first connection.
            tls = cfg.server_tls
            self.credentials = None if tls is None else tls.grpc_credentials()
            self.http_ssl = None if tls is None else tls.ssl_context()
            if (peer_tls := cfg.peer_tls) is not None:
                peer_tls.check()
        except TLSConfigError as err:
            raise BrokerStartupError(str(err)) from None
        self.broker = Broker(cfg, cfg.auth)
        self.http: BrokerHTTP | None = None
        self.server: grpc.aio.Server | None = None
        self.direct: DirectAppendServer | None = None

    async def start(self) -> None:
        cfg = self.cfg
        if cfg.http_port:  # Bound before the broker registers: a port in use fails the start.
            http = BrokerHTTP(self.broker, cfg.http_host, cfg.http_port, ssl=self.http_ssl)
            try:
                await http.start()
            except OSError as err:
                raise BrokerStartupError(
                    f"{err.strerror} (--http-port / BROKER_HTTP_PORT)"
                ) from err
            self.http = http
        await self.broker.start()
        server = grpc.aio.server(options=GRPC_OPTIONS)
        service = JournalService(self.broker)
        add_journal_service(server, service)
        try:
            if cfg.direct_port >= 0:
                # Under TLS, as the gRPC port: the same certificate and client checks.
                self.direct = DirectAppendServer(
                    service, cfg.http_host, cfg.direct_port, ssl=self.http_ssl
                )
                try:
                    await self.direct.start()
                except OSError as err:
                    self.direct = None
                    raise BrokerStartupError(
                        f"direct appends: {err.strerror} (--direct-port / BROKER_DIRECT_PORT)"
                    ) from err
                server.add_generic_rpc_handlers([port_handler(self.direct.port)])
            try:
                if self.credentials is None:
                    server.add_insecure_port(cfg.listen)
                else:
                    server.add_secure_port(cfg.listen, self.credentials)
            except RuntimeError as err:
                raise BrokerStartupError(f"cannot listen on {cfg.listen}: {err}") from err
            await server.start()
        except BaseException:
            if self.direct is not None:
                await self.direct.close()
            await self.broker.shutdown()  # Registered already: release the member's lease at once.
            raise
        self.server = server

    def ready(self) -> str:
        cfg = self.cfg
        if self.http is not None:
            self.http.set_ready()
        served = ""
        if self.http is not None:
            scheme = "http" if self.http_ssl is None else "https"
            served = f" http={scheme}://{self.http.host}:{self.http.port}"
        if self.direct is not None:
            served += f" direct={self.direct.port}"
        log.info(
            "serving endpoint=%s etcd=%s root=%s spool_dir=%s",
            cfg.endpoint,
            cfg.etcd,
            cfg.root,
            cfg.spool_dir,
        )
        return f"broker ready endpoint={cfg.endpoint} id={cfg.zone}#{cfg.suffix}{served}"

    async def run(self) -> None:
        await self.broker.run_background()

    def stopping(self) -> None:
        if self.http is not None:
            self.http.set_draining()

    async def drain(self, timeout: float) -> bool:
        # Keeps serving (and proxying) while the allocator moves our journals.
        return await self.broker.drain(timeout)

    async def stop_serving(self) -> None:
        self.broker.end_streams()
        # Appends in progress get the same grace on both transports, at the same time.
        assert self.server is not None
        stopping = [self.server.stop(grace=STOP_GRACE)]
        if self.direct is not None:
            stopping.append(self.direct.close(grace=STOP_GRACE))
        await asyncio.gather(*stopping)

    async def shutdown(self) -> None:
        await self.broker.shutdown()

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()


async def serve(cfg: BrokerConfig) -> None:
    """Serve until a termination signal; then stop accepting RPCs and persist spools.
    Raises `BrokerStartupError`, or `LeaseLostError` (once stopped) if the lease was lost."""
    await process.serve(BrokerProcess(cfg), cfg.drain_timeout, log, fenced=LeaseLostError)


def _lease_lost(cfg: BrokerConfig, err: LeaseLostError) -> None:
    # Paused or cut off from etcd past --lease-ttl: our journals belong to other brokers now.
    # Spools were judged and published (or kept) on the way out; a supervisor restarts us
    # as a new member.
    log.error(
        "exiting: this broker's etcd lease was lost (%s); its journals moved to other brokers",
        err,
    )


def main(argv: list[str] | None = None) -> None:
    process.run_main(
        "gazette-broker",
        lambda: parse_args(argv),
        lambda cfg: cfg.log_level,
        serve,
        fenced=LeaseLostError,
        on_fenced=_lease_lost,
    )


if __name__ == "__main__":
    main()
