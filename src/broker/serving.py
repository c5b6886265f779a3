"""What the handlers of the Journal service's RPCs share.

A handler ends an RPC with a gRPC status through its servicer context; code that has no
context (the append state machine, `broker.append_fsm`) raises or returns an `RpcFailure`
instead, which the handler turns into that status. The rest: resolving the journal a request
names, telling a request another broker forwarded, and the statuses of a failed forward and
of a failed spool write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

import grpc

from gazette.auth.claims import ALL, Claims
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.resolver import Resolution
from gazette.broker.spool import SpoolDiskFull, SpoolError

log = logging.getLogger(__name__)


class RpcFailure(Exception):
    """The RPC ends with gRPC status `code` and `details`, not with a response."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RpcFailure):
            return NotImplemented
        return (self.code, self.details) == (other.code, other.details)

    def __hash__(self) -> int:
        return hash((self.code, self.details))

    async def abort(self, context: Any) -> NoReturn:
        """End the RPC of `context` with this status (`context.abort` raises)."""
        await context.abort(self.code, self.details)
        raise AssertionError("unreachable: abort raises")


async def abort_invalid(context: Any, err: ValidationError) -> NoReturn:
    """End the RPC of `context`: its request is malformed, as `err` says."""
    await RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(err)).abort(context)


class Resolver(Protocol):
    """Where a journal's requests are served (`broker.resolver.Resolver.resolve`)."""

    async def resolve(
        self,
        journal: str,
        *,
        min_etcd_revision: int = 0,
        require_primary: bool = False,
        may_proxy: bool = True,
        covered: Callable[[pb.LabelSet], bool] | None = None,
        proxy_header: pb.Header | None = None,
    ) -> Resolution: ...


UNLIMITED = Claims(ALL)
"""The claims of a call when authorization is off: everything."""


async def resolve(
    resolver: Resolver,
    journal: str,
    min_revision: int,
    *,
    require_primary: bool,
    may_proxy: bool,
    claims: Claims = UNLIMITED,
    header: pb.Header | None = None,
) -> Resolution:
    """Where to serve `journal`; JOURNAL_NOT_FOUND if the caller's `claims` do not cover
    it (as if it did not exist, as upstream answers). `header` is the request's: when
    another broker forwarded it (`was_proxied`), a route of the journal other than ours
    makes the keyspace reach that broker's etcd revision first (`Resolver.resolve`), so
    this broker never answers from an older view of the journal's assignment than the one
    the request was routed by. Raises RpcFailure UNAVAILABLE if the keyspace has not
    reached that revision or `min_revision`, or the journal's replica is not recovered in
    time."""
    proxy_header = header if header is not None and was_proxied(header) else None
    try:
        return await resolver.resolve(
            journal,
            min_etcd_revision=min_revision,
            require_primary=require_primary,
            may_proxy=may_proxy,
            covered=claims.covers if claims.selector.ByteSize() else None,
            proxy_header=proxy_header,
        )
    except TimeoutError:
        wanted = min_revision
        if proxy_header is not None:
            wanted = max(wanted, int(proxy_header.etcd.revision))
        raise RpcFailure(
            grpc.StatusCode.UNAVAILABLE,
            f"journal {journal} not ready (etcd revision {wanted} or its recovery)",
        ) from None


def was_proxied(header: pb.Header) -> bool:
    """A request carrying a broker's header was proxied once already: never again."""
    return bool(header.process_id.zone or header.process_id.suffix)


def proxy_failure(target: str, err: grpc.aio.AioRpcError) -> RpcFailure:
    """The status of a request forwarded to `target` that failed with `err`: the primary's
    own status, but UNAVAILABLE for an unknown failure (the primary may be gone)."""
    code = err.code()
    if code == grpc.StatusCode.UNKNOWN:
        code = grpc.StatusCode.UNAVAILABLE
    return RpcFailure(code, f"proxy to primary {target}: {err.details()}")


def spool_failure(err: SpoolError, relieve_disk: Callable[[], None]) -> RpcFailure:
    """The status of a request whose spool write failed with `err`. A full disk is relieved
    first (`relieve_disk`: spools are rolled and persisted, which removes them) and the
    client told to retry."""
    log.error("spool write failed: %s", err)
    if isinstance(err, SpoolDiskFull):
        relieve_disk()
        return RpcFailure(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{err}: the broker is persisting its spools to free the disk; retry",
        )
    return RpcFailure(grpc.StatusCode.INTERNAL, str(err))
