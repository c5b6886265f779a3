"""The counter application (tests/consumer/counter_app.py) with a gRPC query that authorizes
its calls through the runtime, as an application's own API does when the consumer runs with
``--auth-keys``.

``/counter.Secured/Get`` (JSON bytes ``{"shard", "key"}``) needs READ over the shard (its
``id`` label): a call without it ends UNAUTHENTICATED (`ConsumerRuntime.verify`), one whose
claims' selector does not cover the shard is answered NOT_FOUND. Any process answers, the
primary's answer forwarded (with the caller's token, which the primary verifies again).
HTTP ``GET /totals/{shard}/{key}`` answers the same from the primary (forwarded over HTTPS
when the consumers serve TLS), without authorization.

Run by `gazette-consumer tests.consumer.secured_app:SecuredCounter` in
tests/consumer/test_security.py."""

from __future__ import annotations

import json
from typing import Any

import grpc
import grpc.aio
from aiohttp import web

from gazette.auth.claims import READ
from gazette.broker.protocol.labels import label_set
from gazette.consumer.runtime import ConsumerRuntime
from gazette.stores.rocksdb.store import RocksDBStore
from tests.consumer.counter_app import Counter

__all__ = ["GET_METHOD", "SecuredCounter"]

GET_METHOD = "/counter.Secured/Get"


def _total(store: Any, key: str) -> int:
    assert isinstance(store, RocksDBStore)
    raw = store.get(b"k" + key.encode())
    return int(raw) if raw is not None else 0


class SecuredCounter(Counter):
    def register_http(self, app: web.Application, runtime: ConsumerRuntime) -> None:
        served_by = f"{runtime.cfg.zone}#{runtime.cfg.suffix}"

        async def total(request: web.Request) -> web.StreamResponse:
            shard, key = request.match_info["shard"], request.match_info["key"]
            async with runtime.resolver.resolve(shard, may_proxy=True, incoming=request) as res:
                if not res.local:
                    return await res.forward_http(request)
                return web.json_response({"total": _total(res.store, key), "served_by": served_by})

        app.router.add_get("/totals/{shard}/{key}", total)

    def register_grpc(self, server: grpc.aio.Server, runtime: ConsumerRuntime) -> None:
        served_by = f"{runtime.cfg.zone}#{runtime.cfg.suffix}"

        async def get(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            claims = await runtime.verify(context, READ)
            req = json.loads(request)
            if not claims.covers(label_set(("id", req["shard"]))):
                await context.abort(grpc.StatusCode.NOT_FOUND, f"no shard {req['shard']}")
            async with runtime.resolver.resolve(
                req["shard"], may_proxy=True, incoming=context
            ) as res:
                if not res.local:
                    out: bytes = await res.forward_unary(GET_METHOD, request, context)
                    return out
                body = {"total": _total(res.store, req["key"]), "served_by": served_by}
                return json.dumps(body).encode()

        handler = grpc.method_handlers_generic_handler(
            "counter.Secured", {"Get": grpc.unary_unary_rpc_method_handler(get)}
        )
        server.add_generic_rpc_handlers((handler,))
