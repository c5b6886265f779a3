"""`http_api.forward` against a real HTTP server standing for a shard's primary: what is
passed on, what must not be (cookies of other callers, hosts named by the caller), and a
primary that hangs."""

from __future__ import annotations

import asyncio
import json
import time
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
    release = asyncio.Event()  # /hang answers only once the test is over

    async def echo(request: web.Request) -> web.Response:
        seen.append(request)
        if request.path == "/hang":
            await release.wait()
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
        release.set()
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


async def test_a_primary_that_hangs_is_answered_unavailable_after_the_read_timeout(
    primary: tuple[str, Seen],
) -> None:
    target, seen = primary
    async with forwarding_session(read_timeout=0.5) as session:
        start = time.monotonic()
        resp = await forward(
            session, make_mocked_request("GET", "/hang"), target, bpb.Header(), "shard-0"
        )
        waited = time.monotonic() - start
    assert [r.path for r in seen] == ["/hang"]
    assert 0.4 < waited < 5, waited
    assert isinstance(resp, web.Response) and resp.status == 503
    assert resp.body is not None
    body = json.loads(bytes(resp.body))  # type: ignore[arg-type]
    assert body["status"] == "UNAVAILABLE" and body["shard"] == "shard-0"
    assert f"request to primary {target} failed" in body["error"]
