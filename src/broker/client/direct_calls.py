"""Direct appends, client side: Append calls over a TCP stream to our brokers (TLS to a
broker dialled with TLS, which serves its direct port with the same certificate).

`DirectAppends` asks a broker (once, over gRPC) for the port of its direct-append listener,
keeps idle connections to it, and hands out `DirectAppendCall`s, which the `Appender` drives
exactly as a gRPC `StreamUnaryCall`: `write` each AppendRequest, `done_writing`, then await
the AppendResponse. Failures surface as `grpc.aio.AioRpcError` with the status a gRPC call
would have had (UNAVAILABLE for a lost connection), so retries and error handling are the
same for both transports. A broker without the listener (upstream's, or one started with
``--direct-port -1``) answers UNIMPLEMENTED, and its appends go over gRPC. With
authorization, each append opens with an `AUTHORIZATION` frame for its journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

import grpc
import grpc.aio

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.direct_framing import (
    AUTHORIZATION,
    END,
    ERROR,
    HEADER,
    MAGIC,
    REQUEST,
    RESPONSE,
    SERVICE_METHOD,
    DirectProtocolError,
    content_frame_header,
    decode_error,
    read_frame,
)

__all__ = ["DirectAppendCall", "DirectAppends", "host_of", "rpc_error"]

log = logging.getLogger(__name__)

DISCOVERY_TIMEOUT = 5.0
"""Seconds to wait for a broker to answer its direct-append port."""
CONNECT_TIMEOUT = 2.0
"""Seconds to wait for a direct-append connection."""
RETRY_AFTER = 10.0
"""Seconds a broker's appends go over gRPC after its direct-append port could not be
reached (it may have restarted on another port, or a firewall is in the way); doubled at
each failure in a row, up to `RETRY_AFTER_MAX`."""
RETRY_AFTER_MAX = 600.0
STREAM_LIMIT = 1 << 20


def host_of(target: str) -> str | None:
    """The host of a ``host:port`` (or ``https://host:port``, dialled with TLS) gRPC target;
    None for other target forms."""
    target = target.removeprefix("https://")
    if "://" in target or target.startswith("unix:") or ":" not in target:
        return None
    host = target.rsplit(":", 1)[0].strip("[]")
    return host or None


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a gRPC call would raise with status `code`."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None)


def _unavailable(target: str, what: str) -> grpc.aio.AioRpcError:
    return rpc_error(grpc.StatusCode.UNAVAILABLE, f"direct append to {target}: {what}")


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class DirectAppendCall:
    """One append on a direct connection, shaped as the `grpc.aio.StreamUnaryCall` of
    ``Journal.Append`` as far as the `Appender` uses it."""

    def __init__(self, owner: DirectAppends, target: str, conn: _Connection) -> None:
        self._owner = owner
        self._target = target
        self._conn: _Connection | None = conn
        self._ended = False
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._started = False  # A message was written.
        self._cancelled = False
        self._outcome: pb.AppendResponse | BaseException | None = None
        self._answer = asyncio.ensure_future(self._read_answer(conn.reader))
        owner.active.add(self)

    async def _read_answer(self, reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        try:
            kind, payload = await read_frame(reader)
            if kind not in (RESPONSE, ERROR):
                raise DirectProtocolError(f"unexpected frame {kind!r} of {len(payload)} bytes")
            return kind, payload
        except (asyncio.IncompleteReadError, OSError) as err:
            # Any socket error (a reset, a timeout, an unreachable host), as `append`.
            raise _unavailable(self._target, f"connection lost ({err!r})") from None
        except DirectProtocolError as err:
            raise _unavailable(self._target, str(err)) from None

    async def _send(self, *parts: bytes, answered_ok: bool = False, hold: bool = False) -> None:
        """Write `parts` (with any held before them), or with `hold` keep them for the next
        write while fewer than `_SMALL` bytes are held: small frames then travel with the
        next content or the stream's end, in one socket write rather than a write (and a
        wake-up of the broker) each."""
        conn = self._conn
        if conn is None:
            raise _unavailable(self._target, "the call was cancelled")
        if self._answer.done() and not answered_ok:
            # The broker answered before the stream's end (a refusal): stop writing; the
            # Appender then awaits the call for the answer.
            raise asyncio.InvalidStateError("the broker answered the append already")
        if hold and self._held_bytes + (size := sum(len(p) for p in parts)) < _SMALL:
            self._held.extend(parts)
            self._held_bytes += size
            return
        if self._held:
            parts, self._held, self._held_bytes = (*self._held, *parts), [], 0
        try:
            for part in _coalesced(parts):
                conn.writer.write(part)
            await conn.writer.drain()
        except OSError as err:  # drain() raises the socket's error, whatever it was.
            raise _unavailable(self._target, f"connection lost ({err!r})") from None

    async def write(self, msg: pb.AppendRequest) -> None:
        payload = msg.SerializeToString()
        # The request (the stream's first message) waits for the first content, and the
        # commit message (empty) for the end; content goes out as it comes.
        hold = not payload or not self._started
        parts = [HEADER.pack(REQUEST, len(payload)), payload]
        if not self._started:
            parts[:0] = self._owner.authorization_frame(msg.journal)
        self._started = True
        await self._send(*parts, hold=hold)

    async def write_content(self, parts: Sequence[bytes]) -> None:
        """Write one AppendRequest carrying the concatenation of `parts` (bytes) as its
        content, framed around the parts as they are: the same bytes as ``write`` of that
        message, without joining or serializing a copy of them."""
        total = sum(len(p) for p in parts)
        if not total:
            raise ValueError("an empty content message would commit the append")
        self._started = True
        await self._send(content_frame_header(total), *parts)

    async def done_writing(self) -> None:
        """End the stream (whether or not the broker has answered already, as gRPC's)."""
        if not self._ended:
            self._ended = True
            await self._send(HEADER.pack(END, 0), answered_ok=True)

    def __await__(self) -> Generator[Any, None, pb.AppendResponse]:
        return self._result().__await__()

    async def _result(self) -> pb.AppendResponse:
        if self._outcome is None:
            self._outcome = await self._settle()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome

    async def _settle(self) -> pb.AppendResponse | BaseException:
        """The call's outcome, once: every later await gives the same."""
        if self._cancelled:
            return asyncio.CancelledError()  # As a cancelled gRPC call's.
        try:
            kind, payload = await self._answer
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                self.cancel()  # Our caller is cancelled: so is the call.
                raise
            return asyncio.CancelledError()  # The call was cancelled (its client closed).
        except Exception as err:  # noqa: BLE001 - the outcome, kept for every await
            self.cancel()
            return err
        conn = self._conn
        if conn is not None and not self._ended:
            # Answered early: end the stream, so that the broker reads up to the next append.
            self._ended = True
            with contextlib.suppress(ConnectionError):
                conn.writer.write(HEADER.pack(END, 0))
        self._conn = None
        self._owner.active.discard(self)
        if conn is not None:
            # After an error the broker may close the connection: do not keep it.
            self._owner.release(self._target, conn, reusable=kind == RESPONSE)
        if kind == ERROR:
            code, details = decode_error(payload)
            return rpc_error(code, details)
        return pb.AppendResponse.FromString(payload)

    def cancel(self) -> bool:
        """End the call: its connection is closed, so the broker rolls back an append whose
        stream had not ended. Does nothing once the call is answered."""
        conn, self._conn = self._conn, None
        self._owner.active.discard(self)
        if conn is None:
            return False
        self._cancelled = True
        self._answer.cancel()
        conn.close()
        return True


_SMALL = 16 << 10

_COMMIT_AND_END = HEADER.pack(REQUEST, 0) + HEADER.pack(END, 0)
"""An append's empty commit message (an empty serialized AppendRequest), then its end."""


def _coalesced(parts: Sequence[bytes]) -> list[bytes]:
    """`parts` with runs of small ones joined: a socket write each for large parts (no
    copy), few writes for many small ones."""
    out: list[bytes] = []
    run: list[bytes] = []
    for part in parts:
        if len(part) < _SMALL:
            run.append(part)
            continue
        if run:
            out.append(b"".join(run))
            run = []
        out.append(part)
    if run:
        out.append(b"".join(run))
    return out


class DirectAppends:
    """Direct-append connections of a `JournalClient`, per gRPC target."""

    def __init__(
        self,
        channel: Callable[[str], grpc.aio.Channel],
        *,
        ssl_for: Callable[[], ssl.SSLContext] | None = None,
        authorization: Callable[[str], str | None] | None = None,
    ) -> None:
        self._channel = channel
        self._ssl_for = ssl_for
        self._ssl: ssl.SSLContext | None = None
        self._authorization = authorization
        self._ports: dict[str, int] = {}
        self._off_until: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self.active: set[DirectAppendCall] = set()
        """Calls not yet answered nor cancelled."""
        self._idle: dict[str, list[_Connection]] = {}
        self._in_flight: set[_Connection] = set()
        """Connections of `append` calls awaiting their answer."""
        self._closed = False
        self.answered = 0
        """Direct appends answered by a broker (whatever their status)."""

    async def call(self, target: str) -> DirectAppendCall | None:
        """A direct append to `target`'s broker; None if it is not to be reached so (then
        append over gRPC)."""
        conn = await self._connection(target)
        return None if conn is None else DirectAppendCall(self, target, conn)

    async def append(
        self, target: str, request: pb.AppendRequest, content: Sequence[bytes]
    ) -> pb.AppendResponse | None:
        """A whole append to `target`'s broker, written in one go: `request`, the
        concatenation of `content` (bytes) as one content message, and the commit; the
        broker's response (whatever its status). None if `target` is not to be reached so
        (then append over gRPC).

        The same append as a `DirectAppendCall` fed those messages, without the call's
        machinery: a single socket write, and the answer read here. Fails as that call
        would: ``grpc.aio.AioRpcError`` with the status the broker sent, UNAVAILABLE for a
        lost connection (the append may or may not have committed), and
        ``asyncio.CancelledError`` if the client is closed meanwhile (as a call of a closed
        gRPC channel). Cancelled once written, the append may have committed too.
        """
        payload = request.SerializeToString()
        frames = [*self.authorization_frame(request.journal), HEADER.pack(REQUEST, len(payload))]
        frames.append(payload)
        if size := sum(len(part) for part in content):
            frames.append(content_frame_header(size))
            frames.extend(content)
        frames.append(_COMMIT_AND_END)
        conn = await self._connection(target)
        if conn is None:
            return None
        self._in_flight.add(conn)
        try:
            conn.writer.writelines(frames)
            await conn.writer.drain()
            kind, answer = await read_frame(conn.reader)
            if kind not in (RESPONSE, ERROR):
                raise DirectProtocolError(f"unexpected frame {kind!r} of {len(answer)} bytes")
        except (asyncio.IncompleteReadError, OSError) as err:
            conn.close()
            if self._closed:
                raise asyncio.CancelledError() from None  # As a closed gRPC channel's call.
            raise _unavailable(target, f"connection lost ({err!r})") from None
        except DirectProtocolError as err:
            conn.close()
            raise _unavailable(target, str(err)) from None
        except BaseException:
            conn.close()  # Cancelled: the answer may still come; the stream is out of step.
            raise
        finally:
            self._in_flight.discard(conn)
        # After an error the broker may close the connection: do not keep it.
        self.release(target, conn, reusable=kind == RESPONSE)
        if kind == ERROR:
            code, details = decode_error(answer)
            raise rpc_error(code, details)
        return pb.AppendResponse.FromString(answer)

    def authorization_frame(self, journal: str) -> list[bytes]:
        """The `AUTHORIZATION` frame opening an append to `journal` (none without
        authorization)."""
        value = self._authorization(journal) if self._authorization is not None else None
        if value is None:
            return []
        data = value.encode()
        return [HEADER.pack(AUTHORIZATION, len(data)), data]

    def release(self, target: str, conn: _Connection, *, reusable: bool = True) -> None:
        """Keep `conn` for the next append to `target` (an append was answered on it), if
        `reusable`."""
        self.answered += 1
        if self._closed or not reusable or not conn.usable():
            conn.close()
            return
        self._idle.setdefault(target, []).append(conn)

    def idle(self, target: str) -> int:
        """Idle connections kept to `target`."""
        return len(self._idle.get(target, ()))

    def close(self) -> None:
        """Cancel the calls in flight (as closing a gRPC channel does) and close the idle
        connections; later calls go over gRPC."""
        self._closed = True
        for call in list(self.active):
            call.cancel()
        for conn in list(self._in_flight):
            conn.close()  # Its `append` raises CancelledError.
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    async def _connection(self, target: str) -> _Connection | None:
        """An idle connection to `target`, or a new one; None if it is not to be reached."""
        conn = self._take(target)
        if conn is None:
            conn = await self._dial(target)
            if conn is not None and self._closed:  # Closed while dialling.
                conn.close()
                return None
        return conn

    def _take(self, target: str) -> _Connection | None:
        conns = self._idle.get(target)
        while conns:
            conn = conns.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    async def _dial(self, target: str) -> _Connection | None:
        if self._closed or time.monotonic() < self._off_until.get(target, 0.0):
            return None
        host = host_of(target)
        if host is None:
            return None
        port = self._ports.get(target)
        if port is None:
            port = await self._discover(target)
            if port is None:
                return None
        tls: ssl.SSLContext | None = None
        if target.startswith("https://"):
            if self._ssl_for is None:
                return None  # No TLS settings for the direct port: over gRPC.
            if self._ssl is None:
                self._ssl = self._ssl_for()
            tls = self._ssl
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    limit=STREAM_LIMIT,
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                )
        except (OSError, TimeoutError) as err:
            self._back_off(target, f"unreachable on port {port} ({err!r})")
            self._ports.pop(target, None)  # Asked again next time: it may have moved.
            return None
        self._failures.pop(target, None)
        writer.write(MAGIC)
        return _Connection(reader, writer)

    def _back_off(self, target: str, why: str) -> None:
        """Append to `target` over gRPC for a while: 10 s, doubling at each failure in a row
        up to 10 min."""
        failures = self._failures.get(target, 0)
        self._failures[target] = failures + 1
        off = min(RETRY_AFTER * 2**failures, RETRY_AFTER_MAX)
        log.warning("direct appends to %s %s: appending over gRPC for %.0f s", target, why, off)
        self._off_until[target] = time.monotonic() + off

    async def _discover(self, target: str) -> int | None:
        method = self._channel(target).unary_unary(SERVICE_METHOD, None, None)
        try:
            answer = await method(b"", timeout=DISCOVERY_TIMEOUT)
            port = int(answer)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.debug("broker %s has no direct appends: appending over gRPC", target)
                self._off_until[target] = float("inf")
            else:  # Down or hung: not asked again at every append.
                self._back_off(target, f"did not answer its port ({err.code().name})")
            return None
        except ValueError:
            log.warning("broker %s answered no port for direct appends: %r", target, answer)
            self._off_until[target] = float("inf")
            return None
        self._ports[target] = port
        return port
