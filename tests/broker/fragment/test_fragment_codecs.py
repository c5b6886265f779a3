"""Codecs: round trips, goldens from independent encoders, and corrupt input."""

from __future__ import annotations

import gzip
import io
import os
import random
from pathlib import Path

import cramjam
import pytest
import zstandard

from gazette.broker.fragment.codecs import (
    CorruptContentError,
    UnknownCodecError,
    compress_file,
    decompress_to,
    new_compressor,
    new_decompressor,
)
from gazette.broker.protocol import protocol_pb2 as pb

CODECS = [pb.NONE, pb.GZIP, pb.ZSTANDARD, pb.SNAPPY, pb.GZIP_OFFLOAD_DECOMPRESSION]


def _content(size: int, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    # Half incompressible, half repetitive: exercises stored and compressed snappy chunks.
    half = size // 2
    return rng.randbytes(half) + (b"gazette journal line\n" * (size // 20 + 1))[: size - half]


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    c = _crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _chunk(kind: int, body: bytes) -> bytes:
    n = len(body)
    return bytes([kind, n & 0xFF, (n >> 8) & 0xFF, n >> 16]) + body


STREAM_ID = bytes.fromhex("ff060000734e61507059")


def test_crc32c_vector() -> None:
    assert _crc32c(b"123456789") == 0xE3069283


@pytest.mark.parametrize("codec", CODECS, ids=pb.CompressionCodec.Name)
@pytest.mark.parametrize("size", [0, 1, 100_000, 3 * (1 << 20) + 17])
def test_round_trip_files(tmp_path: Path, codec: int, size: int) -> None:
    data = _content(size)
    src, dst, out = tmp_path / "src", tmp_path / "dst", tmp_path / "out"
    src.write_bytes(data)

    n = compress_file(codec, src, dst)
    assert n == dst.stat().st_size
    if codec == pb.NONE:
        assert dst.read_bytes() == data

    with open(dst, "rb") as fin, open(out, "wb") as fout:
        assert decompress_to(codec, fin, fout) == size
    assert out.read_bytes() == data


@pytest.mark.parametrize("codec", CODECS, ids=pb.CompressionCodec.Name)
def test_small_reads_and_incremental_writes(codec: int) -> None:
    data = _content(300_000, seed=7)
    buf = io.BytesIO()
    w = new_compressor(codec, buf)
    for i in range(0, len(data), 12_345):
        w.write(data[i : i + 12_345])
    w.close()
    assert not buf.closed

    buf.seek(0)
    r = new_decompressor(codec, buf)
    got = bytearray()
    while chunk := r.read(1000):
        assert len(chunk) <= 1000
        got += chunk
    r.close()
    assert bytes(got) == data


def test_output_decodes_with_independent_decoders(tmp_path: Path) -> None:
    data = _content(500_000, seed=3)
    src = tmp_path / "src"
    src.write_bytes(data)

    compress_file(pb.GZIP, src, tmp_path / "gz")
    assert gzip.decompress((tmp_path / "gz").read_bytes()) == data

    compress_file(pb.ZSTANDARD, src, tmp_path / "zst")
    dobj = zstandard.ZstdDecompressor().decompressobj()
    assert dobj.decompress((tmp_path / "zst").read_bytes()) == data

    compress_file(pb.SNAPPY, src, tmp_path / "sz")
    framed = (tmp_path / "sz").read_bytes()
    assert framed.startswith(STREAM_ID)
    assert bytes(cramjam.snappy.decompress(framed)) == data


def _decode(codec: int, raw: bytes) -> bytes:
    out = io.BytesIO()
    decompress_to(codec, io.BytesIO(raw), out)
    return out.getvalue()


def test_golden_gzip_and_zstd_streams() -> None:
    # Multi-member gzip, as Go brokers write when they flush incremental compression.
    assert _decode(pb.GZIP, gzip.compress(b"hello, ") + gzip.compress(b"world\n")) == (
        b"hello, world\n"
    )
    # `printf 'hi\n' | gzip -n`.
    golden = bytes.fromhex("1f8b0800000000000003cbc8e402007a7a6fed03000000")
    assert _decode(pb.GZIP, golden) == b"hi\n"
    assert _decode(pb.GZIP_OFFLOAD_DECOMPRESSION, golden) == b"hi\n"
    # Several zstd frames are read across.
    cctx = zstandard.ZstdCompressor()
    assert _decode(pb.ZSTANDARD, cctx.compress(b"abc") + cctx.compress(b"def")) == b"abcdef"


def test_golden_hand_built_snappy_framed_stream() -> None:
    plain = b"hello, gazette\n"
    compressible = b"a" * 5000
    raw = bytes(cramjam.snappy.compress_raw(compressible))
    stream = (
        STREAM_ID
        + _chunk(0x01, _masked_crc(plain).to_bytes(4, "little") + plain)  # Uncompressed.
        + _chunk(0xFE, b"\x00" * 7)  # Padding: skipped.
        + _chunk(0x80, b"skippable")  # Skippable: ignored.
        + _chunk(0x00, _masked_crc(compressible).to_bytes(4, "little") + raw)  # Compressed.
        + STREAM_ID  # Repeated stream identifiers are allowed (concatenated streams).
        + _chunk(0x01, _masked_crc(b"!").to_bytes(4, "little") + b"!")
    )
    assert stream[:10].hex(" ") == "ff 06 00 00 73 4e 61 50 70 59"
    assert _decode(pb.SNAPPY, stream) == plain + compressible + b"!"
    # Byte at a time through the reader, too.
    r = new_decompressor(pb.SNAPPY, io.BytesIO(stream))
    got = b"".join(iter(lambda: r.read(1), b""))
    assert got == plain + compressible + b"!"


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(_chunk(0x01, _masked_crc(b"x").to_bytes(4, "little") + b"x"), id="no-id"),
        pytest.param(
            STREAM_ID + _chunk(0x01, (_masked_crc(b"x") ^ 1).to_bytes(4, "little") + b"x"),
            id="bad-crc",
        ),
        pytest.param(STREAM_ID + _chunk(0x02, b"reserved"), id="reserved-unskippable"),
        pytest.param(STREAM_ID + b"\x01\x10\x00", id="truncated-header"),
        pytest.param(STREAM_ID + b"\x01\x10\x00\x00abc", id="truncated-body"),
        pytest.param(b"\xff\x06\x00\x00sNaPpX", id="bad-id"),
    ],
)
def test_snappy_corrupt_streams(stream: bytes) -> None:
    with pytest.raises(CorruptContentError):
        _decode(pb.SNAPPY, stream)


@pytest.mark.parametrize("codec", [pb.GZIP, pb.ZSTANDARD, pb.SNAPPY])
def test_corrupt_compressed_input_raises(codec: int) -> None:
    data = os.urandom(1000) + b"z" * 50_000
    buf = io.BytesIO()
    w = new_compressor(codec, buf)
    w.write(data)
    w.close()
    raw = bytearray(buf.getvalue())
    # Truncation is always detected.
    with pytest.raises(CorruptContentError):
        _decode(codec, bytes(raw[: len(raw) // 2]))
    # A flipped byte is detected by the codec's own checksum.
    raw[len(raw) // 2] ^= 0x40
    with pytest.raises(CorruptContentError):
        _decode(codec, bytes(raw))


@pytest.mark.parametrize("codec", [pb.INVALID, 99])
def test_unknown_codec(codec: int) -> None:
    with pytest.raises(UnknownCodecError, match="unsupported compression codec"):
        new_decompressor(codec, io.BytesIO(b""))
    with pytest.raises(UnknownCodecError):
        new_compressor(codec, io.BytesIO())
