"""Which gRPC failures of an etcd call send it to the next member, and which are etcd's
answer. A member dying under a watch or keep-alive stream sometimes surfaces as gRPC core's
own INTERNAL error rather than UNAVAILABLE (a full-suite run saw a keyspace mirror reload for
it); tests/keyspace/test_etcd_failover.py kills real members."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest

from gazette.keyspace.etcd import is_transport_failure


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize(
    ("code", "details", "transport"),
    [
        (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses", True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", True),
        (grpc.StatusCode.INTERNAL, "Internal error from Core", True),
        # etcd's own answers: the request is refused, not undelivered.
        (grpc.StatusCode.INTERNAL, "etcdserver: corrupt cluster", False),
        (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided", False),
        (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: requested lease not found", False),
    ],
)
def test_which_failures_go_to_the_next_member(
    code: grpc.StatusCode, details: str, transport: bool
) -> None:
    assert is_transport_failure(rpc_error(code, details)) is transport
