"""RemoteRecorder: a Recorder in a process of its own, against a real broker: operations
sent from any thread are recorded in order, barriers, hints, the final FSM of a clean close,
fencing, and the process's end when its parent goes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from gazette.broker.client import AppendService, JournalClient
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.hints import validate_hints
from gazette.recoverylog.op_batch import CREATE, RENAME, WRITE, Op
from gazette.recoverylog.recorder import Recorder
from gazette.recoverylog.remote import (
    HEADER,
    MAX_IOVECS,
    RecorderGone,
    RemoteRecorder,
    RemoteRecorderFenced,
    RemoteRecordingFailed,
    decode_ops,
    encode_ops,
)
from gazette.testing.broker import BrokerProcess
from tests.recoverylog.recorder_support import (
    MakeLog,
    make_rec_log,
    read_log,
    rec_client,
    rec_service,
    recorder_broker,
    replay,
)

__all__ = ["make_rec_log", "rec_client", "rec_service", "recorder_broker"]  # Fixtures used here.

A, B = 0xA11CE, 0xB0B


async def _start(endpoint: str, log: str, directory: Path, author: int = A) -> RemoteRecorder:
    directory.mkdir(parents=True, exist_ok=True)
    return await RemoteRecorder.start(endpoint, log, FSM(log), author, directory)


def _gone_within(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    """Whether `proc` exited within `seconds` (reaping it)."""
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


async def _fenced(
    broker: BrokerProcess, service: AppendService, make_log: MakeLog, tmp_path: Path
) -> tuple[RemoteRecorder, Recorder]:
    """A remote recorder which recorded a file, and the Recorder of a new author which then
    took its log over (as a Player's hand-off does)."""
    log = await make_log()
    rec = await _start(broker.endpoint, log, tmp_path / "d")
    rec.record([(CREATE, "a", 0, b"")])
    await rec.barrier()
    (tmp_path / "e").mkdir()
    other = await Recorder.open(FSM(log), B, tmp_path / "e", service, log, fence_log=True)
    return rec, other


async def test_ops_from_another_thread_are_recorded_in_order_and_close_returns_the_fsm(
    recorder_broker: BrokerProcess,
    rec_client: JournalClient,
    make_rec_log: MakeLog,
    tmp_path: Path,
) -> None:
    log = await make_rec_log()
    rec = await _start(recorder_broker.endpoint, log, tmp_path / "d")
    assert rec.pid != os.getpid() and rec.author == A
    ops: list[Op] = [(CREATE, "a", 0, b""), (WRITE, "a", 0, b"hello ")]
    # The store's thread sends; the loop waits.
    sender = threading.Thread(target=rec.record, args=(ops,))
    sender.start()
    sender.join()
    rec.record([(WRITE, "a", 6, b"world" * 100_000), (RENAME, "a", 0, b"b")])
    head = await rec.barrier()
    assert head == rec.write_head > 500_000
    hints = await rec.build_hints()
    validate_hints(hints)
    fsm, final_head = await rec.close()
    assert final_head == head
    assert set(fsm.links) == {"/b"}
    assert rec.proc.returncode == 0

    played = replay(await read_log(rec_client, log), log)
    assert played.files() == {"/b": b"hello " + b"world" * 100_000}
    # The recorder is closed: nothing more is taken.
    with pytest.raises(RecorderGone):
        rec.record([(CREATE, "c", 0, b"")])
    with pytest.raises(RecorderGone):
        await rec.barrier()


async def test_a_fenced_remote_recorder_fails_its_barriers_and_refuses_ops(
    recorder_broker: BrokerProcess,
    rec_service: AppendService,
    make_rec_log: MakeLog,
    tmp_path: Path,
) -> None:
    rec, other = await _fenced(recorder_broker, rec_service, make_rec_log, tmp_path)
    rec.record([(WRITE, "a", 0, b"zombie")])
    with pytest.raises(RemoteRecorderFenced, match="RecorderFenced"):
        await rec.barrier()
    assert isinstance(rec.error, RemoteRecorderFenced)
    with pytest.raises(RemoteRecordingFailed):
        rec.record([(WRITE, "a", 6, b"more")])
    with pytest.raises(RemoteRecordingFailed):
        await rec.close()
    assert _gone_within(rec.proc, 5)
    await other.close()


async def test_a_barrier_after_a_failed_background_append_is_answered_not_fatal(
    recorder_broker: BrokerProcess,
    rec_service: AppendService,
    make_rec_log: MakeLog,
    tmp_path: Path,
) -> None:
    rec, other = await _fenced(recorder_broker, rec_service, make_rec_log, tmp_path)
    # The child appends this op on its own and finds the fence: its Recorder breaks with no
    # barrier waiting. The next barrier request then fails at once, in the child...
    rec.record([(WRITE, "a", 0, b"zombie")])
    await asyncio.sleep(1.0)
    with pytest.raises(RemoteRecorderFenced):
        await rec.barrier()
    # ...which answers it rather than dying (a dead child's barriers raise RecorderGone).
    await asyncio.sleep(0.5)
    assert rec.proc.poll() is None
    with pytest.raises(RemoteRecorderFenced):
        await rec.barrier()
    assert not isinstance(rec.error, RecorderGone)
    rec.kill()
    await other.close()


async def test_a_killed_recorder_process_fails_pending_and_later_barriers(
    recorder_broker: BrokerProcess, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await _start(recorder_broker.endpoint, log, tmp_path / "d")
    rec.record([(CREATE, "a", 0, b"")])
    await rec.barrier()
    os.kill(rec.pid, signal.SIGSTOP)  # Holds the next barrier...
    pending = rec.barrier()
    await asyncio.sleep(0.1)
    assert not pending.done()
    os.kill(rec.pid, signal.SIGKILL)  # ...until the process dies.
    with pytest.raises(RecorderGone, match="exited"):
        await asyncio.wait_for(pending, 10)
    with pytest.raises(RecorderGone):
        await rec.barrier()
    with pytest.raises(RecorderGone):
        rec.record([(WRITE, "a", 0, b"x")])
    rec.kill()  # Idempotent once gone.


async def test_the_process_ends_when_its_parent_goes(
    recorder_broker: BrokerProcess, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await _start(recorder_broker.endpoint, log, tmp_path / "d")
    rec.record([(CREATE, "a", 0, b"")])
    await rec.barrier()
    # A dead parent's sockets close: the child sees the end of its input and exits.
    rec._down.close()
    assert await asyncio.get_running_loop().run_in_executor(None, _gone_within, rec.proc, 10)
    rec.kill()


async def test_an_fsm_with_remaining_hints_is_refused(
    recorder_broker: BrokerProcess, make_rec_log: MakeLog, tmp_path: Path
) -> None:
    log = await make_rec_log()
    rec = await _start(recorder_broker.endpoint, log, tmp_path / "d")
    rec.record([(CREATE, "a", 0, b"")])
    hints = await rec.build_hints()
    await rec.close()
    # An FSM of hints not played through: it does not know every file yet.
    with pytest.raises(ValueError, match="remaining hints"):
        await RemoteRecorder.start(
            recorder_broker.endpoint, log, FSM.from_hints(hints), B, tmp_path
        )


def test_operations_round_trip_through_their_encoding_and_bad_payloads_are_refused() -> None:
    ops: list[Op] = [
        (CREATE, "dir/ä", 0, b""),
        (WRITE, "dir/ä", 1 << 40, b"x" * 70_000),
        (RENAME, "dir/ä", 0, b"b"),
    ]
    payload = b"".join(encode_ops(ops))
    for decoded in (decode_ops(payload), decode_ops(bytearray(payload))):
        assert [(k, p, o, bytes(d)) for k, p, o, d in decoded] == ops
    with pytest.raises(ValueError, match="past the end"):
        decode_ops(payload[:-1])
    with pytest.raises(ValueError, match="malformed"):
        decode_ops(payload[:5])


class _ShortSocket:
    """A socket taking at most `chunk` bytes a call; fails after `fail_after` bytes."""

    def __init__(self, chunk: int, fail_after: int | None = None) -> None:
        self.chunk, self.fail_after = chunk, fail_after
        self.data = bytearray()
        self.calls: list[int] = []
        self.shut = False

    def sendmsg(self, buffers: list[memoryview]) -> int:
        self.calls.append(len(buffers))
        if self.fail_after is not None and len(self.data) >= self.fail_after:
            raise TimeoutError("timed out")
        flat = b"".join(bytes(b) for b in buffers)[: self.chunk]
        self.data += flat
        return len(flat)

    def shutdown(self, how: int) -> None:
        self.shut = True


def _bare(sock: _ShortSocket) -> RemoteRecorder:
    rec = RemoteRecorder.__new__(RemoteRecorder)
    rec._down = sock  # type: ignore[assignment]
    rec._lock = threading.Lock()
    rec._cut = False
    rec._error = None
    rec.log = "log"
    rec.proc = subprocess.Popen(["true"])
    rec.proc.wait()
    return rec


def test_a_frame_is_sent_whole_however_the_socket_cuts_it() -> None:
    ops: list[Op] = [(WRITE, "f", i, bytes([i % 251]) * 7) for i in range(600)]
    sock = _ShortSocket(chunk=1000)
    _bare(sock).record(ops)
    payload = b"".join(encode_ops(ops))
    assert bytes(sock.data[HEADER.size :]) == payload
    assert HEADER.unpack(bytes(sock.data[: HEADER.size]))[2] == len(payload)
    assert max(sock.calls) <= MAX_IOVECS < 2 * len(ops)  # Many calls, none too large.


def test_a_frame_cut_short_cuts_the_recorder_off() -> None:
    sock = _ShortSocket(chunk=100, fail_after=300)
    rec = _bare(sock)
    with pytest.raises(RecorderGone, match="timed out"):
        rec.record([(WRITE, "f", 0, b"x" * 1000)])
    assert sock.shut and isinstance(rec.error, RecorderGone)
    sent = len(sock.data)
    with pytest.raises(RecorderGone):  # Nothing more goes down a desynchronised stream.
        rec.record([(WRITE, "f", 0, b"y")])
    assert len(sock.data) == sent
