"""Configuration of a broker process: one typed place, from flags and environment."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from gazette.auth.flags import (
    add_auth_flags,
    add_server_tls_flags,
    auth_from_args,
    check_server_tls_flags,
    server_tls_values,
)
from gazette.auth.keys import NO_AUTH, BearerAuth, KeyedAuth, NoAuth
from gazette.mainboilerplate.flags import (
    ETCD_TLS,
    ETCD_TLS_ENV,
    ETCD_TLS_HELP,
    DefaultsHelpFormatter,
    MemberConfig,
    MemberFlags,
    default_suffix,
    env,
    http_host,
)

__all__ = ["BROKER_FLAGS", "BrokerConfig", "default_suffix", "http_host", "parse_args"]


@dataclass(frozen=True)
class BrokerConfig(MemberConfig):
    """Everything a broker process needs; defaults run on one machine."""

    spool_dir: Path = Path("/var/tmp/gazette-broker")
    spool_sync: bool = False
    chunk_timeout: float = 30.0
    cache_bytes: int = 1 << 30
    journal_limit: int = 1024
    hole_wait: float = 30.0
    """Seconds blocking reads wait at the hole a new replication-1 primary leaves after a crash
    (broker.reservation) for the old primary to publish what it acknowledged there."""
    http_port: int = 0
    """Port of the HTTP server (``/healthz``, ``/debug/metrics``) on the host of `listen`;
    0: none."""
    direct_port: int = 0
    """Port of the direct-append listener (the Append RPC over a TCP stream, for our
    clients; docs/direct-appends.md) on the host of `listen`; 0: a free port; -1: none.
    TLS, as the gRPC port, while the server has TLS on (docs/security.md)."""
    auth: KeyedAuth | NoAuth = field(default=NO_AUTH, repr=False, compare=False)
    """Verifies the calls served, and signs this broker's calls to its peers
    (``--auth-keys``); `NO_AUTH`: authorization off."""


BROKER_FLAGS = MemberFlags(
    env={
        "etcd": "ETCD_ADDRESS",
        "root": "ETCD_PREFIX",
        "zone": "BROKER_ZONE",
        "suffix": "BROKER_ID",
        "listen": "BROKER_LISTEN",
        "advertise": "BROKER_ADVERTISE",
        "lease-ttl": "BROKER_LEASE_TTL",
        "drain-timeout": "BROKER_DRAIN_TIMEOUT",
        "log-level": "LOG_LEVEL",
        "http-port": "BROKER_HTTP_PORT",
        **ETCD_TLS_ENV,
    },
    help={
        "etcd": "etcd endpoints, comma-separated [ETCD_ADDRESS]",
        "log-level": "log level [LOG_LEVEL]",
        "root": "etcd root prefix of the broker keyspace [ETCD_PREFIX]",
        "zone": "zone of this broker [BROKER_ZONE]",
        "suffix": "unique id of this broker within its zone; default: the host name made a "
        "valid suffix (%(default)s) [BROKER_ID]",
        "listen": "host:port to serve gRPC on [BROKER_LISTEN]",
        "advertise": "endpoint advertised to clients (default: --listen) [BROKER_ADVERTISE]",
        "lease-ttl": "etcd lease TTL in seconds",
        "drain-timeout": "at SIGTERM, seconds to wait for journals to move to other brokers "
        "(0: none)",
        "http-port": "serve HTTP (/healthz, Prometheus /debug/metrics) on this port of the host "
        "of --listen; 0 (the default) serves none [BROKER_HTTP_PORT]",
        **ETCD_TLS_HELP,
    },
    no_http="0: no HTTP",
    lease_ttl_error="--lease-ttl must be at least 2 seconds",
)
"""The member flags as `gazette-broker` names them."""


def parse_args(argv: list[str] | None = None) -> BrokerConfig:
    """Flags win over environment variables, which win over defaults."""
    d = BrokerConfig()
    p = argparse.ArgumentParser(
        prog="gazette-broker",
        description="Serve Gazette journals over gRPC (protocol.Journal).",
        formatter_class=DefaultsHelpFormatter,
    )
    flags = BROKER_FLAGS
    flags.add(p, d, "etcd", *ETCD_TLS, "root", "zone", "suffix", "listen", "advertise")
    p.add_argument(
        "--spool-dir",
        type=Path,
        default=Path(env("BROKER_SPOOL_DIR", str(d.spool_dir))),
        help="local directory of spools and cached fragments [BROKER_SPOOL_DIR]",
    )
    flags.add(p, d, "lease-ttl")
    p.add_argument(
        "--spool-sync",
        action="store_true",
        default=env("BROKER_SPOOL_SYNC", "") not in ("", "0", "false"),
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
    p.add_argument(
        "--journal-limit",
        type=int,
        default=d.journal_limit,
        help="most journals assigned to this broker",
    )
    flags.add(p, d, "drain-timeout")
    p.add_argument(
        "--hole-wait",
        type=float,
        default=float(env("BROKER_HOLE_WAIT", str(d.hole_wait))),
        help="seconds blocking reads wait at the offsets a new primary of a replication-1 "
        "journal skipped after a crash, for the old broker to publish them, before jumping "
        "over them (default %(default)s) [BROKER_HOLE_WAIT]",
    )
    flags.add(p, d, "log-level", "http-port")
    p.add_argument(
        "--direct-port",
        type=int,
        default=env("BROKER_DIRECT_PORT", str(d.direct_port)),
        help="serve direct appends (Append over a TCP stream, which our clients use instead "
        "of gRPC; TLS with --server-cert-file) on this port of the host of --listen; 0 (the "
        "default): a free port, which clients discover over gRPC; -1: none "
        "[BROKER_DIRECT_PORT]",
    )
    add_server_tls_flags(p, "BROKER_", process="broker", peers="other brokers")
    add_auth_flags(p, "BROKER_", token=False, signs="this broker's calls to its peers")
    a = p.parse_args(argv)
    auth = auth_from_args(p, a, "BROKER_")
    assert not isinstance(auth, BearerAuth)  # a broker verifies: keys or nothing
    if a.hole_wait < 0:
        p.error(f"--hole-wait must be >= 0, not {a.hole_wait}")
    if not -1 <= a.direct_port <= 65535:
        p.error(
            f"--direct-port must be a port number (0: any free port, -1: none), not {a.direct_port}"
        )
    flags.check(p, a)
    check_server_tls_flags(p, a)
    return BrokerConfig(
        **flags.values(a),
        spool_dir=a.spool_dir,
        spool_sync=a.spool_sync,
        chunk_timeout=a.chunk_timeout,
        cache_bytes=a.cache_bytes,
        journal_limit=a.journal_limit,
        hole_wait=a.hole_wait,
        direct_port=a.direct_port,
        **server_tls_values(a),
        auth=auth,
    )
