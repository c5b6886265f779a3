"""Calls of the ``consumer.Shard`` service that map a non-OK status to an exception.

async with ShardClient("127.0.0.1:8081") as sc:
    shards = await list_shards(sc, parse_label_selector("app=word-count"))
    await apply_shards(sc, pb.ApplyRequest(changes=[...]))

A consumer serving TLS advertises ``https://host:port``: such an endpoint is dialled with
TLS (the system's CAs unless `tls` says otherwise), and so is any endpoint when a
`ClientTLS` is given. With `auth` (keys or a token, `gazette.auth.keys`) each call carries
what it asks for (`gazette.auth.grpc_auth`).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import grpc.aio

from gazette.auth.grpc_auth import authorized
from gazette.auth.keys import NO_AUTH, Authorizer
from gazette.auth.tls import ClientTLS, endpoint_target
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb

__all__ = [
    "ShardClient",
    "ShardStatusError",
    "apply_shards",
    "apply_batches",
    "apply_shards_in_batches",
    "get_hints",
    "list_shards",
    "stat_shard",
    "unassign_shards",
]


class ShardStatusError(Exception):
    """A consumer answered a Shard RPC with a status other than OK."""

    def __init__(self, rpc: str, status: int, detail: str = "") -> None:
        self.rpc = rpc
        self.status = status
        name = pb.Status.Name(status) if status in pb.Status.values() else str(status)  # type: ignore[arg-type]
        super().__init__(f"{rpc}: {name}" + (f" ({detail})" if detail else ""))


class ShardClient:
    """A channel to one consumer process and its ``consumer.Shard`` stub, whose calls
    `auth` authorizes (module docs). Use as ``async with ShardClient(endpoint)``. Raises
    `TLSConfigError` if the files of `tls` cannot be used."""

    def __init__(
        self, endpoint: str, *, tls: ClientTLS | None = None, auth: Authorizer = NO_AUTH
    ) -> None:
        self.endpoint = endpoint
        target, secure = endpoint_target(endpoint)
        if secure or tls is not None:
            credentials = (tls or ClientTLS()).grpc_credentials()
            self.channel = grpc.aio.secure_channel(target, credentials)
        else:
            self.channel = grpc.aio.insecure_channel(target)
        self.stub = authorized(pb_grpc.ShardStub(self.channel), auth, "consumer.Shard")

    async def close(self) -> None:
        await self.channel.close(None)

    async def __aenter__(self) -> ShardClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _check(rpc: str, status: int, detail: str = "") -> None:
    if status != pb.OK:
        raise ShardStatusError(rpc, status, detail)


async def list_shards(
    client: ShardClient, selector: bpb.LabelSelector | None = None
) -> list[pb.ListResponse.Shard]:
    """The shards matching `selector` (all without one), ordered by id."""
    req = pb.ListRequest()
    if selector is not None:
        req.selector.CopyFrom(selector)
    resp = await client.stub.List(req)
    _check("List", resp.status)
    return list(resp.shards)


async def apply_shards(client: ShardClient, request: pb.ApplyRequest) -> pb.ApplyResponse:
    """Apply every change in one etcd transaction (`ShardStatusError` if a guard failed)."""
    resp = await client.stub.Apply(request)
    _check("Apply", resp.status, "a shard changed since its revision was read")
    return resp


async def apply_shards_in_batches(
    client: ShardClient, request: pb.ApplyRequest, size: int
) -> pb.ApplyResponse:
    """Apply the changes in transactions of at most `size` changes (0: all in one). Earlier
    batches stay applied if a later one fails. Returns the last response."""
    resp = pb.ApplyResponse(status=pb.OK)
    for batch in apply_batches(request, size):
        resp = await apply_shards(client, batch)
    return resp


def apply_batches(request: pb.ApplyRequest, size: int) -> list[pb.ApplyRequest]:
    """`request` split into requests of at most `size` changes each (0: one request), in
    order; a caller that fails over between consumers retries a batch, not those before it."""
    changes = list(request.changes)
    size = size or len(changes) or 1
    return [
        pb.ApplyRequest(changes=changes[i : i + size]) for i in range(0, max(len(changes), 1), size)
    ]


async def stat_shard(
    client: ShardClient, shard: str, read_through: dict[str, int] | None = None
) -> pb.StatResponse:
    resp = await client.stub.Stat(pb.StatRequest(shard=shard, read_through=read_through or {}))
    _check("Stat", resp.status, shard)
    return resp


async def get_hints(client: ShardClient, shard: str) -> pb.GetHintsResponse:
    resp = await client.stub.GetHints(pb.GetHintsRequest(shard=shard))
    _check("GetHints", resp.status, shard)
    return resp


async def unassign_shards(
    client: ShardClient, shards: Sequence[str], *, only_failed: bool, dry_run: bool
) -> list[str]:
    """Unassign `shards` (see `ShardAPI.Unassign`); returns the shards affected."""
    resp = await client.stub.Unassign(
        pb.UnassignRequest(shards=list(shards), only_failed=only_failed, dry_run=dry_run),
    )
    _check("Unassign", resp.status, "an assignment changed meanwhile")
    return list(resp.shards)
