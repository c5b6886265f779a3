"""The broker's direct-append listener: the Append RPC over a plain TCP stream.

Each append read from a connection is handed to the same `JournalService.Append` as gRPC's
(validation, routing and proxying, registers, replication, rollback): only the transport
differs. `broker.protocol.direct` describes the framing; docs/direct-appends.md says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc

from broker.protocol import protocol_pb2 as pb
from broker.protocol.direct import (
    END,
    ERROR,
    HEADER,
    MAGIC,
    MAX_FRAME,
    REQUEST,
    RESPONSE,
    SERVICE_METHOD,
    DirectProtocolError,
    encode_error,
    frame,
)
from broker.service import JournalService

log = logging.getLogger(__name__)

__all__ = ["DirectAppendServer", "port_handler"]

STREAM_LIMIT = 1 << 20
"""Bytes a connection buffers before it stops reading (twice this): above the client's
256 KiB content messages, so that a message is read without pausing the socket."""


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class _Context:
    """What the Append handler uses of a gRPC servicer context."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Aborted(code, details)


async def _read_frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    kind, n = HEADER.unpack(await reader.readexactly(HEADER.size))
    if n > MAX_FRAME:
        raise DirectProtocolError(f"a frame of {n} bytes (at most {MAX_FRAME})")
    return kind, await reader.readexactly(n) if n else b""


class _Requests:
    """The AppendRequest messages of one append, as the handler iterates a gRPC stream:
    StopAsyncIteration at the client's `END`."""

    def __init__(self, reader: asyncio.StreamReader, first: tuple[bytes, bytes]) -> None:
        self.reader = reader
        self.first: tuple[bytes, bytes] | None = first
        self.ended = False

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> pb.AppendRequest:
        if self.ended:
            raise StopAsyncIteration
        if self.first is not None:
            (kind, payload), self.first = self.first, None
        else:
            kind, payload = await _read_frame(self.reader)
        if kind == END:
            self.ended = True
            raise StopAsyncIteration
        if kind != REQUEST:
            raise DirectProtocolError(f"unexpected frame kind {kind!r} in an append")
        try:
            return pb.AppendRequest.FromString(payload)
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError varies by backend
            raise DirectProtocolError(f"a malformed AppendRequest: {err}") from None

    async def skip_rest(self, timeout: float) -> bool:
        """Read and drop what the client still sends of an append already answered, up to
        its `END`. False if the connection ended, broke the framing or stalled instead."""
        try:
            async with asyncio.timeout(timeout):
                while not self.ended:
                    kind, _ = await _read_frame(self.reader)
                    if kind == END:
                        self.ended = True
                    elif kind != REQUEST:
                        return False
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, DirectProtocolError):
            return False
        return True


class DirectAppendServer:
    """Serves direct appends on `host`:`port` (0: a free port; see `port` once started)."""

    def __init__(self, service: JournalService, host: str, port: int = 0) -> None:
        self.service = service
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen. Raises OSError if the port cannot be bound."""
        self._server = await asyncio.start_server(
            self._connection, self.host, self.port, limit=STREAM_LIMIT
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and end every connection; an append in progress is rolled back
        (as a cancelled gRPC Append), and its client sees the connection fail."""
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        for task in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        peer = writer.get_extra_info("peername")
        try:
            await self._serve(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError) as err:
            log.debug("direct append connection from %s ended: %r", peer, err)
        except DirectProtocolError as err:
            log.warning("direct append connection from %s: %s", peer, err)
            with contextlib.suppress(ConnectionError):
                writer.write(frame(ERROR, encode_error(grpc.StatusCode.INVALID_ARGUMENT, str(err))))
        except Exception:
            log.exception("direct append connection from %s failed", peer)
            with contextlib.suppress(ConnectionError):
                writer.write(frame(ERROR, encode_error(grpc.StatusCode.UNKNOWN, "broker error")))
        finally:
            self._conns.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        timeout = self.service.b.cfg.chunk_timeout
        async with asyncio.timeout(timeout):
            magic = await reader.readexactly(len(MAGIC))
        if magic != MAGIC:
            raise DirectProtocolError(f"not a direct-append client (it began with {magic!r})")
        context = _Context()
        while True:
            try:
                first = await _read_frame(reader)  # An idle connection waits here.
            except asyncio.IncompleteReadError as err:
                if not err.partial:
                    return  # Closed between appends.
                raise
            requests = _Requests(reader, first)
            try:
                resp: pb.AppendResponse = await self.service.Append(requests, context)
            except _Aborted as err:
                out = frame(ERROR, encode_error(err.code, err.details))
            else:
                out = frame(RESPONSE, resp.SerializeToString())
            writer.write(out)
            await writer.drain()
            if not await requests.skip_rest(timeout):
                return


def port_handler(port: int) -> grpc.GenericRpcHandler:  # type: ignore[type-arg]
    """The gRPC handler of `SERVICE_METHOD`, answering `port`."""
    answer = str(port).encode()

    async def port_of(_request: bytes, _context: Any) -> bytes:
        return answer

    service, method = SERVICE_METHOD.lstrip("/").split("/")
    return grpc.method_handlers_generic_handler(
        service, {method: grpc.unary_unary_rpc_method_handler(port_of)}
    )
