"""The counter application (tests/consumer/counter_app.py) with query APIs that rely on the
runtime's resolver: any consumer process answers, the primary's answer forwarded.

- gRPC ``/counter.Totals/Get`` (JSON bytes ``{"shard", "key"}``) and HTTP
  ``GET /totals/{shard}/{key}``: ``{"total", "served_by"}`` from the shard's primary.
- gRPC ``/counter.Totals/Watch`` (server streaming) and HTTP ``GET /wait``: long-lived
  calls that run until the process stops serving (`Resolver.stopping`), then end cleanly:
  the stream's last message, and the HTTP response, say ``"stopping"``.

Run by `gazette-consumer tests.consumer.forwarding_app:ForwardingCounter` in
tests/consumer/test_forwarding.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
from aiohttp import web

from gazette.consumer.runtime import ConsumerRuntime
from gazette.stores.rocksdb.store import RocksDBStore
from tests.consumer.counter_app import Counter

__all__ = ["GET_METHOD", "WATCH_METHOD", "ForwardingCounter"]

GET_METHOD = "/counter.Totals/Get"
WATCH_METHOD = "/counter.Totals/Watch"


class ForwardingCounter(Counter):
    runtime: ConsumerRuntime

    def served_by(self) -> str:
        return f"{self.runtime.cfg.zone}#{self.runtime.cfg.suffix}"

    def total(self, store: Any, key: str) -> int:
        assert isinstance(store, RocksDBStore)
        raw = store.get(b"k" + key.encode())
        return int(raw) if raw is not None else 0

    def register_grpc(self, server: grpc.aio.Server, runtime: ConsumerRuntime) -> None:
        self.runtime = runtime

        async def get(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            req = json.loads(request)
            async with runtime.resolver.resolve(
                req["shard"], may_proxy=True, incoming=context
            ) as res:
                if not res.local:
                    out: bytes = await res.forward_unary(GET_METHOD, request, context)
                    return out
                body = {"total": self.total(res.store, req["key"]), "served_by": self.served_by()}
                return json.dumps(body).encode()

        async def watch(
            request: bytes, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[bytes]:
            yield json.dumps({"watching": self.served_by()}).encode()
            await runtime.resolver.stopping.wait()
            yield json.dumps({"stopping": self.served_by()}).encode()

        handler = grpc.method_handlers_generic_handler(
            "counter.Totals",
            {
                "Get": grpc.unary_unary_rpc_method_handler(get),
                "Watch": grpc.unary_stream_rpc_method_handler(watch),
            },
        )
        server.add_generic_rpc_handlers((handler,))

    def register_http(self, app: web.Application, runtime: ConsumerRuntime) -> None:
        self.runtime = runtime

        async def total(request: web.Request) -> web.StreamResponse:
            shard, key = request.match_info["shard"], request.match_info["key"]
            async with runtime.resolver.resolve(shard, may_proxy=True, incoming=request) as res:
                if not res.local:
                    return await res.forward_http(request)
                body = {"total": self.total(res.store, key), "served_by": self.served_by()}
                return web.json_response(body)

        async def wait(request: web.Request) -> web.Response:
            await asyncio.wait_for(runtime.resolver.stopping.wait(), 120)
            return web.json_response({"stopping": self.served_by()})

        app.router.add_get("/totals/{shard}/{key}", total)
        app.router.add_get("/wait", wait)
