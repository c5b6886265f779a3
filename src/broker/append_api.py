"""The Append RPC: a client's content committed to a journal, or forwarded to its primary.

The handler reads and validates the stream's first request, runs the append's state
machine (`broker.append_fsm`) over the rest of the stream, and answers with its outcome: the
response, the failure's gRPC status, or the primary's own answer to the forwarded stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from gazette.auth.claims import Claims
from gazette.auth.grpc_auth import journal_scope
from gazette.broker.append_fsm import AppendFSM, AppendMessage, AppendState, ContentChunk
from gazette.broker.broker import Broker
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.validation import validate_first_append_request
from gazette.broker.serving import UNLIMITED, RpcFailure, abort_invalid, proxy_failure

__all__ = ["append"]


async def append(
    broker: Broker,
    request_iterator: AsyncIterator[AppendMessage],
    context: Any,
    claims: Claims = UNLIMITED,
) -> pb.AppendResponse:
    """Serve one Append stream on `broker`. Ends the RPC through `context.abort` (which
    raises) for a malformed or failed append. Cancelled (the client left), the append is
    rolled back and the cancellation propagates. The stream's later messages may be
    ContentChunks (`append_fsm`), its first is an AppendRequest."""
    it = request_iterator.__aiter__()
    try:
        first = await anext(it)
    except StopAsyncIteration:
        await RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "empty Append stream").abort(context)
    if isinstance(first, ContentChunk):
        raise TypeError("the first message of an Append stream is an AppendRequest")
    try:
        validate_first_append_request(first)
    except ValidationError as err:
        await abort_invalid(context, err)
    fsm = AppendFSM(broker, first, it, chunk_timeout=broker.cfg.chunk_timeout, claims=claims)
    state = await fsm.run()
    if state is AppendState.FINISHED:
        assert fsm.response is not None
        return fsm.response
    if state is AppendState.PROXY:
        assert fsm.resolution is not None
        return await _proxy(broker, fsm.resolution.proxy_to, fsm.header, first, it, context)
    assert fsm.failure is not None
    await fsm.failure.abort(context)


async def _proxy(
    broker: Broker,
    target: str,
    header: pb.Header,
    first: pb.AppendRequest,
    it: AsyncIterator[AppendMessage],
    context: Any,
) -> pb.AppendResponse:
    """Forward an Append stream to the journal's primary at `target` (with our `header`:
    never forwarded again) and relay its response."""
    forwarded = pb.AppendRequest()
    forwarded.CopyFrom(first)
    forwarded.header.CopyFrom(header)

    async def requests() -> AsyncIterator[pb.AppendRequest]:
        yield forwarded
        async for msg in it:
            yield msg.request() if isinstance(msg, ContentChunk) else msg

    try:
        await broker.peer_connected(target)
        # Signed by this broker, on the caller's behalf, for this journal alone.
        with journal_scope(first.journal):
            call = broker.peer_stub(target).Append(requests())
        resp: pb.AppendResponse = await call
        return resp
    except grpc.aio.AioRpcError as err:
        await proxy_failure(target, err).abort(context)
