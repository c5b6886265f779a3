"""Sequencer: turns read-uncommitted messages into read-committed ones, in order, once each.

A Sequencer is a sans-I/O state machine. The caller reads envelopes from journals (uncommitted,
in journal order) and hands each to `Sequencer.queue_uncommitted`, which returns a `QueueOutcome`
saying what the message did. When the outcome commits messages, the caller drains them with
`Sequencer.step` (each committed envelope appears in `Sequencer.dequeued`) before queuing the
next envelope.

Producers are tracked per (journal, ProducerID). Messages of a producer take part in its
transactions through their UUID flags (see `message.uuid`):

- OUTSIDE_TXN commits itself at once, unless its clock is at or below the producer's last ACK
  (a duplicate, ignored). It discards any CONTINUE_TXN span still open for the producer.
- CONTINUE_TXN is held as part of the producer's open span until an ACK decides its fate.
- ACK_TXN with clock C commits the held messages with clock <= C, in journal order, followed by
  the ACK itself, and rolls back held messages above C. An ACK equal to the last ACK rolls the
  open span back (it is what a recovering upstream shard re-sends). An ACK *below* the last ACK
  means an upstream shard recovered an older checkpoint: the producer's clock resets to it, so
  its later messages are processed again (at-least-once for that interval) rather than risk
  never processing them.

Held messages live in a fixed-size ring of the most recently read envelopes, linked per producer
so an ACK finds its span without scanning the ring. A span whose head has been evicted from the
ring (a long transaction, or one begun before the Sequencer was restored from a checkpoint) must
be re-read: the ACK's outcome is `QueueOutcome.ACK_COMMIT_REPLAY`, `replay_range()` names the
journal bytes to re-read, and `start_replay()` takes an iterable of the envelopes read from them
(`step` raises `MustStartReplay` if the caller forgets).

Checkpoints: `checkpoint()` returns each producer's `ProducerState` (its last ACK clock and the
offset at which its open span begins, or -1), and `read_through()` the per-journal offset through
which messages are fully accounted for. A Sequencer built from both, with reading resumed at the
read-through offsets, continues exactly where the old one stopped, even mid-dequeue: states are
tightened as each dequeued message is stepped past.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum

from gazette.message.envelope import Envelope
from gazette.message.uuid import Flags, ProducerID

__all__ = [
    "DEFAULT_PRUNE_HORIZON_NS",
    "DEFAULT_RING_SIZE",
    "CheckpointProducers",
    "MustStartReplay",
    "ProducerKey",
    "ProducerState",
    "QueueOutcome",
    "ReplayError",
    "Sequencer",
    "SequencerError",
    "SequencerStateError",
    "states_from_checkpoint",
    "states_to_checkpoint",
]

_log = logging.getLogger(__name__)

DEFAULT_RING_SIZE = 8192
"""Envelopes held for direct dequeue (ShardSpec.ring_buffer_size defaults to the same)."""

DEFAULT_PRUNE_HORIZON_NS = 24 * 3600 * 1_000_000_000
"""Producers idle this long, relative to the journal's newest ACK, are dropped by checkpoints."""

ProducerKey = tuple[str, ProducerID]
"""(journal, ProducerID): the unit whose sequence a Sequencer tracks."""

CheckpointProducers = dict[str, list[tuple[bytes, int, int]]]
"""journal -> [(producer ID, last_ack, begin)], the shape of Checkpoint.sources[j].producers."""

_FLAG_OUTSIDE = int(Flags.OUTSIDE_TXN)
_FLAG_CONTINUE = int(Flags.CONTINUE_TXN)
_FLAG_ACK = int(Flags.ACK_TXN)
_NODE_MASK = (1 << 48) - 1


class QueueOutcome(Enum):
    """What `Sequencer.queue_uncommitted` did with an envelope.

    Values are upstream's metric labels. Outcomes whose `commits` is true leave a committed
    sequence that the caller must drain with `Sequencer.step` before queuing again.
    """

    OUTSIDE_ALREADY_ACKED = "outsideAlreadyAcked"
    """An OUTSIDE_TXN message at or below the producer's last ACK: a duplicate, ignored."""
    OUTSIDE_COMMIT = "outsideCommit"
    """An OUTSIDE_TXN message committed itself (discarding any open span of its producer)."""
    CONTINUE_ALREADY_ACKED = "continueAlreadyAcked"
    """A CONTINUE_TXN message at or below the producer's last ACK: a duplicate, ignored."""
    CONTINUE_TXN_CLOCK_LARGER = "continueRingClockLarger"
    """A CONTINUE_TXN message at or below a clock already held in the open span: ignored."""
    CONTINUE_BEGIN_SPAN = "continueBeginSpan"
    """A CONTINUE_TXN message opened a new span for its producer."""
    CONTINUE_EXTEND_SPAN = "continueExtendSpan"
    """A CONTINUE_TXN message extended its producer's open span."""
    ACK_ROLLBACK = "ackRollback"
    """An ACK_TXN at or below the last ACK: the open span is discarded and the clock reset."""
    ACK_EMPTY = "ackEmpty"
    """An ACK_TXN with no open span: it commits just itself."""
    ACK_COMMIT_RING = "ackCommitRing"
    """An ACK_TXN committed a span wholly held in the ring."""
    ACK_COMMIT_REPLAY = "ackCommitReplay"
    """An ACK_TXN committed a span that left the ring: replay `replay_range()` first."""

    @property
    def commits(self) -> bool:
        """Whether committed messages now wait to be drained with `Sequencer.step`."""
        return self in _COMMITTING


_COMMITTING = frozenset(
    {
        QueueOutcome.OUTSIDE_COMMIT,
        QueueOutcome.ACK_EMPTY,
        QueueOutcome.ACK_COMMIT_RING,
        QueueOutcome.ACK_COMMIT_REPLAY,
    }
)

_BEGIN_SPAN = QueueOutcome.CONTINUE_BEGIN_SPAN
_EXTEND_SPAN = QueueOutcome.CONTINUE_EXTEND_SPAN


@dataclass(frozen=True, slots=True)
class ProducerState:
    """A producer's sequence state within one journal, as checkpointed by consumers.

    `last_ack` is the Clock of the producer's last committed ACK_TXN or OUTSIDE_TXN message
    (or of the last message stepped past, mid-dequeue). `begin` is the journal offset of the
    first message of the producer's open span of CONTINUE_TXN messages, or -1 if none.
    """

    last_ack: int
    begin: int


class SequencerError(Exception):
    """Base of the Sequencer's errors."""


class SequencerStateError(SequencerError, RuntimeError):
    """A method was called out of turn (e.g. queuing while committed messages remain)."""


class MustStartReplay(SequencerError):
    """Committed messages left the ring: re-read [begin, end) of `journal`, pass to start_replay."""

    def __init__(self, journal: str, begin: int, end: int) -> None:
        super().__init__(f"replay required: journal={journal} begin={begin} end={end}")
        self.journal = journal
        self.begin = begin
        self.end = end


class ReplayError(SequencerError):
    """The replayed envelopes don't match the range `replay_range()` asked for."""


class _Partial:
    """The tracked sequence of one (journal, producer).

    `min_clock` is exclusive (the last ACK, tightened while dequeuing), `max_clock` inclusive
    (the newest held CONTINUE clock, or the committing ACK's clock while dequeuing).
    `ring_start`/`ring_stop` index the first and last held envelopes still in the ring (-1 if
    none); `begin` may precede ring_start's envelope when the span's head was evicted.
    """

    __slots__ = (
        "journal",
        "producer",
        "min_clock",
        "max_clock",
        "begin",
        "ring_start",
        "ring_stop",
    )

    def __init__(self, journal: str, producer: int, clock: int, begin: int) -> None:
        self.journal = journal
        self.producer = producer
        self.min_clock = clock
        self.max_clock = clock
        self.begin = begin
        self.ring_start = -1
        self.ring_stop = -1

    def reset(self, clock: int) -> None:
        self.min_clock = clock
        self.max_clock = clock
        self.begin = -1
        self.ring_start = -1
        self.ring_stop = -1


def _decode(env: Envelope) -> tuple[int, int, int]:
    """(producer as a 48-bit int, clock, flags) of an envelope's UUID; a missing UUID is zero.

    Equivalent to message.uuid's getters, but decoded from one integer, and without their
    version and variant checks: like upstream, any 16 bytes are sequenced by what they encode.
    """
    u = env.message.get_uuid()
    if u is None:
        return 0, 0, 0
    i: int = u.int
    ts = ((i >> 64) & 0x0FFF) << 48 | ((i >> 80) & 0xFFFF) << 32 | (i >> 96) & 0xFFFFFFFF
    return i & _NODE_MASK, ts << 4 | (i >> 58) & 0xF, (i >> 48) & 0x3FF


class Sequencer:
    """Sequences read-uncommitted envelopes of journals into committed ones (see module doc).

    Not thread-safe; one reader drives it. Per message, queuing and stepping are O(1); only
    `has_pending` and `checkpoint` visit every tracked producer.
    """

    def __init__(
        self,
        states: Mapping[ProducerKey, ProducerState] | None = None,
        ring_size: int = DEFAULT_RING_SIZE,
        offsets: Mapping[str, int] | None = None,
    ) -> None:
        """Restore `states` (from `checkpoint`) and `offsets` (from `read_through`).

        A `ring_size` below 1 is taken as 1: the committing ACK itself is always held.
        """
        size = max(1, ring_size)
        self.dequeued: Envelope | None = None
        """The committed envelope to process now; None when no committed sequence is draining."""
        self._dequeued_clock = 0
        self._offsets: dict[str, int] = dict(offsets or {})
        self._last_offsets: dict[str, int] = dict(self._offsets)
        self._partials: dict[tuple[str, int], _Partial] = {}
        self._emit: _Partial | None = None
        self._emit_end = 0  # End offset of the message that committed `_emit`.
        self._replay: Iterator[Envelope] | None = None
        self._ring: list[Envelope | None] = [None] * size
        self._ring_clock: list[int] = [0] * size
        self._ring_owner: list[_Partial | None] = [None] * size
        self._next: list[int] = [-1] * size
        self._head = 0
        for (journal, producer), state in (states or {}).items():
            if len(producer) != 6:
                raise ValueError(f"producer ID must be 6 bytes, not {len(producer)}")
            pid = int.from_bytes(producer, "big")
            self._partials[journal, pid] = _Partial(journal, pid, state.last_ack, state.begin)

    # -- Queuing ----------------------------------------------------------------------------

    def queue_uncommitted(self, env: Envelope) -> QueueOutcome:
        """Apply the next envelope read (uncommitted) from its journal.

        Raises SequencerStateError if committed messages remain to be stepped through.
        """
        if self._emit is not None:
            raise SequencerStateError("committed messages remain to dequeue")
        u = env.message.get_uuid()
        if u is not None:
            # The common case first: an OUTSIDE_TXN message of a producer without an open
            # span, past its last ACK. Exactly what the general path below does for it, in
            # fewer steps (this is on every message's path).
            i: int = u.int
            partial = self._partials.get((env.journal, i & _NODE_MASK))
            if partial is not None and partial.begin == -1 and not (i >> 48) & 0x3FF:
                clock = (
                    ((i >> 64) & 0x0FFF) << 48 | ((i >> 80) & 0xFFFF) << 32 | (i >> 96)
                ) << 4 | (i >> 58) & 0xF
                if clock > partial.min_clock:
                    head = self._head
                    owner = self._ring_owner[head]
                    if owner is not None and owner.ring_start == head:
                        self._evict_at_head()
                    self._ring[head] = env
                    self._ring_clock[head] = clock
                    self._ring_owner[head] = partial
                    self._next[head] = -1
                    partial.ring_start = partial.ring_stop = head
                    head += 1
                    self._head = 0 if head == len(self._ring) else head
                    partial.begin = env.begin
                    partial.max_clock = clock
                    self._emit = partial
                    self._emit_end = env.end
                    return QueueOutcome.OUTSIDE_COMMIT
        self._evict_at_head()

        producer, clock, flags = _decode(env)
        raw_clock = clock  # What the ring remembers; zero clocks are ordered by offset only.
        journal = env.journal
        if clock == 0:
            # A zero clock (e.g. a message without a UUID) commits at once and isn't tracked.
            partial = _Partial(journal, producer, 0, -1)
            flags, clock = _FLAG_OUTSIDE, 1
        else:
            key = (journal, producer)
            found = self._partials.get(key)
            if found is None:
                # A producer seen for the first time: nothing of it is acknowledged yet.
                partial = self._partials[key] = _Partial(journal, producer, clock - 1, -1)
            else:
                partial = found

        if flags == _FLAG_CONTINUE:
            if clock <= partial.min_clock:
                outcome = QueueOutcome.CONTINUE_ALREADY_ACKED
            elif clock <= partial.max_clock:
                outcome = QueueOutcome.CONTINUE_TXN_CLOCK_LARGER
            elif partial.begin == -1:
                outcome = QueueOutcome.CONTINUE_BEGIN_SPAN
            else:
                outcome = QueueOutcome.CONTINUE_EXTEND_SPAN
        elif flags == _FLAG_ACK:
            if clock < partial.min_clock:
                self._log_error(
                    env,
                    partial,
                    clock,
                    flags,
                    "ACK_TXN below the last ACK (loss of exactly-once semantics)",
                )
                outcome = QueueOutcome.ACK_ROLLBACK
            elif clock == partial.min_clock:
                outcome = QueueOutcome.ACK_ROLLBACK
            elif partial.begin == -1:
                outcome = QueueOutcome.ACK_EMPTY
            elif partial.ring_start == -1 or partial.begin != self._ring_begin(partial.ring_start):
                outcome = QueueOutcome.ACK_COMMIT_REPLAY  # The span's head left the ring.
            else:
                outcome = QueueOutcome.ACK_COMMIT_RING
        else:
            if flags != _FLAG_OUTSIDE:
                self._log_error(
                    env, partial, clock, flags, "unexpected UUID flags (handled as OUTSIDE_TXN)"
                )
            if clock <= partial.min_clock:
                outcome = QueueOutcome.OUTSIDE_ALREADY_ACKED
                if partial.begin == env.begin:
                    # Checkpoints written before `mark_processed` completed sequences name
                    # a processed OUTSIDE_TXN message as its producer's open span, and are
                    # read again from it. It is a sequence of its own, and done: no span.
                    partial.reset(partial.min_clock)
            else:
                if partial.begin != -1 and partial.begin != env.begin:
                    # (Equal when a checkpoint taken while dequeuing this very message was
                    # restored, and it's being read again.)
                    self._log_error(
                        env,
                        partial,
                        clock,
                        flags,
                        "OUTSIDE_TXN after an open CONTINUE_TXN span (mixed "
                        "committed and uncommitted publishing?); span discarded",
                    )
                outcome = QueueOutcome.OUTSIDE_COMMIT

        # Each outcome either sets a sequence to emit, or advances the read-through offset.
        # Committing outcomes deliberately don't: a Sequencer restored from a checkpoint taken
        # before the sequence is drained must read the committing message again.
        if outcome is _BEGIN_SPAN or outcome is _EXTEND_SPAN:
            if partial.begin == -1:
                partial.begin = env.begin
            self._add_at_head(env, clock, partial)
            partial.max_clock = clock
            self._offsets[journal] = env.end
        elif outcome is QueueOutcome.ACK_ROLLBACK:
            partial.reset(clock)
            self._offsets[journal] = env.end
        elif outcome.commits:
            self._add_at_head(env, raw_clock, partial)
            if outcome is QueueOutcome.OUTSIDE_COMMIT:
                # Anything held before it is discarded: the sequence is this message alone.
                partial.begin = env.begin
                partial.ring_start = partial.ring_stop
            elif outcome is QueueOutcome.ACK_EMPTY:
                partial.begin = env.begin
            # Commit through this clock; held messages above it roll back as they're stepped.
            partial.max_clock = clock
            self._emit = partial
            self._emit_end = env.end
        else:
            self._offsets[journal] = env.end
        return outcome

    def dequeue_committed(
        self, envelopes: list[Envelope], start: int, stop: int | None = None
    ) -> int:
        """Take a run of messages that each commit alone: from `envelopes[start]` on (up to
        `stop`, exclusive, if given), every OUTSIDE_TXN message of a producer with no open
        span and a clock past its last ACK; returns the index of the first envelope not
        taken (`start` if none was).

        Taking one is queuing it, dequeuing it and stepping past it, at once: `read_through`
        and `checkpoint` already count the run processed, so the caller processes every
        taken envelope before it takes a checkpoint. The rest go through `queue_uncommitted`.
        Raises SequencerStateError if committed messages remain to be stepped through.
        """
        if self._emit is not None:
            raise SequencerStateError("committed messages remain to dequeue")
        partials, offsets = self._partials, self._offsets
        ring, ring_owner = self._ring, self._ring_owner
        nxt = self._next
        size = len(ring)
        head = self._head
        i, n = start, len(envelopes) if stop is None else min(stop, len(envelopes))
        while i < n:
            env = envelopes[i]
            u = env.message.get_uuid()
            if u is None:
                break
            x: int = u.int
            if (x >> 48) & 0x3FF:
                break  # Not OUTSIDE_TXN.
            partial = partials.get((env.journal, x & _NODE_MASK))
            if partial is None or partial.begin != -1:
                break
            hi = x >> 64  # time_low, time_mid, version and time_hi: the clock's timestamp.
            clock = ((hi & 0x0FFF) << 48 | (hi >> 16 & 0xFFFF) << 32 | hi >> 32) << 4 | (
                x >> 58 & 0xF
            )
            if clock <= partial.min_clock:
                break
            # It takes a ring entry as `queue_uncommitted` would (evicting the oldest), but an
            # empty one: the entry of a completed sequence is never read again, and holding
            # the envelope would only keep it alive (for the garbage collector to trace).
            owner = ring_owner[head]
            if owner is not None and owner.ring_start == head:
                self._head = head
                self._evict_at_head()
            ring[head] = None
            ring_owner[head] = None
            nxt[head] = -1
            head += 1
            if head == size:
                head = 0
            partial.min_clock = partial.max_clock = clock
            offsets[env.journal] = env.end
            i += 1
        self._head = head
        return i

    # -- Dequeuing --------------------------------------------------------------------------

    def step(self) -> bool:
        """Advance to the next committed envelope, now in `dequeued`; False when none remain.

        Stepping past a dequeued envelope marks it processed (checkpoints taken afterwards
        won't deliver it again). Raises MustStartReplay if the committed sequence must be
        re-read first, ReplayError if the replay doesn't match `replay_range()`, and whatever
        the replay iterable raises (the step may then be retried).
        """
        emit = self._emit
        if emit is None:
            return False
        if (
            self.dequeued is None
            and self._replay is None
            and emit.begin != self._ring_begin(emit.ring_start)
        ):
            raise MustStartReplay(*self.replay_range())
        if self.dequeued is not None:
            emit.min_clock = self._dequeued_clock  # The caller is done with it.

        while emit.ring_start != -1:
            replay = self._replay
            if replay is None:
                idx = emit.ring_start
                env = self._ring[idx]
                assert env is not None
                clock = self._ring_clock[idx]
                emit.ring_start = self._next[idx]
            else:
                got = next(replay, None)
                if got is None:
                    self._replay = None  # Replay is done: the rest of the span is in the ring.
                    continue
                env = got
                self._check_replayed(env, emit)
                producer, clock, _ = _decode(env)
                if producer != emit.producer:
                    continue  # Other producers' messages share the replayed bytes.

            if clock != 0 and clock <= emit.min_clock:
                # A duplicate of a message already stepped past. Expected in replays; in the
                # ring only after a restore (checkpoints don't keep a span's newest clock, so
                # a re-sent CONTINUE_TXN of a restored span is held as if it extended it).
                continue
            if clock > emit.max_clock:
                continue  # Rolled back by the ACK.

            emit.begin = env.begin
            self.dequeued = env
            self._dequeued_clock = clock
            return True

        self._complete()
        return False

    def _complete(self) -> None:
        """The committed sequence is drained: only now is its committing message read
        through, and its producer ready for its next sequence."""
        emit = self._emit
        assert emit is not None
        self._offsets[emit.journal] = self._emit_end
        emit.reset(emit.min_clock)
        self.dequeued = None
        self._dequeued_clock = 0
        self._emit = None

    def mark_processed(self) -> None:
        """Mark the dequeued envelope as processed now, as the next `step` would: a
        checkpoint taken before that step (e.g. a consumer transaction closing right after
        the envelope) then does not deliver it again.

        If the envelope ends its sequence (an OUTSIDE_TXN message, or the committing ACK),
        the sequence is completed now (`dequeued` becomes None; `step` returns False): the
        checkpoint then reads through it and holds no open span for its producer, as
        upstream's does (it steps past each message as soon as it is consumed). Otherwise
        a restored Sequencer reads the message again as a duplicate."""
        emit = self._emit
        if self.dequeued is None or emit is None:
            return
        emit.min_clock = self._dequeued_clock
        if emit.ring_start == -1 and self._replay is None:
            # The dequeued envelope was the last one held: the committing message.
            self._complete()

    def replay_range(self) -> tuple[str, int, int]:
        """(journal, begin, end): the bytes to re-read before the committed sequence can drain."""
        emit = self._emit
        if emit is None:
            raise SequencerStateError("no committed sequence to replay")
        return emit.journal, emit.begin, self._ring_begin(emit.ring_start)

    def start_replay(self, envelopes: Iterable[Envelope]) -> None:
        """Supply the envelopes read (uncommitted, in order) from `replay_range()`."""
        if self._emit is None:
            raise SequencerStateError("no committed sequence to replay")
        self._replay = iter(envelopes)

    # -- Checkpoints ------------------------------------------------------------------------

    def has_pending(self) -> bool:
        """Whether some producer opened a span since the last checkpoint.

        Assuming producers are live, more messages (and an ACK) are on their way; a consumer
        uses this to decide whether to hold its transaction open a little longer.
        """
        last = self._last_offsets
        for partial in self._partials.values():
            if partial.begin != -1 and partial.begin >= last.get(partial.journal, 0):
                return True
        return False

    def checkpoint(
        self, horizon_ns: int | None = DEFAULT_PRUNE_HORIZON_NS
    ) -> dict[ProducerKey, ProducerState]:
        """Snapshot producer states, first dropping producers idle beyond `horizon_ns`.

        A producer is idle when its newest clock (including held CONTINUE messages) is more than
        `horizon_ns` older than the newest last-ACK clock of any producer of its journal; clocks,
        not wall time, so a journal nobody writes to keeps its producers. None or 0: no pruning.
        Like upstream, an idle producer is dropped even with a span open (the span is taken
        as abandoned), except the one being dequeued. Also marks the current offsets as
        checkpointed for `has_pending`; pair with `read_through()`. May be called mid-dequeue.
        """
        bound: dict[str, int] = {}
        for partial in self._partials.values():
            if partial.min_clock > bound.get(partial.journal, 0):
                bound[partial.journal] = partial.min_clock
        if horizon_ns:
            delta = (horizon_ns // 100) << 4
            for journal in bound:
                bound[journal] -= delta
        else:
            bound.clear()

        out: dict[ProducerKey, ProducerState] = {}
        dropped = []
        for key, partial in self._partials.items():
            # The sequence being dequeued is kept whatever its age: its ACK is read again if
            # this checkpoint is restored, and must find the span's state.
            if partial.max_clock >= bound.get(partial.journal, 0) or partial is self._emit:
                pid = ProducerID(partial.producer.to_bytes(6, "big"))
                out[partial.journal, pid] = ProducerState(partial.min_clock, partial.begin)
            else:
                dropped.append(key)
        for key in dropped:
            del self._partials[key]

        self._last_offsets = dict(self._offsets)
        return out

    def read_through(self) -> dict[str, int]:
        """Per journal, the offset through which envelopes are accounted for.

        Reading resumes here after a restore. The offset of a committing message is only
        passed once its sequence is fully stepped through.
        """
        return dict(self._offsets)

    # -- Ring -------------------------------------------------------------------------------

    def _ring_begin(self, idx: int) -> int:
        env = self._ring[idx]
        assert env is not None, "a tracked ring index must hold an envelope"
        return env.begin

    def _evict_at_head(self) -> None:
        head = self._head
        owner = self._ring_owner[head]
        if owner is None:
            return  # Empty, or already evicted.
        if owner.ring_start == head:
            # Its span loses its oldest held envelope.
            nxt = self._next[head]
            if owner.ring_stop == head:
                if nxt != -1:
                    raise SequencerError("ring invariant: a span's last entry has a successor")
                owner.ring_start = owner.ring_stop = -1
            else:
                if nxt == -1:
                    raise SequencerError("ring invariant: a span's inner entry has no successor")
                owner.ring_start = nxt
        self._ring[head] = None
        self._ring_owner[head] = None
        self._next[head] = -1

    def _add_at_head(self, env: Envelope, clock: int, partial: _Partial) -> None:
        head = self._head
        self._ring[head] = env
        self._ring_clock[head] = clock
        self._ring_owner[head] = partial
        self._next[head] = -1
        if partial.ring_stop == -1:
            partial.ring_start = head
        else:
            self._next[partial.ring_stop] = head
        partial.ring_stop = head
        head += 1
        self._head = 0 if head == len(self._ring) else head

    def _check_replayed(self, env: Envelope, emit: _Partial) -> None:
        end = self._ring_begin(emit.ring_start)
        if env.journal != emit.journal:
            raise ReplayError(f"replay of wrong journal ({env.journal}; expected {emit.journal})")
        if env.begin < emit.begin:
            raise ReplayError(
                f"replay has wrong begin ({env.begin}; expected >= {emit.begin}) "
                f"journal={emit.journal}"
            )
        if env.end > end:
            raise ReplayError(
                f"replay has wrong end ({env.end}; expected <= {end}) journal={emit.journal}"
            )

    def _log_error(
        self, env: Envelope, partial: _Partial, clock: int, flags: int, msg: str
    ) -> None:
        _log.error(
            "%s journal=%s begin=%d end=%d producer=%012x clock=%d flags=%#x "
            "min_clock=%d max_clock=%d span_begin=%d",
            msg,
            env.journal,
            env.begin,
            env.end,
            partial.producer,
            clock,
            flags,
            partial.min_clock,
            partial.max_clock,
            partial.begin,
        )


def states_to_checkpoint(states: Mapping[ProducerKey, ProducerState]) -> CheckpointProducers:
    """Group states by journal as (producer ID, last_ack, begin), sorted by producer ID.

    The shape of consumer Checkpoint.sources[journal].producers (ProducerEntry id, state).
    """
    out: CheckpointProducers = {}
    for (journal, producer), state in sorted(states.items()):
        out.setdefault(journal, []).append((bytes(producer), state.last_ack, state.begin))
    return out


def states_from_checkpoint(
    sources: Mapping[str, Iterable[tuple[bytes, int, int]]],
) -> dict[ProducerKey, ProducerState]:
    """The inverse of `states_to_checkpoint`, ready for `Sequencer(states=...)`."""
    out: dict[ProducerKey, ProducerState] = {}
    for journal, entries in sources.items():
        for producer, last_ack, begin in entries:
            if len(producer) != 6:
                raise ValueError(
                    f"producer ID must be 6 bytes, not {len(producer)} (journal={journal})"
                )
            if not 0 <= last_ack < 1 << 64:
                raise ValueError(f"last_ack {last_ack} is not a uint64 (journal={journal})")
            out[journal, ProducerID(bytes(producer))] = ProducerState(last_ack, begin)
    return out
