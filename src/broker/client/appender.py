"""Appender: one Append RPC, written to like a file; and `append`, a retrying one-shot helper.

The Append RPC is client-streaming. The first message carries the request's parameters
(journal, registers, expected offset...) and no content; content follows in chunks of at most
1 MiB; an empty message then half-close commits. Closing the stream *without* the empty
message makes the broker roll the append back, so nothing is visible to readers until
`Appender.close` succeeds, and an application that dies mid-append leaves no partial content.

Brokers sequence an append into the journal as soon as it begins and expect its remaining
content promptly: use an `Appender` only when the content is at hand. For many small writes,
or writes that should be retried and batched, use `AppendService`.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import AsyncIterable, Callable, Sequence
from typing import IO, TYPE_CHECKING

import grpc
import grpc.aio

from gazette.broker.client.errors import (
    ROUTING_STATUSES,
    BrokerError,
    describe_error,
    error_for_status,
    is_transient_rpc_error,
)
from gazette.broker.client.journal_client import JournalClient
from gazette.broker.client.metrics import CLIENT
from gazette.broker.client.retry_reader import backoff
from gazette.broker.protocol import protocol_pb2 as pb

if TYPE_CHECKING:
    from gazette.broker.client.direct_calls import DirectAppendCall

    AppendCall = grpc.aio.StreamUnaryCall[pb.AppendRequest, pb.AppendResponse] | DirectAppendCall

__all__ = [
    "Appender",
    "AppendRetriesExhausted",
    "append",
    "CHUNK_SIZE",
    "is_retryable_append_error",
    "RetryWindow",
]

log = logging.getLogger(__name__)

CHUNK_SIZE = 256 << 10
"""Largest content chunk sent in one AppendRequest message: grpc.aio moves several times the
bytes/s in 256 KiB messages as in 1 MiB ones (docs/broker.md)."""


OUTCOME_TIMEOUT = 5.0
"""Seconds an `Appender` waits for the outcome of a call one of whose operations failed. Such
a call has normally ended already (its stream broke, or the broker answered early); one that
has not by then is cancelled, and the operation's error raised."""


class AppendRetriesExhausted(Exception):
    """An append kept failing with retryable errors (unreachable brokers, routing statuses)
    for longer than its ``retry_for``. `__cause__` is the last error."""


class RetryWindow:
    """How long an append may keep failing before it gives up: ``retry_for`` seconds from
    its first failure (None: never give up). The window is checked between attempts: an
    attempt itself is not cut short (a large append may stream for long)."""

    def __init__(self, journal: str, retry_for: float | None) -> None:
        self.journal = journal
        self.retry_for = self.checked(retry_for)
        self._first: float | None = None

    @staticmethod
    def checked(retry_for: float | None) -> float | None:
        """`retry_for`, or ValueError if it is not None nor a number of seconds >= 0."""
        if retry_for is not None and not retry_for >= 0:  # Also refuses NaN.
            raise ValueError(f"retry_for must be >= 0 seconds or None (got {retry_for})")
        return retry_for

    def failed(self, err: BaseException, attempt: int, backoff: float) -> float:
        """Note failed `attempt` (from 0), to be retried after `backoff` seconds: return the
        seconds to wait instead (the rest of the window, if shorter: a last attempt is made
        when it ends), or raise `AppendRetriesExhausted` if the window is over."""
        now = asyncio.get_running_loop().time()
        if self._first is None:
            self._first = now
        if self.retry_for is None:
            return backoff
        left = self._first + self.retry_for - now
        if left <= 0:
            raise AppendRetriesExhausted(
                f"append to {self.journal} kept failing for {now - self._first:.1f}s "
                f"({attempt + 1} attempt{'s' if attempt else ''}; retry_for={self.retry_for:g}s): "
                f"{describe_error(err)}"
            ) from err
        return min(backoff, left)


class Appender:
    """One Append RPC of `request` (copied; its content must be empty).

    The RPC starts at the first `write` (or at `close`, for an empty append). Use as
    ``async with Appender(...) as a``: a clean exit commits (`close`), an exception aborts.
    """

    def __init__(self, client: JournalClient, request: pb.AppendRequest) -> None:
        if not request.journal:
            raise ValueError("AppendRequest.journal is required")
        if request.content:
            raise ValueError("AppendRequest.content must be empty: write() the content")
        self.client = client
        self.request = pb.AppendRequest()
        self.request.CopyFrom(request)
        self.response: pb.AppendResponse | None = None
        self.written = 0
        self._call: AppendCall | None = None
        self._finished = False

    async def _start(self) -> AppendCall:
        if self._finished:
            raise RuntimeError("Appender is already closed or aborted")
        if self._call is None:
            self._call = await self.client.append_call(self.request.journal)
            await self._send(self.request)
        return self._call

    async def _send(self, msg: pb.AppendRequest | Sequence[bytes]) -> None:
        """Write one message: an AppendRequest, or the parts of a content message (a direct
        call frames them as they are; gRPC needs them joined)."""
        call = self._call
        assert call is not None
        if isinstance(msg, pb.AppendRequest):
            write = call.write(msg)
        elif hasattr(call, "write_content"):
            write = call.write_content(msg)
        else:
            write = call.write(pb.AppendRequest(content=b"".join(msg)))
        try:
            await write
        except Exception as err:  # noqa: BLE001 - gRPC raises several types here
            await self._outcome_after(err)
            raise RuntimeError(
                f"broker ended the append RPC of {self.request.journal} while it was being "
                f"written ({err!r}) but answered OK"
            ) from None

    async def _outcome_after(self, err: Exception) -> pb.AppendResponse:
        """The call's outcome once one of its operations failed with `err`.

        The broker may have finished the RPC already (e.g. it refused the append with
        INSUFFICIENT_JOURNAL_BROKERS while we were still writing), or died: gRPC then fails
        the operation with InvalidStateError, INTERNAL, or a raw core `InternalError`
        (``ExecuteBatchError``), a direct call with UNAVAILABLE. Whichever it was, the
        call's response or status says what happened, as for any append: returns the
        response if it is OK (the append committed), else raises as `_finish`. If the call
        does not end within `OUTCOME_TIMEOUT`, it is cancelled and `err` is raised.
        """
        timeout = asyncio.timeout(OUTCOME_TIMEOUT)
        try:
            async with timeout:
                return await self._finish()
        except TimeoutError:
            if not timeout.expired():
                raise
        self._cancel()
        self.client.invalidate_route(self.request.journal)
        raise err

    async def write(self, data: bytes) -> None:
        """Stream `data` to the broker (in chunks of at most `CHUNK_SIZE`). Not yet committed.

        Raises a `BrokerError` if the broker has already refused the append, or
        `grpc.aio.AioRpcError` on transport failure; the Appender is then finished. If `write`
        is cancelled the RPC is aborted (rolled back).
        """
        if not data:
            return  # An empty chunk would mean "commit".
        try:
            await self._start()
            if len(data) <= CHUNK_SIZE and isinstance(data, bytes):
                await self._send([data])  # one message, no copy
                self.written += len(data)
                return
            view = memoryview(data)
            for i in range(0, len(view), CHUNK_SIZE):
                chunk = bytes(view[i : i + CHUNK_SIZE])
                await self._send([chunk])
                self.written += len(chunk)
        except BaseException:
            self._cancel()
            raise

    async def write_message(self, parts: Sequence[bytes]) -> None:
        """Stream the concatenation of `parts` (at most `CHUNK_SIZE` bytes) as one content
        message, as `write` would. Over a direct append the parts are framed as they are,
        without a joined copy (`AppendService` hands over each append's buffers this way).
        """
        # As bytes: a memoryview's len() counts items, and the transport may keep a
        # reference to a buffer the caller reuses.
        parts = [p if type(p) is bytes else bytes(p) for p in parts]
        if sum(len(p) for p in parts) > CHUNK_SIZE:
            raise ValueError(f"a content message holds at most {CHUNK_SIZE} bytes")
        parts = [p for p in parts if p]
        if not parts:
            return  # An empty message would mean "commit".
        try:
            await self._start()
            await self._send(parts)
            self.written += sum(len(p) for p in parts)
        except BaseException:
            self._cancel()
            raise

    async def close(self) -> pb.AppendResponse:
        """Commit everything written, and return the broker's response.

        Raises the `BrokerError` subclass of a non-OK status (e.g. `WrongAppendOffset`,
        `RegisterMismatch`), or `grpc.aio.AioRpcError` on transport failure (rarely a raw
        transport error that `is_transient_rpc_error` knows, from a call that would not
        end). If `close` is cancelled, or the connection fails while it runs, the append
        may or may not have committed.
        """
        try:
            call = await self._start()
            await self._send(pb.AppendRequest())
            try:
                await call.done_writing()
            except Exception as err:  # noqa: BLE001 - gRPC raises several types here
                # As for a failed write, the call's outcome tells: an OK answer means the
                # broker had our commit message and the half-close, and committed.
                return await self._outcome_after(err)
            return await self._finish()
        except BaseException:
            self._cancel()
            raise

    async def _finish(self) -> pb.AppendResponse:
        assert self._call is not None
        call, self._finished = self._call, True
        try:
            resp = await call
        except Exception as err:
            if isinstance(err, grpc.aio.AioRpcError) or is_transient_rpc_error(err):
                self.client.invalidate_route(self.request.journal)
            raise
        self._call = None
        self.response = resp
        return settle_response(self.client, self.request, resp)

    @staticmethod
    async def append_once(
        client: JournalClient, request: pb.AppendRequest, content: Sequence[bytes]
    ) -> pb.AppendResponse | None:
        """Append `request` with the concatenation of `content` (bytes, at most
        `CHUNK_SIZE` of them) as its content, in one write to a direct connection of the
        journal's primary: what an `Appender` given one `write_message(content)` then
        `close` does, at a fraction of its CPU. Returns the response, or None if the
        primary's broker takes no direct appends (then use an `Appender`).

        Raises as `close` does: the `BrokerError` of a non-OK status, or
        ``grpc.aio.AioRpcError`` on transport failure (the append may or may not have
        committed). A cancelled call may also have committed. ValueError for a request
        without journal or with content, or more content than a message holds.
        """
        if not request.journal:
            raise ValueError("AppendRequest.journal is required")
        if request.content:
            raise ValueError("AppendRequest.content must be empty: pass the content")
        if sum(len(part) for part in content) > CHUNK_SIZE:
            raise ValueError(f"a content message holds at most {CHUNK_SIZE} bytes")
        direct = client.direct
        if direct is None:
            return None
        try:
            resp = await direct.append(client.endpoint_for(request.journal), request, content)
        except grpc.aio.AioRpcError:
            client.invalidate_route(request.journal)
            raise
        return None if resp is None else settle_response(client, request, resp)

    async def abort(self) -> None:
        """Roll the append back: end the stream without the commit message.

        Nothing written becomes visible. Never raises for broker or transport errors (the
        broker discards an uncommitted append whichever way the stream ends). Idempotent.
        """
        call, self._call = self._call, None
        self._finished = True
        if call is None:
            return
        try:
            await call.done_writing()
            await asyncio.wait_for(call, timeout=5.0)
        except Exception:  # noqa: BLE001
            # Whatever ended the call (the broker's answer to the half-close, a dead broker,
            # a stream gRPC already found broken: ExecuteBatchError...), nothing written is
            # visible; an abort runs on error paths, whose error this must not replace.
            pass
        finally:
            call.cancel()

    def _cancel(self) -> None:
        self._finished = True
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def __aenter__(self) -> Appender:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.abort()


def settle_response(
    client: JournalClient, request: pb.AppendRequest, resp: pb.AppendResponse
) -> pb.AppendResponse:
    """`resp` to the append of `request` once its route is noted: returned if OK, else
    raised as the `BrokerError` of its status (with what explains it)."""
    client.update_route(request.journal, resp.header)
    if resp.status != pb.OK:
        detail = ""
        if resp.status == pb.REGISTER_MISMATCH:
            detail = (
                f"check {_fmt_selector(request.check_registers)} "
                f"vs registers {_fmt_labels(resp.registers)}"
            )
        elif resp.store_health_error:
            detail = resp.store_health_error
        pid = resp.header.process_id
        if pid.zone or pid.suffix:
            answered = f"answered by broker {pid.zone}#{pid.suffix}"
            detail = f"{detail}; {answered}" if detail else answered
        offset = request.offset if request.offset else None
        raise error_for_status(resp.status, journal=request.journal, offset=offset, detail=detail)
    CLIENT.append_bytes[request.journal] += resp.commit.end - resp.commit.begin
    return resp


def _fmt_labels(labels: pb.LabelSet) -> str:
    return "{" + ", ".join(f"{lb.name}={lb.value}" for lb in labels.labels) + "}"


def _fmt_selector(sel: pb.LabelSelector) -> str:
    out = _fmt_labels(sel.include)
    if sel.exclude.labels:
        out += " exclude " + _fmt_labels(sel.exclude)
    return out


def is_retryable_append_error(err: BaseException) -> bool:
    """Whether an append that failed with `err` may be retried as a whole.

    Transport failures and routing statuses (the broker was not, or no longer, the primary;
    the cluster has too few brokers for now) are retryable. Statuses that say the append
    itself is wrong (WrongAppendOffset, RegisterMismatch, NotAllowed, JournalNotFound,
    Suspended...) are not.
    """
    if isinstance(err, BrokerError):
        return err.status in ROUTING_STATUSES
    return is_transient_rpc_error(err)


async def _spool(content: AsyncIterable[bytes]) -> IO[bytes]:
    f: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=CHUNK_SIZE)  # noqa: SIM115
    try:
        async for chunk in content:
            f.write(chunk)
    except BaseException:
        f.close()
        raise
    return f


async def append(
    client: JournalClient,
    request: pb.AppendRequest,
    content: bytes | AsyncIterable[bytes] = b"",
    *,
    backoff_fn: Callable[[int], float] = backoff,
    retry_for: float | None = None,
) -> pb.AppendResponse:
    """Append `content` to `request.journal` as one transaction; return the broker response.

    Transport errors and routing statuses are retried with backoff (an AsyncIterable is
    first consumed into a spool file so it can be replayed): for ever, or with `retry_for`
    seconds until attempts have failed for that long, then `AppendRetriesExhausted` is
    raised from the last error. Other statuses raise their `BrokerError`. A retry after a
    failure that struck while the commit was in flight may duplicate the content
    (at-least-once). If `append` is cancelled, the in-flight attempt is
    aborted and may or may not have committed if its commit message was already sent.
    """
    window = RetryWindow(request.journal, retry_for)
    spooled: IO[bytes] | None = None
    if not isinstance(content, bytes | bytearray | memoryview):
        spooled = await _spool(content)
    try:
        attempt = 0
        while True:
            appender = Appender(client, request)
            try:
                if spooled is None:
                    await appender.write(bytes(content))  # type: ignore[arg-type]
                else:
                    spooled.seek(0)
                    while chunk := spooled.read(CHUNK_SIZE):
                        await appender.write(chunk)
                return await appender.close()
            except Exception as err:
                await appender.abort()
                if not is_retryable_append_error(err):
                    raise
                delay = window.failed(err, attempt, backoff_fn(attempt))
                log.warning(
                    "append failed (will retry) journal=%s attempt=%d err=%s",
                    request.journal,
                    attempt,
                    describe_error(err),
                )
            await asyncio.sleep(delay)
            attempt += 1
    finally:
        if spooled is not None:
            spooled.close()
