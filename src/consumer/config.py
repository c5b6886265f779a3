"""Configuration of a consumer process: one typed place, from flags and environment."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from gazette.broker.config import check_process_id, default_suffix, http_host


@dataclass(frozen=True)
class ConsumerConfig:
    """Everything a consumer process needs; defaults run on one machine."""

    app: str = ""
    """The Application: ``package.module:Name`` (a class, instantiated without arguments, or
    an instance)."""
    etcd: str = "http://127.0.0.1:2379"
    root: str = "/gazette/consumers/app"
    """etcd root of this consumer application's shards, members and assignments."""
    zone: str = "local"
    suffix: str = field(default_factory=default_suffix)
    listen: str = "127.0.0.1:8081"
    http_port: int = 8082
    """Port of the HTTP server (operator endpoints, the application's `register_http`
    handlers), on the host of `listen`. 0: no HTTP server."""
    advertise: str = ""
    broker: str = "127.0.0.1:8080"
    """Broker endpoint(s), comma separated."""
    workdir: Path = Path("/var/tmp/gazette-consumer")
    """Local directory for shards' played-back stores."""
    lease_ttl: int = 20
    shard_limit: int = 1024
    hint_interval: float = 300.0
    drain_timeout: float = 60.0
    log_level: str = "INFO"
    fusefs_prestart: int = 1
    """fusefs processes kept started ahead once a standby of a RocksDB shard is here (each
    promotion of such a standby takes one: it mounts at once); 0: none."""

    @property
    def endpoint(self) -> str:
        """The advertised endpoint, an absolute URL (``http://host:port``)."""
        ep = self.advertise or self.listen
        return ep if "://" in ep else f"http://{ep}"

    @property
    def http_host(self) -> str:
        """The host HTTP binds to: that of `listen` (brackets of an IPv6 address removed)."""
        return http_host(self.listen)

    @property
    def brokers(self) -> list[str]:
        return [b.strip() for b in self.broker.split(",") if b.strip()]


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def parse_args(argv: list[str] | None = None) -> ConsumerConfig:
    """Flags win over environment variables, which win over defaults."""
    d = ConsumerConfig()
    p = argparse.ArgumentParser(
        prog="gazette-consumer",
        description="Run a consumer application's shards (and serve consumer.Shard over gRPC).",
    )
    p.add_argument(
        "app", nargs="?", default=_env("CONSUMER_APP", ""), help="module:Application [CONSUMER_APP]"
    )
    p.add_argument(
        "--etcd", default=_env("ETCD_ADDRESS", d.etcd), help="etcd endpoint [ETCD_ADDRESS]"
    )
    p.add_argument(
        "--root",
        default=_env("CONSUMER_ROOT", d.root),
        help="etcd root of the application's shards [CONSUMER_ROOT]",
    )
    p.add_argument(
        "--zone", default=_env("CONSUMER_ZONE", d.zone), help="zone of this process [CONSUMER_ZONE]"
    )
    p.add_argument(
        "--suffix",
        default=_env("CONSUMER_ID", d.suffix),
        help="unique id of this process within its zone; default: the host name made a "
        "valid suffix (%(default)s) [CONSUMER_ID]",
    )
    p.add_argument(
        "--listen",
        default=_env("CONSUMER_LISTEN", d.listen),
        help="host:port of the gRPC server [CONSUMER_LISTEN]",
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=_env("CONSUMER_HTTP_PORT", str(d.http_port)),  # A string: parsed by `type`.
        help="port of the HTTP server (/healthz, /debug/shards, the application's "
        "register_http handlers) on the host of --listen; 0 disables it [CONSUMER_HTTP_PORT]",
    )
    p.add_argument(
        "--advertise",
        default=_env("CONSUMER_ADVERTISE", ""),
        help="endpoint advertised to others (default: --listen) [CONSUMER_ADVERTISE]",
    )
    p.add_argument(
        "--broker",
        default=_env("BROKER_ADDRESS", d.broker),
        help="broker endpoint(s), comma separated [BROKER_ADDRESS]",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path(_env("CONSUMER_WORKDIR", str(d.workdir))),
        help="local directory of shard stores [CONSUMER_WORKDIR]",
    )
    p.add_argument(
        "--lease-ttl",
        type=int,
        default=int(_env("CONSUMER_LEASE_TTL", str(d.lease_ttl))),
        help="etcd lease TTL in seconds: how long a crashed process holds its shards "
        "[CONSUMER_LEASE_TTL]",
    )
    p.add_argument(
        "--shard-limit",
        type=int,
        default=d.shard_limit,
        help="most shards assigned to this process",
    )
    p.add_argument(
        "--hint-interval",
        type=float,
        default=d.hint_interval,
        help="seconds between primary hints writes (the first one this long after a shard "
        "becomes primary; backup hints are written at each recovery)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=d.drain_timeout,
        help="on SIGTERM, seconds to wait at most for shards to move to other processes "
        "(0: none); shards no other process can take, and FAILED ones, are not waited for",
    )
    p.add_argument(
        "--log-level", default=_env("LOG_LEVEL", d.log_level), help="log level [LOG_LEVEL]"
    )
    p.add_argument(
        "--fusefs-prestart",
        type=int,
        default=int(_env("CONSUMER_FUSEFS_PRESTART", str(d.fusefs_prestart))),
        help="fusefs processes kept started ahead for promotions of RocksDB standbys, ~40 MB "
        "each (0: none) [CONSUMER_FUSEFS_PRESTART]",
    )
    a = p.parse_args(argv)
    if not a.app:
        p.error("the application is required: gazette-consumer package.module:Application")
    if not 0 <= a.http_port <= 65535:
        p.error(f"--http-port must be a port number (0 disables HTTP), not {a.http_port}")
    if a.lease_ttl < 2:
        p.error(f"--lease-ttl must be at least 2 seconds, not {a.lease_ttl}")
    if not 0 <= a.fusefs_prestart <= 64:
        p.error(f"--fusefs-prestart must be within 0..64, not {a.fusefs_prestart}")
    check_process_id(p, a.zone, a.suffix, "CONSUMER_ZONE/CONSUMER_ID")
    return ConsumerConfig(
        app=a.app,
        etcd=a.etcd,
        root=a.root.rstrip("/"),
        zone=a.zone,
        suffix=a.suffix,
        listen=a.listen,
        http_port=a.http_port,
        advertise=a.advertise,
        broker=a.broker,
        workdir=a.workdir,
        lease_ttl=a.lease_ttl,
        shard_limit=a.shard_limit,
        hint_interval=a.hint_interval,
        drain_timeout=a.drain_timeout,
        log_level=a.log_level,
        fusefs_prestart=a.fusefs_prestart,
    )
