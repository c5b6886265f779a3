"""Sequencer scenarios (after upstream's message/sequencer_test.go) and a model-based fuzz test."""

from __future__ import annotations

import bisect
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.message.envelope import Envelope
from gazette.message.sequencer import (
    DEFAULT_PRUNE_HORIZON_NS,
    MustStartReplay,
    ProducerKey,
    ProducerState,
    QueueOutcome,
    ReplayError,
    Sequencer,
    SequencerStateError,
    _decode,
    states_from_checkpoint,
    states_to_checkpoint,
)
from gazette.message.uuid import (
    Clock,
    Flags,
    ProducerID,
    build_uuid,
    get_clock,
    get_flags,
    get_producer_id,
)

Q = QueueOutcome
JOURNAL = "test/journal"
A = ProducerID(bytes.fromhex("01000000000a"))
B = ProducerID(bytes.fromhex("01000000000b"))
C = ProducerID(bytes.fromhex("01000000000c"))
CONT, ACK, OUT = Flags.CONTINUE_TXN, Flags.ACK_TXN, Flags.OUTSIDE_TXN


@dataclass(eq=False)
class Msg:
    """A tiny Message: a UUID and nothing else."""

    uid: uuid.UUID | None

    def get_uuid(self) -> uuid.UUID | None:
        return self.uid

    def set_uuid(self, u: uuid.UUID) -> None:
        self.uid = u

    def new_acknowledgement(self, journal: str) -> Msg:
        return Msg(None)


class Gen:
    """Envelopes of consecutive journal records, 100 bytes each with 2 dead bytes between."""

    def __init__(self, journal: str = JOURNAL) -> None:
        self.journal = journal
        self.offset = 0

    def __call__(self, producer: bytes, clock: int, flags: int) -> Envelope:
        u = build_uuid(ProducerID(producer), Clock(clock), flags)
        env = Envelope(self.journal, self.offset, self.offset + 100, Msg(u))
        self.offset += 102
        return env

    def zero(self, with_uuid: bool = True) -> Envelope:
        """A message whose UUID is all zeros (or missing)."""
        env = Envelope(
            self.journal,
            self.offset,
            self.offset + 100,
            Msg(uuid.UUID(int=0) if with_uuid else None),
        )
        self.offset += 102
        return env


def queue(seq: Sequencer, *envs: Envelope) -> list[QueueOutcome]:
    return [seq.queue_uncommitted(e) for e in envs]


def clock_of(env: Envelope) -> int:
    return _decode(env)[1]


def expect_dequeue(seq: Sequencer, *expect: Envelope) -> None:
    """Step through exactly `expect`, checking the span tightens behind each step."""
    for i, env in enumerate(expect):
        assert seq.step() is True
        assert seq.dequeued is env
        emit = seq._emit
        assert emit is not None
        assert emit.begin == env.begin
        if i > 0:
            assert emit.min_clock == clock_of(expect[i - 1])
    assert seq.step() is False
    assert seq.dequeued is None
    assert seq.step() is False  # Idempotent once drained.

    last = expect[-1]
    producer, clock, _ = _decode(last)
    if clock != 0:
        # The producer is ready for its next sequence.
        p = seq._partials[last.journal, producer]
        assert (p.min_clock, p.max_clock, p.begin, p.ring_start, p.ring_stop) == (
            clock,
            clock,
            -1,
            -1,
            -1,
        )
    assert seq.read_through()[last.journal] == last.end


def expect_replay(seq: Sequencer, begin: int, end: int, *envs: Envelope) -> None:
    """Check the replay demanded, then feed `envs` as the re-read bytes."""
    with pytest.raises(MustStartReplay) as err:
        seq.step()
    assert (err.value.journal, err.value.begin, err.value.end) == (JOURNAL, begin, end)
    assert seq.replay_range() == (JOURNAL, begin, end)
    assert seq.dequeued is None
    seq.start_replay(envs)


def spans(seq: Sequencer) -> dict[bytes, tuple[int, int, int, int, int]]:
    """producer -> (begin, ring_start, ring_stop, min_clock, max_clock)."""
    return {
        p.producer.to_bytes(6, "big"): (
            p.begin,
            p.ring_start,
            p.ring_stop,
            p.min_clock,
            p.max_clock,
        )
        for p in seq._partials.values()
    }


# -- Decoding ------------------------------------------------------------------------------


@given(
    producer=st.binary(min_size=6, max_size=6),
    clock=st.integers(0, (1 << 64) - 1),
    flags=st.integers(0, 0x3FF),
)
def test_decode_matches_uuid_getters(producer: bytes, clock: int, flags: int) -> None:
    u = build_uuid(ProducerID(producer), Clock(clock), flags)
    got = _decode(Envelope(JOURNAL, 0, 1, Msg(u)))
    assert got == (int.from_bytes(get_producer_id(u), "big"), get_clock(u), int(get_flags(u)))


# -- Ring ----------------------------------------------------------------------------------


def test_ring_add_and_evict() -> None:
    seq = Sequencer(ring_size=5)
    gen = Gen()
    e = {i: gen(A if i in (1, 3, 4) else B, i * 100, CONT) for i in range(1, 12)}
    assert seq._ring == [None] * 5
    assert not seq.has_pending()

    def check(
        ring: list[int | None],
        nxt: list[int],
        head: int,
        want: dict[bytes, tuple[int, int, int, int, int]],
    ) -> None:
        assert seq._ring == [None if i is None else e[i] for i in ring]
        assert seq._next == nxt
        assert seq._head == head
        assert spans(seq) == want

    b1, b2 = e[1].begin, e[2].begin
    assert queue(seq, e[1]) == [Q.CONTINUE_BEGIN_SPAN]
    check([1, None, None, None, None], [-1] * 5, 1, {A: (b1, 0, 0, 99, 100)})
    assert seq.has_pending()
    assert seq.read_through() == {JOURNAL: e[1].end}  # Continuations are read through.

    assert queue(seq, e[2]) == [Q.CONTINUE_BEGIN_SPAN]
    check([1, 2, None, None, None], [-1] * 5, 2, {A: (b1, 0, 0, 99, 100), B: (b2, 1, 1, 199, 200)})

    assert queue(seq, e[3], e[4]) == [Q.CONTINUE_EXTEND_SPAN] * 2
    check(
        [1, 2, 3, 4, None], [2, -1, 3, -1, -1], 4, {A: (b1, 0, 3, 99, 400), B: (b2, 1, 1, 199, 200)}
    )

    assert queue(seq, e[5]) == [Q.CONTINUE_EXTEND_SPAN]
    check([1, 2, 3, 4, 5], [2, 4, 3, -1, -1], 0, {A: (b1, 0, 3, 99, 400), B: (b2, 1, 4, 199, 500)})

    # The ring wraps: e1 (A's head) is evicted, but A's span still begins there.
    assert queue(seq, e[6]) == [Q.CONTINUE_EXTEND_SPAN]
    check([6, 2, 3, 4, 5], [-1, 4, 3, -1, 0], 1, {A: (b1, 2, 3, 99, 400), B: (b2, 1, 0, 199, 600)})

    assert queue(seq, e[7], e[8]) == [Q.CONTINUE_EXTEND_SPAN] * 2
    check([6, 7, 8, 4, 5], [1, 2, -1, -1, 0], 3, {A: (b1, 3, 3, 99, 400), B: (b2, 4, 2, 199, 800)})

    # A's last held envelope leaves the ring; its span is still tracked.
    assert queue(seq, e[9]) == [Q.CONTINUE_EXTEND_SPAN]
    check([6, 7, 8, 9, 5], [1, 2, 3, -1, 0], 4, {A: (b1, -1, -1, 99, 400), B: (b2, 4, 3, 199, 900)})

    assert queue(seq, e[10], e[11]) == [Q.CONTINUE_EXTEND_SPAN] * 2
    check(
        [11, 7, 8, 9, 10], [-1, 2, 3, 4, 0], 1, {A: (b1, -1, -1, 99, 400), B: (b2, 1, 0, 199, 1100)}
    )
    assert seq.read_through() == {JOURNAL: e[11].end}


# -- Transactions --------------------------------------------------------------------------


def test_transaction_sequences() -> None:
    gen = Gen()
    seq = Sequencer(ring_size=3)

    # Duplicates inside a span are dropped; the whole span is in the ring.
    a1, a2, a1dup, a2dup, a3ack = (
        gen(A, 1, CONT),
        gen(A, 2, CONT),
        gen(A, 1, CONT),
        gen(A, 2, CONT),
        gen(A, 3, ACK),
    )
    assert queue(seq, a1, a2, a1dup, a2dup, a3ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_RING,
    ]
    expect_dequeue(seq, a1, a2, a3ack)
    assert not seq.has_pending()

    # An ACK with nothing before it commits itself.
    a4ack = gen(A, 4, ACK)
    assert queue(seq, a4ack) == [Q.ACK_EMPTY]
    expect_dequeue(seq, a4ack)

    # An ACK commits only the clocks at or below its own.
    a5, a7noack, a6ack = gen(A, 5, CONT), gen(A, 7, CONT), gen(A, 6, ACK)
    assert queue(seq, a5, a7noack, a6ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_dequeue(seq, a5, a6ack)

    # Rollback to the last ACK, interleaved with producer B.
    b1, a7, a8, b2, a6abort = (
        gen(B, 1, CONT),
        gen(A, 7, CONT),
        gen(A, 8, CONT),
        gen(B, 2, CONT),
        gen(A, 6, ACK),
    )
    assert queue(seq, a7, b1, a7, a8, b2, a6abort) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_ROLLBACK,
    ]
    assert seq._emit is None and seq.step() is False
    assert spans(seq) == {A: (-1, -1, -1, 6, 6), B: (b1.begin, 1, 1, 0, 2)}

    # B's ACK needs a replay: b1 was evicted.
    b3ack = gen(B, 3, ACK)
    assert queue(seq, b3ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b2.begin, b1, a7, a8)
    expect_dequeue(seq, b1, b2, b3ack)

    # A replayed span with duplicates from inside and before it, in the ring and the replay.
    b4, b1dup, b4dup, b5, b6, b2dup, b7, b8ack = (
        gen(B, 4, CONT),
        gen(B, 1, CONT),
        gen(B, 4, CONT),
        gen(B, 5, CONT),
        gen(B, 6, CONT),
        gen(B, 2, CONT),
        gen(B, 7, CONT),
        gen(B, 8, ACK),
    )
    assert queue(seq, b4, b1dup, b4dup, b5, b6, b2dup, b7, b8ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b4.begin, b6.begin, b4, b1dup, b4dup, b5)
    expect_dequeue(seq, b4, b5, b6, b7, b8ack)

    # A partial commit whose ring entries are all rolled back.
    b9, b11no, b12no, b13no, b10ack = (
        gen(B, 9, CONT),
        gen(B, 11, CONT),
        gen(B, 12, CONT),
        gen(B, 13, CONT),
        gen(B, 10, ACK),
    )
    assert queue(seq, b9, b11no, b12no, b13no, b10ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b9.begin, b12no.begin, b9, b11no)
    expect_dequeue(seq, b9, b10ack)
    assert not seq.has_pending()

    # Two interleaved spans, each needing its own replay.
    b11, a7, a8, b12, a9ack, b13ack = (
        gen(B, 11, CONT),
        gen(A, 7, CONT),
        gen(A, 8, CONT),
        gen(B, 12, CONT),
        gen(A, 9, ACK),
        gen(B, 13, ACK),
    )
    assert queue(seq, b11, a7, a8, b12, a9ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a7.begin, a8.begin, a7)
    expect_dequeue(seq, a7, a8, a9ack)
    assert seq.has_pending()
    assert queue(seq, b13ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b11.begin, b12.begin, b11, a7, a8)
    expect_dequeue(seq, b11, b12, b13ack)
    assert not seq.has_pending()

    # An ACK below the last one resets the producer's clock; its clocks may then be reused.
    b8reset, b9reuse, b10reuse = gen(B, 8, ACK), gen(B, 9, CONT), gen(B, 10, ACK)
    assert queue(seq, b8reset, b9reuse, b10reuse) == [
        Q.ACK_ROLLBACK,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_dequeue(seq, b9reuse, b10reuse)


def test_transactions_without_a_ring() -> None:
    gen = Gen()
    seq = Sequencer(ring_size=0)  # Taken as 1: only the committing message is held.
    a1, a2, b1, a1dup, a2dup, a3ack, b2, b3ack = (
        gen(A, 1, CONT),
        gen(A, 2, CONT),
        gen(B, 1, CONT),
        gen(A, 1, CONT),
        gen(A, 2, CONT),
        gen(A, 3, ACK),
        gen(B, 2, CONT),
        gen(B, 3, ACK),
    )
    assert queue(seq, a1, a2, b1, a1dup, a2dup, a3ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a1.begin, a3ack.begin, a1, a2, b1, a1dup, a2dup)
    expect_dequeue(seq, a1, a2, a3ack)

    assert queue(seq, b2, b3ack) == [Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b3ack.begin, b1, a1dup, a2dup, a3ack, b2)
    expect_dequeue(seq, b1, b2, b3ack)


def test_outside_transaction_messages(caplog: pytest.LogCaptureFixture) -> None:
    gen = Gen()
    seq = Sequencer(ring_size=0)

    # They commit at once.
    a1, a2 = gen(A, 1, OUT), gen(A, 2, OUT)
    assert queue(seq, a1) == [Q.OUTSIDE_COMMIT]
    expect_dequeue(seq, a1)
    assert queue(seq, a2) == [Q.OUTSIDE_COMMIT]
    expect_dequeue(seq, a2)

    # Duplicates are ignored, but read through.
    a1dup, a2dup = gen(A, 1, OUT), gen(A, 2, OUT)
    assert queue(seq, a1dup, a2dup) == [Q.OUTSIDE_ALREADY_ACKED] * 2
    assert seq.step() is False
    assert seq.read_through() == {JOURNAL: a2dup.end}

    # An open span before one is discarded.
    a3, a4, a5 = gen(A, 3, CONT), gen(A, 4, CONT), gen(A, 5, OUT)
    with caplog.at_level(logging.ERROR, logger="gazette.message.sequencer"):
        assert queue(seq, a3, a4, a5) == [
            Q.CONTINUE_BEGIN_SPAN,
            Q.CONTINUE_EXTEND_SPAN,
            Q.OUTSIDE_COMMIT,
        ]
    assert "OUTSIDE_TXN after an open CONTINUE_TXN span" in caplog.text
    expect_dequeue(seq, a5)

    # Unknown flags are handled as OUTSIDE_TXN.
    a6, a7bad, a7baddup = gen(A, 6, CONT), gen(A, 7, 0x100), gen(A, 7, 0x100)
    assert queue(seq, a6, a7bad) == [Q.CONTINUE_BEGIN_SPAN, Q.OUTSIDE_COMMIT]
    expect_dequeue(seq, a7bad)
    assert queue(seq, a7baddup) == [Q.OUTSIDE_ALREADY_ACKED]
    assert seq.step() is False

    # Zero (or missing) UUIDs always commit, and aren't tracked.
    for z in (gen.zero(), gen.zero(), gen.zero(with_uuid=False)):
        assert queue(seq, z) == [Q.OUTSIDE_COMMIT]
        expect_dequeue(seq, z)
    assert spans(seq) == {A: (-1, -1, -1, 7, 7)}
    assert seq.read_through() == {JOURNAL: z.end}


# A producer restored to (last_ack=10, begin), then one message: the outcome.
@pytest.mark.parametrize(
    ("begin", "flags", "clock", "outcome"),
    [
        (-1, OUT, 9, Q.OUTSIDE_ALREADY_ACKED),
        (-1, OUT, 10, Q.OUTSIDE_ALREADY_ACKED),
        (-1, OUT, 11, Q.OUTSIDE_COMMIT),
        (500, OUT, 11, Q.OUTSIDE_COMMIT),
        (-1, CONT, 10, Q.CONTINUE_ALREADY_ACKED),
        (-1, CONT, 11, Q.CONTINUE_BEGIN_SPAN),
        (500, CONT, 10, Q.CONTINUE_ALREADY_ACKED),
        (500, CONT, 11, Q.CONTINUE_EXTEND_SPAN),  # Restored: max_clock is the last ACK.
        (-1, ACK, 9, Q.ACK_ROLLBACK),
        (-1, ACK, 10, Q.ACK_ROLLBACK),
        (-1, ACK, 11, Q.ACK_EMPTY),
        (500, ACK, 10, Q.ACK_ROLLBACK),
        (500, ACK, 11, Q.ACK_COMMIT_REPLAY),  # The span began before the restore.
        (-1, 0x3, 11, Q.OUTSIDE_COMMIT),  # Both bits: unknown, so OUTSIDE_TXN.
    ],
)
def test_outcome_of_one_message(begin: int, flags: int, clock: int, outcome: QueueOutcome) -> None:
    seq = Sequencer({(JOURNAL, A): ProducerState(10, begin)}, ring_size=4, offsets={JOURNAL: 900})
    gen = Gen()
    gen.offset = 1000
    env = gen(A, clock, flags)
    assert seq.queue_uncommitted(env) is outcome
    assert outcome.commits == (seq._emit is not None)
    if outcome.commits:
        assert seq.read_through() == {JOURNAL: 900}  # Not until the sequence is drained.
    else:
        assert seq.read_through() == {JOURNAL: env.end}


def test_ack_below_last_ack_falls_back_to_at_least_once(caplog: pytest.LogCaptureFixture) -> None:
    gen = Gen()
    seq = Sequencer()
    a10, a11ack = gen(A, 10, CONT), gen(A, 11, ACK)
    assert queue(seq, a10, a11ack) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_RING]
    expect_dequeue(seq, a10, a11ack)

    # An upstream shard recovered an older checkpoint and re-sends its ACK intent for clock 5.
    a5ack = gen(A, 5, ACK)
    with caplog.at_level(logging.ERROR, logger="gazette.message.sequencer"):
        assert queue(seq, a5ack) == [Q.ACK_ROLLBACK]
    assert "below the last ACK" in caplog.text
    assert seq.checkpoint(None) == {(JOURNAL, A): ProducerState(5, -1)}

    # It re-publishes; clocks 6..11 are processed again, rather than risk never being processed.
    a6, a10again, a11again = gen(A, 6, CONT), gen(A, 10, CONT), gen(A, 11, ACK)
    assert queue(seq, a6, a10again, a11again) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_dequeue(seq, a6, a10again, a11again)
    # An ACK equal to the last is a plain rollback and logs nothing.
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="gazette.message.sequencer"):
        assert queue(seq, gen(A, 11, ACK)) == [Q.ACK_ROLLBACK]
    assert caplog.text == ""


# -- Checkpoints ---------------------------------------------------------------------------


def test_states_round_trip() -> None:
    gen = Gen()
    seq1 = Sequencer(ring_size=12)
    a1, a2, b1, b2, c1ack, b3ack, c2, c1rollback, a3ack = (
        gen(A, 1, CONT),
        gen(A, 2, CONT),
        gen(B, 1, CONT),
        gen(B, 2, CONT),
        gen(C, 1, ACK),
        gen(B, 3, ACK),
        gen(C, 2, CONT),
        gen(C, 1, ACK),
        gen(A, 3, ACK),
    )
    z1 = gen.zero()

    assert queue(seq1, a1, a2, b1, b2, c1ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_EMPTY,
    ]
    expect_dequeue(seq1, c1ack)
    assert queue(seq1, z1) == [Q.OUTSIDE_COMMIT]
    expect_dequeue(seq1, z1)

    # Spans count as pending only if opened since the last checkpoint.
    assert seq1.has_pending()
    states, offsets = seq1.checkpoint(None), seq1.read_through()
    assert not seq1.has_pending()

    seq2 = Sequencer(states, ring_size=12, offsets=offsets)
    expect = {
        (JOURNAL, A): ProducerState(0, a1.begin),
        (JOURNAL, B): ProducerState(0, b1.begin),
        (JOURNAL, C): ProducerState(1, -1),
    }
    assert states == expect
    assert seq2.checkpoint(None) == expect
    assert offsets == seq2.read_through() == {JOURNAL: z1.end}

    # Both produce the same output; only seq2 needs replays.
    assert queue(seq1, b3ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, b3ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, b1.begin, b3ack.begin, b1, b2, c1ack)
    expect_dequeue(seq1, b1, b2, b3ack)
    expect_dequeue(seq2, b1, b2, b3ack)

    for seq in (seq1, seq2):
        assert queue(seq, c2, c1rollback) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
        assert seq.step() is False
    assert queue(seq1, a3ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, a3ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a3ack.begin, a1, a2, b1, b2, c1ack)
    expect_dequeue(seq1, a1, a2, a3ack)
    expect_dequeue(seq2, a1, a2, a3ack)


def test_states_round_trip_during_dequeue() -> None:
    gen = Gen()
    seq1 = Sequencer(ring_size=12)
    a1, a2, a3ack, a4, a5, a6ack = (
        gen(A, 1, CONT),
        gen(A, 2, CONT),
        gen(A, 3, ACK),
        gen(A, 4, CONT),
        gen(A, 5, CONT),
        gen(A, 6, ACK),
    )

    def restore(seq: Sequencer) -> Sequencer:
        # Twice, to show a restored Sequencer checkpoints the same states.
        once = Sequencer(seq.checkpoint(None), 12, seq.read_through())
        return Sequencer(once.checkpoint(None), 12, once.read_through())

    assert queue(seq1, a1, a2, a3ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    assert seq1.step() and seq1.dequeued is a1
    # Crash here, before a1 is processed: the state is as before a3ack.
    seq2 = restore(seq1)
    for seq in (seq1, seq2):
        assert seq.checkpoint(None) == {(JOURNAL, A): ProducerState(0, a1.begin)}
        assert seq.read_through() == {JOURNAL: a2.end}

    assert queue(seq2, a3ack) == [Q.ACK_COMMIT_REPLAY]  # seq2 reads a3ack again.
    expect_replay(seq2, a1.begin, a3ack.begin, a1, a2)
    assert seq1.step() and seq1.dequeued is a2
    assert seq1.step() and seq1.dequeued is a3ack
    assert not seq1.step()
    expect_dequeue(seq2, a1, a2, a3ack)

    # Crash partway through the next sequence: a4 is processed, a5 isn't.
    assert queue(seq1, a4, a5, a6ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    assert seq1.step() and seq1.dequeued is a4
    assert seq1.step() and seq1.dequeued is a5
    seq2 = restore(seq1)
    for seq in (seq1, seq2):
        assert seq.checkpoint(None) == {(JOURNAL, A): ProducerState(4, a5.begin)}
        assert seq.read_through() == {JOURNAL: a5.end}

    assert queue(seq2, a6ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a5.begin, a6ack.begin, a5)  # Not a4.
    expect_dequeue(seq2, a5, a6ack)


def test_checkpoint_after_processing_the_last_message_of_a_sequence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A consumer transaction may close right after consuming a committed message, before
    stepping past it: it calls `mark_processed`, then checkpoints. When that message ends its
    sequence (an OUTSIDE_TXN message, or the committing ACK), the checkpoint is the one
    upstream writes after stepping: no open span, read through the message. Restored, the
    Sequencer goes on over committed-only input without reporting a discarded span."""
    gen = Gen()
    seq = Sequencer(ring_size=4)
    o1, o2, o3 = gen(A, 1, OUT), gen(A, 2, OUT), gen(A, 3, OUT)
    assert queue(seq, o1) == [Q.OUTSIDE_COMMIT]
    expect_dequeue(seq, o1)
    assert queue(seq, o2) == [Q.OUTSIDE_COMMIT]
    assert seq.step() and seq.dequeued is o2
    seq.mark_processed()
    states, offsets = seq.checkpoint(None), seq.read_through()
    assert states == {(JOURNAL, A): ProducerState(2, -1)}
    assert offsets == {JOURNAL: o2.end}
    assert not seq.step()  # The sequence is complete.
    assert seq.dequeued is None

    restored = Sequencer(states, ring_size=4, offsets=offsets)
    with caplog.at_level(logging.ERROR, logger="gazette.message.sequencer"):
        for s in (seq, restored):
            assert queue(s, o3) == [Q.OUTSIDE_COMMIT]
            expect_dequeue(s, o3)
            assert not s.has_pending()
    assert not caplog.records, caplog.text

    # The same for a transactional sequence: processing its ACK completes it, while
    # processing a message inside it leaves the rest of the span to deliver.
    b1, b2, b3ack = gen(B, 1, CONT), gen(B, 2, CONT), gen(B, 3, ACK)
    assert queue(seq, b1, b2, b3ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    assert seq.step() and seq.dequeued is b1
    seq.mark_processed()
    assert seq.checkpoint(None)[JOURNAL, B] == ProducerState(1, b1.begin)
    assert seq.read_through() == {JOURNAL: b2.end}
    assert seq.step() and seq.dequeued is b2
    assert seq.step() and seq.dequeued is b3ack
    seq.mark_processed()
    assert seq.checkpoint(None)[JOURNAL, B] == ProducerState(3, -1)
    assert seq.read_through() == {JOURNAL: b3ack.end}
    assert not seq.step()


def test_restored_state_of_a_processed_outside_message_read_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Checkpoints written before `mark_processed` completed a sequence hold, for a
    consumed OUTSIDE_TXN message, the producer state (its clock, begin = its offset) with
    reading resumed at that message. Read again it is a duplicate, and must not leave a span
    open: the producer's next committed message is not 'after an open CONTINUE_TXN span'."""
    gen = Gen()
    o1, o2 = gen(A, 1, OUT), gen(A, 2, OUT)
    seq = Sequencer({(JOURNAL, A): ProducerState(1, o1.begin)}, offsets={JOURNAL: o1.begin})
    with caplog.at_level(logging.ERROR, logger="gazette.message.sequencer"):
        assert queue(seq, o1) == [Q.OUTSIDE_ALREADY_ACKED]
        assert not seq.step()
        assert not seq.has_pending()
        assert seq.checkpoint(None) == {(JOURNAL, A): ProducerState(1, -1)}
        assert queue(seq, o2) == [Q.OUTSIDE_COMMIT]
        expect_dequeue(seq, o2)
    assert not caplog.records, caplog.text


def test_checkpoint_prunes_idle_producers() -> None:
    gen = Gen()
    seq = Sequencer(ring_size=12)
    # Clock units are 100 ns, above 4 bits of counter.
    a_cont, b_cont, b_ack, c_cont = (
        gen(A, 10 << 4, CONT),
        gen(B, 19 << 4, CONT),
        gen(B, 20 << 4, ACK),
        gen(C, 30 << 4, CONT),
    )
    assert queue(seq, a_cont, b_cont, b_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_dequeue(seq, b_cont, b_ack)
    assert queue(seq, c_cont) == [Q.CONTINUE_BEGIN_SPAN]

    a = ((JOURNAL, A), ProducerState((10 << 4) - 1, a_cont.begin))
    b = ((JOURNAL, B), ProducerState(20 << 4, -1))
    c = ((JOURNAL, C), ProducerState((30 << 4) - 1, c_cont.begin))
    # Idleness is measured from the journal's newest last-ACK clock, C's ((30 << 4) - 1).
    # Like upstream, an idle producer goes even with a span open: it is taken as abandoned.
    for horizon_ns, expect in [
        (None, [a, b, c]),
        (0, [a, b, c]),
        (20 * 100, [a, b, c]),
        (19 * 100, [b, c]),
        (1, [c]),
    ]:
        assert seq.checkpoint(horizon_ns) == dict(expect)
        assert len(seq._partials) == len(expect)


def test_checkpoint_pruning_is_per_journal_and_defaults_to_a_day() -> None:
    day = 24 * 3600 * 10_000_000 << 4  # One day in Clock units.
    gx, gy = Gen("x"), Gen("y")
    seq = Sequencer()
    old_x, new_x = gx(A, 1000 << 4, OUT), gx(B, (1000 << 4) + day + 16, OUT)
    old_y = gy(A, 1000 << 4, OUT)  # The only producer of y: never idle relative to y.
    for env in (old_x, new_x, old_y):
        assert queue(seq, env) == [Q.OUTSIDE_COMMIT]
        expect_dequeue(seq, env)
    assert DEFAULT_PRUNE_HORIZON_NS == 24 * 3600 * 10**9
    assert set(seq.checkpoint()) == {("x", B), ("y", A)}


def test_checkpoint_keeps_the_sequence_being_dequeued() -> None:
    gen = Gen()
    seq = Sequencer()
    b_new = gen(B, 1000 << 4, OUT)
    a_cont, a_ack = gen(A, 10 << 4, CONT), gen(A, (10 << 4) + 1, ACK)  # Far older clocks.
    queue(seq, b_new)
    expect_dequeue(seq, b_new)
    assert queue(seq, a_cont, a_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_RING]
    assert seq.step() and seq.dequeued is a_cont
    assert seq.checkpoint(100) == {
        (JOURNAL, A): ProducerState((10 << 4) - 1, a_cont.begin),
        (JOURNAL, B): ProducerState(1000 << 4, -1),
    }
    assert seq.step() and seq.dequeued is a_ack
    assert not seq.step()
    assert seq.checkpoint(100) == {(JOURNAL, B): ProducerState(1000 << 4, -1)}


def test_has_pending() -> None:
    gen = Gen()
    seq = Sequencer()
    assert not seq.has_pending()
    a1, b1 = gen(A, 1, CONT), gen(B, 1, OUT)
    queue(seq, a1)
    assert seq.has_pending()
    seq.checkpoint(None)
    assert not seq.has_pending()  # a1's span opened before the checkpoint.
    queue(seq, b1)
    expect_dequeue(seq, b1)
    assert not seq.has_pending()  # Committed messages aren't pending.
    a2, a3ack, a4, a5ack = gen(A, 2, CONT), gen(A, 3, ACK), gen(A, 4, CONT), gen(A, 5, ACK)
    queue(seq, a2)
    assert not seq.has_pending()  # Extending a span doesn't count: it began before.
    queue(seq, a3ack)
    expect_dequeue(seq, a1, a2, a3ack)
    assert not seq.has_pending()
    queue(seq, a4)
    assert seq.has_pending()
    queue(seq, a5ack)
    assert seq.has_pending()  # Committed, but not yet dequeued.
    expect_dequeue(seq, a4, a5ack)
    assert not seq.has_pending()


def test_producer_states_convert_to_checkpoint_shape() -> None:
    states = {
        ("j/2", B): ProducerState(7, -1),
        ("j/1", B): ProducerState(5, 300),
        ("j/1", A): ProducerState((1 << 64) - 1, 0),
    }
    shape = states_to_checkpoint(states)
    assert shape == {
        "j/1": [(A, (1 << 64) - 1, 0), (B, 5, 300)],
        "j/2": [(B, 7, -1)],
    }
    assert states_from_checkpoint(shape) == states
    with pytest.raises(ValueError, match="6 bytes"):
        states_from_checkpoint({"j": [(b"\x01", 1, -1)]})
    with pytest.raises(ValueError, match="uint64"):
        states_from_checkpoint({"j": [(A, -1, -1)]})
    with pytest.raises(ValueError, match="6 bytes"):
        Sequencer({("j", ProducerID(b"\x01\x02")): ProducerState(1, -1)})


# -- Misuse and replay errors --------------------------------------------------------------


def test_calls_out_of_turn() -> None:
    gen = Gen()
    seq = Sequencer()
    with pytest.raises(SequencerStateError):
        seq.replay_range()
    with pytest.raises(SequencerStateError):
        seq.start_replay([])
    assert queue(seq, gen(A, 1, OUT)) == [Q.OUTSIDE_COMMIT]
    with pytest.raises(SequencerStateError, match="remain to dequeue"):
        seq.queue_uncommitted(gen(A, 2, OUT))


def test_resent_continue_of_a_restored_span_is_delivered_once() -> None:
    gen = Gen()
    a1, a1dup, a2ack = gen(A, 1, CONT), gen(A, 1, CONT), gen(A, 2, ACK)
    seq1 = Sequencer(ring_size=4)
    assert queue(seq1, a1) == [Q.CONTINUE_BEGIN_SPAN]
    # Restored, the span's newest clock is unknown, so the re-send looks like an extension.
    seq2 = Sequencer(seq1.checkpoint(None), 4, seq1.read_through())
    assert queue(seq2, a1dup, a2ack) == [Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a1dup.begin, a1)
    expect_dequeue(seq2, a1, a2ack)  # a1dup, in the ring, is skipped.


def test_ack_with_the_clock_of_its_own_continue() -> None:
    gen = Gen()
    seq = Sequencer()
    a1, a1ack = gen(A, 1, CONT), gen(A, 1, ACK)  # A broken producer: the ACK didn't tick.
    assert queue(seq, a1, a1ack) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_RING]
    assert seq.step() and seq.dequeued is a1
    assert seq.step() is False  # The ACK is a duplicate of clock 1.
    assert seq.read_through() == {JOURNAL: a1ack.end}
    assert seq.checkpoint(None) == {(JOURNAL, A): ProducerState(1, -1)}


def _shift_begin(env: Envelope) -> Envelope:
    return replace(env, begin=env.begin - 1)


def _extend_end(env: Envelope) -> Envelope:
    return replace(env, end=env.end + 100)


def _wrong_journal(env: Envelope) -> Envelope:
    return replace(env, journal="wrong/journal")


def _failing(envs: Iterable[Envelope]) -> Iterator[Envelope]:
    raise EOFError("unexpected EOF")
    yield from envs


@pytest.mark.parametrize(
    ("wrap", "error"),
    [
        (lambda envs: envs, None),
        (_failing, "unexpected EOF"),
        (
            lambda envs: map(_wrong_journal, envs),
            r"replay of wrong journal \(wrong/journal; expected test/journal\)",
        ),
        (lambda envs: map(_shift_begin, envs), r"wrong begin \(101; expected >= 102\)"),
        (lambda envs: map(_extend_end, envs), r"wrong end \(302; expected <= 204\)"),
    ],
)
def test_replay_errors(
    wrap: Callable[[list[Envelope]], Iterable[Envelope]], error: str | None
) -> None:
    gen = Gen()
    seq = Sequencer(ring_size=0)
    b1, a2, a3ack = gen(B, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)
    assert queue(seq, b1, a2, a3ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    assert seq.replay_range() == (JOURNAL, a2.begin, a3ack.begin)
    seq.start_replay(wrap([a2]))
    if error is None:
        assert seq.step() and seq.dequeued is a2
    else:
        with pytest.raises((ReplayError, EOFError), match=error):
            seq.step()


# -- Model-based fuzzing -------------------------------------------------------------------


@dataclass(frozen=True)
class _Rec:
    """A message of a producer's stream; `committed` if a reader must process it, once."""

    producer: bytes | None  # None: a message without a UUID.
    clock: int
    flags: int
    committed: bool


@st.composite
def _producer_stream(draw: Any, producer: bytes) -> list[_Rec]:
    """Transactions of one producer, each committed, rolled back or outside, plus re-sends."""
    clock = draw(st.integers(1, 1 << 20)) << 4
    last_ack = clock  # A new producer's first clock - 1 acts as its last ACK.
    acked: list[_Rec] = []
    out: list[_Rec] = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["commit", "rollback", "outside"]))
        if kind == "outside":
            clock += 1
            rec = _Rec(producer, clock, OUT, True)
            out.append(rec)
            acked.append(rec)
            last_ack = clock
        else:
            txn: list[_Rec] = []
            for _ in range(draw(st.integers(0 if kind == "commit" else 1, 4))):
                # A first message follows the implicit last ACK directly.
                clock += draw(st.integers(1, 3)) if out else 1
                rec = _Rec(producer, clock, CONT, kind == "commit")
                out.append(rec)
                txn.append(rec)
                if draw(st.booleans()):  # A re-send within the open transaction.
                    out.append(replace(draw(st.sampled_from(txn)), committed=False))
            if kind == "commit":
                clock += 1
                ack = _Rec(producer, clock, ACK, True)
                out.append(ack)
                acked.extend(txn + [ack])
                last_ack = clock
            else:
                # What a recovering upstream shard re-sends: its last committed ACK.
                out.append(_Rec(producer, last_ack, ACK, False))
        # Re-sends of committed messages, between transactions. An ACK is re-sent only if it
        # is the last one: an older one would (rightly) reset the producer's clock.
        for _ in range(draw(st.integers(0, 2))):
            if acked:
                dup = draw(st.sampled_from(acked))
                if dup.flags != ACK or dup.clock == last_ack:
                    out.append(replace(dup, committed=False))
    return out


@st.composite
def _scenario(draw: Any) -> tuple[list[_Rec], int, list[str]]:
    producers = [bytes([1, 0, 0, 0, 0, i]) for i in range(draw(st.integers(1, 4)))]
    streams = [draw(_producer_stream(p)) for p in producers]
    streams.append([_Rec(None, 0, OUT, True)] * draw(st.integers(0, 2)))
    picks = draw(st.permutations([i for i, s in enumerate(streams) for _ in s]))
    cursors = [0] * len(streams)
    journal = []
    for i in picks:
        journal.append(streams[i][cursors[i]])
        cursors[i] += 1
    ring_size = draw(st.integers(1, 8))
    actions = draw(
        st.lists(
            st.sampled_from(
                ["", "", "", "ckpt", "crash", "ckpt+crash", "mark+ckpt", "mark+ckpt+crash"]
            ),
            max_size=80,
        )
    )
    return journal, ring_size, actions


class _SpanDiscarded(list[str]):
    """Collects what the Sequencer logs about discarded spans while in a `with` block."""

    def __init__(self) -> None:
        super().__init__()
        self.handler = logging.Handler(logging.ERROR)
        self.handler.emit = lambda record: self.append(record.getMessage())  # type: ignore[method-assign]

    def __enter__(self) -> _SpanDiscarded:
        logging.getLogger("gazette.message.sequencer").addHandler(self.handler)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("gazette.message.sequencer").removeHandler(self.handler)


def _envelopes(recs: list[_Rec]) -> list[Envelope]:
    """The records as consecutive 100-byte envelopes, 2 dead bytes apart."""
    envs = []
    for i, r in enumerate(recs):
        u = (
            None
            if r.producer is None
            else build_uuid(ProducerID(r.producer), Clock(r.clock), r.flags)
        )
        envs.append(Envelope(JOURNAL, i * 102, i * 102 + 100, Msg(u)))
    return envs


@settings(max_examples=400, deadline=None)
@given(_scenario())
def test_random_interleavings_commit_exactly_once(
    scenario: tuple[list[_Rec], int, list[str]],
) -> None:
    recs, ring_size, actions = scenario
    envs = _envelopes(recs)
    begins = [e.begin for e in envs]
    index = {id(e): i for i, e in enumerate(envs)}

    # Output is persisted together with checkpoints; a crash loses what followed the last.
    persisted: list[int] = []
    pending: list[int] = []
    states: dict[ProducerKey, ProducerState] = {}
    offsets: dict[str, int] = {}
    seq = Sequencer(ring_size=ring_size)
    replays = 0
    discarded = _SpanDiscarded()

    def act(processed: bool = False) -> bool:
        """Maybe checkpoint and/or crash; True if the Sequencer was replaced. Once the
        dequeued envelope is `processed` (only then), "mark" actions checkpoint it as such,
        as a consumer transaction closing right after it does."""
        nonlocal seq, states, offsets, pending
        if bool(actions and actions[-1].startswith("mark")) != processed:
            return False
        action = actions.pop() if actions else ""
        if "mark" in action:
            seq.mark_processed()
        if "ckpt" in action:
            persisted.extend(pending)
            pending = []
            states, offsets = seq.checkpoint(None), seq.read_through()
        if "crash" in action:
            pending = []
            seq = Sequencer(states, ring_size, offsets)
            return True
        return False

    with discarded:
        pos = 0
        while pos < len(envs):
            if act():
                pos = bisect.bisect_left(begins, offsets.get(JOURNAL, 0))
                continue
            outcome = seq.queue_uncommitted(envs[pos])
            pos += 1
            if outcome is Q.ACK_COMMIT_REPLAY:
                _, begin, end = seq.replay_range()
                lo = bisect.bisect_left(begins, begin)
                seq.start_replay(e for e in envs[lo:] if e.end <= end)
                replays += 1
            crashed = False
            while seq.step():
                assert seq.dequeued is not None
                if act():  # Mid-dequeue: the dequeued envelope isn't processed yet.
                    pos = bisect.bisect_left(begins, offsets.get(JOURNAL, 0))
                    crashed = True
                    break
                pending.append(index[id(seq.dequeued)])
                if act(processed=True):
                    pos = bisect.bisect_left(begins, offsets.get(JOURNAL, 0))
                    crashed = True
                    break
            assert crashed or seq.dequeued is None
    persisted.extend(pending)
    assert not discarded, discarded  # No stream here mixes OUTSIDE_TXN into an open span.

    got = [recs[i] for i in persisted]
    want = [r for r in recs if r.committed]
    # Committed messages, once each, each producer's in clock (and journal) order.
    assert sorted(persisted) == [i for i, r in enumerate(recs) if r.committed]
    for p in {r.producer for r in recs}:
        mine = [r for r in got if r.producer == p]
        assert mine == [r for r in want if r.producer == p]
        if p is not None:
            assert [r.clock for r in mine] == sorted({r.clock for r in mine})


# -- Runs taken at once --------------------------------------------------------------------


def test_dequeue_committed_takes_runs_of_self_committing_messages() -> None:
    gen = Gen()
    a1, a2 = gen(A, 16, OUT), gen(A, 32, OUT)
    b1 = gen(B, 16, CONT)
    a3, a_dup, b_ack, a4 = gen(A, 48, OUT), gen(A, 48, OUT), gen(B, 17, ACK), gen(A, 64, OUT)
    envs = [a1, a2, b1, a3, a_dup, b_ack, a4]
    seq = Sequencer()
    assert seq.dequeue_committed(envs, 0) == 0  # A is new: its first message is queued.
    assert queue(seq, a1) == [Q.OUTSIDE_COMMIT]
    expect_dequeue(seq, a1)
    assert seq.step() is False
    assert seq.dequeue_committed(envs, 1) == 2  # a2; b1 opens a span: not taken.
    assert seq.read_through() == {JOURNAL: a2.end}
    assert seq.checkpoint(None)[JOURNAL, A] == ProducerState(32, -1)
    assert queue(seq, b1) == [Q.CONTINUE_BEGIN_SPAN]
    assert seq.dequeue_committed(envs, 3) == 4  # a3 (B's open span doesn't matter); not a_dup.
    assert queue(seq, a_dup) == [Q.OUTSIDE_ALREADY_ACKED]
    assert seq.dequeue_committed(envs, 5) == 5  # An ACK.
    assert queue(seq, b_ack) == [Q.ACK_COMMIT_RING]
    with pytest.raises(SequencerStateError):
        seq.dequeue_committed(envs, 6)
    expect_dequeue(seq, b1, b_ack)
    assert seq.step() is False
    assert seq.dequeue_committed(envs, 6) == 7
    assert seq.read_through() == {JOURNAL: a4.end}


def _drive(
    seq: Sequencer, envs: list[Envelope], runs: bool, index: dict[int, int]
) -> tuple[list[int], dict[int, Any]]:
    """Process `envs` to the end, taking runs at once if `runs`; the envelopes delivered, and
    after each envelope whose processing completed, the Sequencer's whole observable state."""
    begins = [e.begin for e in envs]
    delivered: list[int] = []
    states: dict[int, Any] = {}
    pos = 0
    while pos < len(envs):
        if runs:
            end = seq.dequeue_committed(envs, pos)
            if end > pos:
                delivered.extend(range(pos, end))
                pos = end
                states[pos] = _observe(seq, index)
                continue
        if seq.queue_uncommitted(envs[pos]) is Q.ACK_COMMIT_REPLAY:
            _, begin, end = seq.replay_range()
            lo = bisect.bisect_left(begins, begin)
            seq.start_replay(e for e in envs[lo:] if e.end <= end)
        pos += 1
        while seq.step():
            assert seq.dequeued is not None
            delivered.append(index[id(seq.dequeued)])
        states[pos] = _observe(seq, index)
    return delivered, states


def _observe(seq: Sequencer, index: dict[int, int]) -> Any:
    """Everything that decides what the Sequencer does next: states, offsets, spans, the
    ring's head and each span's entries (other entries are never read again)."""
    linked = {}
    for p in seq._partials.values():
        i = p.ring_start
        while i != -1:
            env = seq._ring[i]
            assert env is not None and seq._ring_owner[i] is p
            linked[i] = (index[id(env)], seq._ring_clock[i], p.producer)
            i = seq._next[i]
    return (seq.checkpoint(None), seq.read_through(), spans(seq), seq._head, linked)


@settings(max_examples=300, deadline=None)
@given(_scenario())
def test_runs_taken_at_once_leave_the_state_queuing_leaves(
    scenario: tuple[list[_Rec], int, list[str]],
) -> None:
    recs, ring_size, _ = scenario
    envs = _envelopes(recs)
    index = {id(e): i for i, e in enumerate(envs)}
    with _SpanDiscarded():
        slow, slow_states = _drive(Sequencer(ring_size=ring_size), envs, False, index)
        fast, fast_states = _drive(Sequencer(ring_size=ring_size), envs, True, index)
    assert fast == slow
    for pos, state in fast_states.items():
        assert state == slow_states[pos], pos
