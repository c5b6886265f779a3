"""Status -> error mapping, and classification of transport errors."""

from __future__ import annotations

import errno

import grpc
import grpc.aio
import pytest
from grpc._cython import cygrpc

from gazette.broker.client import errors
from gazette.broker.client.errors import (
    BrokerError,
    OffsetJump,
    error_for_status,
    is_transient_rpc_error,
    status_name,
)
from gazette.broker.protocol import protocol_pb2 as pb

CASES = [
    (pb.JOURNAL_NOT_FOUND, errors.JournalNotFound),
    (pb.NO_JOURNAL_PRIMARY_BROKER, errors.NoJournalPrimaryBroker),
    (pb.NOT_JOURNAL_PRIMARY_BROKER, errors.NotJournalPrimaryBroker),
    (pb.INSUFFICIENT_JOURNAL_BROKERS, errors.InsufficientJournalBrokers),
    (pb.NOT_JOURNAL_BROKER, errors.NotJournalBroker),
    (pb.OFFSET_NOT_YET_AVAILABLE, errors.OffsetNotYetAvailable),
    (pb.WRONG_ROUTE, errors.WrongRoute),
    (pb.PROPOSAL_MISMATCH, errors.ProposalMismatch),
    (pb.ETCD_TRANSACTION_FAILED, errors.EtcdTransactionFailed),
    (pb.NOT_ALLOWED, errors.NotAllowed),
    (pb.WRONG_APPEND_OFFSET, errors.WrongAppendOffset),
    (pb.INDEX_HAS_GREATER_OFFSET, errors.IndexHasGreaterOffset),
    (pb.REGISTER_MISMATCH, errors.RegisterMismatch),
    (pb.SUSPENDED, errors.Suspended),
    (pb.FRAGMENT_STORE_UNHEALTHY, errors.FragmentStoreUnhealthy),
]


@pytest.mark.parametrize(("status", "cls"), CASES)
def test_every_status_maps_to_its_class(status: int, cls: type[BrokerError]) -> None:
    err = error_for_status(status, journal="a/journal", offset=42)
    assert type(err) is cls
    assert err.status == status == cls.STATUS
    assert (err.journal, err.offset) == ("a/journal", 42)
    assert str(err) == f"{status_name(status)} journal=a/journal offset=42"
    # Constructing the class directly gives it its own status.
    assert cls(journal="j").status == status


def test_all_non_ok_statuses_are_covered() -> None:
    covered = {s for s, _ in CASES}
    assert covered == {v for v in pb.Status.values() if v != pb.OK}
    assert len({cls for _, cls in CASES}) == len(CASES)


def test_ok_is_not_an_error_and_unknown_status_is_generic() -> None:
    with pytest.raises(ValueError):
        error_for_status(pb.OK)
    err = error_for_status(99, detail="huh")
    assert type(err) is BrokerError and str(err) == "Status(99): huh"


def _rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="x")


@pytest.mark.parametrize(
    ("code", "transient"),
    [
        (grpc.StatusCode.UNAVAILABLE, True),
        (grpc.StatusCode.CANCELLED, True),
        (grpc.StatusCode.INTERNAL, True),
        (grpc.StatusCode.INVALID_ARGUMENT, False),
        (grpc.StatusCode.UNIMPLEMENTED, False),
        (grpc.StatusCode.DATA_LOSS, False),
    ],
)
def test_transient_rpc_errors(code: grpc.StatusCode, transient: bool) -> None:
    assert is_transient_rpc_error(_rpc_error(code)) is transient
    assert not is_transient_rpc_error(ValueError())


@pytest.mark.parametrize(
    ("err", "transient"),
    [
        # Raised raw by grpc.aio call operations on a stream a dying broker broke.
        (cygrpc.ExecuteBatchError('Failed "execute_batch": (<SendClose...>,)'), True),
        (grpc.aio.InternalError("core"), True),
        # A socket's, on a direct append.
        (ConnectionResetError(errno.ECONNRESET, "reset"), True),
        (BrokenPipeError(errno.EPIPE, "broken pipe"), True),
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), True),
        # Misuse and local failures are not the transport's.
        (grpc.aio.UsageError("wrong API style"), False),
        (OSError(errno.ENOSPC, "No space left on device"), False),
        (RuntimeError("JournalClient is closed"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None,
)
def test_raw_transport_errors(err: BaseException, transient: bool) -> None:
    assert is_transient_rpc_error(err) is transient


def test_offset_jump_skipped() -> None:
    assert OffsetJump("j", 10, 25).skipped == 15
    assert OffsetJump("j", -1, 25).skipped == 0
