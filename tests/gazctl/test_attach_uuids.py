"""gazctl attach-uuids: fresh OUTSIDE_TXN UUIDs of one producer, one per input line."""

from __future__ import annotations

import io
import json
import time
import uuid
from pathlib import Path

from gazette.gazctl.main import Streams, run
from gazette.message.uuid import Flags, clock_from_unix_ns, get_clock, get_flags, get_producer_id


def attach(*argv: str, stdin: bytes = b"") -> tuple[int, bytes, str]:
    streams = Streams(stdin=io.BytesIO(stdin), stdout=io.BytesIO(), stderr=io.StringIO())
    rc = run(["attach-uuids", *argv], streams)
    assert isinstance(streams.stdout, io.BytesIO) and isinstance(streams.stderr, io.StringIO)
    return rc, streams.stdout.getvalue(), streams.stderr.getvalue()


def test_prefixes_csv_rows_with_uuids() -> None:
    before = clock_from_unix_ns(time.time_ns())
    rc, out, _ = attach(stdin=b"a,b\r\nc,d\n\nlast,\xff")
    assert rc == 0
    lines = out.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 5
    uuids = []
    for line, want in zip(lines, [b"a,b", b"c,d", b"", b"last,\xff"], strict=False):
        head, rest = line.split(b",", 1)
        assert rest == want  # Carriage return dropped; bytes passed through untouched.
        uuids.append(uuid.UUID(head.decode()))
    assert all(u.version == 1 and get_flags(u) == Flags.OUTSIDE_TXN for u in uuids)
    assert len({get_producer_id(u) for u in uuids}) == 1
    clocks = [get_clock(u) for u in uuids]
    assert clocks == sorted(set(clocks)) and clocks[0] > before
    assert clocks[-1] < clock_from_unix_ns(time.time_ns() + 10**9)


def test_files_templates_and_headers(tmp_path: Path) -> None:
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_bytes(b'"header"\n{"n": 1}\n{"n": 2}\n')
    two.write_bytes(b'"header"\n{"n": 3}\n')
    template = '{"uuid": "{{.UUID}}","record":{{ .Line }}}\n'
    rc, out, _ = attach("--skip-header", "--template", template, str(one), str(two))
    assert rc == 0
    docs = [json.loads(line) for line in out.splitlines()]
    assert [d["record"] for d in docs] == [{"n": 1}, {"n": 2}, {"n": 3}]
    producers = {get_producer_id(uuid.UUID(d["uuid"])) for d in docs}
    assert len(producers) == 1  # One producer for the whole run.

    rc, out, _ = attach("--template", "{{.Line}};{{.UUID}}", str(two))  # No newline: one line.
    assert rc == 0 and out.startswith(b'"header";') and out.count(b";") == 2


def test_errors(tmp_path: Path) -> None:
    rc, _, err = attach("--template", "{{.Foo}}")
    assert rc == 1 and "unsupported template action" in err
    rc, _, err = attach("--template", "{{.UUID}")
    assert rc == 1 and "unclosed template action" in err
    rc, _, err = attach("--max-length", "4", stdin=b"1234\n12345\n")
    assert rc == 1 and "longer than --max-length" in err
    rc, _, err = attach(str(tmp_path / "missing"))
    assert rc == 1 and "No such file" in err
