"""A small typed asyncio client of etcd v3, over the gRPC stubs that `aetcd` ships.

We use aetcd's generated `etcdserverpb` stubs directly rather than its high-level client
because the keyspace mirror needs every response header (revisions) and whole watch
responses, which the high-level client folds away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import grpc
from aetcd import rpc

log = logging.getLogger(__name__)


class EtcdError(Exception):
    """An etcd request failed (transport error or rejected request)."""


def prefix_range_end(prefix: bytes) -> bytes:
    """The exclusive range end covering every key that starts with `prefix`."""
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"


def parse_endpoint(endpoint: str) -> str:
    """`http://host:port`, `host:port` -> gRPC target `host:port`."""
    if "://" in endpoint:
        parsed = urlparse(endpoint)
        if not parsed.hostname:
            raise EtcdError(f"invalid etcd endpoint {endpoint!r}")
        return f"{parsed.hostname}:{parsed.port or 2379}"
    return endpoint


@dataclass(frozen=True)
class Compare:
    """A txn comparison of a key's mod or create revision."""

    key: bytes
    target: str  # "mod" | "create" | "version"
    value: int
    op: str = "=="

    def to_rpc(self) -> Any:
        c = rpc.Compare(key=self.key)
        c.result = {
            "==": rpc.Compare.EQUAL,
            "!=": rpc.Compare.NOT_EQUAL,
            ">": rpc.Compare.GREATER,
            "<": rpc.Compare.LESS,
        }[self.op]
        if self.target == "mod":
            c.target = rpc.Compare.MOD
            c.mod_revision = self.value
        elif self.target == "create":
            c.target = rpc.Compare.CREATE
            c.create_revision = self.value
        elif self.target == "version":
            c.target = rpc.Compare.VERSION
            c.version = self.value
        else:
            raise ValueError(f"unknown compare target {self.target!r}")
        return c


def op_put(key: bytes, value: bytes, lease: int = 0) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def op_delete(key: bytes, prefix: bool = False) -> Any:
    req = rpc.DeleteRangeRequest(key=key)
    if prefix:
        req.range_end = prefix_range_end(key)
    return rpc.RequestOp(request_delete_range=req)


class Etcd:
    """An etcd client bound to one endpoint. Use as an async context manager or call close()."""

    def __init__(self, endpoint: str, *, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(parse_endpoint(endpoint))
        self.kv = rpc.KVStub(self._channel)
        self.watch_stub = rpc.WatchStub(self._channel)
        self.lease_stub = rpc.LeaseStub(self._channel)

    async def close(self) -> None:
        await self._channel.close(None)

    async def __aenter__(self) -> Etcd:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, fn: Any, req: Any) -> Any:
        try:
            return await fn(req, timeout=self.timeout)
        except grpc.aio.AioRpcError as err:
            raise EtcdError(f"etcd {self.endpoint}: {err.code().name}: {err.details()}") from err

    async def get_prefix(self, prefix: bytes, *, revision: int = 0) -> Any:
        """A RangeResponse of every key under `prefix`, sorted by key."""
        req = rpc.RangeRequest(key=prefix, range_end=prefix_range_end(prefix), revision=revision)
        return await self._call(self.kv.Range, req)

    async def get(self, key: bytes) -> Any:
        return await self._call(self.kv.Range, rpc.RangeRequest(key=key))

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> Any:
        return await self._call(self.kv.Put, rpc.PutRequest(key=key, value=value, lease=lease))

    async def delete(self, key: bytes, *, prefix: bool = False) -> Any:
        req = rpc.DeleteRangeRequest(key=key)
        if prefix:
            req.range_end = prefix_range_end(key)
        return await self._call(self.kv.DeleteRange, req)

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Any], failure: Sequence[Any] = ()
    ) -> Any:
        """Run a transaction; returns the TxnResponse (check `.succeeded`)."""
        req = rpc.TxnRequest(
            compare=[c.to_rpc() for c in compare], success=list(success), failure=list(failure)
        )
        return await self._call(self.kv.Txn, req)

    async def grant_lease(self, ttl: int) -> int:
        resp = await self._call(self.lease_stub.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl))
        return int(resp.ID)

    async def revoke_lease(self, lease_id: int) -> None:
        with contextlib.suppress(EtcdError):
            await self._call(self.lease_stub.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease_id))

    async def keep_alive(
        self, lease_id: int, ttl: int, on_renewed: Callable[[float, int], None] | None = None
    ) -> None:
        """Refresh the lease every ttl/3 seconds until cancelled; raises EtcdError if it expired.

        `on_renewed(sent_at, ttl)` is called after each renewal etcd confirms, with the
        `time.monotonic()` at which its request was sent and the TTL granted: the lease
        cannot end before `sent_at + ttl`.
        """
        while True:
            try:
                sent_at = time.monotonic()
                call = self.lease_stub.LeaseKeepAlive(
                    iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=self.timeout
                )
                async for reply in call:
                    if reply.TTL <= 0:
                        raise EtcdError(f"lease {lease_id:x} expired")
                    if on_renewed is not None:
                        on_renewed(sent_at, int(reply.TTL))
                    break
            except grpc.aio.AioRpcError as err:
                log.warning("lease keep-alive failed lease=%x err=%s", lease_id, err.code().name)
            await asyncio.sleep(max(ttl / 3.0, 0.5))

    async def watch_prefix(self, prefix: bytes, start_revision: int) -> AsyncIterator[Any]:
        """Yield WatchResponses of `prefix` from `start_revision` (inclusive), with headers.

        Raises EtcdError if the watch is cancelled by the server (e.g. compacted revision).
        Cancelling the consuming task closes the stream.
        """
        create = rpc.WatchCreateRequest(
            key=prefix,
            range_end=prefix_range_end(prefix),
            start_revision=start_revision,
            progress_notify=True,
        )
        queue: asyncio.Queue[Any] = asyncio.Queue()
        await queue.put(rpc.WatchRequest(create_request=create))

        async def requests() -> AsyncIterator[Any]:
            while True:
                yield await queue.get()

        call = self.watch_stub.Watch(requests())
        try:
            async for resp in call:
                if resp.canceled:
                    raise EtcdError(
                        f"watch of {prefix!r} cancelled: {resp.cancel_reason} "
                        f"(compact_revision={resp.compact_revision})"
                    )
                if resp.created and not resp.events:
                    continue
                yield resp
        except grpc.aio.AioRpcError as err:
            raise EtcdError(f"etcd watch {self.endpoint}: {err.code().name}") from err
        finally:
            call.cancel()
