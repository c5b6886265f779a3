"""The application/x-protobuf-fixed framing: golden bytes, round trips, resynchronization."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.message import (
    FIXED_FRAME_WORD,
    PROTO_FIXED_FRAMING,
    Clock,
    Desync,
    FixedFraming,
    Frame,
    MarshalError,
    ProducerID,
    ProtoMessage,
    UnmarshalError,
    build_uuid,
    encode_fixed_frame,
)
from gazette.message.framing_fixed import _Wire, check_wire_format
from tests.message.framing_support import assert_contiguous, chunks, decode, ranges

UUID = build_uuid(ProducerID(bytes.fromhex("0102030405ff")), Clock(0x0123_4567_89AB_CDEF), 1)


def _event_class() -> Any:
    """message Event { bytes uuid = 1; string user = 2; int64 n = 3; string uuid_text = 4;
    bytes blob = 5; }, built at run time so the tests need no generated module."""
    fdp = descriptor_pb2.FileDescriptorProto(name="fixed_test.proto", package="fixedtest")
    msg = fdp.message_type.add(name="Event")
    F = descriptor_pb2.FieldDescriptorProto
    for number, (name, kind) in enumerate(
        [
            ("uuid", F.TYPE_BYTES),
            ("user", F.TYPE_STRING),
            ("n", F.TYPE_INT64),
            ("uuid_text", F.TYPE_STRING),
            ("blob", F.TYPE_BYTES),
        ],
        start=1,
    ):
        msg.field.add(name=name, number=number, type=kind, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("fixedtest.Event"))


Event = _event_class()


def test_golden_frame() -> None:
    msg = ProtoMessage(Event(user="abc"))
    payload = b"\x12\x03abc"  # Field 2, length-delimited, "abc".
    assert msg.SerializeToString() == payload
    assert PROTO_FIXED_FRAMING.marshal(msg) == b"\x66\x33\x93\x36\x05\x00\x00\x00" + payload
    assert encode_fixed_frame(b"x" * 258)[:8] == b"\x66\x33\x93\x36\x02\x01\x00\x00"


def test_golden_frame_with_uuid_bytes() -> None:
    msg = ProtoMessage(Event(n=1))
    msg.set_uuid(UUID)
    frame = PROTO_FIXED_FRAMING.marshal(msg)
    payload = b"\x0a\x10" + UUID.bytes + b"\x18\x01"
    assert frame == FIXED_FRAME_WORD + struct.pack("<I", len(payload)) + payload
    out = ProtoMessage(Event())
    PROTO_FIXED_FRAMING.unmarshal(frame[8:], out)
    assert out.get_uuid() == UUID and out.msg.n == 1 and out == msg


def test_uuid_as_string_field_and_opt_out() -> None:
    msg = ProtoMessage(Event(), uuid_field="uuid_text")
    assert msg.get_uuid() is None
    msg.set_uuid(UUID)
    assert msg.msg.uuid_text == "789abcde-3456-1012-bc01-0102030405ff"
    assert msg.get_uuid() == UUID
    ack = msg.new_acknowledgement("a/journal")
    assert isinstance(ack, ProtoMessage) and ack.get_uuid() is None
    assert ack.uuid_field == "uuid_text" and isinstance(ack.msg, Event)

    none = ProtoMessage(Event(user="x"), uuid_field=None)
    none.set_uuid(UUID)
    assert none.get_uuid() is None and none.msg.uuid == b""

    with pytest.raises(ValueError, match="no field 'missing'"):
        ProtoMessage(Event(), uuid_field="missing")
    with pytest.raises(ValueError, match="bytes or string"):
        ProtoMessage(Event(), uuid_field="n")


class Custom:
    """The generic path: any object with the protobuf methods and the Message methods."""

    def __init__(self, data: bytes = b"") -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # noqa: N802
        return self.data

    def ParseFromString(self, data: bytes) -> None:  # noqa: N802
        if data == b"bad":
            raise ValueError("bad data")
        self.data = data


def test_generic_objects_and_errors() -> None:
    frame = PROTO_FIXED_FRAMING.marshal(Custom(b"\x08\x01"))
    assert frame == FIXED_FRAME_WORD + b"\x02\x00\x00\x00\x08\x01"
    out = Custom()
    PROTO_FIXED_FRAMING.unmarshal(b"\x08\x01", out)
    assert out.data == b"\x08\x01"
    with pytest.raises(UnmarshalError, match="bad data"):
        PROTO_FIXED_FRAMING.unmarshal(b"bad", Custom())
    with pytest.raises(UnmarshalError, match="Event"):
        PROTO_FIXED_FRAMING.unmarshal(b"\xff\xff", ProtoMessage(Event()).msg)
    with pytest.raises(MarshalError, match="SerializeToString"):
        PROTO_FIXED_FRAMING.marshal(object())
    with pytest.raises(UnmarshalError, match="ParseFromString"):
        PROTO_FIXED_FRAMING.unmarshal(b"", object())
    with pytest.raises(MarshalError, match="over the limit"):
        FixedFraming(max_frame_size=4).marshal(Custom(b"12345"))


events_st = st.lists(
    st.builds(
        lambda user, n, blob: Event(user=user, n=n, blob=blob),
        st.text(max_size=20),
        st.integers(-(2**63), 2**63 - 1),
        # Blobs may hold the magic word: well-formed payloads are never split.
        st.one_of(st.binary(max_size=30), st.just(FIXED_FRAME_WORD * 3)),
    ),
    max_size=10,
)


@settings(max_examples=200, deadline=None)
@given(msgs=events_st, cuts=st.lists(st.integers(0, 1500), max_size=30), base=st.integers(0, 2**40))
def test_any_chunking_yields_exact_frames(msgs: list[Any], cuts: list[int], base: int) -> None:
    frames = [PROTO_FIXED_FRAMING.marshal(ProtoMessage(m)) for m in msgs]
    stream = b"".join(frames)
    dec = PROTO_FIXED_FRAMING.decoder(base)
    events = decode(dec, chunks(stream, cuts))
    assert_contiguous(events, base, base + len(stream))
    assert len(events) == len(msgs)
    for ev, msg in zip(events, msgs, strict=True):
        assert isinstance(ev, Frame)
        out = ProtoMessage(Event())
        PROTO_FIXED_FRAMING.unmarshal(ev.payload, out)
        assert out.msg == msg
    assert dec.at_boundary()


def _frame(user: str) -> bytes:
    return PROTO_FIXED_FRAMING.marshal(ProtoMessage(Event(user=user, n=7)))


@settings(max_examples=200, deadline=None)
@given(
    garbage=st.binary(min_size=1, max_size=40).filter(lambda b: FIXED_FRAME_WORD[:1] not in b),
    cuts=st.lists(st.integers(0, 200), max_size=20),
)
def test_garbage_between_frames(garbage: bytes, cuts: list[int]) -> None:
    a, b = _frame("first"), _frame("second")
    stream = garbage + a + garbage + b + garbage + a
    events = decode(PROTO_FIXED_FRAMING.decoder(), chunks(stream, cuts))
    g = len(garbage)
    at = 0
    expect = []
    for frame in (a, b, a):
        expect += [("Desync", at, at + g), ("Frame", at + g, at + g + len(frame))]
        at += g + len(frame)
    assert ranges(events) == expect
    assert isinstance(events[0], Desync) and "no magic word at offset 0" in events[0].reason


LONG = _frame("a longer user name, to be cut short")
# Longer than LONG, so the frames swallowed by a truncated LONG never end where LONG's header
# says it ends (which would make them indistinguishable from a payload embedding frames).
GOOD = _frame("a good frame, longer than the truncated one is " * 2)


@settings(max_examples=300, deadline=None)
@given(cut=st.integers(1, len(LONG) - 1), cuts=st.lists(st.integers(0, 500), max_size=20))
def test_truncated_frame_followed_by_good_ones(cut: int, cuts: list[int]) -> None:
    # A well-formed payload is judged cut short by the bytes after it that are at hand, so
    # don't split the stream around LONG's declared end (see test_well_formed_payload_...).
    window = range(len(LONG) - len(FIXED_FRAME_WORD), len(LONG) + len(FIXED_FRAME_WORD))
    cuts = [c for c in cuts if c not in window]
    stream = LONG[:cut] + GOOD * 3
    events = decode(PROTO_FIXED_FRAMING.decoder(10), chunks(stream, cuts))
    g = len(GOOD)
    assert ranges(events) == [("Desync", 10, 10 + cut)] + [
        ("Frame", 10 + cut + i * g, 10 + cut + (i + 1) * g) for i in range(3)
    ]


def test_well_formed_payload_ending_like_a_magic_word_is_not_held_back() -> None:
    # Payload 12 01 66: well-formed, and ending as the magic word begins.
    frame = PROTO_FIXED_FRAMING.marshal(ProtoMessage(Event(user="f")))
    assert frame.endswith(b"\x12\x01\x66")
    dec = PROTO_FIXED_FRAMING.decoder()
    dec.feed(frame)
    assert ranges(dec.events()) == [("Frame", 0, len(frame))]
    # With the following frame at hand, it's whole too.
    dec.feed(frame)
    assert ranges(dec.events()) == [("Frame", len(frame), 2 * len(frame))]
    # But followed by the rest of a magic word, it was cut short.
    dec = PROTO_FIXED_FRAMING.decoder()
    dec.feed(frame + GOOD[1:])
    assert ranges(dec.events()) == [
        ("Desync", 0, len(frame) - 1),
        ("Frame", len(frame) - 1, len(frame) - 1 + len(GOOD)),
    ]


@pytest.mark.parametrize("cut", [8, 12, 14])
def test_truncation_at_a_field_boundary_is_reported_at_once(cut: int) -> None:
    # When the bytes before the next magic word already prove the frame malformed, the decoder
    # mustn't wait for the bytes the truncated header promised.
    long = PROTO_FIXED_FRAMING.marshal(ProtoMessage(Event(user="ab", n=5, blob=b"y" * 60)))
    assert long[8:14] == b"\x12\x02ab\x18\x05"  # Cut after the header, or a whole field.
    good = _frame("good")
    dec = PROTO_FIXED_FRAMING.decoder()
    dec.feed(long[:cut] + good)
    events = dec.events()
    assert ranges(events) == [("Desync", 0, cut), ("Frame", cut, cut + len(good))]
    assert isinstance(events[0], Desync)
    assert f"cut short by a frame at {cut}" in events[0].reason


def test_truncation_within_the_last_field_waits_for_proof() -> None:
    # The magic word lies within the declared extent of the last field, which swallows all of
    # the declared length: well-formed. Only the frame chain running past the declared end,
    # and no frame following it, tell it from a payload embedding frames.
    long = PROTO_FIXED_FRAMING.marshal(ProtoMessage(Event(user="x" * 60)))
    dec = PROTO_FIXED_FRAMING.decoder()
    dec.feed(long[:20] + GOOD[:30])
    assert dec.events() == []
    dec.feed(GOOD[30:] + GOOD)
    assert ranges(dec.events()) == [
        ("Desync", 0, 20),
        ("Frame", 20, 20 + len(GOOD)),
        ("Frame", 20 + len(GOOD), 20 + 2 * len(GOOD)),
    ]


def test_payload_embedding_the_magic_word_is_one_frame() -> None:
    inner = _frame("inner")
    outer = PROTO_FIXED_FRAMING.marshal(ProtoMessage(Event(blob=inner * 2)))
    dec = PROTO_FIXED_FRAMING.decoder()
    events = decode(dec, chunks(outer + inner, range(3, len(outer), 3)))
    assert ranges(events) == [
        ("Frame", 0, len(outer)),
        ("Frame", len(outer), len(outer) + len(inner)),
    ]


def test_oversized_length_is_a_desync() -> None:
    framing = FixedFraming(max_frame_size=100)
    bad = FIXED_FRAME_WORD + struct.pack("<I", 101) + b"z" * 20
    good = _frame("ok")
    dec = framing.decoder()
    events = decode(dec, [bad, good])
    assert ranges(events) == [("Desync", 0, len(bad)), ("Frame", len(bad), len(bad) + len(good))]
    assert isinstance(events[0], Desync) and "declares 101 bytes" in events[0].reason


def test_magic_word_split_across_feeds_while_skipping() -> None:
    good = _frame("ok")
    stream = b"garbage!" * 10 + good
    for size in (1, 2, 3, 5):
        dec = PROTO_FIXED_FRAMING.decoder()
        events = decode(dec, chunks(stream, range(size, len(stream), size)))
        assert ranges(events) == [("Desync", 0, 80), ("Frame", 80, len(stream))]
        assert dec.at_boundary()


def test_pending_state() -> None:
    dec = PROTO_FIXED_FRAMING.decoder(7)
    frame = _frame("pending")
    dec.feed(frame[:3])
    assert dec.next_event() is None and not dec.at_boundary() and dec.offset == 7
    dec.feed(frame[3:])
    assert ranges(dec.events()) == [("Frame", 7, 7 + len(frame))]
    dec.feed(b"zz")  # Garbage being skipped: offset stays at its beginning.
    assert dec.next_event() is None and dec.offset == 7 + len(frame) and not dec.at_boundary()
    dec.reset(1000)
    assert dec.at_boundary() and dec.offset == 1000


def test_empty_payload() -> None:
    frame = PROTO_FIXED_FRAMING.marshal(ProtoMessage(Event()))
    assert frame == FIXED_FRAME_WORD + b"\x00\x00\x00\x00"
    dec = PROTO_FIXED_FRAMING.decoder()
    dec.feed(frame * 2)
    assert ranges(dec.events()) == [("Frame", 0, 8), ("Frame", 8, 16)]


@pytest.mark.parametrize(
    ("data", "complete", "verdict"),
    [
        (b"", True, _Wire.VALID),
        (b"\x08\x96\x01", True, _Wire.VALID),
        (b"\x08\x96", True, _Wire.INVALID),
        (b"\x08\x96", False, _Wire.INCOMPLETE),
        (b"\x12\x05ab", False, _Wire.INCOMPLETE),
        (b"\x08\x01", False, _Wire.INCOMPLETE),  # Well-formed so far.
        (b"\x12\x05ab", True, _Wire.INVALID),
        (b"\x0d\x01\x02\x03\x04\x09" + bytes(8), True, _Wire.VALID),
        (FIXED_FRAME_WORD, True, _Wire.INVALID),  # 0x66: wire type 6.
        (b"\x00\x01", True, _Wire.INVALID),  # Field number 0.
        (b"\x08" + b"\xff" * 11, True, _Wire.INVALID),  # Varint too long.
    ],
)
def test_check_wire_format(data: bytes, complete: bool, verdict: _Wire) -> None:
    assert check_wire_format(data, complete) is verdict
