"""RecordingLink's queueing, with a fake loop: a write is handed to the Recorder's loop as it
happens (end to end, through a real mount and broker, in test_mount.py)."""

from __future__ import annotations

from typing import Any

from gazette.fusefs._recording import RecordingLink
from gazette.recoverylog.op_batch import CREATE, WRITE


class _Loop:
    """Records what the link hands over, without running it."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    def call_soon_threadsafe(self, fn: Any, ops: list[Any], *args: Any) -> None:
        self.calls.append(ops)


class _Recorder:
    """What the link asks of a Recorder before anything runs on the loop."""

    log = "test/log"


def test_a_write_is_handed_over_at_once() -> None:
    loop = _Loop()
    link = RecordingLink(_Recorder(), loop)  # type: ignore[arg-type]  # Nothing runs.
    link.create("a")
    assert loop.calls == []  # Other ops wait for a write, a barrier or the tick.
    link.write("a", 0, b"one")
    link.write("a", 3, memoryview(b"two"))
    assert loop.calls == [
        [(CREATE, "a", 0, b""), (WRITE, "a", 0, b"one")],
        [(WRITE, "a", 3, b"two")],
    ]
    assert link.bytes == 6 and link.ops == 3
