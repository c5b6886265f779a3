"""Authorization on gRPC calls: the claims each Journal and Shard call needs, stubs whose calls
carry them (`authorized`), and the servers' check (`verify_call`).

A call carries ``authorization: Bearer <token>`` metadata. What it asks for follows upstream's
authorizing clients: List asks LIST over its own selector; Apply asks APPLY; Read and
ListFragments ask READ over ``name=<journal>``; Append and Replicate ask APPEND and REPLICATE
over the journal in scope (`journal_scope`; everything when none is: the request naming the
journal comes after the call starts); a shard's Stat and GetHints ask READ over
``id=<shard>``; its List, LIST; its Apply and Unassign, APPLY. Tokens of streaming calls are
made to last an hour (a blocking read or a watch is long), the others a minute.

A server refuses a call with UNAUTHENTICATED and the reason (`keys.AuthError`); what the
claims' selector does not cover is the server's business (it acts as if the journal or shard
did not exist).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, NoReturn, TypeVar

import grpc

from gazette.auth.claims import APPEND, APPLY, LIST, READ, REPLICATE, Claims, name_selector
from gazette.auth.keys import AuthError, Authorizer, NoAuth, Verifier
from gazette.broker.protocol import protocol_pb2 as pb

__all__ = [
    "AUTHORIZATION",
    "append_authorization",
    "authorized",
    "journal_scope",
    "refuse",
    "until_expiry",
    "verify_call",
]

AUTHORIZATION = "authorization"
"""The metadata key of a call's token."""

LONG, SHORT = 3600.0, 60.0  # token lifetimes (seconds): streaming calls, unary calls

S = TypeVar("S")

_scope: contextvars.ContextVar[str] = contextvars.ContextVar("gazette_auth_journal", default="")


@contextlib.contextmanager
def journal_scope(journal: str) -> Iterator[None]:
    """Append and Replicate calls started in this block ask for `journal` only."""
    token = _scope.set(journal.split(";", 1)[0])
    try:
        yield
    finally:
        _scope.reset(token)


def _scoped(capability: int) -> Claims:
    journal = _scope.get()
    return Claims(capability, name_selector("name", journal) if journal else pb.LabelSelector())


def _journal(request: Any) -> str:
    return str(request.journal).split(";", 1)[0]


_CLAIMS: dict[str, Callable[[Any], tuple[Claims, float]]] = {
    # protocol.Journal
    "/protocol.Journal/List": lambda r: (Claims(LIST, r.selector), LONG),
    "/protocol.Journal/Apply": lambda r: (Claims(APPLY), SHORT),
    "/protocol.Journal/Read": lambda r: (Claims(READ, name_selector("name", _journal(r))), LONG),
    "/protocol.Journal/ListFragments": lambda r: (
        Claims(READ, name_selector("name", _journal(r))),
        LONG,
    ),
    "/protocol.Journal/FragmentStoreHealth": lambda r: (Claims(READ), LONG),
    "/protocol.Journal/Append": lambda r: (_scoped(APPEND), LONG),
    "/protocol.Journal/Replicate": lambda r: (_scoped(REPLICATE), LONG),
    # consumer.Shard
    "/consumer.Shard/Stat": lambda r: (Claims(READ, name_selector("id", r.shard)), SHORT),
    "/consumer.Shard/List": lambda r: (Claims(LIST, r.selector), SHORT),
    "/consumer.Shard/Apply": lambda r: (Claims(APPLY), SHORT),
    "/consumer.Shard/GetHints": lambda r: (Claims(READ, name_selector("id", r.shard)), SHORT),
    "/consumer.Shard/Unassign": lambda r: (Claims(APPLY), SHORT),
}


class _AuthorizedStub:
    """Proxies a stub: each call gets the ``authorization`` its claims need."""

    def __init__(self, stub: Any, authorizer: Authorizer, service: str) -> None:
        self._stub = stub
        self._authorizer = authorizer
        self._service = service

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        claims_of = _CLAIMS.get(f"/{self._service}/{name}")
        if claims_of is None:
            return method
        authorizer = self._authorizer

        def call(request: Any = None, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
            claims, ttl = claims_of(request)
            value = authorizer.authorization(claims, ttl)
            if value is not None:
                metadata = (*(metadata or ()), (AUTHORIZATION, value))
            return method(request, *args, metadata=metadata, **kwargs)

        setattr(self, name, call)  # made once per method
        return call


def append_authorization(authorizer: Authorizer, journal: str) -> str | None:
    """The ``authorization`` value of an append to `journal` (None: send none), for
    transports other than gRPC (direct appends)."""
    journal = journal.split(";", 1)[0]
    return authorizer.authorization(Claims(APPEND, name_selector("name", journal)), LONG)


def authorized(stub: S, authorizer: Authorizer, service: str = "protocol.Journal") -> S:
    """`stub` (of `service`: ``protocol.Journal`` or ``consumer.Shard``) with every call
    carrying what `authorizer` grants it; `stub` itself when authorization is off."""
    if isinstance(authorizer, NoAuth):
        return stub
    return _AuthorizedStub(stub, authorizer, service)  # type: ignore[return-value]


def _authorization(context: Any) -> str | None:
    metadata = getattr(context, "invocation_metadata", None)  # in-process callers have none
    for key, value in (metadata() if metadata is not None else None) or ():
        if key == AUTHORIZATION:
            return str(value)
    return None


async def refuse(context: Any, reason: str) -> NoReturn:
    """End the call of `context`: UNAUTHENTICATED, for `reason`."""
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
    raise AssertionError("unreachable: abort raises")


@contextlib.asynccontextmanager
async def until_expiry(context: Any, claims: Claims) -> AsyncIterator[None]:
    """Bound the block (a streaming call's serving) by `claims`' expiry, as upstream binds
    the call's context to it: past it, the call ends DEADLINE_EXCEEDED (clients retry such a
    call with a fresh token)."""
    if claims.expires_at is None:
        yield
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (claims.expires_at - time.time())
    timeout = asyncio.timeout_at(deadline)
    try:
        async with timeout:
            yield
    except TimeoutError:
        if not timeout.expired():
            raise
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "authorization expired")


async def verify_call(context: Any, verifier: Verifier, require: int) -> Claims:
    """The claims of the call of `context` if they grant `require`; else the call ends
    UNAUTHENTICATED saying why."""
    try:
        return verifier.verify(_authorization(context), require)
    except AuthError as err:
        await refuse(context, str(err))
