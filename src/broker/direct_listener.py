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
from collections import deque
from collections.abc import AsyncIterator
from ssl import SSLContext
from typing import Any, cast

import grpc

from gazette.broker.append_fsm import AppendMessage, ContentChunk
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.direct_framing import (
    AUTHORIZATION,
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
from gazette.broker.service import JournalService

log = logging.getLogger(__name__)

__all__ = ["DirectAppendServer", "port_handler"]


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


class _Frames(asyncio.Protocol):
    """A connection's transport, read as frames. Bytes are split into frames as they arrive
    (in `data_received`, without a task of its own), and each frame goes to the reader
    waiting for one, or into a queue. So no frame is ever split between readers (a stall
    timeout or a proxying gRPC call abandons a wait, never a read), and the client leaving
    is seen at once: `_Conn.lost_client` runs then. It reads ahead of the handler up to
    `READ_AHEAD` bytes, so a stream's small frames (the commit message, its end) are always
    read, and a client that sent a whole append and left is seen gone while the handler
    still waits (e.g. for the journal). Its writing side is what `_Conn` answers through.
    """

    def __init__(self, server: DirectAppendServer | None = None) -> None:
        self._server = server
        self.conn: _Conn | None = None
        self.transport: asyncio.Transport | None = None
        # Bytes received and not yet split, as views of what each read returned: a payload is
        # copied once, out of them (a buffer appended to and cut from the front would be
        # copied and reallocated at every read of a large frame).
        self._pieces: deque[memoryview] = deque()
        self._have = 0  # Bytes in `_pieces`.
        self._magic: asyncio.Future[bytes] | None = None
        self._magic_ok = False
        self._queue: deque[Frame] = deque()
        self._queued = 0  # Bytes in the queue, as `READ_AHEAD` counts them.
        self._waiter: asyncio.Future[Frame] | None = None
        self._ended: BaseException | None = None  # What ended the reading, once raised.
        self._reading = True
        self._writable: asyncio.Future[None] | None = None  # Set while writing is paused.
        self._closed = False

    # --- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (not an asyncio.Transport subclass with every event loop).
        self.transport = cast(asyncio.Transport, transport)
        if self._server is not None:
            self._server._connected(self)

    def data_received(self, data: bytes) -> None:
        if self._ended is not None or not data:
            return
        self._pieces.append(memoryview(data))
        self._have += len(data)
        if not self._magic_ok:
            if self._have < len(MAGIC):
                return
            magic = self._take(len(MAGIC))
            self._resolve_magic(magic)
            if magic != MAGIC:  # `_Conn.serve` answers it; nothing more is read.
                self._end(DirectProtocolError("not a direct-append client"), lost=False)
                return
            self._magic_ok = True
        self._parse()

    def _take(self, n: int) -> bytes:
        """The first `n` bytes received (there are as many), no longer kept."""
        pieces = self._pieces
        self._have -= n
        first = pieces[0]
        if len(first) > n:
            pieces[0] = first[n:]
            return first[:n].tobytes()
        parts = [pieces.popleft()]
        n -= len(first)
        while n:
            piece = pieces[0]
            if len(piece) > n:
                parts.append(piece[:n])
                pieces[0] = piece[n:]
                break
            parts.append(pieces.popleft())
            n -= len(piece)
        return b"".join(parts)

    def _parse(self, ahead: int = READ_AHEAD) -> None:
        """Split the bytes received into frames while fewer than `ahead` bytes are queued;
        pause reading beyond that."""
        pieces = self._pieces
        while self._queued <= ahead and self._have >= HEADER.size:
            if len(pieces[0]) < HEADER.size:  # A header split between reads.
                pieces.appendleft(memoryview(self._take(HEADER.size)))
                self._have += HEADER.size
            kind, n = HEADER.unpack_from(pieces[0])
            if n > MAX_FRAME:
                self._end(DirectProtocolError(f"a frame of {n} bytes (at most {MAX_FRAME})"))
                return
            if self._have < HEADER.size + n:
                break
            self._take(HEADER.size)
            self._push((kind, self._take(n) if n else b""))
        if self._queued > ahead and self._reading and self.transport is not None:
            self._reading = False
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self._end(None)
        # Keep a plain transport open for an answer (`_Conn` closes it); TLS cannot be kept.
        return self.transport is not None and self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._end(exc)
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None:
            if not self._writable.done():
                self._writable.set_result(None)
            self._writable = None

    # --- reading --------------------------------------------------------------------------
    def _resolve_magic(self, magic: bytes) -> None:
        if self._magic is None:
            self._magic = asyncio.get_running_loop().create_future()
        if not self._magic.done():
            self._magic.set_result(magic)

    async def magic(self) -> bytes:
        """The connection's first bytes, as long as `MAGIC`. Raises what ended the
        connection before them (asyncio.IncompleteReadError for an early end)."""
        if self._magic is None:
            self._magic = asyncio.get_running_loop().create_future()
            if self._ended is not None:
                self._magic.set_exception(self._ended)
        return await self._magic

    def _push(self, item: Frame) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._waiter = None
            waiter.set_result(item)
            return
        self._queue.append(item)
        self._queued += len(item[1]) + FRAME_COST

    def _end(self, err: BaseException | None, lost: bool = True) -> None:
        """Reading ended with `err` (None: the stream ended, asyncio.IncompleteReadError
        with any partial frame), raised to readers once the frames before it are taken; the
        client left (unless it broke the framing)."""
        if self._ended is not None:
            return
        if self._magic_ok and not isinstance(err, DirectProtocolError):
            self._parse(ahead=MAX_FRAME)  # The frames before the end come first.
            if self._ended is not None:  # A frame over MAX_FRAME among them.
                return
        if err is None:
            err = asyncio.IncompleteReadError(b"".join(self._pieces), None)
        self._ended = err
        if self._magic is not None and not self._magic.done():
            self._magic.set_exception(err)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(err)
        self._waiter = None
        if lost and not isinstance(err, DirectProtocolError) and self.conn is not None:
            self.conn.lost_client()  # EOF, a reset, a timed-out or unreachable peer...

    def waiter(self) -> asyncio.Future[Frame]:
        """A future of the next frame (done already if one is here): the frame, or what
        ended the connection (again, at every later call). Cancelling it gives up the wait;
        the frame then stays for the next reader."""
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        ready = self.get_ready_or_end()
        if ready is not None:
            fut.set_result(ready)
        elif self._ended is not None:
            fut.set_exception(self._ended)
        else:
            assert self._waiter is None or self._waiter.done(), "one reader at a time"
            self._waiter = fut
        return fut

    async def get(self) -> Frame:
        """The next frame; raises what ended the connection (again, at every later call)."""
        ready = self.get_ready_or_end()
        if ready is not None:
            return ready
        if self._ended is not None:
            raise self._ended
        return await self.waiter()

    def get_ready(self) -> Frame | None:
        """The next frame if it is here already (else None), as `get`."""
        ready = self.get_ready_or_end()
        if ready is None and self._ended is not None:
            raise self._ended
        return ready

    def get_ready_or_end(self) -> Frame | None:
        if not self._queue:
            return None
        item = self._queue.popleft()
        self._queued -= len(item[1]) + FRAME_COST
        if not self._reading and self._queued <= READ_AHEAD:
            self._reading = True
            self._parse()  # What was received meanwhile, which may pause reading again.
            if self._reading and self.transport is not None and self._ended is None:
                self.transport.resume_reading()
        return item

    # --- writing --------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.transport is not None and not self._closed:
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait until the transport takes more writes. Raises ConnectionResetError if the
        connection is lost."""
        if self._closed:
            raise ConnectionResetError("connection lost")
        if self._writable is not None:
            await self._writable
            if self._closed:
                raise ConnectionResetError("connection lost")

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


_EMPTY = ContentChunk(b"")


def content_only(payload: bytes) -> ContentChunk | None:
    """The content of a serialized AppendRequest which carries content alone (or nothing),
    as a view of `payload` (what clients send after an append's first message); None for
    any other message, which is parsed as protobuf instead."""
    if not payload:
        return _EMPTY
    if payload[0] != 0x22:  # Content: field 4, length-delimited.
        return None
    size, shift = len(payload), 0
    length = 0
    for i in range(1, min(size, 11)):  # Its length: a varint of at most 10 bytes.
        byte = payload[i]
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            if length != size - i - 1:
                return None  # More fields follow.
            return ContentChunk(memoryview(payload)[i + 1 :])
        shift += 7
    return None


class _Requests:
    """The AppendRequest messages of one append, as the handler iterates a gRPC stream:
    StopAsyncIteration at the client's `END`."""

    def __init__(self, frames: _Frames, first: Frame) -> None:
        self.frames = frames
        self.first: Frame | None = first
        self.ended = False
        self.detached = False
        self._taking: asyncio.Future[Frame] | None = None

    def __aiter__(self) -> _Requests:
        return self

    async def _take(self) -> Frame:
        frame = await self.frames.get()
        if frame[0] == END:
            self.ended = True
        return frame

    async def __anext__(self) -> AppendMessage:
        if self.ended or self.detached:
            raise StopAsyncIteration
        first = self.first
        if first is not None:
            (kind, payload), self.first = first, None
            if kind == END:
                self.ended = True
        elif (ready := self.frames.get_ready()) is not None:
            # Here already (a whole append arrives at once): taken without a task.
            kind, payload = ready
            if kind == END:
                self.ended = True
        else:
            # Waited for through a future of its own, which `detach` cancels: a reader left
            # behind (a proxying gRPC call's task) never takes a frame of the next append.
            self._taking = self.frames.waiter()
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
                self.ended = True
        if kind == END:
            raise StopAsyncIteration
        if kind != REQUEST:
            raise DirectProtocolError(f"unexpected frame kind {kind!r} in an append")
        if first is None and (chunk := content_only(payload)) is not None:
            return chunk
        try:
            return pb.AppendRequest.FromString(payload)
        except Exception as err:  # noqa: BLE001 - protobuf's DecodeError varies by backend
            raise DirectProtocolError(f"a malformed AppendRequest: {err}") from None

    def detach(self) -> None:
        """The handler has answered. A reader it left behind (a proxying gRPC call's task)
        gets StopAsyncIteration; the frames are `skip_rest`'s."""
        self.detached = True
        taking = self._taking
        if taking is not None:
            if taking.done() and not taking.cancelled() and taking.exception() is None:
                # Taken, but its reader has not run since: `skip_rest` must not wait for it.
                self.ended = self.ended or taking.result()[0] == END
            taking.cancel()

    async def skip_rest(self, timeout: float) -> bool:
        """Drop what the client still sends of an append already answered, up to its `END`.
        False if the connection ended, broke the framing or stalled instead."""
        if self.ended:  # As usual: the whole stream came with its commit message.
            return True
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
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Frames(self), self.host, self.port, ssl=self.ssl
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

    def _connected(self, frames: _Frames) -> None:
        if self._closing:  # Accepted as the listener closed.
            frames.close()
            return
        conn = frames.conn = _Conn(self.service, frames)
        conn.task = asyncio.get_running_loop().create_task(self._connection(conn))
        self._conns[conn.task] = conn

    async def _connection(self, conn: _Conn) -> None:
        assert conn.task is not None
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

    def __init__(self, service: JournalService, frames: _Frames) -> None:
        self.service = service
        self.frames = frames
        self.task: asyncio.Task[None] | None = None
        self.appending = False  # Between an append's first frame and its answer.
        self.lost = False
        self.busy = False  # Between an append's first frame and the end of its stream.
        self.draining = False  # The listener is closing: end after the current append.

    def lost_client(self) -> None:
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
        self.frames.write(out)

    async def serve(self) -> None:
        frames = self.frames
        assert frames.transport is not None
        peer = frames.transport.get_extra_info("peername")
        started = False
        try:
            timeout = self.service.b.cfg.chunk_timeout
            async with asyncio.timeout(timeout):
                magic = await frames.magic()
            if magic != MAGIC:
                raise DirectProtocolError(f"not a direct-append client (it began with {magic!r})")
            started = True
            await self._appends(frames, timeout)
        except asyncio.CancelledError:
            if not self.lost:
                raise
            log.debug("direct append client %s left during an append: rolled back", peer)
        except (asyncio.IncompleteReadError, OSError, TimeoutError) as err:
            log.debug("direct append connection from %s ended: %r", peer, err)
        except DirectProtocolError as err:
            log.warning("direct append connection from %s: %s", peer, err)
            if self.appending or not started:
                self._answer(frame(ERROR, encode_error(grpc.StatusCode.INVALID_ARGUMENT, str(err))))
        except Exception:
            log.exception("direct append connection from %s failed", peer)
            if self.appending:
                self._answer(frame(ERROR, encode_error(grpc.StatusCode.UNKNOWN, "broker error")))
        finally:
            frames.close()

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
                # Its later messages may be ContentChunks, which the Append handler takes.
                stream = cast(AsyncIterator[pb.AppendRequest], requests)
                resp: pb.AppendResponse = await self.service.Append(stream, context)
            except _Aborted as err:
                out = frame(ERROR, encode_error(err.code, err.details))
            else:
                out = frame(RESPONSE, resp.SerializeToString())
            requests.detach()
            self._answer(out)
            await frames.drain()
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
