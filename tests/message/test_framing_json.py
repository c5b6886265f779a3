"""The application/x-ndjson framing: golden bytes, round trips under any chunking, desyncs."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.message import (
    JSON_FRAMING,
    Clock,
    Desync,
    Frame,
    JSONFraming,
    JSONMessage,
    MarshalError,
    ProducerID,
    UnmarshalError,
    build_uuid,
)
from tests.message.framing_support import assert_contiguous, chunks, decode, ranges

UUID = build_uuid(ProducerID(bytes.fromhex("0102030405ff")), Clock(0x0123_4567_89AB_CDEF), 2)


@dataclass
class Click(JSONMessage):
    user: str = ""
    n: int = 0
    score: float = 0.0
    tags: list[str] = field(default_factory=list)


class Raw:
    """A message implementing only to_json / load_json (no fast path)."""

    def __init__(self, doc: dict[str, Any] | None = None) -> None:
        self.doc = doc or {}

    def to_json(self) -> dict[str, Any]:
        return self.doc

    def load_json(self, doc: dict[str, Any]) -> None:
        self.doc = doc


def test_golden_line() -> None:
    assert str(UUID) == "789abcde-3456-1012-bc02-0102030405ff"
    msg = Click(user="ann", n=3, score=0.5, tags=["a", "b"])
    msg.set_uuid(UUID)
    expect = (
        b'{"uuid":"789abcde-3456-1012-bc02-0102030405ff",'
        b'"user":"ann","n":3,"score":0.5,"tags":["a","b"]}\n'
    )
    assert JSON_FRAMING.marshal(msg) == expect
    # The generic path (to_json, then the encoder) writes the very same bytes.
    assert JSON_FRAMING.marshal(Raw(msg.to_json())) == expect


def test_utf8_unescaped_and_newlines_escaped() -> None:
    line = JSON_FRAMING.marshal(Raw({"s": "é\n☃"}))
    assert line == '{"s":"é\\n☃"}\n'.encode()
    assert line.count(b"\n") == 1


def test_marshal_errors() -> None:
    with pytest.raises(MarshalError, match="to_json"):
        JSON_FRAMING.marshal(object())
    with pytest.raises(MarshalError, match="not JSON-encodable"):
        JSON_FRAMING.marshal(Raw({"x": float("nan")}))
    with pytest.raises(MarshalError, match="not JSON-encodable"):
        JSON_FRAMING.marshal(Raw({"x": object()}))


def test_unmarshal_round_trip_and_errors() -> None:
    msg = Click(user="bo", n=-1, score=2.25, tags=["x"])
    msg.set_uuid(UUID)
    frame = JSON_FRAMING.marshal(msg)
    out = Click()
    JSON_FRAMING.unmarshal(frame[:-1], out)
    assert out == msg and out.get_uuid() == UUID

    with pytest.raises(UnmarshalError, match="invalid JSON"):
        JSON_FRAMING.unmarshal(b'{"user":', Click())
    with pytest.raises(UnmarshalError, match="not an object"):
        JSON_FRAMING.unmarshal(b"[1,2]", Click())
    with pytest.raises(UnmarshalError, match="load_json"):
        JSON_FRAMING.unmarshal(b"{}", object())


def test_decoder_reuses_the_parse_once() -> None:
    framing = JSONFraming()
    dec = framing.decoder()
    dec.feed(b'{"user":"a","tags":["t"]}\n')
    ev = dec.next_event()
    assert isinstance(ev, Frame)
    first, second = Click(), Click()
    framing.unmarshal(ev.payload, first)
    framing.unmarshal(ev.payload, second)  # Parsed anew: no shared containers.
    assert first == second
    assert first.tags is not second.tags


def _lines(docs: list[dict[str, Any]]) -> list[bytes]:
    return [JSON_FRAMING.marshal(Raw(d)) for d in docs]


json_docs = st.lists(
    st.dictionaries(
        st.text(max_size=8),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(max_size=20),
            st.lists(st.integers(), max_size=3),
        ),
        max_size=5,
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(
    docs=json_docs, cuts=st.lists(st.integers(0, 2000), max_size=30), base=st.integers(0, 10**12)
)
def test_any_chunking_yields_exact_frames(
    docs: list[dict[str, Any]], cuts: list[int], base: int
) -> None:
    lines = _lines(docs)
    stream = b"".join(lines)
    dec = JSON_FRAMING.decoder(base)
    events = decode(dec, chunks(stream, cuts))
    assert all(isinstance(ev, Frame) for ev in events)
    assert_contiguous(events, base, base + len(stream))
    assert [ev.payload + b"\n" for ev in events if isinstance(ev, Frame)] == lines
    for ev, doc in zip(events, docs, strict=True):
        out = Raw()
        assert isinstance(ev, Frame)
        JSON_FRAMING.unmarshal(ev.payload, out)
        assert out.doc == doc
    assert dec.at_boundary() and dec.offset == base + len(stream)


@settings(max_examples=100, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 200), max_size=20),
    garbage=st.binary(min_size=1, max_size=30).filter(lambda b: b"\n" not in b),
)
def test_invalid_lines_are_desyncs_under_any_chunking(cuts: list[int], garbage: bytes) -> None:
    good = b'{"a":1}\n'
    stream = good + garbage + b"\n" + good + b"\n" + good + b'{"a":\n' + good
    events = decode(JSON_FRAMING.decoder(100), chunks(stream, cuts))
    g, n = len(good), len(garbage) + 1
    expect = [("Frame", 100, 100 + g)]
    at = 100 + g
    try:
        json.loads(garbage)
        is_object = isinstance(json.loads(garbage), dict)
    except ValueError:
        is_object = False
    expect.append(("Frame" if is_object else "Desync", at, at + n))
    at += n
    expect += [
        ("Frame", at, at + g),
        ("Desync", at + g, at + g + 1),  # A blank line.
        ("Frame", at + g + 1, at + 2 * g + 1),
        ("Desync", at + 2 * g + 1, at + 2 * g + 7),  # Truncated object, then its newline.
        ("Frame", at + 2 * g + 7, at + 3 * g + 7),
    ]
    assert ranges(events) == expect


def test_desync_reason_names_offset_and_error() -> None:
    dec = JSON_FRAMING.decoder(1000)
    dec.feed(b'{"a":1}\nnot json\n{"b":2}\n')
    events = dec.events()
    assert ranges(events) == [("Frame", 1000, 1008), ("Desync", 1008, 1017), ("Frame", 1017, 1025)]
    desync = events[1]
    assert isinstance(desync, Desync)
    assert "offset 1008" in desync.reason and "Expecting value" in desync.reason


def test_invalid_utf8_is_a_desync() -> None:
    dec = JSON_FRAMING.decoder()
    dec.feed(b'{"a":"\xff"}\n{"a":1}\n')
    assert ranges(dec.events()) == [("Desync", 0, 10), ("Frame", 10, 18)]


def test_overlong_lines_are_skipped_through_their_newline() -> None:
    framing = JSONFraming(max_frame_size=16)
    good = b'{"a":1}\n'
    long_line = b'{"a":"' + b"x" * 40 + b'"}\n'
    stream = good + long_line + good
    for size in (1, 3, 7, 100):
        dec = framing.decoder()
        events = decode(dec, chunks(stream, range(size, len(stream), size)))
        assert ranges(events) == [
            ("Frame", 0, 8),
            ("Desync", 8, 8 + len(long_line)),
            ("Frame", 8 + len(long_line), len(stream)),
        ]
        assert isinstance(events[1], Desync) and "longer than 16" in events[1].reason
        # Skipping doesn't keep the skipped bytes.
        assert dec.at_boundary()


def test_offset_and_boundary_while_pending() -> None:
    dec = JSON_FRAMING.decoder(50)
    dec.feed(b'{"a":1}\n{"a"')
    assert isinstance(dec.next_event(), Frame)
    assert dec.next_event() is None
    assert dec.offset == 58 and not dec.at_boundary()
    dec.feed(b":2}\n")
    ev = dec.next_event()
    assert isinstance(ev, Frame) and (ev.begin, ev.end) == (58, 66)
    assert dec.offset == 66 and dec.at_boundary()


def test_reset_discards_partial_frames() -> None:
    dec = JSON_FRAMING.decoder()
    dec.feed(b'{"a":1}\n{"partial')
    dec.events()
    dec.reset(500)
    assert dec.at_boundary() and dec.offset == 500
    dec.feed(b'{"b":2}\n')
    assert ranges(dec.events()) == [("Frame", 500, 508)]


def test_unknown_keys_ignored_and_uuid_parsed() -> None:
    out = Click()
    JSON_FRAMING.unmarshal(
        b'{"uuid":"789abcde-3456-1012-bc02-0102030405ff","user":"x","other":[1]}', out
    )
    assert out.user == "x" and out.get_uuid() == uuid.UUID(str(UUID))
