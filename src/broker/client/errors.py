"""Named errors of the broker client.

Every non-OK `pb.Status` a broker can answer with maps to one `BrokerError` subclass, so callers
match on types (``except WrongAppendOffset``) rather than comparing enum values. Each error carries
the journal and offset that explain it where they are known.

Transport failures (the gRPC call itself failed: connection refused, broker killed, stream reset)
are *not* wrapped: they surface as `grpc.aio.AioRpcError`, or, where grpc.aio or a socket raises
them raw (a gRPC core `InternalError` such as ``ExecuteBatchError``, a ``ConnectionError``), as
those. `is_transient_rpc_error` tells which of them a retrying caller should retry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, cast

import grpc

from gazette.broker.protocol import protocol_pb2 as pb

__all__ = [
    "BrokerError",
    "JournalNotFound",
    "NoJournalPrimaryBroker",
    "NotJournalPrimaryBroker",
    "InsufficientJournalBrokers",
    "NotJournalBroker",
    "OffsetNotYetAvailable",
    "WrongRoute",
    "ProposalMismatch",
    "EtcdTransactionFailed",
    "NotAllowed",
    "WrongAppendOffset",
    "IndexHasGreaterOffset",
    "RegisterMismatch",
    "Suspended",
    "FragmentStoreUnhealthy",
    "OffsetJump",
    "describe_error",
    "error_for_status",
    "status_name",
    "is_transient_rpc_error",
    "ROUTING_STATUSES",
]


def status_name(status: int) -> str:
    """The enum name of a `pb.Status` value (``Status(<n>)`` when unknown)."""
    try:
        return pb.Status.Name(status)  # type: ignore[arg-type]
    except ValueError:
        return f"Status({status})"


class BrokerError(Exception):
    """A broker answered with a non-OK `pb.Status`.

    `status` is the wire status; `journal` and `offset` locate the failure when known
    (`offset` is None when it does not apply); `detail` adds free-form context such as the
    registers that failed a check.
    """

    STATUS: ClassVar[int] = -1

    def __init__(
        self,
        status: int | None = None,
        *,
        journal: str = "",
        offset: int | None = None,
        detail: str = "",
    ) -> None:
        self.status = cast(pb.Status.ValueType, self.STATUS if status is None else status)
        self.journal = journal
        self.offset = offset
        self.detail = detail
        super().__init__(self._message())

    def _message(self) -> str:
        parts = [status_name(self.status)]
        if self.journal:
            parts.append(f"journal={self.journal}")
        if self.offset is not None:
            parts.append(f"offset={self.offset}")
        msg = " ".join(parts)
        if self.detail:
            msg += f": {self.detail}"
        return msg


class JournalNotFound(BrokerError):
    """The journal does not exist (or is not yet visible at the broker's etcd revision)."""

    STATUS = pb.JOURNAL_NOT_FOUND


class NoJournalPrimaryBroker(BrokerError):
    """The journal currently has no primary broker assigned."""

    STATUS = pb.NO_JOURNAL_PRIMARY_BROKER


class NotJournalPrimaryBroker(BrokerError):
    """The broker is not the journal's primary and was asked not to proxy."""

    STATUS = pb.NOT_JOURNAL_PRIMARY_BROKER


class InsufficientJournalBrokers(BrokerError):
    """Fewer brokers are assigned to the journal than its replication requires."""

    STATUS = pb.INSUFFICIENT_JOURNAL_BROKERS


class NotJournalBroker(BrokerError):
    """The broker is not assigned to the journal and was asked not to proxy."""

    STATUS = pb.NOT_JOURNAL_BROKER


class OffsetNotYetAvailable(BrokerError):
    """A non-blocking read reached the journal's write head."""

    STATUS = pb.OFFSET_NOT_YET_AVAILABLE


class WrongRoute(BrokerError):
    """The request's route did not match the broker's view of the journal's route."""

    STATUS = pb.WRONG_ROUTE


class ProposalMismatch(BrokerError):
    """A replication proposal did not match the peer's fragment."""

    STATUS = pb.PROPOSAL_MISMATCH


class EtcdTransactionFailed(BrokerError):
    """An Apply was rejected: a change's expected mod revision did not match etcd."""

    STATUS = pb.ETCD_TRANSACTION_FAILED


class NotAllowed(BrokerError):
    """The journal's flags forbid the operation (e.g. append to an O_RDONLY journal)."""

    STATUS = pb.NOT_ALLOWED


class WrongAppendOffset(BrokerError):
    """An append with an explicit offset did not match the journal's write head."""

    STATUS = pb.WRONG_APPEND_OFFSET


class IndexHasGreaterOffset(BrokerError):
    """The fragment index already extends beyond the requested append offset."""

    STATUS = pb.INDEX_HAS_GREATER_OFFSET


class RegisterMismatch(BrokerError):
    """An append's check_registers selector did not match the journal's registers."""

    STATUS = pb.REGISTER_MISMATCH


class Suspended(BrokerError):
    """The journal is suspended and the request could not resume it."""

    STATUS = pb.SUSPENDED


class FragmentStoreUnhealthy(BrokerError):
    """A fragment store of the journal failed its health check."""

    STATUS = pb.FRAGMENT_STORE_UNHEALTHY


_BY_STATUS: dict[int, type[BrokerError]] = {
    cls.STATUS: cls
    for cls in (
        JournalNotFound,
        NoJournalPrimaryBroker,
        NotJournalPrimaryBroker,
        InsufficientJournalBrokers,
        NotJournalBroker,
        OffsetNotYetAvailable,
        WrongRoute,
        ProposalMismatch,
        EtcdTransactionFailed,
        NotAllowed,
        WrongAppendOffset,
        IndexHasGreaterOffset,
        RegisterMismatch,
        Suspended,
        FragmentStoreUnhealthy,
    )
}

ROUTING_STATUSES: frozenset[int] = frozenset(
    {
        pb.NO_JOURNAL_PRIMARY_BROKER,
        pb.NOT_JOURNAL_PRIMARY_BROKER,
        pb.INSUFFICIENT_JOURNAL_BROKERS,
        pb.NOT_JOURNAL_BROKER,
        pb.WRONG_ROUTE,
    }
)
"""Statuses that say "this broker, right now, cannot serve you": a retry after the cluster
converges (or against another broker) is expected to succeed."""


def error_for_status(
    status: int, *, journal: str = "", offset: int | None = None, detail: str = ""
) -> BrokerError:
    """The `BrokerError` subclass instance for a non-OK `status`.

    Raises ValueError for `pb.OK`, which is not an error. Unknown status values map to a plain
    `BrokerError`.
    """
    if status == pb.OK:
        raise ValueError("Status OK is not an error")
    cls = _BY_STATUS.get(status, BrokerError)
    return cls(status, journal=journal, offset=offset, detail=detail)


_TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)


def describe_error(err: BaseException) -> str:
    """`err` in one line: a gRPC error as its status code and details (not its multi-line
    repr), anything else as its message (or its type's name)."""
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {err.details()}"
    return str(err) or type(err).__name__


def is_transient_rpc_error(err: BaseException) -> bool:
    """Whether `err` is a gRPC transport failure that a retry may overcome.

    Connection loss, a broker restarting (UNAVAILABLE), a stream cancelled or reset by the
    peer (CANCELLED: a cancellation of our own surfaces as `asyncio.CancelledError` instead)
    and broker-side internal errors are transient; INVALID_ARGUMENT, UNIMPLEMENTED,
    PERMISSION_DENIED and the like are not. So are the raw errors a dying peer makes a call
    operation raise: a gRPC core `grpc.aio.InternalError` (``ExecuteBatchError``: e.g.
    ``done_writing()`` on a stream that broke) and a socket's ``ConnectionError``; not
    ``grpc.aio.UsageError``, which is a misuse of the API.
    """
    if isinstance(err, grpc.aio.AioRpcError):
        return err.code() in _TRANSIENT_CODES
    return isinstance(err, grpc.aio.InternalError | ConnectionError)


@dataclass(frozen=True, slots=True)
class OffsetJump:
    """A read resumed at a larger offset than requested.

    This happens when the requested offset is -1 (read from the write head), or when a range
    of the journal no longer exists (fragments were pruned, or were never persisted before a
    broker failure). `from_offset` is what was requested, `to_offset` where content resumes.
    """

    journal: str
    from_offset: int
    to_offset: int

    @property
    def skipped(self) -> int:
        """Bytes skipped over (0 when `from_offset` was -1, the write head)."""
        return 0 if self.from_offset < 0 else self.to_offset - self.from_offset
