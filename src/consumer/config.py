"""Configuration of a consumer process: one typed place, from flags and environment.

The application may declare its own settings: a dataclass as its class's ``Config``
attribute, whose fields the process fills from ``--app.<field>`` flags, ``APP_<FIELD>``
variables and an ``--app-config`` file (`mainboilerplate.settings`), and hands to the class
when it instantiates it (`consumer.main.load_application`)."""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from gazette.auth.client_settings import BROKER_ENV, ClientSettings
from gazette.auth.flags import (
    add_auth_flags,
    add_client_flags,
    add_server_tls_flags,
    auth_from_args,
    auth_keys_from_args,
    check_server_tls_flags,
    client_settings_from_args,
    server_tls_values,
)
from gazette.auth.keys import NO_AUTH, Authorizer, BearerAuth, KeyedAuth, NoAuth
from gazette.auth.tls import ClientTLS
from gazette.consumer import store_hooks
from gazette.mainboilerplate.flags import (
    ETCD_TLS,
    ETCD_TLS_ENV,
    ETCD_TLS_HELP,
    DefaultsHelpFormatter,
    MemberConfig,
    MemberFlags,
    env,
)
from gazette.mainboilerplate.settings import Settings, SettingsError, settings_class

__all__ = ["CONSUMER_FLAGS", "DEFAULT_ROOT", "ConsumerConfig", "app_settings", "parse_args"]

DEFAULT_ROOT = "/gazette/consumers/app"
"""The etcd root of a consumer whose --root is not given: two applications left at it would
share one keyspace (each other's shards and members), so the process says so at start."""


@dataclass(frozen=True)
class ConsumerConfig(MemberConfig):
    """Everything a consumer process needs; defaults run on one machine."""

    app: str = ""
    """The Application: ``package.module:Name`` (a class, instantiated with its `app_config`
    if it declares a ``Config``, else without arguments; or an instance, used as it is)."""
    app_config: Any = None
    """The application's settings: an instance of its ``Config`` dataclass, or None."""
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
    auth: KeyedAuth | NoAuth = field(default=NO_AUTH, repr=False, compare=False)
    """Verifies the Shard calls served (and the application's, through
    ``runtime.verify``), and signs this consumer's calls to other consumers
    (``--auth-keys``); `NO_AUTH`: authorization off."""
    broker_client: ClientSettings = field(default_factory=ClientSettings)
    """TLS and authorization of the calls to brokers (``--broker-cert-file`` ...
    ``--broker-auth-token``; keys default to ``--auth-keys``), this process's and those of
    the processes it spawns (`gazette.auth.client_settings`)."""
    broker_auth: Authorizer = field(default=NO_AUTH, repr=False, compare=False)
    """What authorizes the calls to brokers (`broker_client`'s keys or token)."""

    @property
    def brokers(self) -> list[str]:
        return [b.strip() for b in self.broker.split(",") if b.strip()]

    @property
    def broker_tls(self) -> ClientTLS | None:
        """The TLS of every channel to brokers, if a ``--broker-*`` file is given."""
        return self.broker_client.tls()


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
        **ETCD_TLS_ENV,
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
        **ETCD_TLS_HELP,
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


def app_settings(config: type) -> Settings:
    """The flags, variables and file of an application's `config` dataclass."""
    return Settings(
        config,
        flag_prefix="app.",
        env_prefix="APP_",
        file_flag="app-config",
        file_env="CONSUMER_APP_CONFIG",
    )


def _parser(
    kinds: list[store_hooks.StoreKind],
    settings: Settings | None = None,
    *,
    first_look: bool = False,
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
    flags.add(p, d, "etcd", *ETCD_TLS, "root", "zone", "suffix", "listen", "http-port", "advertise")
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
    add_server_tls_flags(p, "CONSUMER_", process="consumer", peers="other consumers")
    add_auth_flags(
        p,
        "CONSUMER_",
        token=False,
        signs="this consumer's calls to other consumers (and to brokers, unless "
        "--broker-auth-keys or --broker-auth-token is given)",
    )
    add_client_flags(
        p,
        "broker-",
        BROKER_ENV,
        service="broker",
        keys_default="those of --auth-keys (CONSUMER_AUTH_KEYS), else none",
    )
    for kind in kinds:
        kind.add_flags(p)
    if settings is not None:
        settings.add(p)
    return p


def _without_app_flags(argv: list[str] | None) -> list[str]:
    """`argv` without the application's ``--app.*`` flags and their values, which the first
    look does not know yet (a value would be taken for the application)."""
    args = sys.argv[1:] if argv is None else argv
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            if not arg.startswith("-"):
                continue
        if arg.startswith(("--app.", "--app-config")):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def _import_application(argv: list[str] | None) -> type | None:
    """Import the module of the application named by `argv` (or the environment), so that
    the store kinds it uses are registered before the flags are parsed; the ``Config`` the
    application class declares, if any. A module that cannot be imported is reported by
    the application's loading, after the flags."""
    try:
        known, _ = _parser([], first_look=True).parse_known_args(_without_app_flags(argv))
    except _Unparsable:
        return None
    module_name, sep, attr = (known.app or "").partition(":")
    if not (sep and module_name):
        return None
    try:
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - reported (once more) when the application loads
        return None
    app = getattr(module, attr, None)
    return settings_class(app) if inspect.isclass(app) else None


def parse_args(argv: list[str] | None = None) -> ConsumerConfig:
    """Flags win over environment variables, which win over defaults."""
    config = _import_application(argv)
    settings = app_settings(config) if config is not None else None
    kinds = store_hooks.registered()
    try:
        p = _parser(kinds, settings)
    except SettingsError as err:
        _parser(kinds).error(f"the application's Config: {err}")
    a = p.parse_args(argv)
    if not a.app:
        p.error("the application is required: gazette-consumer package.module:Application")
    CONSUMER_FLAGS.check(p, a)
    check_server_tls_flags(p, a)
    auth = auth_from_args(p, a, "CONSUMER_")
    assert not isinstance(auth, BearerAuth)  # a consumer verifies: keys or nothing
    try:
        broker_client = client_settings_from_args(a, "broker-", BROKER_ENV)
    except ValueError as err:
        p.error(str(err))
    broker_client = broker_client.with_default_keys(auth_keys_from_args(a, "CONSUMER_"))
    if a.max_hot_standbys < 0:
        p.error(f"--max-hot-standbys must be >= 0, not {a.max_hot_standbys}")
    app_config = None
    if settings is not None:
        try:
            app_config = settings.build(a, os.environ)
        except SettingsError as err:
            p.error(str(err))
    return ConsumerConfig(
        app_config=app_config,
        **CONSUMER_FLAGS.values(a),
        app=a.app,
        broker=a.broker,
        workdir=a.workdir,
        shard_limit=a.shard_limit,
        max_hot_standbys=a.max_hot_standbys,
        hint_interval=a.hint_interval,
        store_options={kind.name: kind.options(p, a) for kind in kinds},
        **server_tls_values(a),
        auth=auth,
        broker_client=broker_client,
        broker_auth=broker_client.authorizer(),
    )
