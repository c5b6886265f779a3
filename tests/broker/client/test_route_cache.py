"""RouteCache LRU/TTL behaviour and endpoint selection from routes."""

from __future__ import annotations

import pytest

from gazette.broker.client import JournalClient
from gazette.broker.client.route_cache import RouteCache, endpoint_to_target, pick_endpoint
from gazette.broker.protocol import protocol_pb2 as pb


def route(*members: tuple[str, str, str], primary: int = 0) -> pb.Route:
    r = pb.Route(primary=primary)
    for zone, suffix, ep in members:
        r.members.add(zone=zone, suffix=suffix)
        r.endpoints.append(ep)
    return r


def test_lru_eviction_and_invalidation() -> None:
    rc = RouteCache(size=2)
    a, b, c = (route(("z", s, f"h{s}:1")) for s in "abc")
    rc.update("a", a)
    rc.update("b", b)
    assert rc.get("a") == a  # touches "a": "b" is now least recently used
    rc.update("c", c)
    assert rc.get("b") is None and rc.get("a") == a and rc.get("c") == c
    rc.update("a", pb.Route())  # an empty route invalidates
    assert rc.get("a") is None
    rc.invalidate("c")
    assert len(rc) == 0


def test_ttl_expiry() -> None:
    now = [100.0]
    rc = RouteCache(size=4, ttl=10, clock=lambda: now[0])
    rc.update("a", route(("z", "a", "h:1")))
    now[0] = 109.0
    assert rc.get("a") is not None
    now[0] = 110.0
    assert rc.get("a") is None


def test_cached_route_is_a_copy() -> None:
    rc = RouteCache()
    r = route(("z", "a", "h:1"))
    rc.update("a", r)
    r.primary = -1
    got = rc.get("a")
    assert got is not None and got.primary == 0


@pytest.mark.parametrize(
    ("r", "primary", "zone", "want"),
    [
        (route(("z1", "a", "a:1"), ("z2", "b", "b:1"), primary=1), True, "", "b:1"),
        (route(("z1", "a", "a:1"), ("z2", "b", "b:1"), primary=1), False, "z1", "a:1"),
        (route(("z1", "a", "a:1"), ("z2", "b", "b:1"), primary=1), False, "", "b:1"),
        (route(("z1", "a", "a:1"), ("z2", "b", "b:1"), primary=-1), True, "", None),
        (route(("z1", "a", "a:1"), ("z2", "b", "b:1"), primary=-1), False, "zX", "a:1"),
        (pb.Route(primary=-1), False, "", None),
    ],
)
def test_pick_endpoint(r: pb.Route, primary: bool, zone: str, want: str | None) -> None:
    assert pick_endpoint(r, primary=primary, zone=zone) == want


def test_endpoint_to_target() -> None:
    assert endpoint_to_target("http://host:8080") == "host:8080"
    assert endpoint_to_target("http://host:8080/") == "host:8080"
    assert endpoint_to_target("127.0.0.1:1") == "127.0.0.1:1"
    assert endpoint_to_target("unix:///tmp/sock") == "unix:///tmp/sock"


async def test_client_routes_by_cache() -> None:
    async with JournalClient(["http://default:1", "other:2"], zone="z2") as client:
        assert client.endpoints == ("default:1", "other:2")
        assert client.endpoint_for("j") == "default:1"
        client.routes.update("j", route(("z1", "a", "http://a:1"), ("z2", "b", "b:1")))
        assert client.endpoint_for("j", primary=True) == "a:1"
        assert client.endpoint_for("j", primary=False) == "b:1"
        client.invalidate_route("j")
        # After a failure the client moves on to the next configured broker, round-robin.
        assert client.endpoint_for("j") == "other:2"
        client.invalidate_route("j")
        assert client.endpoint_for("j") == "default:1"
    with pytest.raises(ValueError):
        JournalClient([])
