"""The WordCount consumer application: ``gazette-consumer word_count.app:WordCount``.

Each shard reads one deltas partition. Within a transaction, the deltas of each n-gram add up
in memory (starting from the store's count the first time the transaction meets it); at
`finalize_txn` every changed count is written to the shard's RocksDB store (key ``b"n" +
ngram``, value the decimal count) and published as an `NGramCount` with
``publish_uncommitted``: it becomes readable (read-committed) exactly when the transaction
commits, together with the store's checkpoint. A shard killed mid-transaction leaves neither.

Queries: the unary gRPC method ``/wordcount.NGrams/Query`` (added by `register_grpc`; JSON
bytes in and out, see `QUERY_METHOD`) reads a shard's store on its primary. Any consumer
process answers: the runtime's resolver holds the shard's store while a local query reads
it, and forwards a query for a shard primary elsewhere to that primary (once).

    {"shard": "word-count-part-000", "prefix": "the "}  -> counts of n-grams starting "the "
    {"ngram": "of the"}                                  -> its count, from the shard owning it

The same queries over HTTP (added by `register_http`, served on the consumer's
``--http-port``, forwarded to the primary's): ``GET /ngrams?ngram=of+the`` or
``GET /ngrams?shard=ID&prefix=the+``; 200 with the response below, 404 for SHARD_NOT_FOUND,
400 for a bad request, else 503.

Responses: ``{"status": "OK", "shard": ..., "served_by": "zone#suffix", "counts": {...}}``,
or a `consumer.Status` name (SHARD_NOT_FOUND, NO_SHARD_PRIMARY, NOT_SHARD_PRIMARY) with an
``error``, or UNAVAILABLE with an ``error`` (over HTTP: the shard could not be resolved, or
its primary not reached; over gRPC the forwarded call's own error). Requests that are not
JSON objects fail with INVALID_ARGUMENT.

With the consumer's ``--auth-keys``, a gRPC query needs a token granting READ
(`ConsumerRuntime.verify`; UNAUTHENTICATED otherwise), and a shard its selector does not
cover is answered as if it did not exist; a forwarded query carries the caller's token to
the primary.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import grpc
import grpc.aio
from aiohttp import web

from gazette.auth.claims import READ
from gazette.broker.client import list_all_journals
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.broker.protocol.labels import label_set
from gazette.consumer.application import Shard
from gazette.consumer.protocol import pb
from gazette.consumer.resolver import Resolution, Resolver
from gazette.consumer.runtime import ConsumerRuntime
from gazette.consumer.store import RecoveredLog
from gazette.message.envelope import Envelope
from gazette.message.mapping import fnv1a_32
from gazette.message.publisher import Publisher
from gazette.stores.rocksdb.store import RocksDBStore
from word_count.messages import CONTENT_TYPE, COUNTS, NGramCount, NGramDelta, deltas_selector

__all__ = ["KEY_PREFIX", "QUERY_METHOD", "SERVICE", "WordCount"]

log = logging.getLogger("word_count")

SERVICE = "wordcount.NGrams"
QUERY_METHOD = f"/{SERVICE}/Query"
KEY_PREFIX = b"n"
"""Store keys of counts: ``KEY_PREFIX + ngram`` (UTF-8)."""
MAX_RESULTS = 100_000
"""A prefix query returns at most this many counts (``"truncated": true`` if more)."""


def _counts_mapping(_msg: Any) -> tuple[str, str]:
    return COUNTS, CONTENT_TYPE


class WordCount:
    """The application (module docs). One instance serves every shard of its process."""

    def __init__(self) -> None:
        # Shard id -> n-gram -> its count as of the open transaction.
        self._pending: dict[str, dict[str, int]] = {}
        self._runtime: ConsumerRuntime | None = None

    # -- Application --------------------------------------------------------------------------

    async def new_store(self, shard: Shard, recovered: RecoveredLog | None) -> RocksDBStore:
        if recovered is None:
            raise ValueError(f"shard {shard.id}: word-count needs a recovery log")
        self._pending.pop(shard.id, None)
        return await RocksDBStore.from_recovered(recovered)

    def new_message(self, spec: bpb.JournalSpec) -> NGramDelta:
        return NGramDelta()

    def consume_message(
        self, shard: Shard, store: RocksDBStore, env: Envelope, pub: Publisher
    ) -> None:
        msg: NGramDelta = env.message
        pending = self._pending.get(shard.id)
        if pending is None:
            pending = self._pending[shard.id] = {}
        count = pending.get(msg.ngram)
        if count is None:
            raw = store.get(KEY_PREFIX + msg.ngram.encode())
            count = int(raw) if raw is not None else 0
        pending[msg.ngram] = count + msg.delta

    def finalize_txn(self, shard: Shard, store: RocksDBStore, pub: Publisher) -> None:
        pending = self._pending.pop(shard.id, None)
        if not pending:
            return
        for ngram, count in pending.items():
            store.put(KEY_PREFIX + ngram.encode(), b"%d" % count)
            pub.publish_uncommitted(_counts_mapping, NGramCount(ngram, count))

    # -- The query API ------------------------------------------------------------------------

    def register_grpc(self, server: grpc.aio.Server, runtime: ConsumerRuntime) -> None:
        """Add ``wordcount.NGrams`` (its Query method) to the consumer's gRPC server."""
        self._runtime = runtime
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Query": grpc.unary_unary_rpc_method_handler(
                    self._query_rpc, request_deserializer=None, response_serializer=None
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))

    def register_http(self, app: web.Application, runtime: ConsumerRuntime) -> None:
        """Add ``GET /ngrams`` (the query, from URL parameters) to the consumer's HTTP server."""
        self._runtime = runtime
        app.router.add_get("/ngrams", self._query_http)

    async def _query_http(self, request: web.Request) -> web.StreamResponse:
        req = {k: v for k, v in request.query.items() if k in ("ngram", "shard", "prefix")}
        if "ngram" not in req and "shard" not in req:
            body = {"status": "INVALID_ARGUMENT", "error": "give ngram= or shard= (and prefix=)"}
            return web.json_response(body, status=400)
        try:
            shard_id = await self.shard_of_query(req)
            if not shard_id:
                return web.json_response(_no_shard(req), status=404)
            async with self.resolver.resolve(shard_id, may_proxy=True, incoming=request) as res:
                if not res.local:
                    return await res.forward_http(request)  # Or the failure, as JSON.
                return web.json_response(self.read(res, req))
        except Exception as err:  # noqa: BLE001 - e.g. etcd or broker errors resolving
            log.warning("ngrams query failed req=%s err=%r", req, err)
            body = {"status": "UNAVAILABLE", "error": f"{type(err).__name__}: {err}"}
            return web.json_response(body, status=503)

    async def _query_rpc(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        assert self._runtime is not None
        claims = await self._runtime.verify(context, READ)  # all, without --auth-keys
        try:
            req = json.loads(request)
            if not isinstance(req, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad query: {err}")
            raise  # abort raises; this is for type checkers.
        shard_id = await self.shard_of_query(req)
        if not shard_id or not claims.covers(label_set(("id", shard_id))):
            return json.dumps(_no_shard(req)).encode()
        async with self.resolver.resolve(shard_id, may_proxy=True, incoming=context) as res:
            if res.status != pb.OK:
                name = pb.Status.Name(res.status)
                return json.dumps({"status": name, "shard": shard_id, "error": res.error}).encode()
            if not res.local:
                out: bytes = await res.forward_unary(QUERY_METHOD, request, context)
                return out
            return json.dumps(self.read(res, req)).encode()

    @property
    def resolver(self) -> Resolver:
        assert self._runtime is not None, "neither register_grpc nor register_http was called"
        return self._runtime.resolver

    def read(self, res: Resolution, req: dict[str, Any]) -> dict[str, Any]:
        """Answer query `req` from the store of `res`, a local resolution."""
        store = res.store
        assert isinstance(store, RocksDBStore) and self._runtime is not None
        ngram = req.get("ngram")
        counts: dict[str, int] = {}
        truncated = False
        if isinstance(ngram, str) and "prefix" not in req:
            raw_count = store.get(KEY_PREFIX + ngram.encode())
            counts[ngram] = int(raw_count) if raw_count is not None else 0
        else:
            start = KEY_PREFIX + str(req.get("prefix", "")).encode()
            for key, value in store.items(start):
                if not key.startswith(start):
                    break
                if len(counts) >= MAX_RESULTS:
                    truncated = True
                    break
                counts[key[len(KEY_PREFIX) :].decode()] = int(value)
        cfg = self._runtime.cfg
        out = {
            "status": "OK",
            "shard": res.shard_id,
            "served_by": f"{cfg.zone}#{cfg.suffix}",
            "counts": counts,
        }
        if truncated:
            out["truncated"] = True
        return out

    async def shard_of_query(self, req: dict[str, Any]) -> str:
        """The shard a query asks: its ``shard``, else the one reading the deltas partition
        its ``ngram`` maps to (as the feeder maps it: FNV-1a modulo the listed partitions);
        '' if none does."""
        if req.get("shard"):
            return str(req["shard"])
        ngram = req.get("ngram")
        runtime = self._runtime
        if not isinstance(ngram, str) or runtime is None or runtime.client is None:
            return ""
        parts = await list_all_journals(runtime.client, deltas_selector())
        if not parts:
            return ""
        journal = parts[fnv1a_32(ngram) % len(parts)].spec.name
        specs = self.resolver.shards_with_source(journal)
        return str(specs[0].id) if specs else ""


def _no_shard(req: dict[str, Any]) -> dict[str, Any]:
    return {"status": "SHARD_NOT_FOUND", "error": f"no shard reads {req.get('ngram')!r}"}
