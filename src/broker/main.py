"""`gazette-broker`: run a broker process until SIGTERM/SIGINT (graceful) or SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys

import grpc

from gazette.allocator.session import LeaseLostError
from gazette.broker.broker import Broker, BrokerStartupError
from gazette.broker.config import BrokerConfig, http_host, parse_args
from gazette.broker.direct import DirectAppendServer, port_handler
from gazette.broker.http_api import BrokerHTTP
from gazette.broker.request_guard import transport_limit
from gazette.broker.service import MAX_MESSAGE_SIZE, JournalService, add_journal_service

log = logging.getLogger("broker")

GRPC_OPTIONS = [
    # Above the service's own limit, which answers a larger message with a clear status.
    ("grpc.max_receive_message_length", transport_limit(MAX_MESSAGE_SIZE)),
    ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
    ("grpc.so_reuseport", 0),
]
STOP_GRACE = 5.0
LEASE_LOST_EXIT = 3
"""Exit status of a broker whose etcd lease was lost."""
"""Seconds appends in progress get to finish once the broker stops serving."""


async def serve(cfg: BrokerConfig) -> None:
    """Serve until a termination signal; then stop accepting RPCs and persist spools."""
    broker = Broker(cfg)
    http = None
    if cfg.http_port:  # Bound before the broker registers: a port in use fails the start.
        http = BrokerHTTP(broker, http_host(cfg.listen), cfg.http_port)
        try:
            await http.start()
        except OSError as err:
            raise BrokerStartupError(f"{err.strerror} (--http-port / BROKER_HTTP_PORT)") from err
    try:
        await _serve(cfg, broker, http)
    finally:
        if http is not None:
            await http.close()


async def _serve(cfg: BrokerConfig, broker: Broker, http: BrokerHTTP | None) -> None:
    await broker.start()
    server = grpc.aio.server(options=GRPC_OPTIONS)
    service = JournalService(broker)
    add_journal_service(server, service)
    direct: DirectAppendServer | None = None
    try:
        if cfg.direct_port >= 0:
            direct = DirectAppendServer(service, http_host(cfg.listen), cfg.direct_port)
            try:
                await direct.start()
            except OSError as err:
                raise BrokerStartupError(
                    f"direct appends: {err.strerror} (--direct-port / BROKER_DIRECT_PORT)"
                ) from err
            server.add_generic_rpc_handlers([port_handler(direct.port)])
        try:
            server.add_insecure_port(cfg.listen)
        except RuntimeError as err:
            raise BrokerStartupError(f"cannot listen on {cfg.listen}: {err}") from err
        await server.start()
    except BaseException:
        if direct is not None:
            await direct.close()
        await broker.shutdown()  # Registered already: release the member's lease at once.
        raise
    if http is not None:
        http.set_ready()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The harness and operators wait for this line.
    served = f" http=http://{http.host}:{http.port}" if http is not None else ""
    if direct is not None:
        served += f" direct={direct.port}"
    print(f"broker ready endpoint={cfg.endpoint} id={cfg.zone}#{cfg.suffix}{served}", flush=True)
    log.info(
        "serving endpoint=%s etcd=%s root=%s spool_dir=%s",
        cfg.endpoint,
        cfg.etcd,
        cfg.root,
        cfg.spool_dir,
    )
    background = asyncio.create_task(broker.run_background(), name="broker-background")
    stopped = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({background, stopped}, return_when=asyncio.FIRST_COMPLETED)
    log.info("stopping")
    if http is not None:
        http.set_draining()
    if not background.done() and cfg.drain_timeout > 0:
        # Graceful exit: keep serving (and proxying) while the allocator moves our journals.
        await broker.drain(cfg.drain_timeout)
    broker.end_streams()
    # Appends in progress get the same grace on both transports, at the same time.
    stopping = [server.stop(grace=STOP_GRACE)]
    if direct is not None:
        stopping.append(direct.close(grace=STOP_GRACE))
    await asyncio.gather(*stopping)
    background.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await background
    await broker.shutdown()
    if background in done and background.exception() is not None:
        raise background.exception()  # type: ignore[misc]


def main(argv: list[str] | None = None) -> None:
    # Spools, registers, cached fragments: journal content, private to the broker's user
    # (docs/file-modes.md). Set first, so it covers every file the process makes.
    os.umask(0o077)
    cfg = parse_args(argv)
    logging.basicConfig(
        level=cfg.log_level.upper(),
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        _run(cfg)
    except BrokerStartupError as err:
        print(f"gazette-broker: {err}", file=sys.stderr)
        sys.exit(2)


def _run(cfg: BrokerConfig) -> None:
    try:
        asyncio.run(serve(cfg))
    except* LeaseLostError as group:
        # Paused or cut off from etcd past --lease-ttl: our journals belong to other brokers
        # now. Spools were judged and published (or kept) on the way out; a supervisor
        # restarts us as a new member.
        log.error(
            "exiting: this broker's etcd lease was lost (%s); its journals moved to other brokers",
            group.exceptions[0],
        )
        sys.exit(LEASE_LOST_EXIT)


if __name__ == "__main__":
    main()
