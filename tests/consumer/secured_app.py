"""The counter application (tests/consumer/counter_app.py) with a gRPC query that authorizes
its calls through the runtime, as an application's own API does when the consumer runs with
``--auth-keys``.

``/counter.Secured/Get`` (JSON bytes ``{"shard", "key"}``) needs READ over the shard (its
``id`` label): a call without it ends UNAUTHENTICATED (`ConsumerRuntime.verify`), one whose
claims' selector does not cover the shard is answered NOT_FOUND. Any process answers, the
primary's answer forwarded (with the caller's token, which the primary verifies again).

Run by `gazette-consumer tests.consumer.secured_app:SecuredCounter` in
tests/consumer/test_security.py."""

from __future__ import annotations

import json
from typing import Any

import grpc
import grpc.aio

from gazette.auth.claims import READ
from gazette.broker.protocol.labels import label_set
from gazette.consumer.runtime import ConsumerRuntime
from gazette.stores.rocksdb.store import RocksDBStore
from tests.consumer.counter_app import Counter

__all__ = ["GET_METHOD", "SecuredCounter"]

GET_METHOD = "/counter.Secured/Get"


class SecuredCounter(Counter):
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
                assert isinstance(res.store, RocksDBStore)
                raw = res.store.get(b"k" + req["key"].encode())
                total = int(raw) if raw is not None else 0
                return json.dumps({"total": total, "served_by": served_by}).encode()

        handler = grpc.method_handlers_generic_handler(
            "counter.Secured", {"Get": grpc.unary_unary_rpc_method_handler(get)}
        )
        server.add_generic_rpc_handlers((handler,))
