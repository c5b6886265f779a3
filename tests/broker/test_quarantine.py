"""Judging spools of unserved journals (broker.quarantine)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gazette.broker.metrics import render
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.sha1sum import sha1sum_from_digest
from gazette.broker.quarantine import Comparison, list_quarantined, quarantine

SPOOL = b"0123456789" * 10  # offsets [1000, 1100)


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    path = tmp_path / "00000000000003e8.spool"
    path.write_bytes(SPOOL)
    return path


def at(offset: int, n: int) -> bytes:
    return SPOOL[offset - 1000 : offset - 1000 + n]


@pytest.mark.parametrize(
    ("seen", "safe_below", "action"),
    [
        ([(1000, at(1000, 100))], 5000, "redundant"),
        ([(990, b"xxxxxxxxxx" + at(1000, 100) + b"yy")], 5000, "redundant"),
        ([(1000, at(1000, 40)), (1040, at(1040, 60))], None, "redundant"),
        ([(1000, at(1000, 40))], 5000, "publish"),  # the rest lies below the head
        ([], None, "publish"),  # no primary: nobody writes there
        ([(1000, at(1000, 40))], 1050, "wait"),  # the primary may still write [1050, 1100)
        ([(1050, b"different")], 5000, "quarantine"),
        ([(1000, at(1000, 40)), (1040, b"X" + at(1041, 59))], 5000, "quarantine"),
    ],
)
def test_verdicts(
    spool: Path, seen: list[tuple[int, bytes]], safe_below: int | None, action: str
) -> None:
    cmp = Comparison(spool, 1000, 1100)
    for offset, data in seen:
        cmp.observe(offset, data, "test")
    assert cmp.verdict(safe_below).action == action


def test_a_mismatch_names_its_offset_and_source(spool: Path) -> None:
    cmp = Comparison(spool, 1000, 1100)
    cmp.observe(1000, at(1000, 45) + b"!", "fragment [0, 2000) in file:///s/")
    reason = cmp.verdict(None).reason
    assert reason == "differs from fragment [0, 2000) in file:///s/ at offset 1045"


def test_quarantined_spools_are_listed(tmp_path: Path, spool: Path) -> None:
    commits = spool.with_suffix(".commits")
    commits.write_bytes(b"\0" * 8)
    frag = pb.Fragment(
        journal="a/journal",
        begin=1000,
        end=1100,
        sum=sha1sum_from_digest(hashlib.sha1(SPOOL).digest()),
    )
    before = render([])
    dest = quarantine(tmp_path / "spools", frag, spool, commits, "differs from x at offset 1")
    assert not spool.exists() and not commits.exists()
    # The metrics an operator alerts on count it.
    for metric, added in (
        ("gazette_spools_quarantined_total", 1),
        ("gazette_spool_quarantined_bytes_total", 100),
    ):
        assert _value(render([]), metric) == _value(before, metric) + added
    assert dest.read_bytes() == SPOOL
    assert oct(dest.parent.stat().st_mode & 0o777) == "0o700"
    [q] = list_quarantined(tmp_path / "spools")
    assert (q.journal, q.begin, q.end, q.path) == ("a/journal", 1000, 1100, dest)
    assert q.reason == "differs from x at offset 1"
    assert q.sha1 == hashlib.sha1(SPOOL).hexdigest()


def _value(exposition: str, metric: str) -> float:
    [line] = [ln for ln in exposition.splitlines() if ln.split(" ")[0] == metric]
    return float(line.split(" ")[1])
