"""Read calls that fail the ways a dying broker makes them fail.

gRPC core may fail a call's operations raw (``ExecuteBatchError``, a `grpc.aio.InternalError`)
instead of ending the call with a status; a socket may raise ``ConnectionError``. A tailing
`RetryReader` retries both at the offset it reached, as it retries UNAVAILABLE: a reader that
stopped there would stall its consumer. The first calls here are scripted fakes shaped as the
grpc.aio `UnaryStreamCall` the Reader drives (the race is rare against a real broker); the
retry reaches a scripted in-process broker.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc._cython import cygrpc

from gazette.broker.client import JournalClient, RetryReader
from gazette.broker.protocol import protocol_pb2 as pb

from .fake_broker import FakeBroker


class FailingCall:
    """A Read call whose first `read` raises `error`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def read(self) -> Any:
        raise self.error

    def cancel(self) -> bool:
        return True


class FailingStub:
    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.requests: list[pb.ReadRequest] = []

    def Read(self, request: pb.ReadRequest) -> FailingCall:
        self.requests.append(request)
        return FailingCall(self.error)


class FirstCallsFail(JournalClient):
    """A JournalClient whose first Read calls fail with `errors`, one each; then real ones."""

    def __init__(self, endpoint: str, *errors: BaseException) -> None:
        super().__init__(endpoint, direct_appends=False)
        self.failing = [FailingStub(e) for e in errors]
        self.invalidated = 0

    def stub_for(self, journal: str, *, primary: bool = True) -> Any:
        if self.failing:
            return self.failing.pop(0)
        return super().stub_for(journal, primary=primary)

    def invalidate_route(self, journal: str) -> None:
        self.invalidated += 1
        super().invalidate_route(journal)


@pytest.mark.parametrize(
    "error",
    [
        cygrpc.ExecuteBatchError('Failed "execute_batch": (<ReceiveMessageOperation>,)'),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
    ids=["core-internal-error", "connection-error"],
)
async def test_a_raw_transport_error_is_retried_at_the_same_offset(error: Exception) -> None:
    frag = pb.Fragment(journal="fake/journal", begin=0, end=8)
    async with FakeBroker() as fb:
        fb.journal.script(
            "Read",
            [pb.ReadResponse(offset=5, fragment=frag), pb.ReadResponse(offset=5, content=b"xyz")],
        )
        async with FirstCallsFail(fb.endpoint, error, error) as client:
            rr = RetryReader(
                client,
                pb.ReadRequest(journal="fake/journal", offset=5, block=True),
                backoff_fn=lambda _: 0.01,
            )
            assert await rr.read() == b"xyz"
            assert [r.offset for r in fb.journal.calls["Read"]] == [5]
            assert rr.jump_count == 0 and rr.restarts == 2
            assert isinstance(error, ConnectionError) or client.invalidated == 2
            rr.close()


async def test_a_usage_error_is_not_retried() -> None:
    """A misuse of the gRPC API is a bug, not a broker's failure: it surfaces."""
    async with FakeBroker() as fb:
        async with FirstCallsFail(fb.endpoint, cygrpc.UsageError("misused")) as client:
            rr = RetryReader(client, pb.ReadRequest(journal="fake/journal"))
            with pytest.raises(grpc.aio.UsageError):
                await rr.read()
