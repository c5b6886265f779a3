"""``gazctl journals read`` over a journal missing part of its content (a persisted fragment
deleted from the store): it stops at the gap and exits 3, unless --allow-gaps."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from gazette.broker.client import JournalClient, RetryReader
from gazette.broker.client.errors import OffsetJump
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.gazctl.journals import _Gaps
from gazette.testing.broker import BrokerProcess
from tests.kit.eventually import eventually_blocking

from .conftest import Gazctl

PARTS = [b"a" * 1100, b"b" * 1100, b"c" * 1100]
TAIL = b"tail\n"


def _persisted(gazctl: Gazctl, journal: str) -> list[dict[str, object]]:
    r = gazctl("journals", "fragments", "-l", f"name={journal}", "-o", "json")
    assert r.rc == 0, r.err
    return [f for f in json.loads(r.text) if f.get("backing_store")]


@pytest.fixture
def holed(gazctl: Gazctl, prefix: str, tmp_path: Path) -> str:
    """A journal of fragments [0,1100) a, [1100,2200) b, [2200,3300) c (persisted) and a
    tail in the spool, whose fragment [1100, 2200) was then deleted from the store."""
    store = tmp_path / "store"
    store.mkdir()
    journal = f"{prefix}holed"
    spec = (
        f"name: {journal}\nreplication: 1\n"
        "fragment: {length: 1024, compression_codec: NONE, refresh_interval: 1s, "
        f'stores: ["file://{store}/"]}}\n'
    )
    assert gazctl("journals", "apply", stdin=spec.encode()).rc == 0
    for part in [*PARTS, TAIL]:  # Each append of more than `length` rolls a fragment.
        r = gazctl("journals", "append", "--journal", journal, stdin=part)
        assert r.rc == 0, r.err
    t0 = time.monotonic()
    eventually_blocking(
        lambda: len(_persisted(gazctl, journal)) >= 3,
        what="3 persisted fragments",
        timeout=60,
        interval=0.1,
    )
    (second,) = store.rglob("000000000000044c-*")
    second.unlink()
    eventually_blocking(
        lambda: all(f["begin"] != 1100 for f in _persisted(gazctl, journal)),
        what="the broker's index to drop the deleted fragment",
        timeout=max(60 - (time.monotonic() - t0), 0),
        interval=0.2,
    )
    return journal


def test_read_stops_at_a_gap_and_exits_3(gazctl: Gazctl, holed: str, tmp_path: Path) -> None:
    offsets = tmp_path / "offsets.json"
    r = gazctl("journals", "read", "-l", f"name={holed}", "--offsets-out", str(offsets))
    assert r.rc == 3, r.err
    assert r.out == PARTS[0], "content before the gap is written, nothing after it"
    assert r.err.startswith(f"gazctl: error: journal {holed}: offsets [1100, 2200) are missing")
    assert "--allow-gaps" in r.err and r.err.count("\n") == 1, r.err
    # A later read resumes where this one stopped (and stops there again).
    assert json.loads(offsets.read_text()) == {holed: 1100}


def test_read_allow_gaps_reads_past_and_reports(gazctl: Gazctl, holed: str) -> None:
    r = gazctl("journals", "read", "-l", f"name={holed}", "--allow-gaps")
    assert r.rc == 0, r.err
    assert r.out == PARTS[0] + PARTS[2] + TAIL
    assert f"skipped journal {holed}: offsets [1100, 2200) are missing (1100 bytes)" in r.err


def test_jumps_taken_by_from_time_are_no_gaps() -> None:
    """With --from, the broker skips fragments persisted before that time: the jumps before
    the first byte read are what --from asked for; later ones are gaps as without it."""

    def jump(a: int, b: int) -> OffsetJump:
        return OffsetJump("a/journal", a, b)

    gaps = _Gaps(from_time=True)
    gaps.jumped(jump(0, 100))
    gaps.jumped(jump(100, 200))
    assert gaps.take(delivering=True) == []
    gaps.jumped(jump(300, 400))
    assert gaps.take(delivering=True) == [jump(300, 400)]

    gaps = _Gaps(from_time=False)
    gaps.jumped(jump(0, 100))
    assert gaps.take(delivering=False) == [jump(0, 100)]


@pytest.mark.parametrize("bad", ['"12"', "1e30", "99999999999999999999", "-2", "true"])
def test_read_refuses_bad_offsets_files(gazctl: Gazctl, tmp_path: Path, bad: str) -> None:
    """Offsets that no journal has are refused in one line naming the journal (they ended in
    tracebacks)."""
    offsets = tmp_path / "offsets.json"
    offsets.write_text(f'{{"gz/x/y": {bad}}}')
    r = gazctl("journals", "read", "-l", "name=gz/x/y", "--offsets", str(offsets))
    assert r.rc == 1 and r.err.count("\n") == 1, r.err
    assert r.err.startswith(
        f"gazctl: error: --offsets {offsets}: the offset of gz/x/y must be an integer from -1"
    ), r.err
    r = gazctl("journals", "read", "-l", "name=gz/x/y", "--from", "99999999999999999999")
    assert r.rc == 1 and "invalid time" in r.err and r.err.count("\n") == 1, r.err


@pytest.mark.parametrize(("begin", "end"), [(1100, 2000), (1500, 2200)])
async def test_a_blocking_read_of_a_range_inside_a_gap_ends_with_the_jump(
    holed: str, gazctl_broker: BrokerProcess, begin: int, end: int
) -> None:
    """A bounded, blocking read whose whole range is missing (as a Sequencer's replay or a
    recovery-log segment read may ask for) is told where content resumes and ends, rather
    than being ended without a word and retried forever."""
    req = pb.ReadRequest(journal=holed, offset=begin, end_offset=end, block=True)
    async with JournalClient(gazctl_broker.endpoint) as client:
        reader = RetryReader(client, req)
        try:
            assert await asyncio.wait_for(reader.read(), 20) == b""
        finally:
            reader.close()
    assert reader.offset == 2200
