"""The `protocol.Journal` gRPC service of a broker.

`JournalService` hands each RPC to the module serving its family: `broker.list_apply_api`
(List, Apply), `broker.read_api` (Read), `broker.append_api` (Append, run as the state
machine of `broker.append_fsm`), `broker.replicate_api` (Replicate, the peers' side of
replication), `broker.fragments_api` (ListFragments, FragmentStoreHealth). What they share
is in `broker.serving`.

Protocol failures the client can act on (unknown journal, wrong offset, register mismatch,
offset not yet available) are returned as `Status` values in responses, as upstream does;
malformed requests abort with INVALID_ARGUMENT and a message naming the bad field (also
bytes that are not the request's message: `add_journal_service` serves it through
`broker.request_guard`), a message over `MAX_MESSAGE_SIZE` with RESOURCE_EXHAUSTED; a
corrupted fragment aborts the read with DATA_LOSS and is never served.

With authorization on (``--auth-keys``), every call first proves the capability it needs
(`gazette.auth.grpc_auth`; UNAUTHENTICATED otherwise), and its claims' selector limits the
journals it lists, changes, reads and appends to. A List or Read stream ends at its
token's expiry (DEADLINE_EXCEEDED, which clients retry with a fresh token), as upstream's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import grpc

from gazette.auth.claims import APPEND, APPLY, LIST, READ, REPLICATE
from gazette.auth.grpc_auth import until_expiry, verify_call
from gazette.broker import append_api, fragments_api, list_apply_api, read_api, replicate_api
from gazette.broker.broker import Broker
from gazette.broker.metrics import counted
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.broker.request_guard import add_guarded_service

__all__ = ["MAX_MESSAGE_SIZE", "JournalService", "add_journal_service"]

MAX_MESSAGE_SIZE = 64 << 20
"""Largest request message served (64 MiB, as our clients' `broker.client.journal_client`
limit); a larger one is answered RESOURCE_EXHAUSTED naming it. The gRPC server must receive
up to `broker.request_guard.transport_limit` of it."""


class JournalService(pb_grpc.JournalServicer):
    """Implements `protocol.Journal` over a Broker's state, each RPC counted (`metrics`)."""

    def __init__(self, broker: Broker) -> None:
        self.b = broker

    # Streamed responses are relayed from the serving module's generator, which is closed
    # as soon as this one is (its cleanup, such as closing descriptors, runs at once).
    @counted("List")
    async def List(self, request: pb.ListRequest, context: Any) -> AsyncIterator[pb.ListResponse]:  # noqa: N802
        claims = await verify_call(context, self.b.auth, LIST)
        listing = list_apply_api.list_journals(self.b, request, context, claims)
        async with until_expiry(context, claims), aclosing(listing) as responses:
            async for resp in responses:
                yield resp

    @counted("Apply")
    async def Apply(self, request: pb.ApplyRequest, context: Any) -> pb.ApplyResponse:  # noqa: N802
        claims = await verify_call(context, self.b.auth, APPLY)
        return await list_apply_api.apply(self.b, request, context, claims)

    @counted("Read")
    async def Read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.ReadResponse]:  # noqa: N802
        claims = await verify_call(context, self.b.auth, READ)
        reading = read_api.read(self.b, request, context, claims)
        async with until_expiry(context, claims), aclosing(reading) as responses:
            async for resp in responses:
                yield resp

    @counted("Append")
    async def Append(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.AppendRequest], context: Any
    ) -> pb.AppendResponse:
        claims = await verify_call(context, self.b.auth, APPEND)
        return await append_api.append(self.b, request_iterator, context, claims)

    @counted("Replicate")
    async def Replicate(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.ReplicateRequest], context: Any
    ) -> AsyncIterator[pb.ReplicateResponse]:
        claims = await verify_call(context, self.b.auth, REPLICATE)
        async with aclosing(
            replicate_api.replicate(self.b, request_iterator, context, claims)
        ) as responses:
            async for resp in responses:
                yield resp

    @counted("ListFragments")
    async def ListFragments(  # noqa: N802
        self, request: pb.FragmentsRequest, context: Any
    ) -> pb.FragmentsResponse:
        claims = await verify_call(context, self.b.auth, READ)
        return await fragments_api.list_fragments(self.b, request, context, claims)

    @counted("FragmentStoreHealth")
    async def FragmentStoreHealth(  # noqa: N802
        self, request: pb.FragmentStoreHealthRequest, context: Any
    ) -> pb.FragmentStoreHealthResponse:
        await verify_call(context, self.b.auth, READ)
        return await fragments_api.fragment_store_health(self.b, request, context)


def add_journal_service(server: grpc.aio.Server, service: JournalService) -> None:
    """Serve `service` on `server`: request messages that are not their type's protobuf, or
    are over `MAX_MESSAGE_SIZE`, are answered with a status saying so (`broker.request_guard`;
    the server should receive messages up to `transport_limit(MAX_MESSAGE_SIZE)`)."""
    add_guarded_service(
        server,
        pb.DESCRIPTOR.services_by_name["Journal"],
        service,
        max_message_size=MAX_MESSAGE_SIZE,
        drain_timeout=service.b.cfg.chunk_timeout,
    )
