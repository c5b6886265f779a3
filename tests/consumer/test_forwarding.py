"""Resolving and forwarding end to end (consumer.resolver): etcd, a broker and real
`gazette-consumer` processes of tests/consumer/forwarding_app.py. A query sent to the
process that is not a shard's primary is answered by the primary (gRPC and HTTP); a shard
served nowhere is a real error; long-lived calls end cleanly when the process drains."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import grpc
import grpc.aio

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.protocol import pb
from gazette.consumer.resolver import HTTP_PROXY_HEADER
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.publisher import Publisher
from gazette.testing.consumer import ConsumerProcess
from tests.consumer.counter_app import Add
from tests.consumer.forwarding_app import GET_METHOD, WATCH_METHOD
from tests.consumer.support import (
    REPO,
    Setup,
    apply_shards,
    caught_up,
    primary_of,
    until_ready,
)

PRIMARY = pb.ReplicaStatus.PRIMARY


def forwarding_consumer(s: Setup, i: int, **kw: Any) -> ConsumerProcess:
    c = ConsumerProcess(
        "tests.consumer.forwarding_app:ForwardingCounter",
        s.etcd.endpoint,
        [s.broker.endpoint],
        root=s.root,
        zone=f"z{i % 2}",
        suffix=f"consumer-{i}",
        workdir=s.tmp / f"consumer-{i}",
        extra_env={"PYTHONPATH": str(REPO)},
        **kw,
    )
    s.consumers.append(c)
    return c


async def get_json(http: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, Any]:
    async with http.get(url, **kw) as resp:
        return resp.status, await resp.json()


async def test_a_query_to_a_non_primary_is_answered_by_the_primary(
    new_setup: Callable[..., Setup], client: JournalClient
) -> None:
    s = new_setup()
    await s.create_journals(client)
    procs = {c.suffix: c.start() for c in (forwarding_consumer(s, i) for i in range(2))}
    async with s.stubs() as stubs:
        off = s.shard_specs(hot_standbys=0)[0]
        off.id, off.disable = "shard-off", True  # Assigned nowhere: no primary.
        await apply_shards(stubs["consumer-0"], [*s.shard_specs(hot_standbys=0), off])
        await until_ready(stubs["consumer-0"], [PRIMARY], "a primary")
        primary = await primary_of(stubs["consumer-0"], "shard-000")
        other = next(k for k in procs if k != primary)
        async with AppendService(client) as svc:
            pub = Publisher(svc)
            for n in (2, 3):
                pub.publish_committed(
                    lambda _m: (s.inputs[0], CONTENT_TYPE_JSON_LINES), Add("k", n)
                )
            await pub.barrier()
        await caught_up(client, stubs[primary], s.inputs[0])
        want = {"total": 5, "served_by": f"{procs[primary].zone}#{primary}"}

        async with grpc.aio.insecure_channel(procs[other].endpoint) as ch:
            get = ch.unary_unary(GET_METHOD)
            query = json.dumps({"shard": "shard-000", "key": "k"}).encode()
            assert json.loads(await get(query, timeout=30)) == want
            for shard, code in [
                ("nope", grpc.StatusCode.NOT_FOUND),
                ("shard-off", grpc.StatusCode.UNAVAILABLE),
            ]:
                try:
                    await get(json.dumps({"shard": shard, "key": "k"}).encode(), timeout=30)
                    raise AssertionError(f"{shard} answered")
                except grpc.aio.AioRpcError as err:
                    assert err.code() == code, err

        async with aiohttp.ClientSession() as http:
            base = procs[other].http_endpoint
            assert await get_json(http, f"{base}/totals/shard-000/k") == (200, want)
            status, body = await get_json(http, f"{base}/totals/nope/k")
            assert (status, body["status"]) == (404, "SHARD_NOT_FOUND"), body
            status, body = await get_json(http, f"{base}/totals/shard-off/k")
            assert (status, body["status"]) == (503, "NO_SHARD_PRIMARY"), body
            # A request another process forwarded is not forwarded on (no loops).
            forwarded = {HTTP_PROXY_HEADER: base64.b64encode(b"").decode()}
            status, body = await get_json(http, f"{base}/totals/shard-000/k", headers=forwarded)
            assert (status, body["status"]) == (503, "NOT_SHARD_PRIMARY"), body
            # The primary itself answers it.
            url = f"{procs[primary].http_endpoint}/totals/shard-000/k"
            assert await get_json(http, url, headers=forwarded) == (200, want)


async def test_long_lived_calls_end_cleanly_when_the_process_drains(
    new_setup: Callable[..., Setup],
) -> None:
    """SIGTERM: once its shards are handed over (none here) the process sets its resolver's
    `stopping` before closing its servers; a server stream and a long HTTP request waiting
    on it end with their last message and status OK, instead of being cut off (CANCELLED)
    once the servers' grace ran out."""
    s = new_setup()
    proc = forwarding_consumer(s, 0, extra_args=["--drain-timeout", "30"]).start()
    me = f"{proc.zone}#{proc.suffix}"
    async with (
        grpc.aio.insecure_channel(proc.endpoint) as ch,
        aiohttp.ClientSession() as http,
    ):
        call = ch.unary_stream(WATCH_METHOD)(b"", timeout=60)
        assert json.loads(await call.read()) == {"watching": me}
        waiting = asyncio.create_task(get_json(http, f"{proc.http_endpoint}/wait"))
        await asyncio.sleep(0.5)  # The HTTP request is in flight.
        assert not waiting.done()
        assert proc.proc is not None
        t0 = time.monotonic()
        proc.proc.send_signal(signal.SIGTERM)
        assert json.loads(await asyncio.wait_for(call.read(), 20)) == {"stopping": me}
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
        assert await asyncio.wait_for(waiting, 20) == (200, {"stopping": me})
        code = await asyncio.to_thread(proc.proc.wait, 30)
        took = time.monotonic() - t0
    assert code == 0, proc.tail_log()
    assert took < 10.0, f"SIGTERM to exit took {took:.1f}s"
    print(f"SIGTERM to exit with a stream and a long request open: {took:.2f}s")
