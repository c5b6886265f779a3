"""The counter application (tests/consumer/counter_app.py) with an HTTP query handler:
``GET /counter/{shard}/{key}`` answers a key's committed total from the shard's primary.

Run by `gazette-consumer tests.consumer.http_app:HTTPCounter` in tests/consumer/test_http.py."""

from __future__ import annotations

from aiohttp import web

from gazette.consumer.protocol import pb
from gazette.consumer.runtime import ConsumerRuntime
from gazette.stores.rocksdb.store import RocksDBStore
from tests.consumer.counter_app import Counter

__all__ = ["HTTPCounter"]


class HTTPCounter(Counter):
    def register_http(self, app: web.Application, runtime: ConsumerRuntime) -> None:
        async def total(request: web.Request) -> web.Response:
            shard, key = request.match_info["shard"], request.match_info["key"]
            res = await runtime.resolve(shard)
            if res.replica is None:
                # Not served here: say where (this test app does not proxy).
                body = {"status": pb.Status.Name(res.status), "primary": res.primary_endpoint}
                return web.json_response(body, status=404 if res.status else 421)
            store = res.replica.store
            assert isinstance(store, RocksDBStore)
            raw = store.get(b"k" + key.encode())
            return web.json_response(
                {"shard": shard, "key": key, "total": int(raw) if raw is not None else 0}
            )

        app.router.add_get("/counter/{shard}/{key}", total)
