"""Op framing golden bytes, the checksum chain, and the sans-I/O OpDecoder."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.recoverylog import _crc32c
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.codec import (
    HEADER_LENGTH,
    MAGIC,
    DecodedOp,
    Desync,
    OpDecodeError,
    OpDecoder,
    OpEvent,
    PayloadChunk,
    PayloadEnd,
    encode_op,
    encode_write,
)
from gazette.recoverylog.fsm import FSM

LOG = "a/recovery/log"


def bitwise_crc32c(crc: int, data: bytes) -> int:
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


# Golden frames, written out from the field numbers and wire types of RecordedOp.
CREATE_BODY = bytes(
    [0x08, 0x01]  # seq_no (1, varint) = 1
    + [0x15, 0x04, 0x03, 0x02, 0x01]  # checksum (2, fixed32 LE) = 0x01020304
    + [0x1D, 0xDD, 0xCC, 0xBB, 0xAA]  # author (3, fixed32 LE) = 0xaabbccdd
    + [0x22, 0x04, 0x0A, 0x02]  # create (4, bytes) { path (1, bytes) =
)
CREATE_BODY += b"/a"  # "/a" }
CREATE_FRAME = MAGIC + bytes([len(CREATE_BODY), 0, 0, 0]) + CREATE_BODY

WRITE_BODY = bytes(
    [0x08, 0xAC, 0x02]  # seq_no = 300
    + [0x15, 0x78, 0x56, 0x34, 0x12]  # checksum = 0x12345678
    + [0x1D, 0xDD, 0xCC, 0xBB, 0xAA]  # author
    + [0x3A, 0x06]  # write (7, bytes), 6 bytes
    + [0x08, 0x01, 0x10, 0x05, 0x18, 0x03]  # { fnode = 1, offset = 5, length = 3 }
)
WRITE_FRAME = MAGIC + bytes([len(WRITE_BODY), 0, 0, 0]) + WRITE_BODY + b"xyz"


def create_op() -> rpb.RecordedOp:
    return rpb.RecordedOp(
        seq_no=1, checksum=0x01020304, author=0xAABBCCDD, create=rpb.RecordedOp.Create(path="/a")
    )


def write_op() -> rpb.RecordedOp:
    return rpb.RecordedOp(
        seq_no=300,
        checksum=0x12345678,
        author=0xAABBCCDD,
        write=rpb.RecordedOp.Write(fnode=1, offset=5, length=3),
    )


def test_golden_create_frame() -> None:
    assert encode_op(create_op()) == CREATE_FRAME
    assert CREATE_FRAME[:8] == bytes.fromhex("6633933612000000")


def test_golden_write_frame() -> None:
    assert encode_write(write_op(), b"xyz") == WRITE_FRAME


def test_encode_drops_meta_fields() -> None:
    op = create_op()
    op.first_offset, op.last_offset, op.log = 10, 20, LOG
    assert encode_op(op) == CREATE_FRAME
    assert op.log == LOG  # The caller's op is untouched.


def test_encode_write_checks_length() -> None:
    with pytest.raises(ValueError, match="length"):
        encode_write(write_op(), b"xy")
    with pytest.raises(ValueError, match="not a Write"):
        encode_write(create_op(), b"")


def test_decode_golden_frames() -> None:
    dec = OpDecoder(offset=1000, log=LOG)
    dec.feed(CREATE_FRAME + WRITE_FRAME)
    ev = dec.next_event()
    assert isinstance(ev, DecodedOp)
    expect = create_op()
    expect.first_offset, expect.last_offset, expect.log = 1000, 1000 + len(CREATE_FRAME), LOG
    assert ev.op == expect
    assert ev.frame == CREATE_BODY

    ev = dec.next_event()
    assert isinstance(ev, DecodedOp)
    begin = 1000 + len(CREATE_FRAME)
    assert (ev.op.first_offset, ev.op.last_offset) == (begin, begin + len(WRITE_FRAME))
    assert ev.frame == WRITE_BODY
    assert dec.in_payload and dec.payload_remaining == 3
    assert dec.next_event() == PayloadChunk(fnode=1, offset=5, data=b"xyz")
    end = dec.next_event()
    assert isinstance(end, PayloadEnd) and end.op is ev.op
    assert dec.next_event() is None
    assert dec.offset == begin + len(WRITE_FRAME)


def test_checksum_chain_over_three_ops() -> None:
    # Each op carries the CRC-32C of the marshaled ops before it.
    ops = [
        rpb.RecordedOp(author=7, create=rpb.RecordedOp.Create(path="/f")),
        rpb.RecordedOp(author=7, write=rpb.RecordedOp.Write(fnode=1, length=4)),
        rpb.RecordedOp(author=7, link=rpb.RecordedOp.Link(fnode=1, path="/g")),
    ]
    stream = b""
    crc = 0
    for seq, op in enumerate(ops, start=1):
        op.seq_no, op.checksum = seq, crc
        frame = encode_write(op, b"data") if op.HasField("write") else encode_op(op)
        stream += frame
        body_len = int.from_bytes(frame[4:8], "little")
        crc = bitwise_crc32c(crc, frame[HEADER_LENGTH : HEADER_LENGTH + body_len])
    assert crc != 0

    fsm = FSM(LOG)
    dec = OpDecoder(log=LOG)
    dec.feed(stream)
    while (ev := dec.next_event()) is not None:
        if isinstance(ev, DecodedOp):
            fsm.apply(ev.op, ev.frame)
    assert (fsm.next_seq_no, fsm.next_checksum) == (4, crc)
    assert fsm.links == {"/f": 1, "/g": 1}
    assert fsm.live_nodes[1].segments == [
        rpb.Segment(
            author=7,
            first_seq_no=1,
            last_seq_no=3,
            first_offset=0,
            last_offset=len(stream),
            log=LOG,
        )
    ]


@given(st.binary(max_size=200), st.integers(0, 0xFFFFFFFF))
def test_crc32c_matches_bitwise_reference(data: bytes, seed: int) -> None:
    assert _crc32c.update_pure(seed, data) == bitwise_crc32c(seed, data)
    assert _crc32c.update(seed, data) == bitwise_crc32c(seed, data)
    half = len(data) // 2
    assert _crc32c.update(_crc32c.update(seed, data[:half]), data[half:]) == _crc32c.update(
        seed, data
    )


def test_crc32c_check_value() -> None:
    assert _crc32c.update(0, b"123456789") == 0xE3069283


# Streams of random ops, fed in random pieces.

paths = st.text(alphabet="abc/", min_size=1, max_size=12)
ops = st.one_of(
    st.builds(lambda p: ("create", p, b""), paths),
    st.builds(lambda f, p: ("link", p, f.to_bytes(2, "little")), st.integers(1, 99), paths),
    st.builds(lambda f, p: ("unlink", p, f.to_bytes(2, "little")), st.integers(1, 99), paths),
    st.builds(lambda p: ("property", p, b""), paths),
    st.just(("noop", "", b"")),
    # Payloads hold magic words, which must not confuse the decoder.
    st.builds(
        lambda d: ("write", "", d),
        st.binary(max_size=300).map(lambda b: b + MAGIC + b[:5]),
    ),
)


def build(kind: str, path: str, extra: bytes, seq: int) -> tuple[rpb.RecordedOp, bytes]:
    op = rpb.RecordedOp(seq_no=seq, checksum=seq * 7919, author=0xA5A5)
    if kind == "create":
        op.create.path = path
    elif kind in ("link", "unlink"):
        getattr(op, kind).CopyFrom(
            rpb.RecordedOp.Link(fnode=int.from_bytes(extra, "little"), path=path)
        )
    elif kind == "property":
        op.property.CopyFrom(rpb.Property(path=path, content=path * 2))
    elif kind == "write":
        op.write.CopyFrom(rpb.RecordedOp.Write(fnode=seq, offset=seq * 10, length=len(extra)))
        return op, encode_write(op, extra)
    return op, encode_op(op)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


def drain(dec: OpDecoder, pieces: list[bytes]) -> list[OpEvent]:
    events: list[OpEvent] = []
    for piece in pieces:
        dec.feed(piece)
        while (ev := dec.next_event()) is not None:
            events.append(ev)
    return events


@settings(max_examples=200)
@given(st.lists(ops, max_size=12), st.lists(st.integers(0, 10**6), max_size=30))
def test_decoder_yields_exact_offsets_in_any_chunking(
    spec: list[tuple[str, str, bytes]], cuts: list[int]
) -> None:
    base = 12345
    stream = b""
    expect = []
    for seq, (kind, path, extra) in enumerate(spec, start=1):
        op, frame = build(kind, path, extra, seq)
        payload = extra if kind == "write" else b""
        expect.append((op, base + len(stream), base + len(stream) + len(frame), payload))
        stream += frame

    dec = OpDecoder(offset=base, log=LOG)
    events = drain(dec, split(stream, cuts))
    assert dec.offset == base + len(stream) and dec.buffered == 0

    got = []
    it = iter(events)
    for ev in it:
        assert isinstance(ev, DecodedOp)
        payload = b""
        if ev.op.HasField("write"):
            file_offset = ev.op.write.offset
            for sub in it:
                if isinstance(sub, PayloadEnd):
                    assert sub.op is ev.op
                    break
                assert isinstance(sub, PayloadChunk)
                assert sub.fnode == ev.op.write.fnode and sub.offset == file_offset
                assert sub.data  # Never empty.
                file_offset += len(sub.data)
                payload += sub.data
        meta = (ev.op.first_offset, ev.op.last_offset)
        assert ev.op.log == LOG
        ev.op.ClearField("first_offset")
        ev.op.ClearField("last_offset")
        ev.op.ClearField("log")
        assert ev.frame == ev.op.SerializeToString()
        got.append((ev.op, *meta, payload))
    assert got == expect


def test_discarded_payload_spanning_feeds() -> None:
    op = write_op()
    op.write.length = 10_000
    payload = os.urandom(10_000)
    tail = encode_op(create_op())
    dec = OpDecoder(log=LOG)
    dec.feed(encode_op(op) + payload[:100])
    ev = dec.next_event()
    assert isinstance(ev, DecodedOp)
    dec.discard_payload()
    assert dec.next_event() is None  # 100 bytes skipped, no chunk.
    for i in range(100, 9_100, 1000):
        dec.feed(payload[i : i + 1000])
        assert dec.next_event() is None
    dec.feed(payload[9_100:] + tail)
    end = dec.next_event()
    assert isinstance(end, PayloadEnd) and end.op is ev.op
    nxt = dec.next_event()
    assert isinstance(nxt, DecodedOp) and nxt.op.first_offset == ev.op.last_offset
    assert not dec.in_payload
    with pytest.raises(RuntimeError):
        dec.discard_payload()


def test_zero_length_write_still_ends() -> None:
    op = write_op()
    op.write.length = 0
    dec = OpDecoder()
    dec.feed(encode_write(op, b""))
    assert isinstance(dec.next_event(), DecodedOp)
    assert isinstance(dec.next_event(), PayloadEnd)
    assert dec.next_event() is None


def merged_desyncs(events: list[OpEvent]) -> list[OpEvent]:
    out: list[OpEvent] = []
    for ev in events:
        if isinstance(ev, Desync) and out and isinstance(out[-1], Desync):
            assert out[-1].end == ev.begin
            out[-1] = Desync(out[-1].begin, ev.end)
        else:
            out.append(ev)
    return out


@settings(max_examples=100)
@given(
    st.binary(min_size=1, max_size=100).filter(lambda b: MAGIC not in b),
    st.sampled_from([b"", MAGIC[:1], MAGIC[:2], MAGIC[:3]]),
    st.lists(st.integers(0, 10**6), max_size=10),
)
def test_desync_skips_to_the_next_frame(garbage: bytes, partial: bytes, cuts: list[int]) -> None:
    # The garbage may end in a partial magic word, which isn't a frame either.
    garbage += partial
    first, second = encode_op(create_op()), WRITE_FRAME
    stream = first + garbage + second
    if stream.find(MAGIC, len(first)) != len(first) + len(garbage):
        return  # The garbage happens to complete a magic word with what follows.
    events = merged_desyncs(drain(OpDecoder(log=LOG), split(stream, cuts)))
    kinds = [type(ev).__name__ for ev in events]
    assert kinds[:3] == ["DecodedOp", "Desync", "DecodedOp"]
    assert set(kinds[3:-1]) == {"PayloadChunk"} and kinds[-1] == "PayloadEnd"
    assert events[1] == Desync(len(first), len(first) + len(garbage))
    second_op = events[2]
    assert isinstance(second_op, DecodedOp)
    assert second_op.op.first_offset == len(first) + len(garbage)
    assert second_op.op.last_offset == len(stream)


def test_decoding_from_mid_payload_resynchronizes() -> None:
    # A reader starting at an offset which is not a frame boundary.
    stream = CREATE_FRAME + WRITE_FRAME + CREATE_FRAME
    start = len(CREATE_FRAME) + 3
    dec = OpDecoder(offset=start)
    dec.feed(stream[start:])
    ev = dec.next_event()
    assert ev == Desync(start, len(CREATE_FRAME) + len(WRITE_FRAME))
    ev = dec.next_event()
    assert isinstance(ev, DecodedOp) and ev.op.last_offset == len(stream)


def test_desync_before_a_full_header_and_trailing_partial_magic() -> None:
    dec = OpDecoder(offset=50)
    dec.feed(b"\x00\x01")
    assert dec.next_event() == Desync(50, 52)
    assert dec.next_event() is None
    dec.feed(b"\x66\x33")  # A possible magic word: wait.
    assert dec.next_event() is None
    dec.feed(b"\x00")  # Not one after all.
    assert dec.next_event() == Desync(52, 55)
    dec.feed(b"junk" + MAGIC[:3])
    assert dec.next_event() == Desync(55, 59)  # Keeps the partial magic.
    dec.feed(CREATE_FRAME[3:])
    ev = dec.next_event()
    assert isinstance(ev, DecodedOp) and ev.op.first_offset == 59


def test_oversized_header_is_a_desync() -> None:
    dec = OpDecoder(max_frame_length=1000)
    dec.feed(MAGIC + (1001).to_bytes(4, "little") + b"\x00" * 10 + CREATE_FRAME)
    assert dec.next_event() == Desync(0, 18)
    assert isinstance(dec.next_event(), DecodedOp)


def test_undecodable_frame_raises_after_consuming_it() -> None:
    body = b"\xff\xff\xff"
    dec = OpDecoder(offset=7)
    dec.feed(MAGIC + len(body).to_bytes(4, "little") + body + CREATE_FRAME)
    with pytest.raises(OpDecodeError) as info:
        dec.next_event()
    assert (info.value.begin, info.value.end) == (7, 7 + 8 + len(body))
    ev = dec.next_event()
    assert isinstance(ev, DecodedOp) and ev.op.first_offset == 7 + 8 + len(body)


def test_negative_write_length_is_undecodable() -> None:
    op = write_op()
    op.write.length = -5
    dec = OpDecoder()
    dec.feed(encode_op(op))
    with pytest.raises(OpDecodeError, match="negative"):
        dec.next_event()
    assert not dec.in_payload


def test_reset_drops_partial_state() -> None:
    dec = OpDecoder(log="x/log")
    dec.feed(WRITE_FRAME[:-1])
    assert isinstance(dec.next_event(), DecodedOp)
    assert isinstance(dec.next_event(), PayloadChunk)
    assert dec.in_payload
    dec.reset(5000, log=LOG)
    assert not dec.in_payload and dec.buffered == 0 and dec.offset == 5000
    dec.feed(CREATE_FRAME)
    ev = dec.next_event()
    assert isinstance(ev, DecodedOp)
    assert (ev.op.first_offset, ev.op.log) == (5000, LOG)


def test_large_payload_is_streamed_not_accumulated() -> None:
    op = write_op()
    op.write.length = 8 << 20
    dec = OpDecoder()
    dec.feed(encode_op(op))
    assert isinstance(dec.next_event(), DecodedOp)
    piece = b"z" * (64 << 10)
    total = 0
    for i in range(128):
        dec.feed(piece)
        assert dec.buffered <= len(piece)
        ev = dec.next_event()
        assert isinstance(ev, PayloadChunk) and len(ev.data) == len(piece)
        total += len(ev.data)
        if i != 127:
            assert dec.next_event() is None
    assert total == 8 << 20
    assert isinstance(dec.next_event(), PayloadEnd)


def test_in_frame_tells_a_partial_frame_from_garbage() -> None:
    frame = encode_op(rpb.RecordedOp(seq_no=1, checksum=0, author=7))
    dec = OpDecoder()
    assert not dec.in_frame
    dec.feed(frame[:3])  # A prefix of the magic.
    assert dec.next_event() is None and dec.in_frame
    dec.feed(frame[3:-1])  # All but the last byte.
    assert dec.next_event() is None and dec.in_frame
    dec.feed(frame[-1:])
    assert dec.next_event() is not None and not dec.in_frame
    dec.feed(b"zz")  # Not the start of a frame.
    assert not dec.in_frame
