"""JSONMessage: dataclasses as JSON-lines messages."""

from __future__ import annotations

import enum
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
    Flags,
    JSONMessage,
    Message,
    UnmarshalError,
    build_uuid,
)
from gazette.message import ProducerID as PID
from gazette.message.framing_json import encode_json

UUID = build_uuid(PID(bytes.fromhex("0102030405ff")), Clock(0x0123_4567_89AB_CDEF), Flags.ACK_TXN)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Point:
    x: int
    y: int = 0


@dataclass
class Rich(JSONMessage):
    name: str = ""
    n: int = 0
    f: float = 0.0
    flag: bool = False
    maybe: str | None = None
    ref: uuid.UUID | None = None
    color: Color = Color.RED
    point: Point = field(default_factory=lambda: Point(0))
    points: list[Point] = field(default_factory=list)
    by_name: dict[str, Point] = field(default_factory=dict)
    by_id: dict[int, str] = field(default_factory=dict)
    pair: tuple[int, ...] = ()
    free: Any = None


@dataclass
class Declared(JSONMessage):
    uuid: uuid.UUID | None = None
    body: str = ""


@dataclass
class Renamed(JSONMessage):
    uuid_field = "id"
    body: str = ""


@dataclass
class Required(JSONMessage):
    needed: int


def _rich() -> Rich:
    return Rich(
        name="ä",
        n=7,
        f=2.5,
        flag=True,
        maybe="m",
        ref=UUID,
        color=Color.BLUE,
        point=Point(1, 2),
        points=[Point(3), Point(4, 5)],
        by_name={"p": Point(6)},
        by_id={1: "one"},
        pair=(1, 2),
        free={"k": [1, None]},
    )


def test_is_a_message() -> None:
    assert isinstance(Rich(), Message)


def test_to_json_shape() -> None:
    msg = _rich()
    msg.set_uuid(UUID)
    assert msg.to_json() == {
        "uuid": str(UUID),
        "name": "ä",
        "n": 7,
        "f": 2.5,
        "flag": True,
        "maybe": "m",
        "ref": str(UUID),
        "color": "blue",
        "point": {"x": 1, "y": 2},
        "points": [{"x": 3, "y": 0}, {"x": 4, "y": 5}],
        "by_name": {"p": {"x": 6, "y": 0}},
        "by_id": {1: "one"},
        "pair": (1, 2),
        "free": {"k": [1, None]},
    }
    assert next(iter(msg.to_json())) == "uuid"
    assert "uuid" not in Rich().to_json()


def test_round_trip_through_the_framing() -> None:
    msg = _rich()
    msg.set_uuid(UUID)
    line = JSON_FRAMING.marshal(msg)
    out = Rich()
    JSON_FRAMING.unmarshal(line[:-1], out)
    assert out == msg and out.get_uuid() == UUID
    assert Rich.from_json(json.loads(line)) == msg


def test_fast_line_matches_the_generic_encoding() -> None:
    msg = _rich()
    for uid in (None, UUID):
        if uid:
            msg.set_uuid(uid)
        line = msg.to_json_line()
        assert line == (encode_json(msg.to_json()) + "\n").encode()


def test_fast_line_falls_back_on_unexpected_types() -> None:
    msg = Rich(n=True, f=1)  # Valid for the type checker, not for the JSON fast path.
    assert msg.to_json_line() is None
    assert json.loads(JSON_FRAMING.marshal(msg))["n"] is True
    assert Rich(f=float("inf")).to_json_line() is None


scalars = st.builds(
    Rich,
    name=st.text(),
    n=st.integers(-(2**70), 2**70),
    f=st.floats(allow_nan=False, allow_infinity=False),
    flag=st.booleans(),
    maybe=st.none() | st.text(max_size=5),
    ref=st.none() | st.uuids(),
)


@settings(max_examples=300, deadline=None)
@given(msg=scalars, uid=st.none() | st.uuids())
def test_fast_line_equivalence(msg: Rich, uid: uuid.UUID | None) -> None:
    if uid is not None:
        msg.set_uuid(uid)
    line = msg.to_json_line()
    assert line is not None
    assert line == (encode_json(msg.to_json()) + "\n").encode()
    out = Rich()
    out.load_json(json.loads(line))
    assert out == msg and out.get_uuid() == uid


def test_declared_and_renamed_uuid_fields() -> None:
    d = Declared(body="b")
    d.set_uuid(UUID)
    assert d.uuid == UUID
    assert d.to_json() == {"uuid": str(UUID), "body": "b"}
    assert Declared.from_json({"uuid": str(UUID), "body": "c"}) == Declared(UUID, "c")

    r = Renamed(body="b")
    r.set_uuid(UUID)
    assert JSON_FRAMING.marshal(r) == f'{{"id":"{UUID}","body":"b"}}\n'.encode()
    out = Renamed()
    out.load_json({"id": str(UUID), "body": "x"})
    assert out.get_uuid() == UUID


def test_new_acknowledgement() -> None:
    msg = _rich()
    msg.set_uuid(UUID)
    ack = msg.new_acknowledgement("a/journal")
    assert type(ack) is Rich and ack == Rich() and ack.get_uuid() is None
    with pytest.raises(TypeError, match="give every field a default"):
        Required(1).new_acknowledgement("a/journal")
    assert Required.from_json({"needed": 3}) == Required(3)
    with pytest.raises(UnmarshalError, match="Required"):
        Required.from_json({})


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"n": "7"}, "field 'n': expected an integer"),
        ({"n": True}, "field 'n': expected an integer"),
        ({"f": "x"}, "field 'f': expected a number"),
        ({"flag": 1}, "field 'flag': expected a boolean"),
        ({"name": None}, "field 'name': expected a string"),
        ({"uuid": "not-a-uuid"}, "field 'uuid'"),
        ({"ref": 12}, "field 'ref': expected a UUID string"),
        ({"color": "green"}, "field 'color'"),
        ({"point": [1]}, "field 'point': expected an object"),
        ({"points": [{"x": "1"}]}, "field 'points': field 'x': expected an integer"),
        ({"by_id": {"x": "1"}}, "field 'by_id'"),
    ],
)
def test_load_json_type_errors(doc: dict[str, Any], match: str) -> None:
    with pytest.raises(UnmarshalError, match=match):
        Rich().load_json(doc)


def test_load_json_keeps_missing_fields_and_converts() -> None:
    msg = Rich(name="keep")
    msg.load_json({"f": 3, "by_id": {"2": "two"}, "pair": [1, 2, 3], "extra": 1})
    assert msg.name == "keep" and msg.f == 3.0 and isinstance(msg.f, float)
    assert msg.by_id == {2: "two"} and msg.pair == (1, 2, 3)
