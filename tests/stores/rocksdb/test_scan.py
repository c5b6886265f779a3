"""The native RocksDB scanner (`stores.rocksdb.scan`) against rocksdict on real databases:
the same pairs in the same order for any range and batch size, keys only in the WAL,
deletions, empty values, batches cut by bytes, and clear errors for what it cannot read."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import cast

import pyarrow as pa
import pytest
from rocksdict import AccessType, Options, Rdict

from gazette.stores.rocksdb import recorded_options
from gazette.stores.rocksdb import scan as native
from gazette.stores.rocksdb.scan import ScanError, ScanUnavailable, scan


def _pairs(
    directory: Path,
    start: bytes = b"",
    stop: bytes | None = None,
    *,
    batch_rows: int = 65536,
    batch_bytes: int = 64 << 20,
) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    for keys, values in scan(
        directory, start, stop, batch_rows=batch_rows, batch_bytes=batch_bytes
    ):
        assert isinstance(keys, pa.BinaryArray) and isinstance(values, pa.BinaryArray)
        assert len(keys) == len(values) > 0
        out.extend(zip(keys.to_pylist(), values.to_pylist(), strict=True))
    return out


def _reference(
    directory: Path, start: bytes = b"", stop: bytes | None = None
) -> list[tuple[bytes, bytes]]:
    db = Rdict(str(directory), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        items: Iterator[tuple[bytes, bytes]] = db.items(from_key=start)  # type: ignore[assignment]
        return [(k, v) for k, v in items if stop is None or k < stop]
    finally:
        db.close()


def test_the_scanner_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    # `make test` builds it (Makefile target `scanner`): the fast path is what users get.
    monkeypatch.delenv(native.ENV_PATH, raising=False)
    assert native.find() == native.BINARY


def test_same_pairs_as_rocksdict_for_any_range_and_batch(tmp_path: Path) -> None:
    rnd = random.Random(7)
    db = Rdict(str(tmp_path), recorded_options())
    written = {}
    for i in range(6000):
        key = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 12)))
        value = b"" if i % 10 == 0 else rnd.randbytes(rnd.randrange(1, 300))
        db[key] = value
        written[key] = value
        if i % 2000 == 1999:
            db.flush()  # Several SST files, and the rest in the memtable (WAL).
    for key in list(written)[::7]:
        del db[key]
        del written[key]
    db.close()
    assert _pairs(tmp_path) == sorted(written.items()) == _reference(tmp_path)
    bounds = [b"", b"\x00", b"\x01", b"\x7f\x80", b"\xff", b"\xff\xff\xff"]
    for start in bounds:
        for stop in [None, *bounds]:
            want = _reference(tmp_path, start, stop)
            for rows in (1, 999, 65536):
                assert _pairs(tmp_path, start, stop, batch_rows=rows) == want, (start, stop)


def test_batches_are_cut_by_rows_and_by_bytes(tmp_path: Path) -> None:
    db = Rdict(str(tmp_path), recorded_options())
    for i in range(100):
        db[b"k%03d" % i] = bytes([i]) * 1000
    db.close()
    sizes = [len(k) for k, _ in scan(tmp_path, batch_rows=30)]
    assert sizes == [30, 30, 30, 10]
    # 4,500 bytes of values a batch at most: 4 values each (a value larger than the limit
    # still goes, alone).
    sizes = [len(k) for k, _ in scan(tmp_path, batch_bytes=4500)]
    assert sizes == [4] * 25
    assert [len(k) for k, _ in scan(tmp_path, batch_bytes=10)] == [1] * 100
    assert _pairs(tmp_path, batch_bytes=10) == _reference(tmp_path)


def test_keys_only_in_the_wal_of_a_killed_writer(tmp_path: Path) -> None:
    script = (
        "import os, sys\n"
        "from rocksdict import Rdict\n"
        "from gazette.stores.rocksdb import recorded_options\n"
        "db = Rdict(sys.argv[1], recorded_options())\n"
        "for i in range(500):\n"
        "    db[b'w%04d' % i] = b'v%d' % i\n"
        "del db[b'w0003']\n"
        "db.flush_wal(True)\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True)
    assert not list(tmp_path.glob("*.sst"))
    got = _pairs(tmp_path)
    assert len(got) == 499 and (b"w0003", b"v3") not in got
    assert got == _reference(tmp_path)


def test_an_empty_database_and_an_empty_range(tmp_path: Path) -> None:
    Rdict(str(tmp_path), recorded_options()).close()
    assert _pairs(tmp_path) == []
    db = Rdict(str(tmp_path), recorded_options())
    db[b"b"] = b"1"
    db.close()
    assert _pairs(tmp_path, b"c") == [] and _pairs(tmp_path, b"a", b"b") == []
    assert _pairs(tmp_path, b"a", b"c") == [(b"b", b"1")]


def test_what_it_cannot_open_is_unavailable_with_rocksdbs_reason(tmp_path: Path) -> None:
    with pytest.raises(ScanUnavailable, match=r"exit status 1\): rocksdb-scan: opening .*none"):
        list(scan(tmp_path / "none"))
    # rocksdict's default table format (6) is newer than what Debian 12's librocksdb (7.8)
    # reads: refused, with RocksDB's reason. A librocksdb that reads it must read it right.
    db = Rdict(str(tmp_path / "v6"), Options(raw_mode=True))
    db[b"k"] = b"v"
    db.close()  # Flushed to a table file.
    try:
        got = _pairs(tmp_path / "v6")
    except ScanUnavailable as err:
        assert "unsupported format_version: 6" in str(err)
    else:
        assert got == [(b"k", b"v")]


def test_no_scanner_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ENV_PATH, str(tmp_path / "missing"))
    assert native.find() is None
    with pytest.raises(ScanUnavailable, match=r"GAZETTE_ROCKSDB_SCAN=.*missing is not an exec"):
        list(scan(tmp_path))
    monkeypatch.setenv(native.ENV_PATH, str(tmp_path))  # A directory is not a scanner.
    assert native.find() is None
    monkeypatch.delenv(native.ENV_PATH)
    assert "is not built (python -m gazette.stores.rocksdb.scan build)" in native.not_found_reason()


def test_a_scanner_that_cannot_run_is_unavailable(tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x7fELF not really")
    junk.chmod(0o755)
    with pytest.raises(ScanUnavailable, match="cannot run the native RocksDB scanner .*junk"):
        list(scan(tmp_path, binary=junk))


def test_a_key_read_first_then_the_range(tmp_path: Path) -> None:
    db = Rdict(str(tmp_path), recorded_options())
    db[b"\x00checkpoint"] = b"cp" * 1000
    db[b"\x00empty"] = b""
    for i in range(10):
        db[b"k%d" % i] = b"v%d" % i
    db.close()
    with native.ScanStream(tmp_path, b"k3", b"k6", get=b"\x00checkpoint") as stream:
        assert stream.got == b"cp" * 1000
        got = [
            (k, v)
            for keys, values in stream
            for k, v in zip(keys.to_pylist(), values.to_pylist(), strict=True)
        ]
    assert got == [(b"k3", b"v3"), (b"k4", b"v4"), (b"k5", b"v5")]
    with native.ScanStream(tmp_path, get=b"\x00none") as stream:
        assert stream.got is None
    with native.ScanStream(tmp_path, get=b"\x00empty") as stream:
        assert stream.got == b""


def test_value_offsets_are_aligned_whatever_the_key_lengths(tmp_path: Path) -> None:
    db = Rdict(str(tmp_path), recorded_options())
    for i in range(1, 200):
        db[b"k" * (i % 7 + 1) + b"%03d" % i] = b"x" * (i % 5)
    db.close()
    for keys, values in scan(tmp_path, batch_rows=13):
        for array in (keys, values):
            assert array.buffers()[1].address % 4 == 0  # int32 offsets
        assert (
            pa.Table.from_arrays([keys, values], ["k", "v"])
            .group_by("v")
            .aggregate([("k", "count")])
            .num_rows
            >= 1
        )


def test_a_huge_batch_row_count_is_clamped_not_wrapped(tmp_path: Path) -> None:
    db = Rdict(str(tmp_path), recorded_options())
    for i in range(1000):
        db[b"k%04d" % i] = b"v"
    db.close()
    # 2**32 + 3 read as a 32-bit count would be 3-row batches.
    assert [len(k) for k, _ in scan(tmp_path, batch_rows=2**32 + 3)] == [1000]


def _fake(tmp_path: Path, body: str, name: str = "fake-scan", magic: bool = True) -> Path:
    """A stand-in scanner (a shell script) writing a given byte stream after the version
    magic: the reader's side of the framing, for streams a real scanner only writes when
    killed or failing."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + ("printf GZRSCAN1\n" if magic else "") + body)
    path.chmod(0o755)
    return path


FRAME = (
    "printf '\\001\\000\\000\\000\\001\\000\\000\\000\\002\\000\\000\\000'"  # 1 row, 1 + 2 bytes
    "; printf '\\000\\000\\000\\000\\001\\000\\000\\000k'"
    "; printf '\\000\\000\\000\\000\\000\\000\\000'"  # padding: 9 bytes to 16
    "; printf '\\000\\000\\000\\000\\002\\000\\000\\000vv'\n"
)


def _children() -> set[int]:
    """This process's child processes (zombies included)."""
    out: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        out.update(int(p) for p in (task / "children").read_text().split())
    return out


def test_a_stream_cut_after_a_batch_is_an_error_not_an_end(tmp_path: Path) -> None:
    fake = _fake(
        tmp_path, FRAME + "echo 'rocksdb-scan: reading: Corruption: bad block' >&2\nexit 1\n"
    )
    batches = scan(tmp_path, binary=fake)
    keys, values = next(batches)
    assert (keys.to_pylist(), values.to_pylist()) == ([b"k"], [b"vv"])
    with pytest.raises(ScanError, match="exit status 1.*Corruption: bad block") as err:
        next(batches)
    assert not isinstance(err.value, ScanUnavailable)  # Rows were yielded: no fallback.

    killed = _fake(tmp_path, FRAME + "kill -9 $$\n")
    with pytest.raises(ScanError, match="signal 9"):
        list(scan(tmp_path, binary=killed))
    # Cut within a frame: the same.
    half = _fake(tmp_path, "printf '\\001\\000\\000\\000\\001\\000\\000\\000'\nexit 0\n")
    with pytest.raises(ScanUnavailable, match="exit status 0"):
        list(scan(tmp_path, binary=half))
    # The end frame from a scanner that then fails is not success either.
    ended = _fake(
        tmp_path,
        FRAME + "printf '\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000'; exit 3\n",
    )
    with pytest.raises(ScanError, match="exit status 3"):
        list(scan(tmp_path, binary=ended))


def test_a_consumer_that_stops_early_leaves_no_scanner_behind(tmp_path: Path) -> None:
    # A scanner that would never end by itself: only the stream's close stops and reaps it.
    before = _children()
    stuck = _fake(tmp_path, FRAME + "exec sleep 1000\n")
    batches = cast(Generator[tuple[pa.Array, pa.Array], None, None], scan(tmp_path, binary=stuck))
    keys, _ = next(batches)
    assert keys.to_pylist() == [b"k"]
    assert len(_children() - before) == 1
    batches.close()
    assert _children() == before
    with native.ScanStream(tmp_path, binary=stuck) as stream:
        next(iter(stream))
    assert _children() == before
    # A key read first, then a stream cut within a frame: unavailable, and reaped.
    with pytest.raises(ScanUnavailable):
        native.ScanStream(tmp_path, get=b"x", binary=_fake(tmp_path, "printf '\\001'\n", "cut"))
    assert _children() == before
    # Started, never read: close stops it.
    waiting = _fake(tmp_path, "printf '\\001\\000\\000\\000'; exec sleep 1000\n", "waiting")
    stream = native.ScanStream(tmp_path, binary=waiting)
    assert len(_children() - before) == 1
    stream.close()
    assert _children() == before
    with pytest.raises(RuntimeError, match="read once"):
        next(iter(stream))


def test_a_scanner_of_another_frame_version_is_unavailable(tmp_path: Path) -> None:
    # An older build (no version magic, frames without padding) is refused, not misread.
    old = _fake(tmp_path, FRAME, "old", magic=False)
    with pytest.raises(ScanUnavailable, match=r"writes another version .*rebuild it"):
        list(scan(tmp_path, binary=old))
    with pytest.raises(ScanUnavailable, match="exit status 0"):  # Nothing at all.
        list(scan(tmp_path, binary=_fake(tmp_path, "", "mute", magic=False)))


def test_split_points_cut_ranges_of_equal_size_within_bounds(tmp_path: Path) -> None:
    db = Rdict(str(tmp_path), recorded_options())
    keys = [b"k%06d" % i for i in range(0, 200_000, 2)]
    for i, k in enumerate(keys):
        db[k] = b"v" * 20
        if (i + 1) % 20_000 == 0:
            db.flush()
    db.close()
    for count, start, stop in ((2, b"", None), (5, b"k", b"l"), (3, b"k05", b"k15")):
        points = native.split_points(tmp_path, start, stop, count)
        assert points == sorted(set(points)) and len(points) == count - 1, points
        assert all(p > start and (stop is None or p < stop) for p in points)
        inside = [k for k in keys if k >= start and (stop is None or k < stop)]
        highs: list[bytes | None] = [*points, stop]
        sizes = [
            len([k for k in inside if lo <= k and (hi is None or k < hi)])
            for lo, hi in zip([start, *points], highs, strict=True)
        ]
        assert max(sizes) <= 1.05 * len(inside) / count, (count, sizes)
    assert native.split_points(tmp_path, b"x", None, 4) == []  # No keys there.
    assert native.split_points(tmp_path, b"", None, 1) == []


def test_split_points_of_what_it_cannot_open_or_of_an_older_scanner(tmp_path: Path) -> None:
    with pytest.raises(ScanUnavailable, match=r"exit status 3\): rocksdb-scan: opening .*none"):
        native.split_points(tmp_path / "none", b"", None, 2)
    # A scanner built before --split refuses its arguments (exit status 2), writing nothing.
    old = _fake(tmp_path, "echo 'rocksdb-scan: bad arguments' >&2\nexit 2\n", magic=False)
    with pytest.raises(ScanUnavailable, match=r"predates --split\): rebuild it"):
        native.split_points(tmp_path, b"", None, 2, binary=old)
    failing = _fake(tmp_path, "echo GZRSPLIT1; echo 'it broke' >&2\nexit 1\n", "failing", False)
    with pytest.raises(ScanError, match=r"exit status 1\): it broke") as caught:
        native.split_points(tmp_path, b"", None, 2, binary=failing)
    assert not isinstance(caught.value, ScanUnavailable)


def test_build_reports_the_compilers_message(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="building the RocksDB scanner failed"):
        native.build(tmp_path / "out", compiler="false")
    assert not (tmp_path / "out").exists()
    built = native.build(tmp_path / "scanner")
    db = Rdict(str(tmp_path / "db"), recorded_options())
    db[b"a"] = b"1"
    db.close()
    got = [(k.to_pylist(), v.to_pylist()) for k, v in scan(tmp_path / "db", binary=built)]
    assert got == [([b"a"], [b"1"])]
