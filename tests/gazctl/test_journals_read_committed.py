"""``gazctl journals read --committed``: only messages of committed transactions, each once,
without acknowledgements, against journals written as a failing and recovering producer
writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gazette.message.uuid import Clock, Flags, ProducerID, build_uuid

from .conftest import Gazctl

PRODUCER = ProducerID(bytes.fromhex("0a0b0c0d0e0f"))


def _uuid(clock: int, flags: Flags) -> str:
    return str(build_uuid(PRODUCER, Clock(clock << 4), flags))


def _line(clock: int, flags: Flags, **fields: object) -> bytes:
    return json.dumps({"uuid": _uuid(clock, flags), **fields}).encode() + b"\n"


# A producer commits a transaction, begins another, fails and recovers (re-sending its last
# ACK, which rolls the open transaction back), redoes it and commits; then writes one message
# outside any transaction, and begins a transaction it never commits.
FIRST = _line(1, Flags.CONTINUE_TXN, n=1)
ROLLED_BACK = _line(2, Flags.CONTINUE_TXN, n=2, attempt=1)
REDONE = _line(3, Flags.CONTINUE_TXN, n=2, attempt=2)
OUTSIDE = _line(4, Flags.OUTSIDE_TXN, n=3)
NEVER_ACKED = _line(5, Flags.CONTINUE_TXN, n=4)
JSON_LINES = [
    FIRST,
    _line(1, Flags.ACK_TXN),
    ROLLED_BACK,
    _line(1, Flags.ACK_TXN),
    REDONE,
    _line(3, Flags.ACK_TXN),
    OUTSIDE,
    NEVER_ACKED,
]


def _journal(gazctl: Gazctl, name: str, content_type: str, store: Path) -> None:
    store.mkdir(exist_ok=True)
    spec = (
        f"name: {name}\nreplication: 1\nlabels: [{{name: content-type, value: {content_type}}}]\n"
        "fragment: {length: 1048576, compression_codec: NONE, refresh_interval: 1m, "
        f'stores: ["file://{store}/"]}}\n'
    )
    r = gazctl("journals", "apply", stdin=spec.encode())
    assert r.rc == 0, r.err


def _append(gazctl: Gazctl, journal: str, lines: list[bytes]) -> None:
    for line in lines:  # One append each: as many appends as a producer makes.
        r = gazctl("journals", "append", "--journal", journal, stdin=line)
        assert r.rc == 0, r.err


def test_committed_messages_once_without_acks(gazctl: Gazctl, prefix: str, tmp_path: Path) -> None:
    a, b = f"{prefix}out/a", f"{prefix}out/b"
    for journal in (a, b):
        _journal(gazctl, journal, "application/x-ndjson", tmp_path / "store")
    _append(gazctl, a, JSON_LINES)
    _append(gazctl, b, JSON_LINES[:2])

    raw = gazctl("journals", "read", "-l", f"name={a}")
    assert raw.rc == 0, raw.err
    assert raw.out == b"".join(JSON_LINES)

    r = gazctl("journals", "read", "-l", f"name={a}", "--committed")
    assert r.rc == 0, r.err
    assert r.out == FIRST + REDONE + OUTSIDE

    # Each journal is sequenced by itself (the same producer's ACK in b commits b's message).
    r = gazctl("journals", "read", "-l", f"name:prefix={prefix}out/", "--committed")
    assert r.rc == 0, r.err
    assert sorted(r.out.splitlines(keepends=True)) == sorted([FIRST, REDONE, OUTSIDE, FIRST])


def test_committed_csv(gazctl: Gazctl, prefix: str, tmp_path: Path) -> None:
    journal = f"{prefix}csv"
    _journal(gazctl, journal, "text/csv", tmp_path / "store")
    rows = [
        f"{_uuid(1, Flags.CONTINUE_TXN)},a,1\n".encode(),
        f"{_uuid(2, Flags.CONTINUE_TXN)},b,2\n".encode(),
        f"{_uuid(1, Flags.ACK_TXN)},,\n".encode(),
    ]
    _append(gazctl, journal, rows)
    r = gazctl("journals", "read", "-l", f"name={journal}", "--committed")
    assert r.rc == 0, r.err
    assert r.out == rows[0]


@pytest.mark.parametrize(
    ("content_type", "argv", "message"),
    [
        (
            "application/x-protobuf-fixed",
            (),
            "is application/x-protobuf-fixed, whose UUIDs are fields of the application's "
            "message type",
        ),
        ("application/octet-stream", (), "no framing for content type"),
        ("application/x-ndjson", ("--offsets-out", "o.json"), "--offsets and --offsets-out"),
    ],
)
def test_committed_refused(
    gazctl: Gazctl,
    prefix: str,
    tmp_path: Path,
    content_type: str,
    argv: tuple[str, ...],
    message: str,
) -> None:
    journal = f"{prefix}j"
    _journal(gazctl, journal, content_type, tmp_path / "store")
    r = gazctl("journals", "read", "-l", f"name={journal}", "--committed", *argv)
    assert r.rc == 1 and r.err.count("\n") == 1, r.err
    assert r.err.startswith("gazctl: error: ") and message in r.err, r.err
    assert r.out == b""
