"""CSVMessage: dataclasses as CSV messages."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.message import (
    CSV_FRAMING,
    Clock,
    CSVMessage,
    Frame,
    Message,
    UnmarshalError,
    build_uuid,
)
from gazette.message import ProducerID as PID

UUID = build_uuid(PID(bytes.fromhex("0102030405ff")), Clock(0x0123_4567_89AB_CDEF), 1)


class Level(enum.Enum):
    LOW = 1
    HIGH = 2


@dataclass
class Reading(CSVMessage):
    sensor: str = ""
    value: float = 0.0
    count: int = 0
    ok: bool = False
    note: str | None = None
    ref: uuid.UUID | None = None
    level: Level = Level.LOW


def test_row_shape_and_round_trip() -> None:
    msg = Reading("s,1", 0.1, 3, True, None, UUID, Level.HIGH)
    msg.set_uuid(UUID)
    assert isinstance(msg, Message)
    assert msg.to_csv_row() == ["s,1", "0.1", "3", "true", "", str(UUID), "2"]
    frame = CSV_FRAMING.marshal(msg)
    assert frame == f'{UUID},"s,1",0.1,3,true,,{UUID},2\n'.encode()
    dec = CSV_FRAMING.decoder()
    dec.feed(frame)
    ev = dec.next_event()
    assert isinstance(ev, Frame)
    out = Reading()
    CSV_FRAMING.unmarshal(ev.payload, out)
    assert out == msg and out.get_uuid() == UUID
    ack = msg.new_acknowledgement("j")
    assert ack == Reading() and ack.get_uuid() is None


@settings(max_examples=200, deadline=None)
@given(
    sensor=st.text(st.characters(codec="utf-8", exclude_characters="\x00")),
    value=st.floats(allow_nan=False),
    count=st.integers(),
    ok=st.booleans(),
    note=st.none() | st.text(min_size=1),
)
def test_round_trip(sensor: str, value: float, count: int, ok: bool, note: str | None) -> None:
    msg = Reading(sensor, value, count, ok, note)
    msg.set_uuid(UUID)
    dec = CSV_FRAMING.decoder()
    dec.feed(CSV_FRAMING.marshal(msg))
    ev = dec.next_event()
    assert isinstance(ev, Frame) and dec.at_boundary()
    out = Reading()
    CSV_FRAMING.unmarshal(ev.payload, out)
    assert out == msg


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_go_booleans(text: str) -> None:
    out = Reading()
    out.load_csv_row(["", "0", "0", text, "", "", "1"])
    assert out.ok is True


def test_errors() -> None:
    with pytest.raises(UnmarshalError, match="7 CSV columns after the UUID, but the record has 1"):
        Reading().load_csv_row(["x"])
    with pytest.raises(UnmarshalError, match="field 'count'"):
        Reading().load_csv_row(["", "0", "x", "true", "", "", "1"])
    with pytest.raises(UnmarshalError, match="field 'ok'"):
        Reading().load_csv_row(["", "0", "0", "yes", "", "", "1"])

    @dataclass
    class Bad(CSVMessage):
        items: list[str] | None = None

    with pytest.raises(TypeError, match="unsupported field type for CSV"):
        Bad().to_csv_row()
