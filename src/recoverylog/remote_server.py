"""The recorder process: ``python -m gazette.recoverylog.remote_server DOWN_FD UP_FD PARENT_PID``.

Started by `RemoteRecorder.start` (see `recoverylog.remote` for the protocol): reads the
configuration and FSM from the first frame of DOWN_FD, records onwards through a Recorder,
and answers on UP_FD. Exits when DOWN_FD ends (the parent closed it or died) without
waiting for appends in flight, as a crashed store's recorder would; after a `CLOSE` once
everything is committed. Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket
import struct
import sys
from typing import Any

from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.handover import set_parent_death_signal
from gazette.recoverylog.remote import (
    BARRIER,
    CLOSE,
    CLOSED,
    DONE,
    FAILED,
    HEADER,
    HELLO,
    HINTS,
    HINTS_REPLY,
    OPS,
    READY,
    config_from_hello,
    decode_ops,
    failure_payload,
)

log = logging.getLogger("gazette.recoverylog.remote_server")


async def serve(down_fd: int, up_fd: int) -> int:
    """Serve the parent until its socket ends or it closes us; the exit status."""
    from gazette.broker.client import AppendService, JournalClient
    from gazette.recoverylog.handover import dump_fsm
    from gazette.recoverylog.op_batch import apply_ops
    from gazette.recoverylog.recorder import Recorder

    loop = asyncio.get_running_loop()
    down = socket.socket(fileno=down_fd)
    down.setblocking(False)
    _, writer = await asyncio.open_connection(sock=socket.socket(fileno=up_fd))
    header = bytearray(HEADER.size)

    async def read_into(buf: bytearray) -> None:
        # Raw reads: a frame's payload is copied once, from the kernel into `buf`.
        view, got = memoryview(buf), 0
        while got < len(buf):
            n = await loop.sock_recv_into(down, view[got:])
            if not n:
                raise asyncio.IncompleteReadError(bytes(view[:got]), len(buf))
            got += n

    def reply(kind: int, ident: int, payload: bytes = b"") -> None:
        writer.write(HEADER.pack(kind, ident, len(payload)) + payload)

    async def frame() -> tuple[int, int, bytearray]:
        await read_into(header)
        kind, ident, n = HEADER.unpack(header)
        payload = bytearray(n)
        await read_into(payload)
        return kind, ident, payload

    kind, _, hello = await frame()
    if kind != HELLO:
        log.error("expected the configuration, got a frame of kind %d", kind)
        return 2
    cfg, fsm, head = config_from_hello(bytes(hello))
    async with JournalClient(cfg["endpoint"]) as client, AppendService(client) as svc:
        rec = Recorder(fsm, cfg["author"], cfg["directory"], svc, cfg["log"], write_head=head)
        reply(READY, rec.write_head)
        failed: bytes | None = None  # The FAILED payload of the first failure.
        tasks: set[asyncio.Task[Any]] = set()  # Hints being built.

        def fail(ident: int, err: BaseException) -> None:
            nonlocal failed
            payload = failure_payload(err)
            failed = failed or payload
            reply(FAILED, ident, payload)

        def answer(ident: int, fut: asyncio.Future[Any]) -> None:
            # Replies to a barrier (DONE) or hints request (HINTS_REPLY) once it resolved.
            err = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
            if err is not None:
                fail(ident, err)
            elif isinstance(result := fut.result(), rpb.FSMHints):
                reply(HINTS_REPLY, ident, result.SerializeToString())
            else:
                reply(DONE, ident, struct.pack("<Q", rec.write_head))

        while True:
            try:
                kind, ident, payload = await frame()
            except (asyncio.IncompleteReadError, ConnectionError):
                # Not waiting for appends in flight (nor closing the client, which would).
                log.info("the parent's socket ended: exiting log=%s", cfg["log"])
                logging.shutdown()
                os._exit(0)
            if kind == OPS:
                if failed is None:
                    try:
                        apply_ops(rec, decode_ops(payload), exclusive_create=True)
                    except BaseException as err:  # A broken Recorder, or a bad op.
                        log.error("recording failed log=%s err=%r", cfg["log"], err)
                        fail(0, err)
            elif failed is not None and kind in (BARRIER, HINTS, CLOSE):
                reply(FAILED, ident, failed)
                if kind == CLOSE:
                    await writer.drain()
                    return 1
            elif kind == BARRIER:
                try:  # (A Recorder already broken raises at once.)
                    fut = rec.barrier(confirm=payload != b"\x00")
                except BaseException as err:
                    fail(ident, err)
                else:
                    fut.add_done_callback(functools.partial(answer, ident))
            elif kind == HINTS:
                task = asyncio.ensure_future(rec.build_hints())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(functools.partial(answer, ident))
            elif kind == CLOSE:
                try:
                    await rec.close()
                except BaseException as err:
                    fail(ident, err)
                    await writer.drain()
                    return 1
                reply(CLOSED, ident, dump_fsm(rec.fsm, rec.write_head))
                await writer.drain()
                return 0
            else:
                log.error("unknown frame kind %d", kind)
                return 2


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(
        level=os.environ.get("RECORDER_LOG_LEVEL", "WARNING"),
        stream=sys.stderr,
        format="%(asctime)s recorder[%(process)d] %(levelname)s %(name)s %(message)s",
    )
    down_fd, up_fd, parent = int(argv[0]), int(argv[1]), int(argv[2])
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:
        sys.exit(1)  # The parent died before we could take its death signal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # An interrupt is the parent's to handle.
    status = asyncio.run(serve(down_fd, up_fd))
    # Leave without waiting for appends still in flight once the parent is gone.
    logging.shutdown()
    os._exit(status)


if __name__ == "__main__":
    main()
