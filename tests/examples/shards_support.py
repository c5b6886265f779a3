"""Watching the shards of an example's consumers: each shard's replicas and their status."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc.aio

from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from tests.kit.eventually import eventually


async def until(cond: Callable[[], Awaitable[bool]], what: str) -> None:
    """Until `cond` holds (the processes given a minute to start, recover or hand over)."""
    await eventually(cond, what=what, timeout=60, interval=0.1)


async def statuses(stub: pb_grpc.ShardStub) -> dict[str, dict[str, int]]:
    """Shard id -> consumer suffix -> its ReplicaStatus code."""
    resp = await stub.List(pb.ListRequest())
    return {
        s.spec.id: {m.suffix: st.code for m, st in zip(s.route.members, s.status, strict=False)}
        for s in resp.shards
    }


def all_shards(
    stub: pb_grpc.ShardStub, count: int, ok: Callable[[dict[str, int]], bool]
) -> Callable[[], Awaitable[bool]]:
    """Whether there are `count` shards and `ok` holds for the statuses of each."""

    async def check() -> bool:
        try:
            st = await statuses(stub)
        except grpc.aio.AioRpcError:
            return False
        return len(st) == count and all(ok(s) for s in st.values())

    return check
