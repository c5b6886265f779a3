"""The ListFragments and FragmentStoreHealth RPCs: a journal's fragment index, and whether a
fragment store answers.

ListFragments pages through the fragments of a journal's index from `next_page_token` (a
fragment's begin offset), optionally within a range of modification times and with signed
URLs to fetch them from their stores. FragmentStoreHealth probes a store (writes, reads back
and lists a small object) and answers FRAGMENT_STORE_UNHEALTHY with the store's error if
that fails.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from gazette.auth.claims import Claims
from gazette.broker.broker import Broker
from gazette.broker.fragment.store import FragmentStoreError, store_for_url
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.validation import validate_fragments_request
from gazette.broker.serving import (
    UNLIMITED,
    RpcFailure,
    abort_invalid,
    proxy_failure,
    resolve,
    was_proxied,
)

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_FRAGMENTS_PAGE", "fragment_store_health", "list_fragments"]

DEFAULT_FRAGMENTS_PAGE = 1000


async def list_fragments(
    broker: Broker, request: pb.FragmentsRequest, context: Any, claims: Claims = UNLIMITED
) -> pb.FragmentsResponse:
    """Serve one ListFragments on `broker`, here or forwarded to the primary."""
    try:
        validate_fragments_request(request)
    except ValidationError as err:
        await abort_invalid(context, err)
    try:
        res = await resolve(
            broker,
            request.journal,
            0,
            require_primary=False,
            may_proxy=not request.do_not_proxy and not was_proxied(request.header),
            claims=claims,
            header=request.header,
        )
    except RpcFailure as failure:
        await failure.abort(context)
    if res.status != pb.OK:
        return pb.FragmentsResponse(status=res.status, header=res.header)
    if res.proxy_to:
        forwarded = pb.FragmentsRequest()
        forwarded.CopyFrom(request)
        forwarded.header.CopyFrom(res.header)
        await broker.peer_connected(res.proxy_to)
        try:
            proxied: pb.FragmentsResponse = await broker.peer_stub(res.proxy_to).ListFragments(
                forwarded
            )
            return proxied
        except grpc.aio.AioRpcError as err:
            await proxy_failure(res.proxy_to, err).abort(context)
    replica = res.replica
    assert replica is not None
    limit = request.page_limit or DEFAULT_FRAGMENTS_PAGE
    resp = pb.FragmentsResponse(status=pb.OK, header=res.header)
    ttl = (
        request.signatureTTL.seconds + request.signatureTTL.nanos / 1e9
        if request.HasField("signatureTTL")
        else 0.0
    )
    for entry in replica.index:
        f = entry.spec
        if f.begin < request.next_page_token:
            continue
        if request.begin_mod_time and f.mod_time < request.begin_mod_time:
            continue
        if request.end_mod_time and f.mod_time >= request.end_mod_time:
            continue
        if len(resp.fragments) == limit:
            resp.next_page_token = f.begin
            break
        item = resp.fragments.add(spec=f)
        if ttl > 0 and f.backing_store:
            try:
                item.signed_url = await store_for_url(f.backing_store).sign_get_url(f, ttl)
            except FragmentStoreError as err:
                log.warning("cannot sign fragment URL err=%s", err)
    return resp


async def fragment_store_health(
    broker: Broker, request: pb.FragmentStoreHealthRequest, _context: Any
) -> pb.FragmentStoreHealthResponse:
    """Serve one FragmentStoreHealth on `broker`."""
    try:
        store = store_for_url(request.fragment_store)
        await store.health()
    except FragmentStoreError as err:
        return pb.FragmentStoreHealthResponse(
            status=pb.FRAGMENT_STORE_UNHEALTHY,
            header=broker.header(),
            store_health_error=str(err),
        )
    return pb.FragmentStoreHealthResponse(status=pb.OK, header=broker.header())
