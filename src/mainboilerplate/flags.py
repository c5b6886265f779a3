"""The flags of an allocator member process (a broker, a consumer), declared once.

Both processes announce themselves in etcd under a root, as ``zone#suffix``, serve gRPC on a
listen address (advertised as an endpoint), may serve HTTP on a port of the same host, hold
their membership under a lease, drain at SIGTERM, and log at a level. `MemberConfig` holds
those values; `MemberFlags` declares the flags that set them (types, environment look-up,
defaults, checks). What a process calls them is its own: each passes the environment
variables, help texts and error wordings its operators know (`MemberFlags` fields), and adds
its own flags in between, so its ``--help`` reads in the order it always had.

The TLS files of the etcd connection (``--etcd-cert-file``, ``--etcd-cert-key-file``,
``--etcd-trusted-ca-file``) are named alike in every process, as upstream names them, with
their environment variables (`ETCD_TLS_ENV`) and help (`ETCD_TLS_HELP`); a file that cannot
be used is a usage error naming its flag.

Flags win over environment variables, which win over the process's defaults. ``--help``
shows each flag's default (`DefaultsHelpFormatter`): the value it takes here and now, the
environment included.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gazette.auth.tls import PEER_FLAGS, SERVER_FLAGS, ClientTLS, ServerTLS, TLSConfigError
from gazette.mainboilerplate.etcd_endpoints import InvalidEndpoint, etcd_tls, parse_endpoints

__all__ = [
    "ETCD_TLS",
    "ETCD_TLS_ENV",
    "ETCD_TLS_HELP",
    "MEMBER_FLAGS",
    "DefaultsHelpFormatter",
    "MemberConfig",
    "MemberFlags",
    "check_process_id",
    "default_suffix",
    "env",
    "http_host",
]

ETCD_TLS = ("etcd-cert-file", "etcd-cert-key-file", "etcd-trusted-ca-file")
"""The member flags of the etcd connection's TLS files."""

ETCD_TLS_ENV = {
    "etcd-cert-file": "ETCD_CERT_FILE",
    "etcd-cert-key-file": "ETCD_CERT_KEY_FILE",
    "etcd-trusted-ca-file": "ETCD_TRUSTED_CA_FILE",
}
"""The environment variables of `ETCD_TLS`, upstream's (for a `MemberFlags.env`)."""

ETCD_TLS_HELP = {
    "etcd-cert-file": "TLS certificate (PEM) presented to etcd, for its --client-cert-auth "
    "[ETCD_CERT_FILE]",
    "etcd-cert-key-file": "private key (PEM) of --etcd-cert-file [ETCD_CERT_KEY_FILE]",
    "etcd-trusted-ca-file": "CA certificate (PEM) etcd's certificate must be signed by, instead "
    "of the system's CAs; any of these three files dials every --etcd endpoint over TLS, "
    "as https:// endpoints are [ETCD_TRUSTED_CA_FILE]",
}
"""The help texts of `ETCD_TLS` (for a `MemberFlags.help`)."""

MEMBER_FLAGS = (
    "etcd",
    *ETCD_TLS,
    "root",
    "zone",
    "suffix",
    "listen",
    "advertise",
    "http-port",
    "lease-ttl",
    "drain-timeout",
    "log-level",
)
"""The flags every member process has (`MemberFlags.add` takes their names)."""

MIN_LEASE_TTL = 2
"""Shortest etcd lease (seconds): keep-alives are sent at a third of it."""


def env(name: str, default: str) -> str:
    """The environment variable `name`, or `default`."""
    return os.environ.get(name, default)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` that ends each flag's text with its default, as the process would take it
    (a default read from the environment shows that value). Not for flags whose text already
    speaks of its default, nor for an empty default (an optional argument that is absent
    unless given), nor for flags without a text."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if not text or "default" in text:
            return text
        if action.default in (None, "", argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


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


def http_host(listen: str) -> str:
    """The host of a ``host:port`` listen address, which a process's HTTP server binds to
    (brackets of an IPv6 address removed; every address if there is no host)."""
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    return host.strip("[]") or "0.0.0.0"


@dataclass(frozen=True)
class MemberConfig:
    """What every member process is configured with. A process's own configuration extends
    it, overriding the defaults that differ (its root, its ports, its drain bound)."""

    etcd: str = "http://127.0.0.1:2379"
    """The etcd members' endpoints, comma-separated (`etcd_endpoints`): the client fails over
    between them."""
    etcd_cert_file: Path | None = None
    """The certificate presented to etcd (for its ``--client-cert-auth``); None: none."""
    etcd_cert_key_file: Path | None = None
    etcd_trusted_ca_file: Path | None = None
    """The CA etcd's certificate must be signed by; None: the system's CAs."""
    root: str = "/gazette/cluster"
    """etcd root of the keyspace: its items, members and assignments."""
    zone: str = "local"
    suffix: str = field(default_factory=default_suffix)
    listen: str = "127.0.0.1:8080"
    advertise: str = ""
    lease_ttl: int = 20
    drain_timeout: float = 30.0
    log_level: str = "INFO"
    http_port: int = 0
    """Port of the HTTP server on the host of `listen`; 0: none."""
    server_cert_file: Path | None = None
    """The server's TLS certificate: with it, gRPC and HTTP are served over TLS only, and the
    advertised endpoint is ``https://``; without it, the other server and peer TLS settings
    are unused."""
    server_cert_key_file: Path | None = None
    server_ca_file: Path | None = None
    """With it, clients (peers too) must present a certificate this CA signed."""
    peer_cert_file: Path | None = None
    """The certificate presented to peers (other members of the same kind) calling them."""
    peer_cert_key_file: Path | None = None
    peer_ca_file: Path | None = None
    """The CA peers' certificates must be signed by (default: the system's)."""

    @property
    def endpoint(self) -> str:
        """The advertised endpoint: an absolute URL as upstream's (``http://host:port``, or
        ``https://`` when the server has TLS on), defaulting to the listen address."""
        ep = self.advertise or self.listen
        if "://" in ep:
            return ep
        return f"{'https' if self.server_cert_file is not None else 'http'}://{ep}"

    @property
    def server_tls(self) -> ServerTLS | None:
        """The TLS of the gRPC and HTTP servers, if on. Raises `TLSConfigError` for a
        certificate without its key."""
        if self.server_cert_file is None:
            return None
        if self.server_cert_key_file is None:
            raise TLSConfigError(f"{SERVER_FLAGS.cert} is given without {SERVER_FLAGS.key}")
        return ServerTLS(self.server_cert_file, self.server_cert_key_file, self.server_ca_file)

    @property
    def peer_tls(self) -> ClientTLS | None:
        """The TLS of calls to peers that advertise ``https://`` endpoints: built, as
        upstream's, only when the server has TLS on (else the system's CAs, no certificate)."""
        if self.server_cert_file is None:
            return None
        return ClientTLS(
            self.peer_ca_file, self.peer_cert_file, self.peer_cert_key_file, flags=PEER_FLAGS
        )

    @property
    def http_host(self) -> str:
        """The host HTTP binds to: that of `listen` (brackets of an IPv6 address removed)."""
        return http_host(self.listen)

    @property
    def etcd_tls(self) -> ClientTLS | None:
        """The TLS of the etcd connection, if any of its files is given (then every
        endpoint is dialed over TLS); None: only ``https://`` endpoints are, trusting the
        system's CAs."""
        return etcd_tls(self.etcd_cert_file, self.etcd_cert_key_file, self.etcd_trusted_ca_file)


@dataclass(frozen=True)
class MemberFlags:
    """The member flags as one process presents them.

    `env` names the environment variable of each flag (by its name in `MEMBER_FLAGS`; a flag
    without one reads no environment), `help` its help text (absent: none). `no_http` says
    what port 0 means, in the --http-port error; `lease_ttl_error` is the --lease-ttl error,
    formatted with ``{value}``.
    """

    env: Mapping[str, str]
    help: Mapping[str, str]
    no_http: str
    lease_ttl_error: str

    def add(self, parser: argparse.ArgumentParser, defaults: MemberConfig, *names: str) -> None:
        """Add the member flags `names` (of `MEMBER_FLAGS`) to `parser`, in that order,
        defaulting to the environment, else to `defaults`."""
        for name in names:
            default: Any = getattr(defaults, name.replace("-", "_"))
            variable = self.env.get(name)
            if name in ETCD_TLS:
                # A file, or None: an empty variable names none.
                if variable is not None:
                    default = env(variable, "") or default
            elif variable is not None:
                # A string: parsed by `type` (argparse converts a string default).
                default = env(variable, str(default))
            kwargs: dict[str, Any] = {"default": default}
            if name in ETCD_TLS:
                kwargs.update(type=Path, metavar="FILE")
            elif name in ("http-port", "lease-ttl"):
                kwargs["type"] = int
            elif name == "drain-timeout":
                kwargs["type"] = float
            if name in ("lease-ttl", "drain-timeout"):
                # Converted here: a bad value in the environment fails at once, not as a
                # usage error (--http-port's is one: its default stays a string).
                kwargs["default"] = kwargs["type"](default)
            if name in self.help:
                kwargs["help"] = self.help[name]
            parser.add_argument(f"--{name}", **kwargs)

    def check(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        """Exit through `parser` (status 2) if a member flag's value is invalid."""
        try:
            parse_endpoints(args.etcd)
        except InvalidEndpoint as err:
            variable = self.env.get("etcd")
            parser.error(f"--etcd{f' ({variable})' if variable else ''}: {err}")
        tls = etcd_tls(
            args.etcd_cert_file,
            args.etcd_cert_key_file,
            args.etcd_trusted_ca_file,
        )
        if tls is not None:
            try:
                tls.check()
            except TLSConfigError as err:
                parser.error(str(err))
        if not 0 <= args.http_port <= 65535:
            parser.error(
                f"--http-port must be a port number ({self.no_http}), not {args.http_port}"
            )
        if args.lease_ttl < MIN_LEASE_TTL:
            parser.error(self.lease_ttl_error.format(value=args.lease_ttl))
        check_process_id(parser, args.zone, args.suffix, f"{self.env['zone']}/{self.env['suffix']}")

    @staticmethod
    def values(args: argparse.Namespace) -> dict[str, Any]:
        """The `MemberConfig` fields of parsed `args` (the root without a trailing ``/``)."""
        return {
            "etcd": args.etcd,
            "etcd_cert_file": args.etcd_cert_file,
            "etcd_cert_key_file": args.etcd_cert_key_file,
            "etcd_trusted_ca_file": args.etcd_trusted_ca_file,
            "root": args.root.rstrip("/"),
            "zone": args.zone,
            "suffix": args.suffix,
            "listen": args.listen,
            "advertise": args.advertise,
            "lease_ttl": args.lease_ttl,
            "drain_timeout": args.drain_timeout,
            "log_level": args.log_level,
            "http_port": args.http_port,
        }
