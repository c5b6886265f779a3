"""Configuration of a broker process: one typed place, from flags and environment."""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path


def default_suffix(hostname: str | None = None) -> str:
    """The default process suffix (``--suffix``): the host's name, as upstream, made a valid
    suffix where it is not one: a suffix is 4..128 token characters (``[A-Za-z0-9-_+/.]``),
    so a short name such as ``vm`` becomes ``vm-host`` and other characters become ``-``.
    Deterministic, so a restarted process takes the same identity."""
    from gazette.broker.protocol.validation import (
        MAX_SUFFIX_LENGTH,
        MIN_SUFFIX_LENGTH,
        TOKEN_SYMBOLS,
    )

    name = socket.gethostname() if hostname is None else hostname
    name = "".join(c if c.isascii() and (c.isalnum() or c in TOKEN_SYMBOLS) else "-" for c in name)
    if len(name) < MIN_SUFFIX_LENGTH:
        name = f"{name}-host" if name else "host"
    return name[:MAX_SUFFIX_LENGTH]


def check_process_id(
    parser: argparse.ArgumentParser, zone: str, suffix: str, env_names: str
) -> None:
    """Exits through `parser` (status 2) if --zone/--suffix (environment variables
    `env_names`) do not make a valid ProcessSpec.ID."""
    from gazette.broker.protocol import protocol_pb2 as pb
    from gazette.broker.protocol.errors import ValidationError
    from gazette.broker.protocol.validation import validate_process_id

    try:
        validate_process_id(pb.ProcessSpec.ID(zone=zone, suffix=suffix))
    except ValidationError as err:
        parser.error(f"--zone/--suffix ({env_names}): {err}")


@dataclass(frozen=True)
class BrokerConfig:
    """Everything a broker process needs; defaults run on one machine."""

    etcd: str = "http://127.0.0.1:2379"
    root: str = "/gazette/cluster"
    zone: str = "local"
    suffix: str = field(default_factory=default_suffix)
    listen: str = "127.0.0.1:8080"
    advertise: str = ""
    spool_dir: Path = Path("/var/tmp/gazette-broker")
    lease_ttl: int = 20
    spool_sync: bool = False
    chunk_timeout: float = 30.0
    cache_bytes: int = 1 << 30
    journal_limit: int = 1024
    drain_timeout: float = 30.0
    hole_wait: float = 30.0
    """Seconds blocking reads wait at the hole a new replication-1 primary leaves after a crash
    (broker.reservation) for the old primary to publish what it acknowledged there."""
    log_level: str = "INFO"
    http_port: int = 0
    """Port of the HTTP server (``/healthz``, ``/debug/metrics``) on the host of `listen`;
    0: none."""
    direct_port: int = 0
    """Port of the direct-append listener (the Append RPC over a plain TCP stream, for our
    clients; docs/direct-appends.md) on the host of `listen`; 0: a free port; -1: none."""

    @property
    def endpoint(self) -> str:
        """The advertised endpoint: an absolute URL as upstream's (``http://host:port``),
        defaulting to the listen address."""
        ep = self.advertise or self.listen
        return ep if "://" in ep else f"http://{ep}"


def http_host(listen: str) -> str:
    """The host of a ``host:port`` listen address, which a process's HTTP server binds to
    (brackets of an IPv6 address removed; every address if there is no host)."""
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    return host.strip("[]") or "0.0.0.0"


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def parse_args(argv: list[str] | None = None) -> BrokerConfig:
    """Flags win over environment variables, which win over defaults."""
    d = BrokerConfig()
    p = argparse.ArgumentParser(
        prog="gazette-broker", description="Serve Gazette journals over gRPC (protocol.Journal)."
    )
    p.add_argument(
        "--etcd", default=_env("ETCD_ADDRESS", d.etcd), help="etcd endpoint [ETCD_ADDRESS]"
    )
    p.add_argument(
        "--root",
        default=_env("ETCD_PREFIX", d.root),
        help="etcd root prefix of the broker keyspace [ETCD_PREFIX]",
    )
    p.add_argument(
        "--zone", default=_env("BROKER_ZONE", d.zone), help="zone of this broker [BROKER_ZONE]"
    )
    p.add_argument(
        "--suffix",
        default=_env("BROKER_ID", d.suffix),
        help="unique id of this broker within its zone; default: the host name made a "
        "valid suffix (%(default)s) [BROKER_ID]",
    )
    p.add_argument(
        "--listen",
        default=_env("BROKER_LISTEN", d.listen),
        help="host:port to serve gRPC on [BROKER_LISTEN]",
    )
    p.add_argument(
        "--advertise",
        default=_env("BROKER_ADVERTISE", ""),
        help="endpoint advertised to clients (default: --listen) [BROKER_ADVERTISE]",
    )
    p.add_argument(
        "--spool-dir",
        type=Path,
        default=Path(_env("BROKER_SPOOL_DIR", str(d.spool_dir))),
        help="local directory of spools and cached fragments [BROKER_SPOOL_DIR]",
    )
    p.add_argument(
        "--lease-ttl",
        type=int,
        default=int(_env("BROKER_LEASE_TTL", str(d.lease_ttl))),
        help="etcd lease TTL in seconds",
    )
    p.add_argument(
        "--spool-sync",
        action="store_true",
        default=_env("BROKER_SPOOL_SYNC", "") not in ("", "0", "false"),
        help="fdatasync spools on every commit (default off: replication is durability)",
    )
    p.add_argument(
        "--chunk-timeout",
        type=float,
        default=d.chunk_timeout,
        help="seconds an append may stall between chunks before it is rolled back",
    )
    p.add_argument(
        "--cache-bytes",
        type=int,
        default=d.cache_bytes,
        help="bytes of decompressed remote fragments cached for reads",
    )
    p.add_argument("--journal-limit", type=int, default=d.journal_limit)
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=float(_env("BROKER_DRAIN_TIMEOUT", str(d.drain_timeout))),
        help="at SIGTERM, seconds to wait for journals to move to other brokers (0: none)",
    )
    p.add_argument(
        "--hole-wait",
        type=float,
        default=float(_env("BROKER_HOLE_WAIT", str(d.hole_wait))),
        help="seconds blocking reads wait at the offsets a new primary of a replication-1 "
        "journal skipped after a crash, for the old broker to publish them, before jumping "
        "over them (default %(default)s) [BROKER_HOLE_WAIT]",
    )
    p.add_argument("--log-level", default=_env("LOG_LEVEL", d.log_level))
    p.add_argument(
        "--http-port",
        type=int,
        default=_env("BROKER_HTTP_PORT", str(d.http_port)),  # A string: parsed by `type`.
        help="serve HTTP (/healthz, Prometheus /debug/metrics) on this port of the host of "
        "--listen; 0 (the default) serves none [BROKER_HTTP_PORT]",
    )
    p.add_argument(
        "--direct-port",
        type=int,
        default=_env("BROKER_DIRECT_PORT", str(d.direct_port)),
        help="serve direct appends (Append over a plain TCP stream, which our clients use "
        "instead of gRPC) on this port of the host of --listen; 0 (the default): a free "
        "port, which clients discover over gRPC; -1: none [BROKER_DIRECT_PORT]",
    )
    a = p.parse_args(argv)
    if a.hole_wait < 0:
        p.error(f"--hole-wait must be >= 0, not {a.hole_wait}")
    if a.lease_ttl < 2:
        p.error("--lease-ttl must be at least 2 seconds")
    if not 0 <= a.http_port <= 65535:
        p.error(f"--http-port must be a port number (0: no HTTP), not {a.http_port}")
    if not -1 <= a.direct_port <= 65535:
        p.error(
            f"--direct-port must be a port number (0: any free port, -1: none), not {a.direct_port}"
        )
    check_process_id(p, a.zone, a.suffix, "BROKER_ZONE/BROKER_ID")
    return BrokerConfig(
        etcd=a.etcd,
        root=a.root.rstrip("/"),
        zone=a.zone,
        suffix=a.suffix,
        listen=a.listen,
        advertise=a.advertise,
        spool_dir=a.spool_dir,
        lease_ttl=a.lease_ttl,
        spool_sync=a.spool_sync,
        chunk_timeout=a.chunk_timeout,
        cache_bytes=a.cache_bytes,
        journal_limit=a.journal_limit,
        drain_timeout=a.drain_timeout,
        hole_wait=a.hole_wait,
        log_level=a.log_level,
        http_port=a.http_port,
        direct_port=a.direct_port,
    )
