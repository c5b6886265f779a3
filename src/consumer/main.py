"""``gazette-consumer package.module:Application``: run a consumer application's shards.

Serves ``consumer.Shard`` (Stat, List, Apply, GetHints, Unassign) on ``--listen``; an
application may add its own gRPC services by defining ``register_grpc(server, runtime)``
(called before the server starts; `runtime` is the `ConsumerRuntime`, whose ``resolver``
finds a shard's primary and forwards calls to it). HTTP on ``--http-port`` (same host; 0:
none) serves ``/healthz``, ``/debug/shards`` and the handlers of the application's
``register_http(web_app, runtime)`` (`consumer.http_api`). SIGTERM/SIGINT: hand shards
over to other processes (up to ``--drain-timeout``, and no longer than some other member
can take them), then stop: the servers first (HTTP answers 503 to the application's routes
once the drain is over, and waits a few seconds at most for requests in flight), then the
runtime.

A process whose etcd lease expired (it was paused, or cut off from etcd, for longer than
``--lease-ttl``) has been fenced: its shards went to other members, and its recovery logs'
hand-offs refuse its writes. It stops like a drained one, logs one WARNING line saying so,
and exits with status `EXIT_FENCED`; restart it to rejoin.

With ``--server-cert-file`` gRPC and HTTP are served over TLS only (the advertised endpoint
is ``https://``), and with ``--auth-keys`` every Shard call is verified
(`consumer.shard_api`). The application's own gRPC handlers authorize their calls
themselves: ``claims = await runtime.verify(context, capability)`` ends a call that lacks
the capability UNAUTHENTICATED, and the claims' selector says what it may see. Calls to
brokers take the ``--broker-*`` settings, which processes this one spawns (the fusefs
process of a RocksDB store) find in their environment (`gazette.auth.client_settings`);
docs/security.md states the design.

The life cycle is the one every member process shares (`mainboilerplate.process`); the
consumer's parts are `ConsumerProcess`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from gazette._extras import require
from gazette.allocator.session import LeaseLostError, MemberExistsError
from gazette.auth.tls import TLSConfigError
from gazette.consumer.application import (
    Application,
    IncompleteMessageProducer,
    check_message_producer,
)
from gazette.consumer.config import DEFAULT_ROOT, ConsumerConfig, parse_args
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.runtime import ConsumerRuntime
from gazette.consumer.shard_api import ShardAPI
from gazette.keyspace.etcd import EtcdError
from gazette.mainboilerplate import process
from gazette.mainboilerplate.settings import settings_class

# The HTTP server is imported late (after the store hooks start: see ConsumerProcess.start),
# but a missing extra still stops the command before anything starts.
require("the consumer's HTTP server", "consumer", "aiohttp")

if TYPE_CHECKING:
    from gazette.consumer.http_api import ConsumerHTTP

__all__ = [
    "EXIT_FENCED",
    "ConsumerProcess",
    "ConsumerStartupError",
    "load_application",
    "main",
    "serve",
]

log = logging.getLogger("consumer")

EXIT_FENCED = process.EXIT_LEASE_LOST
"""Exit status of a consumer that was fenced: its etcd lease expired."""

STOP_GRACE = 2.0
"""Seconds RPCs in flight get to finish once the consumer stops serving."""


class ConsumerStartupError(process.StartupError):
    """The consumer cannot start (bad application, etcd unreachable, address in use...)."""


def load_application(ref: str, config: Any = None) -> Application:
    """The Application named by ``package.module:Name``. A class is instantiated: with
    `config` if it declares a ``Config`` dataclass (its defaults if `config` is None), else
    without arguments; an instance is used as it is."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConsumerStartupError(f"application {ref!r} is not of the form package.module:Name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConsumerStartupError(f"cannot import {module_name}: {err}") from err
    try:
        obj: Any = getattr(module, attr)
    except AttributeError as err:
        raise ConsumerStartupError(f"module {module_name} has no attribute {attr!r}") from err
    app: Any
    if not inspect.isclass(obj):
        app = obj
    elif (config_class := settings_class(obj)) is None:
        app = obj()
    else:
        if config is None:
            try:
                config = config_class()
            except TypeError as err:
                raise ConsumerStartupError(f"{ref}: its Config has no default: {err}") from err
        make: Any = obj  # A class of the application's: it takes its Config.
        app = make(config)
    missing = [
        m
        for m in ("new_store", "new_message", "consume_message", "finalize_txn")
        if not hasattr(app, m)
    ]
    if missing:
        raise ConsumerStartupError(f"{ref} is not an Application: it lacks {', '.join(missing)}")
    try:
        check_message_producer(app)
    except IncompleteMessageProducer as err:
        raise ConsumerStartupError(f"{ref}: {err}") from err
    return app  # type: ignore[no-any-return]


class ConsumerProcess:
    """The consumer's parts of a member process's life cycle (`process.MemberProcess`)."""

    def __init__(self, cfg: ConsumerConfig, app: Application) -> None:
        self.cfg = cfg
        self.app = app
        try:  # The files are read now: a bad one fails the start, not the first connection.
            tls = cfg.server_tls
            self.credentials = None if tls is None else tls.grpc_credentials()
            self.http_ssl = None if tls is None else tls.ssl_context()
            for client in (cfg.peer_tls, cfg.broker_tls):
                if client is not None:
                    client.check()
        except TLSConfigError as err:
            raise ConsumerStartupError(str(err)) from None
        self.runtime = ConsumerRuntime(cfg, app)
        self.http: ConsumerHTTP | None = None
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        cfg, runtime = self.cfg, self.runtime
        # First: a store kind's hook may start a process (RocksDB's, a fusefs process), which
        # then starts while this one imports its HTTP server (aiohttp: 0.15-0.6 s) and
        # announces itself.
        await runtime.start_store_hooks()
        if cfg.root == DEFAULT_ROOT:
            log.info(
                "starting app=%s root=%s: the default root, which applications left at it "
                "share; give each its own with --root or CONSUMER_ROOT",
                cfg.app,
                cfg.root,
            )
        else:
            log.info("starting app=%s root=%s", cfg.app, cfg.root)
        if cfg.app_config is not None:
            # Fields declared with repr=False (secrets) are left out.
            log.info("application settings %r", cfg.app_config)
        if cfg.http_port:
            from gazette.consumer.http_api import (
                DEFAULT_SHUTDOWN_TIMEOUT,
                ConsumerHTTP,
                HTTPStartError,
            )

            # Bound before registering: a port in use fails the start with nothing announced.
            http = ConsumerHTTP(
                runtime,
                cfg.http_host,
                cfg.http_port,
                # In-flight requests may delay the exit a little, not beyond the drain's bound.
                shutdown_timeout=min(DEFAULT_SHUTDOWN_TIMEOUT, max(cfg.drain_timeout, 0.0)),
                ssl=self.http_ssl,
            )
            try:
                await http.start(getattr(self.app, "register_http", None))
            except HTTPStartError as err:
                raise ConsumerStartupError(str(err)) from err
            self.http = http
        try:
            await runtime.start()
        except MemberExistsError as err:
            raise ConsumerStartupError(
                f"another consumer runs as {cfg.zone}#{cfg.suffix} under {cfg.root} "
                "(or its lease has not expired yet)"
            ) from err
        except EtcdError as err:
            raise ConsumerStartupError(f"etcd {cfg.etcd}: {err}") from err
        assert runtime.etcd is not None
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        api = ShardAPI(
            runtime.etcd,
            runtime.keyspace,
            cfg.root,
            runtime.process_id,
            stat=runtime.stat,
            verifier=cfg.auth,
        )
        pb_grpc.add_ShardServicer_to_server(api, server)
        register = getattr(self.app, "register_grpc", None)
        if register is not None:
            register(server, runtime)
        try:
            if self.credentials is None:
                server.add_insecure_port(cfg.listen)
            else:
                server.add_secure_port(cfg.listen, self.credentials)
        except RuntimeError as err:
            await runtime.shutdown()
            raise ConsumerStartupError(f"cannot listen on {cfg.listen}: {err}") from err
        await server.start()
        self.server = server

    def ready(self) -> str:
        cfg = self.cfg
        if self.http is not None:
            self.http.set_ready()
        http_at = self.http.endpoint if self.http is not None else "none"
        log.info(
            "serving endpoint=%s http=%s etcd=%s root=%s app=%s",
            cfg.endpoint,
            http_at,
            cfg.etcd,
            cfg.root,
            cfg.app,
        )
        return f"consumer ready endpoint={cfg.endpoint} http={http_at} id={cfg.zone}#{cfg.suffix}"

    async def run(self) -> None:
        await self.runtime.run_background()

    def stopping(self) -> None:
        if self.http is not None:
            self.http.set_draining()

    async def drain(self, timeout: float) -> bool:
        return await self.runtime.drain(timeout)

    async def stop_serving(self) -> None:
        """After the drain: stop serving. The HTTP server answers 503 to the application's
        routes from here on, and is closed (requests in flight get its ``shutdown_timeout``)
        before the runtime shuts down: no handler runs on a runtime whose replicas are
        released and whose clients are closed. Long-lived application calls are told first
        (``runtime.resolver.stopping``), so that they end within the servers' grace."""
        self.runtime.resolver.begin_stopping()
        if self.http is not None:
            self.http.set_stopped()
        assert self.server is not None
        closing = [self.server.stop(grace=STOP_GRACE)]
        if self.http is not None:
            closing.append(self.http.close())
        for err in await asyncio.gather(*closing, return_exceptions=True):
            if isinstance(err, Exception):
                log.warning("closing a server failed err=%r", err)
            elif isinstance(err, BaseException):
                raise err

    async def shutdown(self) -> None:
        await self.runtime.shutdown()

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
        await self.runtime.close_store_hooks()  # Left open by a start that failed.


async def serve(cfg: ConsumerConfig, app: Application) -> None:
    """Serve until a termination signal; then hand shards over and stop. Raises
    `ConsumerStartupError`, or `LeaseLostError` (once stopped) if the process was fenced."""
    await process.serve(ConsumerProcess(cfg, app), cfg.drain_timeout, log, fenced=LeaseLostError)


async def _main(cfg: ConsumerConfig) -> None:
    # The processes this one spawns (a RocksDB store's fusefs process) reach the brokers
    # with the settings it was given, flags and defaults included.
    os.environ.update(cfg.broker_client.environ())
    await serve(cfg, load_application(cfg.app, cfg.app_config))


def _fenced(cfg: ConsumerConfig, err: LeaseLostError) -> None:
    # Normal for a process that lost its lease: said once, without a traceback.
    log.warning(
        "fenced: the lease of member %s#%s expired (the process was paused, or cut off from "
        "etcd, for longer than --lease-ttl %ds), so its shards were handed to other members; "
        "restart it to rejoin",
        cfg.zone,
        cfg.suffix,
        cfg.lease_ttl,
    )


def main(argv: list[str] | None = None) -> None:
    process.run_main(
        "gazette-consumer",
        lambda: parse_args(argv),
        lambda cfg: cfg.log_level,
        _main,
        fenced=LeaseLostError,
        on_fenced=_fenced,
    )


if __name__ == "__main__":
    main()
