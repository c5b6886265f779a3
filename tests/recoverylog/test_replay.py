"""The pieces together: recording a log with a hand-off and a zombie, then replaying it
with and without hints, the way a Player drives OpDecoder and FSM."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.codec import (
    HEADER_LENGTH,
    DecodedOp,
    OpDecoder,
    PayloadChunk,
    PayloadEnd,
    encode_op,
)
from gazette.recoverylog.fsm import FSM, FSMError, WrongSeqNo
from gazette.recoverylog.hints import hints_from_bytes, hints_to_json

LOG = "a/recovery/log"
A, B = 0xA, 0xB


class Writer:
    """Appends ops to a shared log as a Recorder would, from its own FSM's view."""

    def __init__(self, log: bytearray, fsm: FSM, author: int) -> None:
        self.log, self.fsm, self.author = log, fsm, author

    def op(self, op: rpb.RecordedOp, payload: bytes = b"") -> None:
        op.seq_no, op.checksum, op.author = (
            self.fsm.next_seq_no,
            self.fsm.next_checksum,
            self.author,
        )
        frame = encode_op(op)
        op.first_offset, op.log = len(self.log), LOG
        self.log += frame + payload
        self.fsm.apply(op, frame[HEADER_LENGTH:])


def record() -> bytes:
    log = bytearray()
    a = Writer(log, FSM(LOG), A)
    a.op(rpb.RecordedOp(create=rpb.RecordedOp.Create(path="/x")))
    a.op(rpb.RecordedOp(write=rpb.RecordedOp.Write(fnode=1, offset=0, length=5)), b"hello")
    a.op(rpb.RecordedOp(create=rpb.RecordedOp.Create(path="/tmp")))
    a.op(rpb.RecordedOp(write=rpb.RecordedOp.Write(fnode=3, offset=0, length=3)), b"tmp")
    a.op(rpb.RecordedOp(unlink=rpb.RecordedOp.Link(fnode=3, path="/tmp")))

    # B takes over with a no-op sequenced after A's ops (a hand-off)...
    b = Writer(log, copy.deepcopy(a.fsm), B)
    b.op(rpb.RecordedOp())
    # ...while A, now a zombie, still writes an op of the same seq_no.
    a.op(rpb.RecordedOp(write=rpb.RecordedOp.Write(fnode=1, offset=0, length=6)), b"zombie")
    b.op(rpb.RecordedOp(write=rpb.RecordedOp.Write(fnode=1, offset=5, length=5)), b"world")
    b.op(rpb.RecordedOp(property=rpb.Property(path="/IDENTITY", content="b")))
    return bytes(log)


def replay(
    fsm: FSM, log: bytes, start: int, pieces: list[int]
) -> tuple[dict[int, bytearray], list[str]]:
    files: dict[int, bytearray] = {}
    outcomes: list[str] = []
    dec = OpDecoder(offset=start, log=LOG)
    data = log[start:]
    cuts = sorted({p % (len(data) + 1) for p in pieces} | {len(data)})
    prev = 0
    for cut in cuts:
        dec.feed(data[prev:cut])
        prev = cut
        while (ev := dec.next_event()) is not None:
            if isinstance(ev, DecodedOp):
                try:
                    fsm.apply(ev.op, ev.frame)
                    outcomes.append("ok")
                except WrongSeqNo as err:
                    outcomes.append("behind" if err.behind else "ahead")
                    applied = False
                except FSMError as err:
                    outcomes.append(type(err).__name__)
                    applied = False
                else:
                    applied = True
                if ev.op.HasField("create") and applied:
                    files[ev.op.seq_no] = bytearray()
                if ev.op.HasField("write") and not applied:
                    dec.discard_payload()
            elif isinstance(ev, PayloadChunk):
                f = files[ev.fnode]
                f[ev.offset : ev.offset + len(ev.data)] = ev.data
            else:
                assert isinstance(ev, PayloadEnd)
    return files, outcomes


@given(st.lists(st.integers(0, 10_000), max_size=8))
def test_replay_without_and_with_hints(pieces: list[int]) -> None:
    log = record()

    full = FSM(LOG)
    files, outcomes = replay(full, log, 0, pieces)
    # Without hints, everything but the zombie's op applies (fnode 3 is tracked until unlinked).
    assert outcomes == ["ok"] * 6 + ["behind", "ok", "ok"]
    assert files[1] == b"helloworld"
    assert full.properties == {"/IDENTITY": "b"}
    assert list(full.live_nodes) == [1]

    hints = hints_from_bytes(hints_to_json(full.build_hints(LOG)))
    assert [(s.author, s.first_seq_no, s.last_seq_no) for s in hints.live_nodes[0].segments] == [
        (A, 1, 2),
        (B, 7, 7),
    ]

    hinted = FSM.from_hints(hints)
    first = hinted.next_hinted_segment
    assert first is not None
    files, outcomes = replay(hinted, log, first.first_offset, pieces)
    assert outcomes == [
        "ok",
        "ok",
        # A's later ops and the zombie's aren't of the hinted history; B's no-op is
        # skipped by the hints (fnode 1 has nothing in it).
        "NotHintedAuthor",
        "NotHintedAuthor",
        "NotHintedAuthor",
        "behind",
        "NotHintedAuthor",
        "ok",
        "ok",  # Hints are consumed: the property applies.
    ]
    assert files == {1: bytearray(b"helloworld")}
    assert hinted.properties == {"/IDENTITY": "b"}
    assert hinted.build_hints(LOG) == full.build_hints(LOG)
    assert (hinted.next_seq_no, hinted.next_checksum) == (full.next_seq_no, full.next_checksum)
