"""How a process is told to reach etcd: the endpoints it is given (``--etcd``), a
comma-separated list of the members' client URLs, ``http://host[:port]``,
``https://host[:port]`` or ``host[:port]`` (port 2379 if none), checked once here so that a
bad one is a usage error rather than a failure at the first request; and the TLS files of
the connection (``--etcd-cert-file``, ``--etcd-cert-key-file``, ``--etcd-trusted-ca-file``,
upstream Gazette's names), as a `ClientTLS` (`etcd_tls`).

``https://`` endpoints are dialed with TLS, ``http://`` and bare ones without, unless TLS
files are given: then every endpoint is dialed with TLS (`Etcd`; docs/security.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from gazette.auth.tls import ClientTLS, TLSFlags

__all__ = [
    "DEFAULT_PORT",
    "ETCD_TLS_FLAGS",
    "InvalidEndpoint",
    "etcd_tls",
    "is_tls_endpoint",
    "parse_endpoint",
    "parse_endpoints",
]

DEFAULT_PORT = 2379

ETCD_TLS_FLAGS = TLSFlags("--etcd-cert-file", "--etcd-cert-key-file", "--etcd-trusted-ca-file")
"""What every process calls the TLS files of its etcd connection (errors name them)."""


class InvalidEndpoint(ValueError):
    """An etcd endpoint that is not ``http://host[:port]``, ``https://host[:port]`` or
    ``host[:port]``."""


def parse_endpoint(endpoint: str) -> str:
    """`http://host:port`, `https://host:port`, `host:port` or `host` -> the gRPC target
    `host:port` (port 2379 if none is given). Raises `InvalidEndpoint`."""
    text = endpoint.strip()
    if "://" in text:
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https"):
            raise InvalidEndpoint(
                f"etcd endpoint {endpoint!r}: scheme {parts.scheme!r} is not http or https"
            )
    else:
        parts = urlsplit(f"//{text}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise InvalidEndpoint(f"etcd endpoint {endpoint!r}: only a host and a port may be given")
    try:
        port = parts.port
    except ValueError:
        raise InvalidEndpoint(f"etcd endpoint {endpoint!r}: invalid port") from None
    if port == 0:
        raise InvalidEndpoint(f"etcd endpoint {endpoint!r}: invalid port")
    host = parts.hostname
    if not host:
        raise InvalidEndpoint(f"etcd endpoint {endpoint!r}: no host")
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port or DEFAULT_PORT}"


def parse_endpoints(endpoints: str | Sequence[str]) -> tuple[str, ...]:
    """The endpoints of a comma-separated list (or of a sequence), each checked by
    `parse_endpoint`. Raises `InvalidEndpoint` if one is invalid or none is given."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    if not any(item.strip() for item in items):
        raise InvalidEndpoint("no etcd endpoint given")
    for item in items:
        if not item.strip():
            raise InvalidEndpoint(f"an empty etcd endpoint in {endpoints!r}")
        parse_endpoint(item)
    return tuple(item.strip() for item in items)


def is_tls_endpoint(endpoint: str) -> bool:
    """Whether `endpoint` asks for TLS by its scheme (``https://``)."""
    return endpoint.strip().lower().startswith("https://")


def etcd_tls(
    cert_file: str | Path | None, key_file: str | Path | None, ca_file: str | Path | None
) -> ClientTLS | None:
    """The TLS of an etcd connection from its files (named by `ETCD_TLS_FLAGS` in errors);
    None if none is given (None or ""). The files are not read here (`ClientTLS.check`
    does)."""
    cert_file, key_file, ca_file = (f or None for f in (cert_file, key_file, ca_file))
    if cert_file is None and key_file is None and ca_file is None:
        return None
    return ClientTLS(ca_file, cert_file, key_file, flags=ETCD_TLS_FLAGS)
