"""Configuration of a consumer process: one typed place, from flags and environment."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from gazette.consumer import store_hooks
from gazette.mainboilerplate.flags import DefaultsHelpFormatter, MemberConfig, MemberFlags, env

__all__ = ["CONSUMER_FLAGS", "DEFAULT_ROOT", "ConsumerConfig", "parse_args"]

DEFAULT_ROOT = "/gazette/consumers/app"
"""The etcd root of a consumer whose --root is not given: two applications left at it would
share one keyspace (each other's shards and members), so the process says so at start."""


@dataclass(frozen=True)
class ConsumerConfig(MemberConfig):
    """Everything a consumer process needs; defaults run on one machine."""

    app: str = ""
    """The Application: ``package.module:Name`` (a class, instantiated without arguments, or
    an instance)."""
    root: str = DEFAULT_ROOT
    """etcd root of this consumer application's shards, members and assignments."""
    listen: str = "127.0.0.1:8090"
    """gRPC; beside a quickstart's brokers (8080 and up), not on them."""
    http_port: int = 8091
    """Port of the HTTP server (operator endpoints, the application's `register_http`
    handlers), on the host of `listen`. 0: no HTTP server."""
    broker: str = "127.0.0.1:8080"
    """Broker endpoint(s), comma separated."""
    workdir: Path = Path("/var/tmp/gazette-consumer")
    """Local directory for shards' played-back stores."""
    shard_limit: int = 1024
    max_hot_standbys: int = 3
    """The most hot standbys the allocator gives any one shard, whatever its ShardSpec's
    ``hot_standbys`` asks (upstream's ``--consumer.max-hot-standbys``, default 3). The
    allocator's leader applies its own value: run every process with the same one."""
    hint_interval: float = 300.0
    drain_timeout: float = 60.0
    store_options: Mapping[str, Any] = field(default_factory=dict)
    """The options of the store kinds the application uses, by kind (`consumer.store_hooks`);
    a kind missing here runs with its defaults."""

    @property
    def brokers(self) -> list[str]:
        return [b.strip() for b in self.broker.split(",") if b.strip()]


CONSUMER_FLAGS = MemberFlags(
    env={
        "etcd": "ETCD_ADDRESS",
        "root": "CONSUMER_ROOT",
        "zone": "CONSUMER_ZONE",
        "suffix": "CONSUMER_ID",
        "listen": "CONSUMER_LISTEN",
        "http-port": "CONSUMER_HTTP_PORT",
        "advertise": "CONSUMER_ADVERTISE",
        "lease-ttl": "CONSUMER_LEASE_TTL",
        "log-level": "LOG_LEVEL",
    },
    help={
        "etcd": "etcd endpoints, comma-separated [ETCD_ADDRESS]",
        "root": "etcd root of the application's shards, members and assignments: give each "
        "application its own [CONSUMER_ROOT]",
        "zone": "zone of this process [CONSUMER_ZONE]",
        "suffix": "unique id of this process within its zone; default: the host name made a "
        "valid suffix (%(default)s) [CONSUMER_ID]",
        "listen": "host:port of the gRPC server [CONSUMER_LISTEN]",
        "http-port": "port of the HTTP server (/healthz, /debug/shards, the application's "
        "register_http handlers) on the host of --listen; 0 disables it [CONSUMER_HTTP_PORT]",
        "advertise": "endpoint advertised to others (default: --listen) [CONSUMER_ADVERTISE]",
        "lease-ttl": "etcd lease TTL in seconds: how long a crashed process holds its shards "
        "[CONSUMER_LEASE_TTL]",
        "drain-timeout": "on SIGTERM, seconds to wait at most for shards to move to other "
        "processes (0: none); shards no other process can take, and FAILED ones, are not "
        "waited for",
        "log-level": "log level [LOG_LEVEL]",
    },
    no_http="0 disables HTTP",
    lease_ttl_error="--lease-ttl must be at least 2 seconds, not {value}",
)
"""The member flags as `gazette-consumer` names them."""


class _Unparsable(Exception):
    pass


class _FirstLook(argparse.ArgumentParser):
    """A parser that only looks for the application: silent on errors (the full parse
    reports them)."""

    def error(self, message: str) -> NoReturn:
        raise _Unparsable(message)


def _parser(
    kinds: list[store_hooks.StoreKind], *, first_look: bool = False
) -> argparse.ArgumentParser:
    d = ConsumerConfig()
    p = (_FirstLook if first_look else argparse.ArgumentParser)(
        prog="gazette-consumer",
        description="Run a consumer application's shards (and serve consumer.Shard over gRPC).",
        add_help=not first_look,
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument(
        "app", nargs="?", default=env("CONSUMER_APP", ""), help="module:Application [CONSUMER_APP]"
    )
    flags = CONSUMER_FLAGS
    flags.add(p, d, "etcd", "root", "zone", "suffix", "listen", "http-port", "advertise")
    p.add_argument(
        "--broker",
        default=env("BROKER_ADDRESS", d.broker),
        help="broker endpoint(s), comma separated [BROKER_ADDRESS]",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path(env("CONSUMER_WORKDIR", str(d.workdir))),
        help="local directory of shard stores [CONSUMER_WORKDIR]",
    )
    flags.add(p, d, "lease-ttl")
    p.add_argument(
        "--shard-limit",
        type=int,
        default=d.shard_limit,
        help="most shards assigned to this process",
    )
    p.add_argument(
        "--max-hot-standbys",
        type=int,
        default=env("CONSUMER_MAX_HOT_STANDBYS", str(d.max_hot_standbys)),
        help="most hot standbys of any one shard, bounding its ShardSpec's hot_standbys (e.g. "
        "0 to run production specs on one process); the allocator's leader applies its own "
        "value, so give every process the same [CONSUMER_MAX_HOT_STANDBYS]",
    )
    p.add_argument(
        "--hint-interval",
        type=float,
        default=d.hint_interval,
        help="seconds between primary hints writes (the first one this long after a shard "
        "becomes primary; backup hints are written at each recovery)",
    )
    flags.add(p, d, "drain-timeout", "log-level")
    for kind in kinds:
        kind.add_flags(p)
    return p


def _import_application(argv: list[str] | None) -> None:
    """Import the module of the application named by `argv` (or the environment), so that
    the store kinds it uses are registered before the flags are parsed. A module that
    cannot be imported is reported by the application's loading, after the flags."""
    try:
        known, _ = _parser([], first_look=True).parse_known_args(argv)
    except _Unparsable:
        return
    module, sep, _attr = (known.app or "").partition(":")
    if sep and module:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - reported (once more) when the application loads
            pass


def parse_args(argv: list[str] | None = None) -> ConsumerConfig:
    """Flags win over environment variables, which win over defaults."""
    _import_application(argv)
    kinds = store_hooks.registered()
    p = _parser(kinds)
    a = p.parse_args(argv)
    if not a.app:
        p.error("the application is required: gazette-consumer package.module:Application")
    CONSUMER_FLAGS.check(p, a)
    if a.max_hot_standbys < 0:
        p.error(f"--max-hot-standbys must be >= 0, not {a.max_hot_standbys}")
    return ConsumerConfig(
        **CONSUMER_FLAGS.values(a),
        app=a.app,
        broker=a.broker,
        workdir=a.workdir,
        shard_limit=a.shard_limit,
        max_hot_standbys=a.max_hot_standbys,
        hint_interval=a.hint_interval,
        store_options={kind.name: kind.options(p, a) for kind in kinds},
    )
