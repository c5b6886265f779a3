"""gazctl journals append with record framings and mappings over several journals."""

from __future__ import annotations

import base64
import struct
import textwrap
from pathlib import Path

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.message.mapping import modulo_mapping, rendezvous_mapping

from .conftest import Gazctl


def apply_topic(gazctl: Gazctl, prefix: str, store: Path, count: int) -> list[str]:
    store.mkdir(parents=True, exist_ok=True)
    children = "".join(f"\n        - name: {prefix}part-{i}" for i in range(count))
    doc = textwrap.dedent(
        f"""\
        name: {prefix}
        replication: 1
        labels:
        - {{name: topic, value: {prefix.strip("/").replace("/", "-")}}}
        fragment:
          length: 1048576
          compression_codec: NONE
          stores: ["file://{store}/"]
          refresh_interval: 10s
        children:"""
    )
    r = gazctl("journals", "apply", stdin=(doc + children + "\n").encode())
    assert r.rc == 0, r.err
    return [f"{prefix}part-{i}" for i in range(count)]


def listing(names: list[str]) -> list[pb.ListResponse.Journal]:
    out = []
    for n in sorted(names):
        j = pb.ListResponse.Journal()
        j.spec.name = n
        out.append(j)
    return out


def content(gazctl: Gazctl, journal: str) -> bytes:
    r = gazctl("journals", "read", "-l", f"name={journal}")
    assert r.rc == 0, r.err
    return r.out


def fixed(payload: bytes) -> bytes:
    return struct.pack("<4sI", b"\x66\x33\x93\x36", len(payload)) + payload


def test_lines_mapped_on_keys(gazctl: Gazctl, prefix: str, tmp_path: Path) -> None:
    names = apply_topic(gazctl, prefix, tmp_path / "store", 4)
    selector = f"name:prefix={prefix}"
    keys = [f"key-{i % 13}" for i in range(60)]
    records = [f'{{"n": {i}}}'.encode() for i in range(60)]

    text = b"".join(k.encode() + b"\n" + r + b"\n" for k, r in zip(keys, records, strict=True))
    r = gazctl("journals", "append", "-l", selector, "-f", "lines", "-m", "modulo", stdin=text)
    assert r.rc == 0 and "appended 60 line(s) to 4 journals" in r.err, r.err

    b64 = b"".join(
        base64.b64encode(k.encode()) + b"\n" + r + b"\n" for k, r in zip(keys, records, strict=True)
    )
    r = gazctl(
        "journals",
        "append",
        "-l",
        selector,
        "-f",
        "lines",
        "-m",
        "rendezvous",
        "--base64",
        stdin=b64,
    )
    assert r.rc == 0, r.err

    # The same keys over the same (name-ordered) journals map as Gazette's mappings do.
    parts = listing(names)
    modulo = modulo_mapping(lambda k: k, lambda: parts)
    hrw = rendezvous_mapping(lambda k: k, lambda: parts)
    want: dict[str, bytes] = {n: b"" for n in names}
    for k, rec in zip(keys, records, strict=True):
        want[modulo(k)[0]] += rec + b"\n"
    for k, rec in zip(keys, records, strict=True):
        want[hrw(k)[0]] += rec + b"\n"
    for n in names:
        assert content(gazctl, n) == want[n]
    assert sum(1 for n in names if want[n]) > 1


def test_fixed_frames_direct_and_random(gazctl: Gazctl, prefix: str, tmp_path: Path) -> None:
    names = apply_topic(gazctl, prefix, tmp_path / "store", 3)
    selector = f"name:prefix={prefix}"

    frames = [fixed(b"payload-%d" % i) for i in range(30)]
    r = gazctl("journals", "append", "-l", selector, "-f", "fixed", stdin=b"".join(frames))
    assert r.rc == 0 and "appended 30 record(s)" in r.err, r.err
    got = b"".join(content(gazctl, n) for n in names)
    assert sorted(got.split(b"\x66\x33\x93\x36")[1:]) == sorted(f[4:] for f in frames)

    direct = b"".join(fixed(names[i % 2].encode()) + fixed(b"d%d" % i) for i in range(6))
    before = {n: content(gazctl, n) for n in names}
    r = gazctl("journals", "append", "-l", selector, "-f", "fixed", "-m", "direct", stdin=direct)
    assert r.rc == 0, r.err
    assert content(gazctl, names[0]) == before[names[0]] + b"".join(
        fixed(b"d%d" % i) for i in (0, 2, 4)
    )
    assert content(gazctl, names[2]) == before[names[2]]

    r = gazctl(
        "journals",
        "append",
        "-l",
        selector,
        "-f",
        "lines",
        "-m",
        "direct",
        stdin=b"not/a/member\nrecord\n",
    )
    assert r.rc == 1 and "not among the current partitions" in r.err

    # A whole input to one random journal of several.
    r = gazctl("journals", "append", "-l", selector, "-m", "random", stdin=b"whole\n")
    assert r.rc == 0, r.err
    assert sum(content(gazctl, n).endswith(b"whole\n") for n in names) == 1


def test_append_argument_errors(gazctl: Gazctl, prefix: str, tmp_path: Path) -> None:
    apply_topic(gazctl, prefix, tmp_path / "store", 2)
    selector = f"name:prefix={prefix}"
    for argv, msg in [
        (["-m", "modulo"], "'none' --framing may only be used with 'random'"),
        (["-f", "fixed", "-m", "modulo", "--base64"], "--base64 requires"),
        (["-f", "lines", "--base64"], "--base64 requires"),
    ]:
        r = gazctl("journals", "append", "-l", selector, *argv, stdin=b"x\n")
        assert r.rc == 1 and msg in r.err, (argv, r.err)
    r = gazctl("journals", "append", "-l", selector, "-f", "fixed", stdin=b"garbage!")
    assert r.rc == 1 and "no fixed frame header" in r.err
    r = gazctl("journals", "append", "-l", selector, "-f", "lines", "-m", "modulo", stdin=b"k\n")
    assert r.rc == 1 and "partition key but no record" in r.err
    r = gazctl("journals", "append", "-l", "name=no/such/journal", "-f", "lines", stdin=b"x\n")
    assert r.rc == 1 and "no journals match" in r.err


async def test_lines_append_that_gives_up_lands_nothing_after_it() -> None:
    """A journal whose append gives up (--retry-for) gets none of the later records: they
    are chained on it, not appended out of order into a hole; and the command fails within
    about one window, not one per queued batch."""
    import asyncio
    import io
    import time

    from gazette.gazctl.main import Streams, run
    from tests.broker.client.fake_broker import FakeBroker

    async with FakeBroker() as fb:
        spec = pb.JournalSpec(name="a/b", replication=1)
        listing = [pb.ListResponse(status=pb.OK, journals=[pb.ListResponse.Journal(spec=spec)])]
        fb.journal.script("List", *[listing] * 100)
        refused = pb.AppendResponse(status=pb.NO_JOURNAL_PRIMARY_BROKER)
        ok = pb.AppendResponse(status=pb.OK, commit=pb.Fragment(journal="a/b", begin=0, end=1))
        fb.journal.script("Append", *[refused] * 6, *[ok] * 100)
        lines = b"".join(b"line-%07d\n" % i for i in range(300_000))  # Several batches.
        streams = Streams(stdin=io.BytesIO(lines), stdout=io.BytesIO(), stderr=io.StringIO())
        argv = ["journals", "append", "--journal", "a/b", "-f", "lines", "--retry-for", "1"]
        t0 = time.monotonic()
        rc = await asyncio.to_thread(run, [*argv, "--broker", fb.endpoint], streams)
        took = time.monotonic() - t0
    assert isinstance(streams.stderr, io.StringIO)
    err = streams.stderr.getvalue()
    assert rc == 1 and "append to a/b kept failing" in err, err
    calls = fb.journal.calls["Append"]
    assert len(calls) == 6, len(calls)  # The first batch's attempts, and nothing after.
    # One window (1 s) per queued batch would take over 10 s; allow for a loaded machine.
    assert took < 8, took
