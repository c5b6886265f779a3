"""RetryReader: a journal byte stream that survives broker restarts and reassignment.

A `RetryReader` wraps successive `Reader`s. When a Read RPC ends (the broker closed it, a
directly read fragment is exhausted) or fails in a way that a retry can fix (transport errors
such as a broker being killed, whether gRPC ends the call with a status or fails its
operations raw with a core `InternalError`; NOT_JOURNAL_BROKER, NO_JOURNAL_PRIMARY_BROKER and
other routing statuses while the cluster converges), it starts a new RPC at the current
offset, backing off between failed attempts. Errors a retry cannot fix surface to the caller:
OffsetNotYetAvailable for non-blocking reads at the write head, JournalNotFound (after a few
attempts, to ride out a just-created journal), Suspended, FragmentCorrupted, and non-transient
gRPC errors.

Offset jumps are surfaced, not hidden: each one (other than the initial jump of a read from
the write head, offset -1) increments `jump_count` and is passed to the `on_jump` callback.

`readline` and `read` share one internal buffer; `offset` is always the journal offset of the
next byte the caller will receive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc.aio

from gazette.broker.client.errors import (
    ROUTING_STATUSES,
    BrokerError,
    JournalNotFound,
    OffsetJump,
    OffsetNotYetAvailable,
    describe_error,
    is_transient_rpc_error,
)
from gazette.broker.client.journal_client import JournalClient
from gazette.broker.client.reader import Reader
from gazette.broker.fragment.store import FragmentCorrupted
from gazette.broker.protocol import protocol_pb2 as pb

__all__ = ["RetryReader", "backoff"]

log = logging.getLogger(__name__)


def backoff(attempt: int) -> float:
    """Seconds to wait before retry `attempt` (0-based).

    Short at first (the cluster typically converges on new assignments within tens of
    milliseconds of an etcd update), then up to 5 s for outages such as a broker restart.
    """
    if attempt <= 1:
        return 0.05
    if attempt <= 3:
        return 0.1
    if attempt <= 5:
        return 1.0
    return 5.0


class RetryReader:
    """Reads `request.journal` from `request.offset` onwards, restarting RPCs as needed.

    `on_jump` is called with each `OffsetJump` over missing content. `backoff_fn` maps a retry
    attempt to seconds of delay (tests shorten it). A RetryReader is used by one task at a time.
    """

    def __init__(
        self,
        client: JournalClient,
        request: pb.ReadRequest,
        *,
        on_jump: Callable[[OffsetJump], None] | None = None,
        backoff_fn: Callable[[int], float] = backoff,
    ) -> None:
        self.client = client
        self.on_jump = on_jump
        self.jump_count = 0
        self.restarts = 0
        self._backoff = backoff_fn
        self._buf = bytearray()
        self.reader = self._new_reader(request)

    def _new_reader(self, request: pb.ReadRequest) -> Reader:
        return Reader(self.client, request, on_jump=self._jumped)

    def _jumped(self, jump: OffsetJump) -> None:
        if jump.from_offset < 0:
            return  # Reading from the write head: nothing was skipped.
        self.jump_count += 1
        if self.on_jump is not None:
            self.on_jump(jump)

    @property
    def journal(self) -> str:
        return self.reader.request.journal

    @property
    def offset(self) -> int:
        """Journal offset of the next byte returned to the caller."""
        if self.reader.offset < 0:
            return self.reader.offset
        return self.reader.offset - len(self._buf)

    @property
    def request(self) -> pb.ReadRequest:
        """The ReadRequest the next RPC would be started with (offset kept current)."""
        return self.reader.request

    def seek(self, offset: int) -> int:
        """Continue reading at `offset` (-1: the write head) with a new RPC; returns it.

        Buffered content is discarded and the current RPC cancelled.
        """
        req = pb.ReadRequest()
        req.CopyFrom(self.reader.request)
        req.offset = offset
        self._buf.clear()
        self.reader.close()
        self.reader = self._new_reader(req)
        return offset

    def _restart(self) -> None:
        req = pb.ReadRequest()
        req.CopyFrom(self.reader.request)
        self.reader.close()
        self.reader = self._new_reader(req)
        self.restarts += 1

    async def read(self, n: int = -1) -> bytes:
        """The next content: at most `n` bytes if `n` > 0, else whatever is available.

        Returns b"" only once `request.end_offset` has been read through. Raises
        `OffsetNotYetAvailable` at the write head of a non-blocking read (call again later to
        continue), and the non-retryable errors listed in the module docstring; transient
        failures are retried indefinitely with backoff. Cancelling `read` cancels the current
        RPC; a later `read` restarts at `offset` with nothing lost.
        """
        if n == 0:
            return b""
        if self._buf:
            take = len(self._buf) if n < 0 else min(n, len(self._buf))
            data = bytes(self._buf[:take])
            del self._buf[:take]
            return data
        return await self._read_reader(n)

    async def _read_reader(self, n: int) -> bytes:
        attempt = 0
        while True:
            begin = self.reader.offset
            err: BaseException
            try:
                data = await self.reader.read(n)
            except OffsetNotYetAvailable as e:
                if not self.reader.request.block:
                    self._restart()  # The next read asks the broker again.
                    raise
                err, attempt = e, 0
            except JournalNotFound as e:
                if self.reader.request.HasField("header") or attempt >= 3:
                    self._restart()
                    raise
                err = e
            except BrokerError as e:
                if e.status not in ROUTING_STATUSES:
                    self._restart()
                    raise
                err = e
            except (grpc.aio.AioRpcError, grpc.aio.InternalError) as e:
                # A dying broker can make gRPC core fail the call's operations raw
                # (``ExecuteBatchError``) rather than end it with a status.
                if not is_transient_rpc_error(e):
                    self._restart()
                    raise
                err = e
            except FragmentCorrupted:
                self._restart()
                raise
            except OSError as e:  # A direct fragment fetch failed (store unreachable...).
                err = e
            else:
                if data:
                    return data
                req = self.reader.request
                if req.end_offset and req.offset >= req.end_offset:
                    return b""
                progressed = self.reader.offset != begin
                self._restart()
                if progressed:
                    attempt = 0
                    continue  # The RPC (or a direct fragment read) ended normally.
                await asyncio.sleep(self._backoff(attempt))
                attempt += 1
                continue

            squelch = attempt == 0 and (isinstance(err, BrokerError) or is_transient_rpc_error(err))
            (log.debug if squelch else log.warning)(
                "read failure (will retry) journal=%s offset=%d attempt=%d err=%s",
                self.journal,
                self.reader.offset,
                attempt,
                describe_error(err),
            )
            self._restart()
            await asyncio.sleep(self._backoff(attempt))
            attempt += 1

    async def readline(self) -> bytes:
        """The next line, including its b"\\n"; the final partial line at `end_offset`; b"" at
        the end.

        On `OffsetNotYetAvailable` (non-blocking read at the write head) a partial line stays
        buffered and the error is raised; calling again continues the line. Cancellation
        keeps buffered content.
        """
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line = bytes(self._buf[: i + 1])
                del self._buf[: i + 1]
                return line
            data = await self._read_reader(-1)
            if not data:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            self._buf += data

    def close(self) -> None:
        """Cancel the current RPC and drop buffered content."""
        self._buf.clear()
        self.reader.close()

    def __aiter__(self) -> RetryReader:
        return self

    async def __anext__(self) -> bytes:
        data = await self.read()
        if not data:
            raise StopAsyncIteration
        return data

    async def __aenter__(self) -> RetryReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
