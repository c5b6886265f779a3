"""Helpers shared by the framing tests: feeding a decoder in chunks, checking event ranges."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gazette.message import Desync, Frame, FrameDecoder


def chunks(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """`data` split at the (sorted, deduplicated) positions `cuts`."""
    points = sorted({c for c in cuts if 0 < c < len(data)})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


def decode(decoder: FrameDecoder, parts: Sequence[bytes]) -> list[Frame | Desync]:
    """Feed `parts` one at a time, pulling all events after each."""
    events: list[Frame | Desync] = []
    for part in parts:
        decoder.feed(part)
        events.extend(decoder.events())
    return events


def assert_contiguous(events: Sequence[Frame | Desync], begin: int, end: int) -> None:
    """Events tile [begin, end) exactly: each starts where the previous ended."""
    at = begin
    for ev in events:
        assert ev.begin == at, (ev, at)
        assert ev.end > ev.begin, ev
        at = ev.end
    assert at == end, (at, end)


def ranges(events: Sequence[Frame | Desync]) -> list[tuple[str, int, int]]:
    return [(type(ev).__name__, ev.begin, ev.end) for ev in events]
