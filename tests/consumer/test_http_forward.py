"""`http_api.forward` against a real HTTP server standing for a shard's primary: what is
passed on, and what must not be (cookies of other callers, hosts named by the caller)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.http_api import HTTP_PROXY_HEADER, forward, forwarding_session

Seen = list[web.Request]


@pytest.fixture
async def primary() -> AsyncIterator[tuple[str, Seen]]:
    """An HTTP server answering every request with its path and query, setting a cookie;
    its address and the requests it saw."""
    seen: Seen = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(request)
        resp = web.json_response({"path": request.raw_path})
        resp.set_cookie("session", f"of-{request.query.get('user', '')}")
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "localhost", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://localhost:{port}", seen
    finally:
        await runner.cleanup()


async def test_a_cookie_set_for_one_caller_never_rides_along_with_another(
    primary: tuple[str, Seen],
) -> None:
    target, seen = primary
    async with forwarding_session() as session:
        for user, cookie in (("alice", ""), ("bob", "session=of-bob-own")):
            headers = {"Cookie": cookie} if cookie else {}
            request = make_mocked_request("GET", f"/q?user={user}", headers=headers)
            await forward(session, request, target, bpb.Header(), "shard-0")
    assert [r.headers.get("Cookie") for r in seen] == [None, "session=of-bob-own"]
    assert all(HTTP_PROXY_HEADER in r.headers for r in seen)


async def test_path_and_query_are_passed_as_encoded_to_the_primary_alone(
    primary: tuple[str, Seen],
) -> None:
    target, seen = primary
    async with forwarding_session() as session:
        for path in ("/api/x%2Fy?a=1&b=%20x", "http://elsewhere.example/api/s?u=1"):
            request = make_mocked_request("GET", path)
            await forward(session, request, target, bpb.Header(), "shard-0")
    assert [r.raw_path for r in seen] == ["/api/x%2Fy?a=1&b=%20x", "/api/s?u=1"]
