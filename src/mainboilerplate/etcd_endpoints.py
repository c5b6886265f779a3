"""The etcd endpoints a process is given (``--etcd``): a comma-separated list of the members'
client URLs, ``http://host[:port]`` or ``host[:port]`` (port 2379 if none), checked once here
so that a bad one is a usage error rather than a failure at the first request.

Plain HTTP only: etcd over TLS is refused by name rather than left to fail at connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

__all__ = ["DEFAULT_PORT", "InvalidEndpoint", "parse_endpoint", "parse_endpoints"]

DEFAULT_PORT = 2379


class InvalidEndpoint(ValueError):
    """An etcd endpoint that is not ``http://host[:port]`` or ``host[:port]``."""


def parse_endpoint(endpoint: str) -> str:
    """`http://host:port`, `host:port` or `host` -> the gRPC target `host:port` (port 2379 if
    none is given). Raises `InvalidEndpoint`."""
    text = endpoint.strip()
    if "://" in text:
        parts = urlsplit(text)
        if parts.scheme == "https":
            raise InvalidEndpoint(f"etcd endpoint {endpoint!r}: TLS to etcd is not supported")
        if parts.scheme != "http":
            raise InvalidEndpoint(
                f"etcd endpoint {endpoint!r}: scheme {parts.scheme!r} is not http"
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
