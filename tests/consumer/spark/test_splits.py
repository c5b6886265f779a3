"""Splitting a RocksDB shard's export into key ranges of one snapshot (no Spark needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from rocksdict import AccessType, Options, Rdict

from gazette.consumer.spark.errors import ExportError, InvalidOption
from gazette.consumer.spark.options import ShardsOptions
from gazette.consumer.spark.playback import PlayedShard, rocksdb_batches
from gazette.consumer.spark.resolve import ShardPlan, estimated_bytes
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.stores.rocksdb import recorded_options
from gazette.stores.rocksdb.keyranges import (
    SstFile,
    clip,
    key_position,
    range_of,
    split_points,
    sst_files,
)

SCANS = ["native", "rocksdict"]
"""Both ways of reading keys (option ``rocksdb_scan``): each test runs both."""

SCHEMA = pa.schema(
    [
        ("shard", pa.string()),
        ("checkpoint", pa.binary()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)


def test_key_position_interpolates_after_the_common_prefix() -> None:
    f = SstFile(b"user/0000", b"user/9999", 10_000)
    assert key_position(f, b"a") == 0.0
    assert key_position(f, b"user/0000") == 0.0
    assert key_position(f, b"zzz") == 1.0
    middle = key_position(f, b"user/5000")
    assert 0.4 < middle < 0.6  # Digits are not spread over the byte range: roughly.
    assert key_position(f, b"user/2") < middle < key_position(f, b"user/7")


def test_key_position_reads_text_bytes_in_their_own_radix() -> None:
    # A file spanning a change of leading digit (as every file of a large word-count store
    # does): read in base 256, "n0650000" sat at 2% of it, so two splits of a 5M-key store
    # came out 1M and 4M keys.
    f = SstFile(b"n0000000 gram0", b"n1299999 gram5", 1_300_000)
    assert 0.45 < key_position(f, b"n0650000 gram") < 0.55
    words = SstFile(b"user/aardvark", b"user/zebra", 1000)
    assert 0.4 < key_position(words, b"user/m") < 0.6
    # Other bytes keep the whole byte range.
    binary = SstFile(b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", 100)
    assert 0.49 < key_position(binary, b"\x80\x00") < 0.51


def test_split_points_balance_entries_and_stay_within_bounds() -> None:
    files = [
        SstFile(b"a000", b"a999", 1000),
        SstFile(b"b000", b"b999", 3000),  # Three times as dense.
        SstFile(b"c000", b"c999", 1000),
    ]
    points = split_points(files, 5, b"\x01")
    assert len(points) == 4
    assert points == sorted(set(points))
    assert points[0] == b"a999"  # 1000 of 5000 entries: the a's.
    assert points[-1] == b"b999"  # 4000 of 5000: the a's and b's.
    assert all(b"b" < p < b"b999" for p in points[1:-1])

    # Within a prefix range only.
    points = split_points(files, 4, b"b", b"c")
    assert len(points) == 3 and all(b"b" < p < b"c" for p in points)

    # Nothing to split by: no points (one non-empty range).
    assert split_points([], 4, b"\x01") == []
    assert split_points(files, 1, b"\x01") == []
    assert split_points(files, 4, b"x") == []


def test_clip_cuts_file_ranges_to_the_exported_keys() -> None:
    files = [SstFile(b"\x00cp", b"n9", 100), SstFile(b"a", b"b", 5), SstFile(b"n5", b"z", 50)]
    assert clip(files, b"n0", b"n9") == [SstFile(b"n0", b"n9", 100), SstFile(b"n5", b"n9", 50)]


def test_ranges_are_disjoint_and_cover_every_key() -> None:
    points = [b"g", b"p"]
    ranges = [range_of(points, i, b"\x01") for i in range(4)]
    assert ranges[:3] == [(b"\x01", b"g"), (b"g", b"p"), (b"p", None)]
    begin, end = ranges[3]
    assert begin == end  # Past the points: empty.


def _fill(path: Path, keys: list[bytes], flush_every: int) -> None:
    db = Rdict(str(path), recorded_options())
    db[b"\x00checkpoint"] = b""
    for i, k in enumerate(keys):
        db[k] = k[::-1]
        if (i + 1) % flush_every == 0:
            db.flush()
    db.close()


def _read(
    path: Path, split: tuple[int, int], prefix: bytes = b"", scan: str = "native"
) -> list[bytes]:
    played = PlayedShard(ShardPlan("shard-x", "log", "key", b"{}"), path, {}, 0, 0.0)
    batches = rocksdb_batches(
        played, SCHEMA, key_prefix=prefix, split=split, batch_size=777, scan=scan
    )
    return [r["key"] for b in batches for r in b.to_pylist()]


def _parts(path: Path, count: int, prefix: bytes = b"", scan: str = "native") -> list[list[bytes]]:
    return [_read(path, (i, count), prefix, scan) for i in range(count)]


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("flush_every", [7_000, 1 << 30])
def test_splits_of_a_real_store_partition_its_keys(
    tmp_path: Path, flush_every: int, scan: str
) -> None:
    # Word-count-like keys: one prefix, then numbers; in several SSTs, or in one (flushed at
    # close) which also holds the store's 0x00 checkpoint key, far below every other key.
    keys = [b"n%07d gram" % i for i in range(0, 600_000, 10)]
    _fill(tmp_path, keys, flush_every=flush_every)
    ro = Rdict(str(tmp_path), Options(raw_mode=True), access_type=AccessType.read_only())
    files = sst_files(ro.live_files())
    ro.close()
    assert len(files) >= 1
    assert files[0].start == b"\x00checkpoint"

    for count in (1, 2, 3, 4, 8):
        parts = _parts(tmp_path, count, scan=scan)
        assert [k for p in parts for k in p] == keys, count
        sizes = [len(p) for p in parts]
        if count <= 4:
            # Balanced within a factor of two of an even share (finer splits less so: decimal
            # digits are read as bytes, see stores.rocksdb.keyranges).
            assert max(sizes) <= 2 * len(keys) / count, (count, sizes)
            assert min(sizes) >= len(keys) / count / 2, (count, sizes)
        else:
            assert sum(1 for n in sizes if n) >= count // 2, sizes


@pytest.mark.parametrize("scan", SCANS)
def test_splits_balance_keys_whose_leading_digit_changes_within_files(
    tmp_path: Path, scan: str
) -> None:
    # As in a 5M-key word-count store: each file holds keys of two leading digits.
    keys = [b"n%07d gram" % i for i in range(0, 5_000_000, 50)]
    _fill(tmp_path, keys, flush_every=30_000)
    for count in (2, 3, 4):
        parts = _parts(tmp_path, count, scan=scan)
        assert [k for p in parts for k in p] == keys, count
        sizes = [len(p) for p in parts]
        assert max(sizes) <= 1.2 * len(keys) / count, (count, sizes)


@pytest.mark.parametrize("scan", SCANS)
def test_splits_of_flushes_that_each_hold_the_checkpoint(tmp_path: Path, scan: str) -> None:
    # As a store's recent SST files are: every transaction writes the 0x00 checkpoint key, so
    # every flushed file holds it beside a run of application keys. The files' metadata says
    # each may hold keys from the first one up (the 5M-key benchmark shard split 1.25M and
    # 3.75M); RocksDB's own size estimates (rocksdb_scan=native) see where they are.
    db = Rdict(str(tmp_path), recorded_options())
    keys = [b"n%07d gram" % i for i in range(0, 5_000_000, 50)]
    for i, k in enumerate(keys):
        if i % 1000 == 0:
            db[b"\x00checkpoint"] = b""
        db[k] = b"v"
        if (i + 1) % 30_000 == 0:
            db.flush()
    db.close()
    for count in (2, 3, 4, 8):
        parts = _parts(tmp_path, count, scan=scan)
        assert [k for p in parts for k in p] == keys, count
        if scan == "native":
            sizes = [len(p) for p in parts]
            assert max(sizes) <= 1.1 * len(keys) / count, (count, sizes)
    # Within a key prefix, and where it holds no keys.
    some = [k for k in keys if k.startswith(b"n1")]
    assert [k for p in _parts(tmp_path, 3, b"n1", scan) for k in p] == some
    assert _parts(tmp_path, 3, b"x", scan) == [[], [], []]


@pytest.mark.parametrize("scan", SCANS)
def test_splits_cover_every_key_whatever_the_layout(tmp_path: Path, scan: str) -> None:
    # Prefixes far apart in one file: the estimate is poor (keys cluster where a uniform
    # spread is assumed), yet every key is exported once, in order, within the key prefix.
    keys = sorted(b"%s%06d" % (p, i) for p in (b"k", b"n", b"u") for i in range(0, 60_000, 3))
    _fill(tmp_path, keys, flush_every=7_000)
    for prefix, want in ((b"", keys), (b"n", [k for k in keys if k.startswith(b"n")])):
        for count in (2, 3, 8):
            parts = _parts(tmp_path, count, prefix, scan)
            assert [k for p in parts for k in p] == want, (prefix, count)
            assert sum(1 for p in parts if p) >= 2, (prefix, count)


@pytest.mark.parametrize("scan", SCANS)
def test_a_store_without_sst_files_exports_whole_from_split_zero(tmp_path: Path, scan: str) -> None:
    # Written by a process that dies without closing the store (as a SIGKILL would): the
    # keys are only in the WAL, no SST file has been written.
    script = (
        "import os, sys\n"
        "from rocksdict import Rdict\n"
        "from gazette.stores.rocksdb import recorded_options\n"
        "db = Rdict(sys.argv[1], recorded_options())\n"
        "for i in range(100):\n"
        "    db[b'k%04d' % i] = b'v'\n"
        "db.flush_wal(True)\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True)
    keys = [b"k%04d" % i for i in range(100)]
    ro = Rdict(str(tmp_path), Options(raw_mode=True), access_type=AccessType.read_only())
    files = ro.live_files()
    ro.close()
    assert files == []
    parts = [_read(tmp_path, (i, 3), scan=scan) for i in range(3)]
    assert parts == [keys, [], []]
    assert _read(tmp_path, (0, 1), scan=scan) == keys


def test_estimated_bytes_is_the_union_of_live_segments_and_the_tail() -> None:
    hints = rpb.FSMHints(log="log")
    a = hints.live_nodes.add(fnode=1)
    a.segments.add(author=1, first_seq_no=1, first_offset=0, last_seq_no=2, last_offset=100)
    a.segments.add(author=1, first_seq_no=5, first_offset=500, last_seq_no=6, last_offset=600)
    b = hints.live_nodes.add(fnode=3)
    b.segments.add(author=1, first_seq_no=3, first_offset=50, last_seq_no=4, last_offset=200)
    b.segments.add(author=1, first_seq_no=9, first_offset=900, last_seq_no=9)  # Open-ended.
    # [0, 200) + [500, 600) + [900, 1000) read; the tail after the last segment is in it.
    assert estimated_bytes(hints, 1000) == 200 + 100 + 100
    assert estimated_bytes(rpb.FSMHints(log="log"), 1000) == 1000


def test_splits_option() -> None:
    base = {"etcd": "e", "root": "/r", "broker": "b", "shards": "shard-1"}
    assert ShardsOptions.parse({**base, "store": "rocksdb"}).splits == 0  # auto
    assert ShardsOptions.parse({**base, "store": "rocksdb", "splits": "AUTO"}).splits == 0
    assert ShardsOptions.parse({**base, "store": "rocksdb", "splits": "4"}).splits == 4
    assert ShardsOptions.parse({**base, "store": "json", "splits": "1"}).splits == 1
    for bad, match in (
        ("0", "within 1..1024"),
        ("many", "'auto' or a number"),
        ("5000", "within 1..1024"),
    ):
        with pytest.raises(InvalidOption, match=match):
            ShardsOptions.parse({**base, "store": "rocksdb", "splits": bad})
    with pytest.raises(InvalidOption, match="only store=rocksdb"):
        ShardsOptions.parse({**base, "store": "sqlite", "table": "t", "splits": "2"})


def test_rocksdb_scan_option() -> None:
    base = {"etcd": "e", "root": "/r", "broker": "b", "shards": "shard-1"}
    assert ShardsOptions.parse({**base, "store": "rocksdb"}).rocksdb_scan == "auto"
    opts = ShardsOptions.parse({**base, "store": "rocksdb", "rocksdb_scan": " Native"})
    assert opts.rocksdb_scan == "native"
    with pytest.raises(InvalidOption, match="must be one of auto, native, rocksdict, not 'c'"):
        ShardsOptions.parse({**base, "store": "rocksdb", "rocksdb_scan": "c"})
    with pytest.raises(InvalidOption, match="'rocksdb_scan'.*only for store=rocksdb"):
        ShardsOptions.parse({**base, "store": "json", "rocksdb_scan": "auto"})


def _fake_scanner(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fake-scan"
    path.write_text("#!/bin/sh\nprintf GZRSCAN1\n" + body)  # The version magic, then `body`.
    path.chmod(0o755)
    return path


def test_a_database_the_scanner_cannot_open_is_read_through_rocksdict(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gazette.stores.rocksdb import scan as native

    keys = [b"k%05d" % i for i in range(3000)]
    _fill(tmp_path / "db", keys, flush_every=1000)
    # As the scanner does for a table format or option its librocksdb does not know.
    fake = _fake_scanner(
        tmp_path, "echo 'rocksdb-scan: opening: Corruption: unknown' >&2\nexit 1\n"
    )
    monkeypatch.setenv(native.ENV_PATH, str(fake))
    assert _read(tmp_path / "db", (0, 1), scan="auto") == keys
    assert "reading through rocksdict" in caplog.text and "Corruption: unknown" in caplog.text
    first = _read(tmp_path / "db", (0, 2), scan="auto")
    caplog.clear()
    second = _read(tmp_path / "db", (1, 2), scan="auto")
    assert first and second and first + second == keys
    assert "Corruption: unknown" in caplog.text  # Each split says so.
    for split in ((0, 1), (0, 2)):
        with pytest.raises(ExportError, match="shard 'shard-x'.*Corruption: unknown"):
            _read(tmp_path / "db", split, scan="native")


def test_a_scanner_failing_after_a_batch_fails_the_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rows were handed to Spark already: falling back would repeat them, stopping would
    # lose the rest. The task fails (Spark retries it).
    from gazette.stores.rocksdb import scan as native

    _fill(tmp_path / "db", [b"k1", b"k2"], flush_every=1 << 30)
    fake = _fake_scanner(
        tmp_path,
        "printf '\\000\\000\\000\\000\\000\\000\\000\\000'\n"  # the checkpoint: absent
        "printf '\\001\\000\\000\\000\\001\\000\\000\\000\\001\\000\\000\\000'\n"
        "printf '\\000\\000\\000\\000\\001\\000\\000\\000a\\000\\000\\000\\000\\000\\000\\000'\n"
        "printf '\\000\\000\\000\\000\\001\\000\\000\\000b'\n"
        "echo 'rocksdb-scan: reading: Corruption: block checksum mismatch' >&2\nexit 1\n",
    )
    monkeypatch.setenv(native.ENV_PATH, str(fake))
    played = PlayedShard(ShardPlan("shard-x", "log", "key", b"{}"), tmp_path / "db", {}, 0, 0.0)
    batches = rocksdb_batches(played, SCHEMA, scan="auto")
    assert next(batches).column("key").to_pylist() == [b"a"]
    with pytest.raises(ExportError, match="shard 'shard-x'.*block checksum mismatch"):
        next(batches)


def test_without_a_scanner_auto_reads_through_rocksdict_and_native_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gazette.stores.rocksdb import scan as native

    keys = [b"k%05d" % i for i in range(100)]
    _fill(tmp_path, keys, flush_every=1 << 30)
    monkeypatch.setenv(native.ENV_PATH, str(tmp_path / "not-built"))
    assert _read(tmp_path, (0, 1), scan="auto") == keys
    with pytest.raises(ExportError, match=r"rocksdb_scan=native, but GAZETTE_ROCKSDB_SCAN=.*not"):
        _read(tmp_path, (0, 1), scan="native")
    monkeypatch.setenv(native.ENV_PATH, "")
    monkeypatch.setattr(native, "BINARY", tmp_path / "not-built")
    with pytest.raises(
        ExportError, match=r"scanner is not built \(python -m gazette.stores.rocksdb.scan"
    ):
        _read(tmp_path, (0, 1), scan="native")
