"""OpQueue alone, without threads or a loop: order and coalescing, size accounting, batches
and their application, the latched failure, discarding. (Through real threads, loops and
brokers: tests/stores/sqlite and tests/fusefs.)"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gazette.recoverylog.op_batch import CREATE, LINK, RENAME, TRUNCATE, UNLINK, WRITE, Op
from gazette.recoverylog.op_queue import OpQueue
from gazette.recoverylog.recorder import RecordingFailed


class _Sink:
    """Records the batches applied to it; fails with `fail` once set."""

    def __init__(self) -> None:
        self.batches: list[list[Op]] = []
        self.fail: BaseException | None = None

    def __call__(self, ops: Sequence[Op]) -> None:
        if self.fail is not None:
            raise self.fail
        self.batches.append(list(ops))


def test_operations_are_taken_in_order_with_contiguous_writes_coalesced() -> None:
    q = OpQueue("a/log")
    q.create("db-wal")
    q.write("db-wal", 0, b"head")
    q.write("db-wal", 4, b"page")  # Extends the run.
    q.write("db", 0, b"base")  # Another file: a new run.
    q.write("db-wal", 8, b"more")  # Back to the first file: not merged across `db`.
    q.rename("db-wal", "db.pages/1.wal")
    q.link("db", "copy")
    q.truncate("db")
    q.unlink("copy")
    assert q.take() == [
        (CREATE, "db-wal", 0, b""),
        (WRITE, "db-wal", 0, b"headpage"),
        (WRITE, "db", 0, b"base"),
        (WRITE, "db-wal", 8, b"more"),
        (RENAME, "db-wal", 0, b"db.pages/1.wal"),
        (LINK, "db", 0, b"copy"),
        (TRUNCATE, "db", 0, b""),
        (UNLINK, "copy", 0, b""),
    ]
    assert (q.ops, q.bytes, q.queued_bytes) == (8, 16, 0)
    assert q.take() == []


@pytest.mark.parametrize(
    ("path", "offset", "merged"),
    [
        ("f", 3, True),  # Contiguous.
        ("f", 2, False),  # Overlaps.
        ("f", 4, False),  # Leaves a hole.
        ("g", 3, False),  # Another file.
    ],
)
def test_a_write_is_coalesced_only_when_it_continues_the_last(
    path: str, offset: int, merged: bool
) -> None:
    q = OpQueue("a/log")
    q.write("f", 0, b"abc")
    q.write(path, offset, b"d")
    expected = (
        [(WRITE, "f", 0, b"abcd")]
        if merged
        else [(WRITE, "f", 0, b"abc"), (WRITE, path, offset, b"d")]
    )
    assert q.take() == expected


def test_a_write_keeps_a_copy_of_a_reused_buffer_and_empty_writes_are_dropped() -> None:
    q = OpQueue("a/log")
    buf = bytearray(b"one")
    q.write("f", 0, memoryview(buf))
    buf[:] = b"two"  # The caller reuses its buffer.
    q.write("f", 3, b"")
    assert q.take() == [(WRITE, "f", 0, b"one")]


def test_a_taken_batch_is_the_callers_own() -> None:
    q = OpQueue("a/log")
    empty = q.take()
    q.create("a")
    batch = q.take()
    q.create("b")  # Queued after the takes: in neither batch.
    assert empty == [] and batch == [(CREATE, "a", 0, b"")]


def test_write_says_when_a_hand_over_is_due() -> None:
    q = OpQueue("a/log", flush_bytes=10)
    assert [q.write("f", i * 4, b"1234") for i in range(3)] == [False, False, True]
    q.take()
    assert q.queued_bytes == 0 and not q.write("f", 12, b"1234")


def test_must_wait_counts_what_is_queued_or_taken_since_the_last_barrier() -> None:
    q = OpQueue("a/log", max_unsynced=10)
    q.write("f", 0, b"123456")
    assert q.unsynced_bytes == 6 and not q.must_wait
    q.take()
    q.write("f", 6, b"7890")
    assert q.unsynced_bytes == 10 and q.must_wait
    assert q.take_for_barrier() == [(WRITE, "f", 6, b"7890")]
    assert q.unsynced_bytes == 0 and not q.must_wait
    assert q.bytes == 10  # Still counted as taken.


@pytest.mark.parametrize(
    ("steps", "due"),
    [
        ([], False),
        (["create"], True),  # Queued.
        (["write"], True),  # Queued in an open run.
        (["create", "take"], True),  # Handed over: a barrier would cover it.
        (["create", "take_clean"], False),  # Handed over as no commit's.
        (["create", "take_clean", "create"], True),
        (["create", "take", "take_for_barrier"], False),
        (["create", "take_for_barrier", "write"], True),
    ],
)
def test_a_barrier_is_due_for_what_was_queued_or_handed_over_since_the_last(
    steps: list[str], due: bool
) -> None:
    q = OpQueue("a/log")
    for step in steps:
        if step == "create":
            q.create("f")
        elif step == "write":
            q.write("f", 0, b"x")
        elif step == "take":
            q.take()
        elif step == "take_clean":
            q.take(dirty=False)
        else:
            q.take_for_barrier()
    assert q.barrier_due is due


def test_apply_records_batches_and_says_which_is_the_last_taken() -> None:
    q, sink = OpQueue("a/log"), _Sink()
    assert q.apply([], sink)  # Nothing taken is outstanding.
    q.create("a")
    first = q.take()
    q.create("b")
    second = q.take()
    assert not q.apply(first, sink)  # `second` is on its way behind it.
    assert q.apply(second, sink)
    q.create("c")
    assert q.apply(q.take_for_barrier(), sink)
    assert sink.batches == [
        [],
        [(CREATE, "a", 0, b"")],
        [(CREATE, "b", 0, b"")],
        [(CREATE, "c", 0, b"")],
    ]


def test_the_first_failure_is_latched_and_stops_recording() -> None:
    seen: list[BaseException] = []
    q, sink = OpQueue("a/log", on_failure=seen.append), _Sink()
    q.check()
    q.create("a")
    q.create("b")
    first = q.take()
    q.create("c")
    second = q.take()
    broken = RuntimeError("write of unrecorded file 'a'")
    sink.fail = broken
    assert not q.apply(first, sink)
    sink.fail = None
    assert not q.apply(second, sink)  # Not recorded after the failure.
    assert sink.batches == []
    assert q.error is broken and seen == [broken]

    with pytest.raises(RecordingFailed, match="recording to a/log failed: RuntimeError") as info:
        q.check()
    assert info.value.__cause__ is broken

    later = ValueError("a barrier failed too")
    failed = q.fail(later)  # Raised by its caller; the first failure stays latched.
    assert isinstance(failed, RecordingFailed) and "ValueError" in str(failed)
    assert q.error is broken and seen == [broken]


def test_discard_drops_what_is_queued_and_anything_later() -> None:
    q, sink = OpQueue("a/log"), _Sink()
    q.create("a")
    batch = q.take()
    q.write("a", 0, b"queued")
    q.discard()
    assert q.discarded and q.queued_bytes == 0
    q.create("b")
    assert not q.write("a", 6, b"later")
    assert q.take() == [] and q.take_for_barrier() == []
    assert not q.apply(batch, sink)  # Taken before the discard, applied after: dropped.
    assert sink.batches == [] and not q.barrier_due
    q.check()  # Discarding is not a failure.
