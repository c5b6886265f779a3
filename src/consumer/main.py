"""``gazette-consumer package.module:Application``: run a consumer application's shards.

Serves ``consumer.Shard`` (Stat, List, Apply, GetHints, Unassign) on ``--listen``; an
application may add its own gRPC services by defining ``register_grpc(server, runtime)``
(called before the server starts; `runtime` is the `ConsumerRuntime`, whose ``resolve``
finds a shard's primary). HTTP on ``--http-port`` (same host; 0: none) serves ``/healthz``,
``/debug/shards`` and the handlers of the application's ``register_http(web_app, runtime)``
(`consumer.http_api`). SIGTERM/SIGINT: hand shards over to other processes (up to
``--drain-timeout``, and no longer than some other member can take them), then stop: the
servers first (HTTP answers 503 to the application's routes once the drain is over, and
waits a few seconds at most for requests in flight), then the runtime.

A process whose etcd lease expired (it was paused, or cut off from etcd, for longer than
``--lease-ttl``) has been fenced: its shards went to other members, and its recovery logs'
hand-offs refuse its writes. It stops like a drained one, logs one WARNING line saying so,
and exits with status `EXIT_FENCED`; restart it to rejoin.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os
import signal
import sys
from typing import Any

import grpc
import grpc.aio

from gazette.allocator.session import LeaseLostError, MemberExistsError
from gazette.consumer.application import (
    Application,
    IncompleteMessageProducer,
    check_message_producer,
)
from gazette.consumer.config import ConsumerConfig, parse_args
from gazette.consumer.http_api import DEFAULT_SHUTDOWN_TIMEOUT, ConsumerHTTP, HTTPStartError
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.runtime import ConsumerRuntime
from gazette.consumer.shard_api import ShardAPI
from gazette.keyspace.etcd import EtcdError

__all__ = [
    "EXIT_FENCED",
    "ConsumerFenced",
    "ConsumerStartupError",
    "load_application",
    "main",
    "serve",
]

log = logging.getLogger("consumer")

EXIT_FENCED = 3
"""Exit status of a consumer that was fenced: its etcd lease expired (`ConsumerFenced`)."""


class ConsumerStartupError(Exception):
    """The consumer cannot start (bad application, etcd unreachable, address in use...)."""


class ConsumerFenced(Exception):
    """The member's etcd lease expired while the process ran (it was paused, or cut off from
    etcd, for longer than ``--lease-ttl``): its shards were handed to other members, and it
    has stopped. Restart the process to rejoin. ``__cause__`` is the `LeaseLostError`."""


def load_application(ref: str) -> Application:
    """The Application named by ``package.module:Name`` (a class is instantiated)."""
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
    app = obj() if inspect.isclass(obj) else obj
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
    return app  # type: ignore[return-value]


async def serve(cfg: ConsumerConfig, app: Application) -> None:
    """Serve until a termination signal; then hand shards over and stop."""
    runtime = ConsumerRuntime(cfg, app)
    http: ConsumerHTTP | None = None
    if cfg.http_port:
        # Bound before registering: a port in use fails the start with nothing announced.
        http = ConsumerHTTP(
            runtime,
            cfg.http_host,
            cfg.http_port,
            # In-flight requests may delay the exit a little, not beyond the drain's bound.
            shutdown_timeout=min(DEFAULT_SHUTDOWN_TIMEOUT, max(cfg.drain_timeout, 0.0)),
        )
        try:
            await http.start(getattr(app, "register_http", None))
        except HTTPStartError as err:
            raise ConsumerStartupError(str(err)) from err
    try:
        await _serve(cfg, app, runtime, http)
    finally:
        if http is not None:
            await http.close()


async def _serve(
    cfg: ConsumerConfig, app: Application, runtime: ConsumerRuntime, http: ConsumerHTTP | None
) -> None:
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
    api = ShardAPI(runtime.etcd, runtime.keyspace, cfg.root, runtime.process_id, stat=runtime.stat)
    pb_grpc.add_ShardServicer_to_server(api, server)
    register = getattr(app, "register_grpc", None)
    if register is not None:
        register(server, runtime)
    try:
        server.add_insecure_port(cfg.listen)
    except RuntimeError as err:
        await runtime.shutdown()
        raise ConsumerStartupError(f"cannot listen on {cfg.listen}: {err}") from err
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if http is not None:
        http.set_ready()
    http_at = http.endpoint if http is not None else "none"
    print(
        f"consumer ready endpoint={cfg.endpoint} http={http_at} id={cfg.zone}#{cfg.suffix}",
        flush=True,
    )
    log.info(
        "serving endpoint=%s http=%s etcd=%s root=%s app=%s",
        cfg.endpoint,
        http_at,
        cfg.etcd,
        cfg.root,
        cfg.app,
    )
    background = asyncio.create_task(runtime.run_background(), name="consumer-background")
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({background, stopped}, return_when=asyncio.FIRST_COMPLETED)
    log.info("stopping")
    if http is not None:
        http.set_draining()
    if not background.done() and cfg.drain_timeout > 0:
        await runtime.drain(cfg.drain_timeout)
    await _stop(runtime, server, http, background)
    failure = None if background.cancelled() else background.exception()
    if failure is not None:
        lost = _lease_lost(failure)
        if lost is not None:
            raise ConsumerFenced(
                f"the lease of member {cfg.zone}#{cfg.suffix} expired (the process was paused, "
                f"or cut off from etcd, for longer than --lease-ttl {cfg.lease_ttl}s), so its "
                "shards were handed to other members; restart it to rejoin"
            ) from lost
        raise failure


def _lease_lost(err: BaseException) -> LeaseLostError | None:
    """The `LeaseLostError` that ended the background loops, if that is what ended them
    (they run in a task group: it comes wrapped in an exception group)."""
    if isinstance(err, LeaseLostError):
        return err
    if isinstance(err, BaseExceptionGroup):
        for inner in err.exceptions:
            found = _lease_lost(inner)
            if found is not None:
                return found
    return None


async def _stop(
    runtime: ConsumerRuntime,
    server: grpc.aio.Server,
    http: ConsumerHTTP | None,
    background: asyncio.Task[None],
) -> None:
    """After the drain: stop serving, then the runtime. The HTTP server answers 503 to the
    application's routes from here on, and is closed (requests in flight get its
    ``shutdown_timeout``) before the runtime shuts down: no handler runs on a runtime whose
    replicas are released and whose clients are closed."""
    if http is not None:
        http.set_stopped()
    closing = [server.stop(grace=2)]
    if http is not None:
        closing.append(http.close())
    for err in await asyncio.gather(*closing, return_exceptions=True):
        if isinstance(err, Exception):
            log.warning("closing a server failed err=%r", err)
        elif isinstance(err, BaseException):
            raise err
    background.cancel()
    # Waited for, not awaited: had it failed (its lease lost), awaiting it would raise here,
    # and the replicas would be left to asyncio.run's teardown, commits cut off mid-way.
    await asyncio.wait({background})
    await runtime.shutdown()


def main(argv: list[str] | None = None) -> None:
    # Stores, their recovery-log playbacks and fusefs backing files hold the application's
    # state: private to the consumer's user (docs/file-modes.md). Set first, so it covers
    # what RocksDB, SQLite and the fusefs process (which inherits it) create.
    os.umask(0o077)
    cfg = parse_args(argv)
    logging.basicConfig(
        level=cfg.log_level.upper(),
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        app = load_application(cfg.app)
        asyncio.run(serve(cfg, app))
    except ConsumerStartupError as err:
        print(f"gazette-consumer: {err}", file=sys.stderr)
        sys.exit(2)
    except ConsumerFenced as err:
        # Normal for a process that lost its lease: said once, without a traceback.
        log.warning("fenced: %s", err)
        sys.exit(EXIT_FENCED)


if __name__ == "__main__":
    main()
