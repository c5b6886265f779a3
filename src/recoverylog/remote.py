"""RemoteRecorder: a Recorder in a process of its own, fed file operations over a socket.

A store that observes its file operations in Python (the SQLite VFS) and records them in
the same process pays for the recording (the Recorder, the append client, their event
loop) with the store's own time: both need the GIL. `RemoteRecorder.start` runs the
Recorder, its `JournalClient` and `AppendService` in a child process
(``python -m gazette.recoverylog.remote_server``) and hands it the FSM to record onwards from; the
store's thread then sends its operations with `record` (``sendmsg`` of their own buffers,
which releases the GIL) and the event loop only asks for barriers and waits for them
(docs/sqlite-store.md, "The recorder process").

Two socket pairs connect the processes: operations and requests go down one, written
blocking (at most `SEND_TIMEOUT` a frame) from any thread under a lock; replies come up the
other, read by the loop. Frames are `HEADER` (kind, request id, payload length) and a
payload. The child exits when the parent's end closes (also when the parent dies), after a
`close`, or once killed; a dead child fails every pending and later barrier with
`RecorderGone`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.handover import dump_fsm, load_fsm
from gazette.recoverylog.op_batch import Op, OpView
from gazette.recoverylog.recorder import RecorderFenced

__all__ = ["RecorderGone", "RemoteRecorder", "RemoteRecorderFenced", "RemoteRecordingFailed"]

log = logging.getLogger(__name__)

HEADER = struct.Struct("<BQI")
"""Frame header: kind, request id, payload length."""

OP_HEADER = struct.Struct("<BIQI")
"""An operation in an `OPS` payload: kind, path length, offset, data length; then the
path (UTF-8) and the data."""

MAX_IOVECS = 512
"""Buffers per ``sendmsg`` (the kernel takes at most ``IOV_MAX``, 1024 on Linux)."""

# Parent -> child.
HELLO = 1  # Payload: pickle of {"config": {...}, "fsm": dump_fsm bytes}.
OPS = 2  # Payload: operations (`encode_ops`).
BARRIER = 3  # Payload: b"\x01" to confirm, b"\x00" not (`Recorder.barrier`).
HINTS = 4
CLOSE = 5
# Child -> parent.
READY = 10  # Id: the write head.
DONE = 11  # Payload: the write head, as 8 bytes.
FAILED = 12  # Payload: `failure_payload`. Id 0: recording failed, unasked.
HINTS_REPLY = 13  # Payload: serialized FSMHints.
CLOSED = 14  # Payload: dump_fsm of the final FSM.

SOCKET_BUFFER = 4 << 20
"""Send buffer asked for the operations' socket (the kernel caps it at ``net.core.wmem_max``,
212,992 bytes by default: a large commit then waits for the child to read it)."""

SEND_TIMEOUT = 30.0
"""Longest a frame's send may block (on a child that stopped reading): past it the child is
taken for gone, and the event loop, which sends barrier requests, is never blocked for good."""


class RemoteRecordingFailed(Exception):
    """The recorder process reported a failure (e.g. the log was fenced by a new primary);
    the message is its error. Nothing more can be recorded."""


class RemoteRecorderFenced(RemoteRecordingFailed):
    """The recorder process's log was fenced by another author (its Recorder raised
    `RecorderFenced`): typically a hand-off to a new primary."""


class RecorderGone(RemoteRecordingFailed):
    """The recorder process exited (or was killed) before answering."""


class RemoteRecorder:
    """A Recorder in a child process (module docs). Create with `start`; use on the event
    loop that started it, except `record`, which any thread may call."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        down: socket.socket,
        up: socket.socket,
        log_name: str,
        directory: Path,
        fsm: FSM,
    ) -> None:
        self.proc = proc
        self.log = log_name
        self.directory = directory
        self.fsm = fsm
        """The FSM recording began from (the child's copy moves on; `close` returns it)."""
        self.write_head = 0
        self.author = 0
        self._down = down
        self._up = up
        self._lock = threading.Lock()
        self._ids = 0
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._error: RemoteRecordingFailed | None = None
        self._loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[int] = self._loop.create_future()
        self._reader: asyncio.Task[None] | None = None
        self._up_writer: asyncio.StreamWriter | None = None
        self._cut = False  # Nothing more is sent (a frame was cut short, or killed).
        self._closing = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def error(self) -> RemoteRecordingFailed | None:
        """The failure reported by the child, or its exit; None while it records."""
        return self._error

    @classmethod
    async def start(
        cls,
        endpoint: str,
        log_name: str,
        fsm: FSM,
        author: int,
        directory: str | os.PathLike[str],
        *,
        write_head: int = 0,
        timeout: float = 30.0,
        log_level: str | None = None,
    ) -> RemoteRecorder:
        """Start a recorder process recording `directory` into `log_name` as `author`,
        onwards from `fsm` (complete: no remaining hints) at least at `write_head`, appending
        through the broker at `endpoint`; return once it is ready.

        Raises `RecorderGone` if it exits or is not ready within `timeout`, and ValueError
        for an FSM with remaining hints.
        """
        directory = Path(directory).resolve()
        hello = pickle.dumps(
            {
                "config": {
                    "endpoint": endpoint,
                    "log": log_name,
                    "author": author,
                    "directory": str(directory),
                    "write_head": write_head,
                },
                "fsm": dump_fsm(fsm, write_head),
            }
        )
        down, child_down = socket.socketpair()
        up, child_up = socket.socketpair()
        down.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        down.settimeout(SEND_TIMEOUT)
        env = dict(os.environ)
        if log_level is not None:
            env["RECORDER_LOG_LEVEL"] = log_level
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gazette.recoverylog.remote_server",
                    str(child_down.fileno()),
                    str(child_up.fileno()),
                    str(os.getpid()),
                ],
                pass_fds=(child_down.fileno(), child_up.fileno()),
                env=env,
            )
        except BaseException:
            for s in (down, up):
                s.close()
            raise
        finally:
            child_down.close()
            child_up.close()
        self = cls(proc, down, up, log_name, directory, fsm)
        self.author = author
        try:
            # (The writer is kept: a StreamWriter closes its socket once collected.)
            reader, self._up_writer = await asyncio.open_connection(sock=up, limit=1 << 20)
            self._reader = self._loop.create_task(
                self._read(reader), name=f"remote-recorder:{log_name}"
            )
            self._send(HELLO, 0, hello)
            async with asyncio.timeout(timeout):
                self.write_head = await self._ready
        except BaseException as err:
            self.kill()
            if isinstance(err, (TimeoutError, OSError)):
                raise RecorderGone(
                    f"recorder process {proc.pid} of {log_name} was not ready in {timeout}s"
                ) from err
            raise
        log.info("recorder process ready pid=%d log=%s", proc.pid, log_name)
        return self

    # -- Any thread ------------------------------------------------------------------------

    def record(self, ops: list[Op]) -> None:
        """Send `ops` to be recorded, in order after everything sent before. Their data is
        not copied: the kernel takes it from the buffers as they are. Blocks (GIL released)
        while the child's socket buffer is full. Raises `RemoteRecordingFailed` once the
        child failed or is gone."""
        if not ops:
            return
        self.check()
        buffers = encode_ops(ops)
        size = sum(len(b) for b in buffers)
        self._send_buffers([HEADER.pack(OPS, 0, size), *buffers])

    def check(self) -> None:
        """Raise the child's failure, if it reported one or is gone."""
        err = self._error
        if err is not None:
            raise type(err)(str(err))

    def _send(self, kind: int, ident: int, payload: bytes = b"") -> None:
        self._send_buffers([HEADER.pack(kind, ident, len(payload)), payload])

    def _send_buffers(self, buffers: list[bytes]) -> None:
        """Send one frame (`buffers`), whole: a frame cut short (an error, a timeout, an
        interrupt) would desynchronise the stream, so the child is then cut off for good."""
        views = [memoryview(b) for b in buffers if b]
        begun = False
        with self._lock:
            try:
                if self._cut:
                    raise OSError("the stream to the recorder process was cut")
                i = 0
                while i < len(views):
                    sent = self._down.sendmsg(views[i : i + MAX_IOVECS])
                    begun = True
                    while sent and sent >= len(views[i]):
                        sent -= len(views[i])
                        i += 1
                    if sent:
                        views[i] = views[i][sent:]
            except BaseException as err:
                gone = RecorderGone(
                    f"recorder process {self.proc.pid} of {self.log} is gone: {err!r}"
                )
                if begun or isinstance(err, OSError):
                    self._cut_off(gone)
                if isinstance(err, OSError):
                    raise gone from err
                raise

    def _cut_off(self, err: RemoteRecordingFailed) -> None:
        """Record nothing more (any thread): the child sees its input end and exits; pending
        barriers fail once its replies end."""
        if self._error is None:
            self._error = err
        self._cut = True
        with contextlib.suppress(OSError):
            self._down.shutdown(socket.SHUT_RDWR)

    # -- The loop ----------------------------------------------------------------------------

    def barrier(self, *, confirm: bool = True) -> asyncio.Future[int]:
        """A future of the log's write head once everything sent so far is committed
        (`Recorder.barrier`); it fails with `RemoteRecordingFailed` (or `RecorderGone`)."""
        return self._request(BARRIER, b"\x01" if confirm else b"\x00")

    async def build_hints(self) -> rpb.FSMHints:
        """FSMHints of at least everything sent before the call, returned once committed."""
        return rpb.FSMHints.FromString(await self._request(HINTS))

    async def close(self) -> tuple[FSM, int]:
        """Commit everything sent, stop the process, and return its final (FSM, write head).
        Raises `RemoteRecordingFailed` if not everything could be committed (the process is
        stopped anyway)."""
        self._closing = True
        try:
            data = await self._request(CLOSE)
            fsm, head = load_fsm(data)
            self.write_head = head
            with contextlib.suppress(subprocess.TimeoutExpired):  # Then killed below.
                await asyncio.get_running_loop().run_in_executor(None, self.proc.wait, 10.0)
            return fsm, head
        finally:
            self.kill()

    def abandon(self, reason: str) -> None:
        """Stop recording at once, from any thread (also once the loop is closed): the
        process is killed, and what it had not committed is lost (`Recorder.abandon`)."""
        self._cut_off(RemoteRecordingFailed(f"recorder of {self.log} abandoned: {reason}"))
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self.kill()
        else:
            with contextlib.suppress(RuntimeError):  # A closed loop: nothing to release.
                self._loop.call_soon_threadsafe(self.kill)

    def kill(self) -> None:
        """Kill the process if it still runs and close the sockets; idempotent."""
        with contextlib.suppress(ProcessLookupError):
            if self.proc.poll() is None:
                self.proc.kill()
        self.proc.wait()
        self._cut = True
        with contextlib.suppress(OSError):
            self._down.shutdown(socket.SHUT_RDWR)  # Wakes a thread blocked sending.
        self._down.close()
        if self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # (Retrieved: a failed start raised it already.)
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
        if self._up_writer is not None:
            self._up_writer.close()  # (Its transport owns the socket.)
        else:
            self._up.close()

    def _request(self, kind: int, payload: bytes = b"") -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self._loop.create_future()
        if self._error is not None:
            fut.set_exception(type(self._error)(str(self._error)))
            return fut
        self._ids += 1
        ident = self._ids
        self._waiters[ident] = fut
        try:
            self._send(kind, ident, payload)
        except RemoteRecordingFailed as err:
            self._waiters.pop(ident, None)
            fut.set_exception(err)
            self._fail(err)
        return fut

    def _fail(self, err: RemoteRecordingFailed) -> None:
        if self._error is None:
            self._error = err
        waiters, self._waiters = self._waiters, {}
        for fut in waiters.values():
            if not fut.done():
                fut.set_exception(type(err)(str(err)))
        if not self._ready.done():
            self._ready.set_exception(type(err)(str(err)))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                kind, ident, n = HEADER.unpack(await reader.readexactly(HEADER.size))
                payload = await reader.readexactly(n) if n else b""
                if kind == READY:
                    if not self._ready.done():
                        self._ready.set_result(ident)
                    continue
                if kind == FAILED:
                    err = failure_from_payload(payload)
                    if ident == 0:
                        self._fail(err)
                        continue
                    if self._error is None:
                        self._error = err
                    fut = self._waiters.pop(ident, None)
                    if fut is not None and not fut.done():
                        fut.set_exception(err)
                    continue
                fut = self._waiters.pop(ident, None)
                if fut is None or fut.done():
                    continue
                if kind == DONE:
                    head = struct.unpack("<Q", payload)[0]
                    self.write_head = max(self.write_head, head)
                    fut.set_result(head)
                else:  # HINTS_REPLY, CLOSED.
                    fut.set_result(payload)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except Exception as err:  # A malformed reply: the child is of no further use.
            log.error("recorder process pid=%d sent a bad reply: %r", self.proc.pid, err)
        finally:
            code = self.proc.poll()  # (None if not reaped yet.)
            how = "was stopped" if self._closing else "exited"
            if code is not None and not self._closing:
                how += f" (status {code})"
            self._fail(RecorderGone(f"recorder process {self.proc.pid} of {self.log} {how}"))


def encode_ops(ops: list[Op]) -> list[bytes]:
    """`ops` as the buffers of an `OPS` payload (each op's data is one of them, uncopied)."""
    out: list[bytes] = []
    for kind, path, offset, data in ops:
        name = path.encode()
        out.append(OP_HEADER.pack(kind, len(name), offset, len(data)) + name)
        if data:
            out.append(data)
    return out


def decode_ops(payload: bytes | bytearray) -> list[OpView]:
    """The operations of an `OPS` payload, their data views of it (not copies: `apply_ops`
    copies what it keeps). Raises ValueError if it is malformed."""
    view = memoryview(payload)
    out: list[OpView] = []
    i, end = 0, len(view)
    try:
        while i < end:
            kind, name_len, offset, data_len = OP_HEADER.unpack_from(view, i)
            i += OP_HEADER.size
            path = bytes(view[i : i + name_len]).decode()
            i += name_len
            data = view[i : i + data_len]
            i += data_len
            if i > end:
                raise ValueError(f"an operation runs past the end of its {end}-byte payload")
            out.append((kind, path, offset, data))
    except (struct.error, UnicodeDecodeError) as err:
        raise ValueError(f"malformed operations payload: {err}") from err
    return out


def failure_payload(err: BaseException) -> bytes:
    """A `FAILED` payload for `err`: whether it is a fence (one byte), then its text."""
    return (b"\x01" if isinstance(err, RecorderFenced) else b"\x00") + repr(err).encode()


def failure_from_payload(payload: bytes) -> RemoteRecordingFailed:
    """The exception a `FAILED` payload stands for."""
    text = payload[1:].decode(errors="replace")
    return RemoteRecorderFenced(text) if payload[:1] == b"\x01" else RemoteRecordingFailed(text)


def config_from_hello(hello: bytes) -> tuple[dict[str, Any], FSM, int]:
    """The (configuration, FSM, write head) of a `HELLO` payload (for the child)."""
    msg = pickle.loads(hello)
    fsm, head = load_fsm(msg["fsm"])
    return dict(msg["config"]), fsm, head
