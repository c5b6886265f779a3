"""The text/csv framing: golden bytes, quoted newlines, round trips under any chunking, desyncs."""

from __future__ import annotations

import csv
import io
import uuid
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.message import (
    CSV_FRAMING,
    Clock,
    CSVFraming,
    CSVMessage,
    Desync,
    Frame,
    MarshalError,
    ProducerID,
    UnmarshalError,
    build_uuid,
)
from gazette.message.framing_csv import format_csv_record, parse_csv_record
from tests.message.framing_support import assert_contiguous, chunks, decode, ranges

UUID = build_uuid(ProducerID(bytes.fromhex("0102030405ff")), Clock(0x0123_4567_89AB_CDEF), 0)


class Row:
    """A message of raw string fields (the generic path)."""

    def __init__(self, fields: list[str] | None = None) -> None:
        self.fields = fields or []
        self.uuid: uuid.UUID | None = UUID

    def get_uuid(self) -> uuid.UUID | None:
        return self.uuid

    def set_uuid(self, uuid: uuid.UUID) -> None:
        self.uuid = uuid

    def to_csv_row(self) -> list[str]:
        return self.fields

    def load_csv_row(self, row: list[str]) -> None:
        self.fields = row


@dataclass
class Reading(CSVMessage):
    sensor: str = ""
    value: float = 0.0
    count: int = 0
    ok: bool = False


def test_golden_record() -> None:
    msg = Reading(sensor='a "b", c', value=1.5, count=-2, ok=True)
    msg.set_uuid(UUID)
    assert CSV_FRAMING.marshal(msg) == (
        b'789abcde-3456-1012-bc00-0102030405ff,"a ""b"", c",1.5,-2,true\n'
    )


def test_quoting_rules() -> None:
    assert format_csv_record(["a", "b c", " lead", "x\ny", "r\rs", "", "\\."]) == (
        'a,b c," lead","x\ny","r\rs",,"\\."\n'
    )
    assert format_csv_record([""]) == '""\n'


def test_quoted_newlines_are_one_frame() -> None:
    msgs = [Row(["multi\nline", "x"]), Row(['"quoted\r\n"', ""]), Row(["plain"])]
    stream = b"".join(CSV_FRAMING.marshal(m) for m in msgs)
    dec = CSV_FRAMING.decoder(5)
    events = decode(dec, [stream])
    assert len(events) == 3 and all(isinstance(ev, Frame) for ev in events)
    assert_contiguous(events, 5, 5 + len(stream))
    for ev, msg in zip(events, msgs, strict=True):
        assert isinstance(ev, Frame)
        out = Row()
        CSV_FRAMING.unmarshal(ev.payload, out)
        assert out.fields == msg.fields and out.uuid == UUID


def test_crlf_line_endings_accepted() -> None:
    dec = CSV_FRAMING.decoder()
    dec.feed(f'{UUID},a\r\n{UUID},"b\r\nc"\r\n'.encode())
    events = dec.events()
    assert ranges(events) == [("Frame", 0, 40), ("Frame", 40, 85)]
    out = Row()
    assert isinstance(events[1], Frame)
    CSV_FRAMING.unmarshal(events[1].payload, out)
    assert out.fields == ["b\r\nc"]


fields_st = st.lists(
    st.lists(
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
        max_size=4,
    ),
    max_size=10,
)


@settings(max_examples=200, deadline=None)
@given(
    rows=fields_st, cuts=st.lists(st.integers(0, 1500), max_size=30), base=st.integers(0, 1 << 40)
)
def test_any_chunking_yields_exact_frames(
    rows: list[list[str]], cuts: list[int], base: int
) -> None:
    records = [CSV_FRAMING.marshal(Row(r)) for r in rows]
    stream = b"".join(records)
    dec = CSV_FRAMING.decoder(base)
    events = decode(dec, chunks(stream, cuts))
    assert_contiguous(events, base, base + len(stream))
    assert len(events) == len(rows)
    for ev, row in zip(events, rows, strict=True):
        assert isinstance(ev, Frame)
        out = Row()
        CSV_FRAMING.unmarshal(ev.payload, out)
        assert out.fields == row and out.uuid == UUID
    assert dec.at_boundary()
    # Python's csv module reads the stream as we do.
    parsed = list(csv.reader(io.StringIO(stream.decode(), newline="")))
    assert parsed == [[str(UUID), *r] for r in rows]


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(0, 300), max_size=20))
def test_malformed_records_are_desyncs(cuts: list[int]) -> None:
    good = CSV_FRAMING.marshal(Row(["ok", "multi\nline"]))
    bad = b'"a"b,c\n'  # Text after a closing quote.
    stream = good + bad + good + b"\n" + good
    events = decode(CSV_FRAMING.decoder(), chunks(stream, cuts))
    g, b = len(good), len(bad)
    assert ranges(events) == [
        ("Frame", 0, g),
        ("Desync", g, g + b),
        ("Frame", g + b, 2 * g + b),
        ("Desync", 2 * g + b, 2 * g + b + 1),  # A blank line.
        ("Frame", 2 * g + b + 1, 3 * g + b + 1),
    ]
    assert isinstance(events[1], Desync) and f"offset {g}" in events[1].reason


def test_unterminated_quote_skips_its_first_line_at_the_size_limit() -> None:
    framing = CSVFraming(max_frame_size=64)
    good = CSV_FRAMING.marshal(Row(["ok"]))
    opened = b'x,"never closed\n'
    stream = opened + good * 3
    for size in (1, 7, 1000):
        events = decode(framing.decoder(), chunks(stream, range(size, len(stream), size)))
        n = len(opened)
        assert ranges(events) == [("Desync", 0, n)] + [
            ("Frame", n + i * len(good), n + (i + 1) * len(good)) for i in range(3)
        ]
        assert isinstance(events[0], Desync) and "longer than 64" in events[0].reason


def test_unmarshal_errors() -> None:
    with pytest.raises(UnmarshalError, match="not a UUID"):
        CSV_FRAMING.unmarshal(b"nope,1", Row())
    with pytest.raises(UnmarshalError, match="invalid CSV"):
        CSV_FRAMING.unmarshal(b'"a"b', Row())
    with pytest.raises(UnmarshalError, match="load_csv_row"):
        CSV_FRAMING.unmarshal(f"{UUID},1".encode(), object())
    with pytest.raises(MarshalError, match="to_csv_row"):
        CSV_FRAMING.marshal(object())
    with pytest.raises(MarshalError, match="bad CSV row"):
        CSV_FRAMING.marshal(Row([1]))  # type: ignore[list-item]
    # An empty UUID column leaves the message's UUID alone.
    out = Row()
    CSV_FRAMING.unmarshal(b",x", out)
    assert out.uuid == UUID and out.fields == ["x"]


def test_parse_csv_record() -> None:
    assert parse_csv_record(b'a,"b\nc",') == ["a", "b\nc", ""]
    with pytest.raises(UnmarshalError):
        parse_csv_record(b"\xff")


def test_leading_unicode_space_is_quoted_as_go_does() -> None:
    from gazette.message.framing_csv import format_csv_record

    for lead in (" ", "\t", "\v", "\f", "\u0085", "\u00a0"):
        assert format_csv_record([lead + "x"]) == f'"{lead}x"\n'
    assert format_csv_record(["x "]) == "x \n"
