"""A client of ``/wordcount.NGrams/Query`` (see `word_count.app`).

    python -m word_count.query --consumer 127.0.0.1:9000 --ngram "of the"
    python -m word_count.query --consumer 127.0.0.1:9000 --shard word-count-part-000 \\
        --prefix "the " --top 10

Against consumers with TLS and authorization on, it takes the settings gazctl's shard
commands take from the environment (``CONSUMER_TRUSTED_CA_FILE``, ``CONSUMER_AUTH_KEYS`` ...;
docs/security.md) and asks for READ.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import grpc.aio

from gazette.auth.claims import READ, Claims
from gazette.auth.tls import ClientTLS, endpoint_target
from word_count.app import QUERY_METHOD
from word_count.clients import consumer_settings

__all__ = ["QueryError", "query", "query_channel"]


class QueryError(Exception):
    """The query was answered with a non-OK status."""

    def __init__(self, resp: dict[str, Any]) -> None:
        super().__init__(f"{resp.get('status')}: {resp.get('error', '')}")
        self.status = str(resp.get("status"))
        self.response = resp


async def query_channel(
    channel: grpc.aio.Channel,
    req: dict[str, Any],
    *,
    timeout: float = 10.0,
    authorization: str | None = None,
) -> dict[str, Any]:
    """Send `req` over `channel` (with `authorization`, a ``Bearer`` value, if given); the OK
    response. Raises `QueryError` (other statuses) or ``grpc.aio.AioRpcError``."""
    call = channel.unary_unary(QUERY_METHOD, None, None)
    metadata = None if authorization is None else (("authorization", authorization),)
    answer = await call(json.dumps(req).encode(), timeout=timeout, metadata=metadata)
    resp: dict[str, Any] = json.loads(answer)
    if resp.get("status") != "OK":
        raise QueryError(resp)
    return resp


async def query(endpoint: str, req: dict[str, Any], *, timeout: float = 10.0) -> dict[str, Any]:
    """`query_channel` over a channel of its own to the consumer at `endpoint`, with the
    ``CONSUMER_*`` settings of the environment (module docs)."""
    settings = consumer_settings()
    target, secure = endpoint_target(endpoint)
    tls = settings.tls() or (ClientTLS() if secure else None)
    channel = (
        grpc.aio.insecure_channel(target)
        if tls is None
        else grpc.aio.secure_channel(target, tls.grpc_credentials())
    )
    authorization = settings.authorizer().authorization(Claims(READ), 60)
    async with channel:
        return await query_channel(channel, req, timeout=timeout, authorization=authorization)


async def _run(args: argparse.Namespace) -> None:
    req: dict[str, Any] = {}
    if args.shard:
        req["shard"] = args.shard
    if args.ngram is not None:
        req["ngram"] = args.ngram
    if args.prefix is not None or not req.get("ngram"):
        req["prefix"] = args.prefix or ""
    resp = await query(args.consumer, req)
    counts = sorted(resp["counts"].items(), key=lambda kv: (-kv[1], kv[0]))
    if args.top:
        counts = counts[: args.top]
    print(f"shard {resp['shard']} (served by {resp['served_by']}):")
    for ngram, count in counts:
        print(f"{count:8d}  {ngram}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumer", default="127.0.0.1:9000", help="any consumer's endpoint")
    parser.add_argument("--shard", default="", help="the shard to query")
    parser.add_argument("--ngram", default=None, help="an n-gram (finds its shard)")
    parser.add_argument("--prefix", default=None, help="n-grams starting so (with --shard)")
    parser.add_argument("--top", type=int, default=0, help="only the N highest counts")
    args = parser.parse_args(argv)
    if not args.shard and args.ngram is None:
        parser.error("give --shard or --ngram")
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
