"""The broker's direct-append listener: the Append RPC over a TCP stream (TLS when the
broker serves TLS).

Each append read from a connection is handed to the same `JournalService.Append` as gRPC's
(authorization, validation, routing and proxying, registers, replication, rollback): only the
transport differs. An append's `AUTHORIZATION` frame is what its handler sees as the call's
``authorization`` metadata. `broker.protocol.direct_framing` describes the framing;
docs/direct-appends.md says why.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from ssl import SSLContext
from typing import Any

import grpc

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.direct_framing import (
    AUTHORIZATION,
    END,
    ERROR,
    MAGIC,
    REQUEST,
    RESPONSE,
    SERVICE_METHOD,
    DirectProtocolError,
    encode_error,
    frame,
    read_frame,
)
from gazette.broker.service import JournalService

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
    """What the Append handler uses of a gRPC servicer context: the append's
    `authorization`, and aborting."""

    def __init__(self, authorization: str | None = None) -> None:
        self._metadata = () if authorization is None else (("authorization", authorization),)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Aborted(code, details)


Frame = tuple[bytes, bytes]

READ_AHEAD = 1 << 20
"""Bytes a connection reads ahead of its append handler (besides one frame): payloads, and
`FRAME_COST` a frame, so that a flood of empty frames is bounded too."""
FRAME_COST = 1024


class _Frames:
    """The one reader of a connection. It reads whole frames into a queue, so that no frame
    is ever split between readers (a stall timeout or a proxying gRPC call abandons a `get`,
    never a read), and it sees the client leave at once: `on_lost` runs then. It reads
    ahead of the handler up to `READ_AHEAD` bytes, so a stream's small frames (the commit
    message, its end) are always read, and a client that sent a whole append and left is
    seen gone while the handler still waits (e.g. for the journal)."""

    def __init__(self, reader: asyncio.StreamReader, on_lost: Callable[[], None]) -> None:
        self._queue: asyncio.Queue[Frame | BaseException] = asyncio.Queue()
        self._queued = 0  # Bytes in the queue, as `READ_AHEAD` counts them.
        self._room = asyncio.Event()
        self._room.set()
        self._on_lost = on_lost
        self.task = asyncio.create_task(self._run(reader))

    async def _run(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                frame = await read_frame(reader)
                self._queue.put_nowait(frame)
                self._queued += len(frame[1]) + FRAME_COST
                while self._queued > READ_AHEAD:
                    self._room.clear()
                    await self._room.wait()
        except Exception as err:  # noqa: BLE001 - any failure to read ends the connection
            if not isinstance(err, DirectProtocolError):
                self._on_lost()  # EOF, a reset, a timed-out or unreachable peer...
            self._queue.put_nowait(err)

    async def get(self) -> Frame:
        """The next frame; raises what ended the connection (again, at every later call)."""
        return self._taken(await self._queue.get())

    def get_ready(self) -> Frame | None:
        """The next frame if it is here already (else None), as `get`."""
        if self._queue.empty():
            return None
        return self._taken(self._queue.get_nowait())

    def _taken(self, item: Frame | BaseException) -> Frame:
        if isinstance(item, BaseException):
            self._queue.put_nowait(item)
            raise item
        self._queued -= len(item[1]) + FRAME_COST
        if self._queued <= READ_AHEAD:
            self._room.set()
        return item


class _Requests:
    """The AppendRequest messages of one append, as the handler iterates a gRPC stream:
    StopAsyncIteration at the client's `END`."""

    def __init__(self, frames: _Frames, first: Frame) -> None:
        self.frames = frames
        self.first: Frame | None = first
        self.ended = False
        self.detached = False
        self._taking: asyncio.Task[Frame] | None = None

    def __aiter__(self) -> _Requests:
        return self

    async def _take(self) -> Frame:
        frame = await self.frames.get()
        if frame[0] == END:
            self.ended = True  # Set as the frame is taken: `skip_rest` never waits for it.
        return frame

    async def __anext__(self) -> pb.AppendRequest:
        if self.ended or self.detached:
            raise StopAsyncIteration
        if self.first is not None:
            (kind, payload), self.first = self.first, None
            if kind == END:
                self.ended = True
        elif (ready := self.frames.get_ready()) is not None:
            # Here already (a whole append arrives at once): taken without a task.
            kind, payload = ready
            if kind == END:
                self.ended = True
        else:
            # Taken by a task of its own, which `detach` cancels: a reader left behind (a
            # proxying gRPC call's task) never takes a frame of the next append.
            self._taking = asyncio.ensure_future(self._take())
            try:
                kind, payload = await self._taking
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self.detached and (task is None or not task.cancelling()):
                    raise StopAsyncIteration from None
                raise
            finally:
                self._taking = None
        if kind == END:
            raise StopAsyncIteration
        if kind != REQUEST:
            raise DirectProtocolError(f"unexpected frame kind {kind!r} in an append")
        try:
            return pb.AppendRequest.FromString(payload)
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError varies by backend
            raise DirectProtocolError(f"a malformed AppendRequest: {err}") from None

    def detach(self) -> None:
        """The handler has answered. A reader it left behind (a proxying gRPC call's task)
        gets StopAsyncIteration; the frames are `skip_rest`'s."""
        self.detached = True
        if self._taking is not None:
            self._taking.cancel()

    async def skip_rest(self, timeout: float) -> bool:
        """Drop what the client still sends of an append already answered, up to its `END`.
        False if the connection ended, broke the framing or stalled instead."""
        try:
            async with asyncio.timeout(timeout):
                while not self.ended:
                    kind, _ = await self._take()
                    if kind not in (REQUEST, END):
                        return False
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, DirectProtocolError):
            return False
        return True


class DirectAppendServer:
    """Serves direct appends on `host`:`port` (0: a free port; see `port` once started)."""

    def __init__(
        self, service: JournalService, host: str, port: int = 0, ssl: SSLContext | None = None
    ) -> None:
        self.service = service
        self.ssl = ssl
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._conns: dict[asyncio.Task[None], _Conn] = {}
        self._closing = False

    async def start(self) -> None:
        """Listen. Raises OSError if the port cannot be bound."""
        self._server = await asyncio.start_server(
            self._connection, self.host, self.port, limit=STREAM_LIMIT, ssl=self.ssl
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self, grace: float | None = None) -> None:
        """Stop listening and end every connection.

        With `grace` (seconds), as gRPC's ``server.stop(grace)``: idle connections end at
        once, and each append in progress may finish and be answered within `grace`; its
        connection then ends. An append still in progress after that (or at once, without
        `grace`) is rolled back, as a cancelled gRPC Append, and its client sees the
        connection fail (and retries it).
        """
        self._closing = True
        if self._server is not None:
            self._server.close()
        tasks = list(self._conns)
        try:
            if grace and tasks:
                for conn in self._conns.values():
                    conn.drain()
                _, left = await asyncio.wait(tasks, timeout=grace)
                tasks = list(left)
                cut = [c for t, c in self._conns.items() if t in left and c.appending]
                if cut:
                    log.warning(
                        "direct appends still in progress after %gs: rolled back count=%d",
                        grace,
                        len(cut),
                    )
                if len(cut) < len(tasks):  # Answered, but their clients sent no END since.
                    log.info(
                        "direct append connections still open after %gs: closed count=%d",
                        grace,
                        len(tasks) - len(cut),
                    )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:  # Accepted as the listener closed.
            writer.close()
            return
        conn = _Conn(self.service, reader, writer)
        assert conn.task is not None
        self._conns[conn.task] = conn
        try:
            await conn.serve()
        except asyncio.CancelledError:
            if not self._closing:
                raise
            # Ended by close(): a normal end (asyncio would log a cancelled callback).
        finally:
            self._conns.pop(conn.task, None)


class _Conn:
    """One client connection: its appends, one at a time."""

    def __init__(
        self, service: JournalService, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.service = service
        self.reader = reader
        self.writer = writer
        self.task = asyncio.current_task()
        self.appending = False  # Between an append's first frame and its answer.
        self.lost = False
        self.busy = False  # Between an append's first frame and the end of its stream.
        self.draining = False  # The listener is closing: end after the current append.

    def _on_lost(self) -> None:
        """The client left: an append it has not been answered is cancelled (rolled back),
        as gRPC cancels a handler whose client went away."""
        self.lost = True
        if self.appending and self.task is not None:
            self.task.cancel()

    def drain(self) -> None:
        """End the connection once the append in progress is answered and its stream read
        to its end (at once if idle)."""
        self.draining = True
        if not self.busy and self.task is not None:
            self.task.cancel()

    def _answer(self, out: bytes) -> None:
        self.appending = False
        self.writer.write(out)

    async def serve(self) -> None:
        peer = self.writer.get_extra_info("peername")
        frames: _Frames | None = None
        try:
            timeout = self.service.b.cfg.chunk_timeout
            async with asyncio.timeout(timeout):
                magic = await self.reader.readexactly(len(MAGIC))
            if magic != MAGIC:
                raise DirectProtocolError(f"not a direct-append client (it began with {magic!r})")
            frames = _Frames(self.reader, self._on_lost)
            await self._appends(frames, timeout)
        except asyncio.CancelledError:
            if not self.lost:
                raise
            log.debug("direct append client %s left during an append: rolled back", peer)
        except (asyncio.IncompleteReadError, OSError, TimeoutError) as err:
            log.debug("direct append connection from %s ended: %r", peer, err)
        except DirectProtocolError as err:
            log.warning("direct append connection from %s: %s", peer, err)
            if self.appending or frames is None:
                self._answer(frame(ERROR, encode_error(grpc.StatusCode.INVALID_ARGUMENT, str(err))))
        except Exception:
            log.exception("direct append connection from %s failed", peer)
            if self.appending:
                self._answer(frame(ERROR, encode_error(grpc.StatusCode.UNKNOWN, "broker error")))
        finally:
            if frames is not None:
                frames.task.cancel()
            self.writer.close()

    async def _appends(self, frames: _Frames, timeout: float) -> None:
        anonymous = _Context()
        while True:
            try:
                first = await frames.get()  # An idle connection waits here.
            except asyncio.IncompleteReadError as err:
                if not err.partial:
                    return  # Closed between appends.
                raise
            context = anonymous
            if first[0] == AUTHORIZATION:
                context = _Context(first[1].decode(errors="replace"))
                first = await frames.get()
            if self.lost:
                # The client left after sending (the frames and its end were read in one
                # go): its append is not run, as gRPC cancels a call whose client left.
                log.debug("direct append client left before its append began: not run")
                return
            self.appending = self.busy = True
            requests = _Requests(frames, first)
            try:
                resp: pb.AppendResponse = await self.service.Append(requests, context)
            except _Aborted as err:
                out = frame(ERROR, encode_error(err.code, err.details))
            else:
                out = frame(RESPONSE, resp.SerializeToString())
            requests.detach()
            self._answer(out)
            await self.writer.drain()
            # Read up to the stream's end even when draining: closing with unread bytes
            # would reset the connection, and the client could lose the answer.
            if not await requests.skip_rest(timeout) or self.draining:
                return
            self.busy = False


def port_handler(port: int) -> grpc.GenericRpcHandler:  # type: ignore[type-arg]
    """The gRPC handler of `SERVICE_METHOD`, answering `port`."""
    answer = str(port).encode()

    async def port_of(_request: bytes, _context: Any) -> bytes:
        return answer

    service, method = SERVICE_METHOD.lstrip("/").split("/")
    return grpc.method_handlers_generic_handler(
        service, {method: grpc.unary_unary_rpc_method_handler(port_of)}
    )
