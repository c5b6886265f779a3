"""Batch decoding of JSON lines (`JSONFraming.unmarshal_buffered` and the messages' fast
loaders): the same messages and offsets as the frame-by-frame path, or no batch at all."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.message import JSONMessage
from gazette.message.framing import Frame
from gazette.message.framing_json import JSON_FRAMING, JSONFraming
from gazette.message.uuid import Clock, ProducerID, build_uuid


@dataclass
class Flat(JSONMessage):
    name: str = ""
    n: int = 0
    f: float = 0.0
    flag: bool = False
    maybe: str | None = None
    ref: uuid.UUID | None = None
    tags: list[str] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    free: Any = None


@dataclass
class Point:
    x: int = 0


@dataclass
class Nested(JSONMessage):
    point: Point = field(default_factory=Point)


@dataclass
class Renamed(JSONMessage):
    uuid_field = "id"
    body: str = ""


PRODUCER = ProducerID(bytes.fromhex("01000000000a"))


def _flat(i: int) -> Flat:
    msg = Flat(
        name=f"n{i}ä",
        n=i * 7 - 3,
        f=i / 3,
        flag=i % 2 == 0,
        maybe=None if i % 3 else "m",
        ref=uuid.UUID(int=i) if i % 2 else None,
        tags=[str(i)] * (i % 3),
        scores={"a": float(i)},
        free={"k": [i, None, "x"]} if i % 2 else i,
    )
    msg.set_uuid(build_uuid(PRODUCER, Clock(16 * (i + 1)), 0))
    return msg


def _slow(data: bytes, base: int, new: Any) -> list[tuple[int, int, Any]]:
    dec = JSON_FRAMING.decoder(base)
    dec.feed(data)
    out = []
    for ev in dec.events():
        assert isinstance(ev, Frame)
        msg = new()
        JSON_FRAMING.unmarshal(ev.payload, msg)
        out.append((ev.begin, ev.end, msg))
    return out


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 40), st.integers(0, 1 << 40), st.integers(1, 200))
def test_batches_decode_what_frames_decode(n: int, base: int, cut: int) -> None:
    data = b"".join(JSON_FRAMING.marshal(_flat(i)) for i in range(n))
    dec = JSON_FRAMING.decoder(base)
    got: list[tuple[int, int, Any]] = []
    for k in range(0, len(data), cut * 17):  # Chunks ending anywhere, lines split.
        dec.feed(data[k : k + cut * 17])
        batch = JSON_FRAMING.unmarshal_buffered(dec, Flat)
        if batch is not None:
            begin, ends, msgs = batch
            for end, msg in zip(ends, msgs, strict=True):
                got.append((begin, end, msg))
                begin = end
    assert dec.at_boundary() and dec.offset == base + len(data)
    assert got == _slow(data, base, Flat)
    assert [m.get_uuid() for _, _, m in got] == [_flat(i).get_uuid() for i in range(n)]


def test_a_line_that_does_not_decode_leaves_the_batch_to_the_frame_path() -> None:
    good = JSON_FRAMING.marshal(_flat(1))
    for bad in (
        b"not json\n",
        b"\n",  # Blank: a Desync.
        b'{"n": 1.5}\n',  # Wrong type: unmarshal fails on this line only.
        b'{"n": true}\n',
        b'{"f": NaN}\n',  # JSON the frame path takes (as Python's json does).
        b'{"ref": "{00000000-0000-0000-0000-000000000001}"}\n',
        b"[1]\n",
    ):
        dec = JSON_FRAMING.decoder(10)
        dec.feed(good + bad + good)
        assert JSON_FRAMING.unmarshal_buffered(dec, Flat) is None, bad
        assert dec.offset == 10 and not dec.at_boundary()  # Nothing consumed.
    # Values the frame path accepts and a batch refuses still decode, one by one.
    dec = JSON_FRAMING.decoder(0)
    dec.feed(b'{"f": NaN, "ref": "{00000000-0000-0000-0000-000000000001}"}\n')
    ev = dec.next_event()
    assert isinstance(ev, Frame)
    msg = Flat()
    JSON_FRAMING.unmarshal(ev.payload, msg)
    assert msg.f != msg.f and msg.ref == uuid.UUID(int=1)


def test_overlong_lines_and_pending_skips_are_not_batched() -> None:
    framing = JSONFraming(max_frame_size=20)
    dec = framing.decoder(0)
    dec.feed(b'{"name": "0123456789abcdef"}\n')
    assert framing.unmarshal_buffered(dec, Flat) is None
    dec = framing.decoder(0)
    dec.feed(b"x" * 30)  # A line growing past the limit: being skipped.
    assert dec.next_event() is None
    dec.feed(b"\n" + b'{"n": 1}\n')
    assert framing.unmarshal_buffered(dec, Flat) is None
    assert dec.next_event() is not None  # The Desync, then the line batches.
    batch = framing.unmarshal_buffered(dec, Flat)
    assert batch is not None and batch[2][0].n == 1


def test_fields_missing_from_a_line_keep_the_new_messages_values() -> None:
    first, second = b'{"n": 2}\n', b'{"name": "x", "uuid": null}\n'
    dec = JSON_FRAMING.decoder(0)
    dec.feed(first + second)
    batch = JSON_FRAMING.unmarshal_buffered(dec, lambda: Flat(name="kept", n=9))
    assert batch is not None
    _, ends, msgs = batch
    assert [(m.name, m.n, m.get_uuid()) for m in msgs] == [("kept", 2, None), ("x", 9, None)]
    assert ends == [len(first), len(first) + len(second)]


def test_classes_without_exact_fast_types_and_renamed_uuids() -> None:
    assert Nested().json_fast_loader() is None
    dec = JSON_FRAMING.decoder(0)
    dec.feed(JSON_FRAMING.marshal(Nested(Point(3))))
    assert JSON_FRAMING.unmarshal_buffered(dec, Nested) is None
    assert Renamed().json_fast_loader() is not None
    msg = Renamed(body="b")
    msg.set_uuid(build_uuid(PRODUCER, Clock(32), 2))
    dec.reset(0)
    dec.feed(JSON_FRAMING.marshal(msg))
    batch = JSON_FRAMING.unmarshal_buffered(dec, Renamed)
    assert batch is not None and batch[2] == [msg] and batch[2][0].id == msg.get_uuid()


def test_messages_of_another_class_than_the_first_are_not_batched() -> None:
    made: list[type] = [Flat, Renamed]
    dec = JSON_FRAMING.decoder(0)
    dec.feed(b"{}\n{}\n")
    assert JSON_FRAMING.unmarshal_buffered(dec, lambda: made.pop(0)()) is None
    assert dec.offset == 0


@pytest.mark.parametrize("data", [b"", b'{"n": 1}'])
def test_nothing_complete_is_no_batch(data: bytes) -> None:
    dec = JSON_FRAMING.decoder(0)
    dec.feed(data)
    assert JSON_FRAMING.unmarshal_buffered(dec, Flat) is None


def test_marshal_calls_an_overridden_to_json_line() -> None:
    @dataclass
    class Custom(Flat):
        def to_json_line(self) -> bytes | None:
            return b'{"custom":true}\n'

    assert JSON_FRAMING.marshal(Custom()) == b'{"custom":true}\n'
    assert JSON_FRAMING.marshal(Flat(n=3)) == Flat(n=3).to_json_line()
