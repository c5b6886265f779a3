"""Append calls that fail the ways a dying broker makes them fail.

Every such failure is settled by the call's outcome (the broker's answer, or the gRPC status
the call ended with) and retried by `AppendService` and `append()`: it never ends a batch.
Statuses that say the append itself is wrong still fail it.

The calls here are scripted fakes shaped as the grpc.aio `StreamUnaryCall` the Appender
drives, because these failures are races that killing a real broker hits rarely
(tests/broker/test_cluster.py kills real ones); a direct call gets a real socket.
"""

from __future__ import annotations

import asyncio
import errno
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc._cython import cygrpc

from gazette.broker.client import (
    Appender,
    AppendService,
    JournalClient,
    JournalNotFound,
    RegisterMismatch,
    append,
)
from gazette.broker.client import appender as appender_module
from gazette.broker.client.direct_calls import (
    DirectAppendCall,
    DirectAppends,
    _Connection,
    rpc_error,
)
from gazette.broker.protocol import protocol_pb2 as pb

OK = pb.AppendResponse(status=pb.OK, commit=pb.Fragment(journal="fake/j", begin=0, end=2))
HANG = object()
"""An outcome: the call never ends on its own (until cancelled)."""


def _batch_error() -> cygrpc.ExecuteBatchError:
    """What grpc.aio's done_writing() raised in the failed cluster run."""
    return cygrpc.ExecuteBatchError('Failed "execute_batch": (<SendCloseFromClientOperation>,)')


@dataclass
class Script:
    """One Append call: which operation fails (`fail_write`: the index of the write that
    raises; `fail_done_writing`) with `error`, and the call's `outcome` (a response, an
    exception its await raises, or HANG)."""

    error: BaseException | None = None
    fail_write: int | None = None
    fail_done_writing: bool = False
    outcome: Any = field(default_factory=lambda: OK)


class FakeCall:
    """The parts of a grpc.aio StreamUnaryCall that the Appender uses, following `script`."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.written: list[pb.AppendRequest] = []
        self.cancelled = asyncio.Event()

    async def write(self, msg: pb.AppendRequest) -> None:
        if self.script.fail_write == len(self.written):
            assert self.script.error is not None
            raise self.script.error
        self.written.append(msg)

    async def done_writing(self) -> None:
        if self.script.fail_done_writing:
            assert self.script.error is not None
            raise self.script.error

    def __await__(self) -> Generator[Any, None, pb.AppendResponse]:
        return self._outcome().__await__()

    async def _outcome(self) -> pb.AppendResponse:
        outcome = self.script.outcome
        if outcome is HANG:
            await self.cancelled.wait()
            raise asyncio.CancelledError()  # As a cancelled gRPC call.
        if isinstance(outcome, BaseException):
            raise outcome
        assert isinstance(outcome, pb.AppendResponse)
        return outcome

    def cancel(self) -> bool:
        self.cancelled.set()
        return True


class ScriptedClient(JournalClient):
    """A JournalClient whose Append calls follow `scripts`, then succeed."""

    def __init__(self, *scripts: Script) -> None:
        super().__init__("127.0.0.1:1", direct_appends=False)
        self.scripts = deque(scripts)
        self.calls: list[FakeCall] = []
        self.invalidated = 0

    async def append_call(self, journal: str) -> Any:
        call = FakeCall(self.scripts.popleft() if self.scripts else Script())
        self.calls.append(call)
        return call

    def invalidate_route(self, journal: str) -> None:
        self.invalidated += 1
        super().invalidate_route(journal)


def _rpc(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return rpc_error(code, f"scripted {code.name}")


@pytest.fixture(autouse=True)
def quick_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that does not end after a failed operation is given up on quickly."""
    monkeypatch.setattr(appender_module, "OUTCOME_TIMEOUT", 0.2)


async def _append_via_service(client: ScriptedClient) -> tuple[AppendService, Any]:
    async with AppendService(client, backoff_fn=lambda _: 0.01) as svc:
        a = svc.start_append(pb.AppendRequest(journal="fake/j"))
        a.write(b"hi")
        a.release()
        try:
            return svc, await a.done()
        except Exception as err:  # noqa: BLE001 - returned for the test to check
            return svc, err


# Each makes the first attempt of an append (fresh errors for each test); the next succeeds.
TRANSIENT: dict[str, Callable[[], Script]] = {
    "done_writing fails in gRPC core, call ends UNAVAILABLE": lambda: Script(
        error=_batch_error(),
        fail_done_writing=True,
        outcome=_rpc(grpc.StatusCode.UNAVAILABLE),
    ),
    "done_writing fails in gRPC core, call never ends": lambda: Script(
        error=_batch_error(), fail_done_writing=True, outcome=HANG
    ),
    "done_writing's socket is reset, call ends UNAVAILABLE": lambda: Script(
        error=ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        fail_done_writing=True,
        outcome=_rpc(grpc.StatusCode.UNAVAILABLE),
    ),
    "a write fails in gRPC core, call never ends": lambda: Script(
        error=cygrpc.InternalError("write failed"), fail_write=1, outcome=HANG
    ),
    "awaiting the call fails in gRPC core": lambda: Script(outcome=_batch_error()),
    "awaiting the call finds the socket reset": lambda: Script(
        outcome=ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    ),
}


@pytest.mark.parametrize("first", TRANSIENT.values(), ids=TRANSIENT.keys())
async def test_append_service_retries_what_a_dying_broker_raises(
    first: Callable[[], Script],
) -> None:
    client = ScriptedClient(first())
    svc, result = await _append_via_service(client)
    assert result == OK
    assert svc.rpc_count == 2 and svc.appends_committed == 1
    assert [m.content for m in client.calls[1].written] == [b"", b"hi", b""]
    assert client.calls[0].cancelled.is_set()  # The failed call is not left running.
    assert client.invalidated >= 1  # The retry asks the next broker.


@pytest.mark.parametrize("first", TRANSIENT.values(), ids=TRANSIENT.keys())
async def test_append_retries_what_a_dying_broker_raises(first: Callable[[], Script]) -> None:
    client = ScriptedClient(first())
    resp = await append(
        client, pb.AppendRequest(journal="fake/j"), b"hi", backoff_fn=lambda _: 0.01
    )
    assert resp == OK
    assert len(client.calls) == 2


# The broker answered before the stream broke: its answer decides.
TERMINAL: dict[str, tuple[Callable[[], Script], type[Exception]]] = {
    "RegisterMismatch": (
        lambda: Script(
            error=_batch_error(),
            fail_done_writing=True,
            outcome=pb.AppendResponse(status=pb.REGISTER_MISMATCH),
        ),
        RegisterMismatch,
    ),
    "JournalNotFound": (
        lambda: Script(
            error=_batch_error(),
            fail_write=1,
            outcome=pb.AppendResponse(status=pb.JOURNAL_NOT_FOUND),
        ),
        JournalNotFound,
    ),
    "INVALID_ARGUMENT": (
        lambda: Script(
            error=_batch_error(),
            fail_done_writing=True,
            outcome=_rpc(grpc.StatusCode.INVALID_ARGUMENT),
        ),
        grpc.aio.AioRpcError,
    ),
}


@pytest.mark.parametrize(("first", "error"), TERMINAL.values(), ids=TERMINAL.keys())
async def test_the_brokers_refusal_still_fails_the_append(
    first: Callable[[], Script], error: type[Exception]
) -> None:
    client = ScriptedClient(first())
    svc, result = await _append_via_service(client)
    assert type(result) is error, result
    assert svc.rpc_count == 1 and svc.appends_committed == 0


async def test_a_commit_answered_ok_after_done_writing_failed_is_committed() -> None:
    """The broker got the commit and answered OK, though gRPC failed the half-close: the
    append committed, and is not sent again (no duplicate)."""
    client = ScriptedClient(Script(error=_batch_error(), fail_done_writing=True, outcome=OK))
    a = Appender(client, pb.AppendRequest(journal="fake/j"))
    await a.write(b"hi")
    assert await a.close() == OK
    svc, result = await _append_via_service(
        ScriptedClient(Script(error=_batch_error(), fail_done_writing=True, outcome=OK))
    )
    assert result == OK and svc.rpc_count == 1


async def test_abort_of_a_broken_call_does_not_raise() -> None:
    client = ScriptedClient(
        Script(
            error=_batch_error(), fail_done_writing=True, outcome=_rpc(grpc.StatusCode.CANCELLED)
        )
    )
    a = Appender(client, pb.AppendRequest(journal="fake/j"))
    await a.write(b"hi")
    await a.abort()  # Rolls back; the broken stream is no error of the abort's.
    assert client.calls[0].cancelled.is_set()


@pytest.mark.parametrize(
    "error",
    [
        TimeoutError(errno.ETIMEDOUT, "Connection timed out"),
        OSError(errno.EHOSTUNREACH, "No route to host"),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
    ],
    ids=["ETIMEDOUT", "EHOSTUNREACH", "ECONNRESET"],
)
async def test_a_direct_calls_socket_errors_are_unavailable(error: OSError) -> None:
    """Whatever error the socket of a direct append ends with, its operations and its
    outcome fail as a gRPC call that lost its connection: UNAVAILABLE."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # Until the client goes.
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        call = DirectAppendCall(
            DirectAppends(lambda _t: None),  # type: ignore[arg-type,return-value]
            f"127.0.0.1:{port}",
            _Connection(reader, writer),
        )
        await call.write(pb.AppendRequest(journal="fake/j"))
        # How a socket's error reaches the stream (asyncio's connection_lost(exc)).
        reader.set_exception(error)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call.done_writing()
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as outcome:
            await call
        assert outcome.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error.strerror in (outcome.value.details() or "")
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
