"""Decoders fed arbitrary bytes: never raise, tile the stream exactly, and (JSON, CSV) give the
same events however the stream is split."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gazette.message import CSV_FRAMING, FIXED_FRAME_WORD, JSON_FRAMING, PROTO_FIXED_FRAMING
from tests.message.framing_support import assert_contiguous, chunks, decode

pieces = st.lists(
    st.one_of(
        st.binary(max_size=20),
        st.sampled_from(
            [
                b"\n",
                b'"',
                b",",
                b"\r\n",
                b'{"a":1}\n',
                b'"x\ny",z\n',
                FIXED_FRAME_WORD,
                FIXED_FRAME_WORD + b"\x02\x00\x00\x00\x08\x01",
                FIXED_FRAME_WORD + b"\x10\x00\x00\x00",
            ]
        ),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(parts=pieces, cuts=st.lists(st.integers(0, 600), max_size=25))
def test_decoders_tile_any_input(parts: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(parts)
    for framing in (JSON_FRAMING, CSV_FRAMING, PROTO_FIXED_FRAMING):
        dec = framing.decoder(3)
        events = decode(dec, chunks(stream, cuts))
        assert_contiguous(events, 3, dec.offset)
        if dec.at_boundary():
            assert dec.offset == 3 + len(stream)
        if framing is not PROTO_FIXED_FRAMING:
            whole = framing.decoder(3)
            assert decode(whole, [stream]) == events
