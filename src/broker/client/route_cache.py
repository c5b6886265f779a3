"""RouteCache: the last known `pb.Route` of each journal, bounded and expiring.

Brokers attach the journal's current route to response headers. Remembering it lets a client
dispatch the next request straight to the primary (appends) or to a same-zone replica (reads),
saving a proxy hop through whichever broker it happened to dial. A stale entry is harmless:
the receiving broker proxies or answers with a routing status, and the client invalidates the
entry. The cache is plain synchronous state, safe to use from one event loop.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from gazette.broker.protocol import protocol_pb2 as pb

__all__ = ["RouteCache", "endpoint_to_target"]


def endpoint_to_target(endpoint: str) -> str:
    """The gRPC dial target of a broker's advertised endpoint.

    Gazette brokers advertise URLs (``http://host:8080``); gRPC wants ``host:8080``. Targets
    that already name a gRPC scheme (``unix:``, ``dns:``) or carry no scheme pass unchanged.
    """
    for scheme in ("http://", "https://", "grpc://"):
        if endpoint.startswith(scheme):
            return endpoint[len(scheme) :].rstrip("/")
    return endpoint


class RouteCache:
    """An LRU map of journal name -> `pb.Route`, of at most `size` entries each living `ttl` s.

    `update` with an empty route (no members) or None invalidates the entry.
    """

    def __init__(
        self,
        size: int = 1024,
        ttl: float = 3600.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if size <= 0:
            raise ValueError("RouteCache size must be > 0")
        self._size = size
        self._ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, pb.Route]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, journal: str) -> pb.Route | None:
        """The cached route of `journal`, or None when absent or expired."""
        entry = self._entries.get(journal)
        if entry is None:
            return None
        expires, route = entry
        if self._clock() >= expires:
            del self._entries[journal]
            return None
        self._entries.move_to_end(journal)
        return route

    def update(self, journal: str, route: pb.Route | None) -> None:
        """Cache `route` for `journal`, or drop the entry if `route` is None or empty."""
        if route is None or len(route.members) == 0:
            self._entries.pop(journal, None)
            return
        copy = pb.Route()
        copy.CopyFrom(route)
        self._entries[journal] = (self._clock() + self._ttl, copy)
        self._entries.move_to_end(journal)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def invalidate(self, journal: str) -> None:
        """Forget the route of `journal`."""
        self._entries.pop(journal, None)


def pick_endpoint(route: pb.Route, *, primary: bool, zone: str = "") -> str | None:
    """The endpoint of `route` to dispatch to, or None if the route does not name one.

    With `primary`, that is the primary's endpoint. Otherwise a member in `zone` is preferred
    (the primary among them first), then the primary, then any member with an endpoint.
    """
    endpoints = list(route.endpoints)
    if len(endpoints) != len(route.members):
        return None
    has_primary = 0 <= route.primary < len(endpoints) and bool(endpoints[route.primary])
    if primary:
        return endpoints[route.primary] if has_primary else None
    if zone:
        same_zone = [i for i, m in enumerate(route.members) if m.zone == zone and endpoints[i]]
        if same_zone:
            if has_primary and route.primary in same_zone:
                return endpoints[route.primary]
            return endpoints[same_zone[0]]
    if has_primary:
        return endpoints[route.primary]
    for ep in endpoints:
        if ep:
            return ep
    return None
