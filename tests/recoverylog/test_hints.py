"""FSMHints as Gazette stores them: Go encoding/json bytes, or binary protobuf."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.broker.protocol.errors import ValidationError
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.hints import (
    InvalidHints,
    hints_from_bytes,
    hints_from_json,
    hints_to_json,
    validate_hints,
)

# As written by Gazette's json.Marshal of FSMHints.
SAMPLE = (
    b'{"log":"a/log","live_nodes":[{"fnode":42,"segments":[{"author":1234,"first_seq_no":42,'
    b'"first_offset":100,"first_checksum":5678,"last_seq_no":50,"last_offset":900}]}],'
    b'"properties":[{"path":"/IDENTITY","content":"abc"}]}'
)


def sample() -> rpb.FSMHints:
    return rpb.FSMHints(
        log="a/log",
        live_nodes=[
            rpb.FnodeSegments(
                fnode=42,
                segments=[
                    rpb.Segment(
                        author=1234,
                        first_seq_no=42,
                        first_offset=100,
                        first_checksum=5678,
                        last_seq_no=50,
                        last_offset=900,
                    )
                ],
            )
        ],
        properties=[rpb.Property(path="/IDENTITY", content="abc")],
    )


def test_sample_round_trip() -> None:
    assert hints_from_bytes(SAMPLE) == sample()
    assert hints_to_json(sample()) == SAMPLE
    FSM.from_hints(hints_from_bytes(SAMPLE))  # And it's usable.


def test_empty_repeated_fields_are_null_and_zero_scalars_omitted() -> None:
    assert hints_to_json(rpb.FSMHints()) == b'{"live_nodes":null,"properties":null}'
    hints = rpb.FSMHints(
        log="a/log",
        live_nodes=[rpb.FnodeSegments(fnode=3), rpb.FnodeSegments(segments=[rpb.Segment()])],
        properties=[rpb.Property()],
    )
    assert hints_to_json(hints) == (
        b'{"log":"a/log","live_nodes":[{"fnode":3,"segments":null},{"segments":[{}]}],'
        b'"properties":[{}]}'
    )


def test_uint32_and_segment_log_encoding() -> None:
    hints = rpb.FSMHints(
        log="a/log",
        live_nodes=[
            rpb.FnodeSegments(
                fnode=1,
                segments=[
                    rpb.Segment(
                        author=0xFFFFFFFF,
                        first_seq_no=1,
                        first_checksum=0xFEEDBEEF,
                        last_seq_no=1,
                        log="other/log",
                    )
                ],
            )
        ],
    )
    data = hints_to_json(hints)
    assert data == (
        b'{"log":"a/log","live_nodes":[{"fnode":1,"segments":[{"author":4294967295,'
        b'"first_seq_no":1,"first_checksum":4276993775,"last_seq_no":1,"log":"other/log"}]}],'
        b'"properties":null}'
    )
    assert hints_from_bytes(data) == hints


def test_strings_are_escaped_as_go_does() -> None:
    hints = rpb.FSMHints(
        properties=[rpb.Property(path='/<a&b>"\\', content="tab\there\u2028\u00e9\x01\u2029")]
    )
    data = hints_to_json(hints)
    assert data == (
        b'{"live_nodes":null,"properties":[{"path":"/\\u003ca\\u0026b\\u003e\\"\\\\",'
        b'"content":"tab\\there\\u2028\xc3\xa9\\u0001\\u2029"}]}'
    )
    assert hints_from_bytes(data) == hints


def test_decoding_is_lenient_as_go_is() -> None:
    data = (
        b'{"LOG":"a/log","unknown":[1,2],"Live_Nodes":[{"fnode":7,"segments":null}],'
        b'"properties":null}'
    )
    assert hints_from_bytes(data) == rpb.FSMHints(
        log="a/log", live_nodes=[rpb.FnodeSegments(fnode=7)]
    )
    assert hints_from_json("null") == rpb.FSMHints()


@pytest.mark.parametrize(
    "data",
    [
        b'{"log":5}',
        b'{"live_nodes":[{"fnode":1.5}]}',
        b'{"live_nodes":[{"fnode":1e3}]}',
        b'{"live_nodes":[{"segments":[{"author":-1}]}]}',
        b'{"live_nodes":[{"segments":[{"author":4294967296}]}]}',
        b'{"live_nodes":[{"segments":[{"first_seq_no":9223372036854775808}]}]}',
        b'{"live_nodes":{}}',
        b'{"properties":[[]]}',
        b'{"log":true',
        b"",
        b"\xff\xff",
    ],
)
def test_invalid_hints(data: bytes) -> None:
    with pytest.raises(InvalidHints):
        hints_from_bytes(data)


def test_binary_proto() -> None:
    assert hints_from_bytes(sample().SerializeToString()) == sample()


segments = st.builds(
    rpb.Segment,
    author=st.integers(0, 0xFFFFFFFF),
    first_seq_no=st.integers(0, 2**63 - 1),
    first_offset=st.integers(0, 2**63 - 1),
    first_checksum=st.integers(0, 0xFFFFFFFF),
    last_seq_no=st.integers(-(2**63), 2**63 - 1),
    last_offset=st.integers(0, 2**40),
    log=st.text(max_size=8),
)
all_hints = st.builds(
    rpb.FSMHints,
    log=st.text(max_size=10),
    live_nodes=st.lists(
        st.builds(
            rpb.FnodeSegments,
            fnode=st.integers(-(2**63), 2**63 - 1),
            segments=st.lists(segments, max_size=3),
        ),
        max_size=3,
    ),
    properties=st.lists(
        st.builds(rpb.Property, path=st.text(max_size=8), content=st.text(max_size=20)),
        max_size=3,
    ),
)


@given(all_hints)
def test_json_round_trip(hints: rpb.FSMHints) -> None:
    data = hints_to_json(hints)
    assert data.startswith(b"{")
    assert hints_from_bytes(data) == hints


def test_validate_hints() -> None:
    validate_hints(sample())
    bad = sample()
    bad.live_nodes[0].segments[0].log = "a/log"
    with pytest.raises(ValidationError, match="duplicates FSMHints.Log"):
        validate_hints(bad)
    bad.live_nodes[0].segments[0].author = 0
    bad.live_nodes[0].segments[0].log = ""
    with pytest.raises(ValidationError, match="Segment: Author is zero"):
        validate_hints(bad)
