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

from broker.client import AppendService, JournalClient
from recoverylog.fsm import FSM
from recoverylog.hints import validate_hints
from recoverylog.op_batch import CREATE, RENAME, WRITE, Op
from recoverylog.recorder import Recorder
from recoverylog.remote import (
    RecorderGone,
    RemoteRecorder,
    RemoteRecordingFailed,
    decode_ops,
    encode_ops,
)
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


async def test_ops_from_another_thread_are_recorded_in_order_and_close_returns_the_fsm(
    recorder_broker, rec_client: JournalClient, make_rec_log: MakeLog, tmp_path: Path
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
    recorder_broker,
    rec_service: AppendService,
    make_rec_log: MakeLog,
    tmp_path: Path,
) -> None:
    log = await make_rec_log()
    rec = await _start(recorder_broker.endpoint, log, tmp_path / "d")
    rec.record([(CREATE, "a", 0, b"")])
    await rec.barrier()
    # A new author takes the log over (as a Player's hand-off does).
    (tmp_path / "e").mkdir()
    other = await Recorder.open(FSM(log), B, tmp_path / "e", rec_service, log, fence_log=True)
    rec.record([(WRITE, "a", 0, b"zombie")])
    with pytest.raises(RemoteRecordingFailed, match="RecorderFenced"):
        await rec.barrier()
    assert rec.error is not None
    with pytest.raises(RemoteRecordingFailed):
        rec.record([(WRITE, "a", 6, b"more")])
    with pytest.raises(RemoteRecordingFailed):
        await rec.close()
    assert _gone_within(rec.proc, 5)
    await other.close()


async def test_a_killed_recorder_process_fails_pending_and_later_barriers(
    recorder_broker, make_rec_log: MakeLog, tmp_path: Path
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
    recorder_broker, make_rec_log: MakeLog, tmp_path: Path
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
    recorder_broker, make_rec_log: MakeLog, tmp_path: Path
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
