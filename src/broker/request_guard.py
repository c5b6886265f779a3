"""Serving a gRPC service whose request messages may be unreadable: each gets a status saying why.

gRPC's asyncio server decodes every request message before the servicer sees it, and answers a
message that does not decode with UNKNOWN ("Unexpected <class 'DecodeError'>"). A service
registered with `add_guarded_service` answers instead:

- INVALID_ARGUMENT naming the message type it expected, for bytes that are not that message;
- RESOURCE_EXHAUSTED naming the limit, for a message of more than `max_message_size` bytes.

Both are found by the request deserializer, which returns a `Refusal` rather than raising: a
unary RPC is answered before its servicer runs, and a streaming servicer's request iterator
raises `RequestRefused` where the message would have been, so that the servicer rolls back
what the stream did so far (as for any error) before the status is sent.

Why the transport's own limit (``grpc.max_receive_message_length``) must be larger than
`max_message_size` (`transport_limit`), and why a refused stream is read to its end before it
is answered: gRPC cuts a message over the transport's limit off mid-stream, and a Python
client still sending when a stream is cut or answered reports INTERNAL ("Internal error from
Core") instead of the server's status. A message between the two limits is received whole and
refused here; one over the transport's limit still ends with gRPC's RESOURCE_EXHAUSTED (which
also names a limit, the transport's), which a client that is still sending may misreport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

__all__ = [
    "Refusal",
    "RequestRefused",
    "add_guarded_service",
    "drain_requests",
    "transport_limit",
]

log = logging.getLogger(__name__)

TRANSPORT_LIMIT_FACTOR = 4
"""The transport receives messages up to this many times `max_message_size` whole (and the
guard refuses them with its own status), bounding what one message can make a server hold."""


def transport_limit(max_message_size: int) -> int:
    """The ``grpc.max_receive_message_length`` to pair with `max_message_size` (gRPC takes a
    C int)."""
    return min(max_message_size * TRANSPORT_LIMIT_FACTOR, (1 << 31) - 1)


@dataclass(frozen=True)
class Refusal:
    """Why a request message is not handed to the servicer, as the status to answer with."""

    code: grpc.StatusCode
    details: str


class RequestRefused(Exception):
    """Raised by a guarded request stream in place of a message it refused (`refusal`)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(f"{refusal.code.name}: {refusal.details}")
        self.refusal = refusal


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def _deserializer(cls: type[Message], max_message_size: int) -> Callable[[bytes], Any]:
    name = cls.DESCRIPTOR.full_name

    def deserialize(raw: bytes) -> Message | Refusal:
        if len(raw) > max_message_size:
            return Refusal(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"a {name} message of {len(raw)} bytes is over this server's limit of "
                f"{max_message_size} bytes ({_mib(max_message_size)}): send smaller messages "
                "(split content into several)",
            )
        try:
            return cls.FromString(raw)
        except DecodeError as err:
            return Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the request ({len(raw)} bytes) is not a valid {name} message: {err}",
            )

    return deserialize


class _GuardedRequests:
    """A request stream that raises `RequestRefused` at a refused message (and remembers it)."""

    def __init__(self, requests: AsyncIterator[Any]) -> None:
        self._requests = requests.__aiter__()
        self.refusal: Refusal | None = None

    def __aiter__(self) -> _GuardedRequests:
        return self

    async def __anext__(self) -> Any:
        msg = await anext(self._requests)
        if isinstance(msg, Refusal):
            self.refusal = msg
            raise RequestRefused(msg)
        return msg


async def drain_requests(requests: AsyncIterator[Any], timeout: float) -> None:
    """Read and discard what is left of a request stream, until it ends or for `timeout`
    seconds at most.

    A server that answers an error while its client is still sending should call this first:
    a gRPC Python client whose send fails because the stream was answered reports INTERNAL
    instead of the answer. Best effort: never raises (but for cancellation)."""
    # The stream may already be broken (a receive cancelled by the servicer): that ends it.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await anext(requests)
                except RequestRefused:
                    continue


async def _answer(method: str, refusal: Refusal, context: Any) -> None:
    log.info("refused request method=%s code=%s: %s", method, refusal.code.name, refusal.details)
    await context.abort(refusal.code, refusal.details)


def _refused(requests: _GuardedRequests, context: Any) -> Refusal | None:
    """The refusal to answer with once the servicer raised, or None to let its error be."""
    task = asyncio.current_task()
    if requests.refusal is None or context.done() or (task is not None and task.cancelling()):
        return None
    return requests.refusal


Behavior = Callable[..., Any]


def _guard_unary_unary(method: str, behavior: Behavior) -> Behavior:
    async def handler(request: Any, context: Any) -> Any:
        if isinstance(request, Refusal):
            await _answer(method, request, context)
        return await behavior(request, context)

    return handler


def _guard_unary_stream(method: str, behavior: Behavior) -> Behavior:
    async def handler(request: Any, context: Any) -> AsyncIterator[Any]:
        if isinstance(request, Refusal):
            await _answer(method, request, context)
        async with contextlib.aclosing(behavior(request, context)) as responses:
            async for resp in responses:
                yield resp

    return handler


def _guard_stream_unary(method: str, behavior: Behavior, drain_timeout: float) -> Behavior:
    async def handler(request_iterator: AsyncIterator[Any], context: Any) -> Any:
        requests = _GuardedRequests(request_iterator)
        try:
            return await behavior(requests, context)
        except BaseException:
            refusal = _refused(requests, context)
            if refusal is None:
                raise
        await drain_requests(requests, drain_timeout)
        await _answer(method, refusal, context)

    return handler


def _guard_stream_stream(method: str, behavior: Behavior, drain_timeout: float) -> Behavior:
    async def handler(request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        requests = _GuardedRequests(request_iterator)
        try:
            async with contextlib.aclosing(behavior(requests, context)) as responses:
                async for resp in responses:
                    yield resp
            return
        except BaseException:
            refusal = _refused(requests, context)
            if refusal is None:
                raise
        await drain_requests(requests, drain_timeout)
        await _answer(method, refusal, context)

    return handler


def add_guarded_service(
    server: grpc.aio.Server,
    service: ServiceDescriptor,
    servicer: object,
    *,
    max_message_size: int,
    drain_timeout: float,
) -> None:
    """Serve `servicer`'s implementation of `service` on `server`, guarded as the module says.

    `server` should receive messages up to `transport_limit(max_message_size)`. A refused
    request stream is read for at most `drain_timeout` seconds before it is answered."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        name = f"/{service.full_name}/{method.name}"
        behavior: Callable[..., Awaitable[Any] | AsyncIterator[Any]] = getattr(
            servicer, method.name
        )
        kw: dict[str, Any] = {
            "request_deserializer": _deserializer(
                GetMessageClass(method.input_type), max_message_size
            ),
            "response_serializer": GetMessageClass(method.output_type).SerializeToString,
        }
        if method.client_streaming and method.server_streaming:
            handler = grpc.stream_stream_rpc_method_handler(
                _guard_stream_stream(name, behavior, drain_timeout), **kw
            )
        elif method.client_streaming:
            handler = grpc.stream_unary_rpc_method_handler(
                _guard_stream_unary(name, behavior, drain_timeout), **kw
            )
        elif method.server_streaming:
            handler = grpc.unary_stream_rpc_method_handler(
                _guard_unary_stream(name, behavior), **kw
            )
        else:
            handler = grpc.unary_unary_rpc_method_handler(_guard_unary_unary(name, behavior), **kw)
        handlers[method.name] = handler
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    # As generated code does: found before the generic handlers (missing from grpc's stubs).
    server.add_registered_method_handlers(service.full_name, handlers)  # type: ignore[attr-defined]
