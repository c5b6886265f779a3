"""Streaming compression of fragment content, by `pb.CompressionCodec`.

Every codec here produces and accepts the byte streams Gazette's Go brokers do, so fragments
persisted by either implementation are readable by the other:

- NONE: identity.
- GZIP: RFC 1952 gzip; a stream may hold several concatenated members (Go brokers compress
  spools incrementally, closing a member at each flush).
- ZSTANDARD: zstd frames, possibly several, read across frame boundaries.
- SNAPPY: the snappy *framing* format (stream identifier chunk, then compressed or uncompressed
  chunks of at most 64 KiB, each carrying a masked CRC-32C), as golang/snappy's buffered writer
  and reader produce and accept.
- GZIP_OFFLOAD_DECOMPRESSION: the stored bytes are plain gzip (the store is asked to serve them
  with ``Content-Encoding: gzip``); we decompress them client-side.

All work is chunked: fragments may be gigabytes, and no function here holds a whole fragment in
memory. Decompressors raise `CorruptContentError` for malformed compressed input, whatever the
underlying library's own exception type.
"""

from __future__ import annotations

import gzip
import shutil
import zlib
from pathlib import Path
from typing import BinaryIO, Protocol

import cramjam
import zstandard

from gazette.broker.protocol import protocol_pb2 as pb

CHUNK_SIZE = 1 << 20
"""Bytes moved per read/write step."""

GZIP_LEVEL = 6  # Go's compress/gzip DefaultCompression.
ZSTD_LEVEL = 3  # klauspost/compress zstd SpeedDefault is roughly level 3.

SNAPPY_STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
_SNAPPY_MAX_BLOCK = 65536


class UnknownCodecError(ValueError):
    """The codec is INVALID or not a known `pb.CompressionCodec` value."""

    def __init__(self, codec: int) -> None:
        super().__init__(f"unsupported compression codec {codec_name(codec)}")
        self.codec = codec


class CorruptContentError(ValueError):
    """Compressed input could not be decoded (bad header, checksum, truncation, ...)."""


def codec_name(codec: int) -> str:
    """The enum name of `codec`, or ``CompressionCodec(<n>)`` for unknown values."""
    try:
        return pb.CompressionCodec.Name(codec)  # type: ignore[arg-type]
    except ValueError:
        return f"CompressionCodec({codec})"


class Decompressor(Protocol):
    """A readable stream of decompressed bytes. `close` never closes the underlying source."""

    def read(self, n: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class Compressor(Protocol):
    """A writable stream compressing into a destination. `close` writes any trailer and
    flushes, but never closes the destination."""

    def write(self, data: bytes, /) -> int: ...

    def close(self) -> None: ...


def _check(codec: int) -> None:
    if codec not in (pb.NONE, pb.GZIP, pb.ZSTANDARD, pb.SNAPPY, pb.GZIP_OFFLOAD_DECOMPRESSION):
        raise UnknownCodecError(codec)


# ---------------------------------------------------------------------------------------------
# Compression.


class _IdentityWriter:
    def __init__(self, dst: BinaryIO) -> None:
        self._dst = dst

    def write(self, data: bytes, /) -> int:
        self._dst.write(data)
        return len(data)

    def close(self) -> None:
        self._dst.flush()


class _GzipWriter:
    def __init__(self, dst: BinaryIO) -> None:
        self._dst = dst
        # mtime=0 keeps output deterministic; Go's writer also leaves ModTime zero.
        self._gz = gzip.GzipFile(fileobj=dst, mode="wb", compresslevel=GZIP_LEVEL, mtime=0)

    def write(self, data: bytes, /) -> int:
        return self._gz.write(data)

    def close(self) -> None:
        self._gz.close()  # Writes the trailer; leaves `dst` open.
        self._dst.flush()


class _ZstdWriter:
    def __init__(self, dst: BinaryIO) -> None:
        self._dst = dst
        cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
        self._w = cctx.stream_writer(dst, closefd=False)

    def write(self, data: bytes, /) -> int:
        self._w.write(data)
        return len(data)

    def close(self) -> None:
        self._w.close()  # type: ignore[no-untyped-call]
        self._dst.flush()


class _SnappyWriter:
    def __init__(self, dst: BinaryIO) -> None:
        self._dst = dst
        self._c = cramjam.snappy.Compressor()

    def write(self, data: bytes, /) -> int:
        self._c.compress(data)
        out = self._c.flush()
        if len(out):
            self._dst.write(bytes(out))
        return len(data)

    def close(self) -> None:
        out = self._c.finish()
        if len(out):
            self._dst.write(bytes(out))
        self._dst.flush()


def new_compressor(codec: int, dst: BinaryIO) -> Compressor:
    """A `Compressor` writing `codec`-encoded bytes to `dst`.

    Raises `UnknownCodecError` for INVALID or unknown codecs.
    """
    _check(codec)
    if codec == pb.NONE:
        return _IdentityWriter(dst)
    if codec in (pb.GZIP, pb.GZIP_OFFLOAD_DECOMPRESSION):
        return _GzipWriter(dst)
    if codec == pb.ZSTANDARD:
        return _ZstdWriter(dst)
    return _SnappyWriter(dst)


def compress_stream(codec: int, src: BinaryIO, dst: BinaryIO) -> int:
    """Compress all of `src` into `dst` with `codec`; returns the uncompressed byte count."""
    w = new_compressor(codec, dst)
    n = 0
    while chunk := src.read(CHUNK_SIZE):
        n += w.write(chunk)
    w.close()
    return n


def compress_file(codec: int, src: Path, dst: Path) -> int:
    """Compress file `src` into a new file `dst` (truncated if present) with `codec`.

    Returns the compressed size of `dst`. Raises `UnknownCodecError` or `OSError`.
    """
    _check(codec)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        if codec == pb.NONE:
            shutil.copyfileobj(fin, fout, CHUNK_SIZE)
        else:
            compress_stream(codec, fin, fout)
        fout.flush()
        return fout.tell()


# ---------------------------------------------------------------------------------------------
# Decompression.


class _IdentityReader:
    def __init__(self, src: BinaryIO) -> None:
        self._src = src

    def read(self, n: int = -1, /) -> bytes:
        return self._src.read(n)

    def close(self) -> None:
        pass


class _GzipReader:
    """Multi-member gzip reader that maps library errors to `CorruptContentError`."""

    def __init__(self, src: BinaryIO) -> None:
        self._gz = gzip.GzipFile(fileobj=src, mode="rb")

    def read(self, n: int = -1, /) -> bytes:
        try:
            return self._gz.read(n)
        except (OSError, EOFError, zlib.error) as exc:
            raise CorruptContentError(f"gzip: {exc}") from exc

    def close(self) -> None:
        self._gz.close()  # Does not close a caller-supplied fileobj.


class _ZstdReader:
    """Reads a sequence of zstd frames, one decompression object per frame, so that a
    truncated final frame is an error (zstandard's stream reader ends silently there).
    Input is fed in small pieces to bound the output of any one step."""

    _FEED = 4096

    def __init__(self, src: BinaryIO) -> None:
        self._src = src
        self._dctx = zstandard.ZstdDecompressor()
        self._dobj = self._dctx.decompressobj()
        self._in_frame = False  # The current frame has begun but not ended.
        self._buf = bytearray()
        self._eof = False

    def _step(self) -> None:
        data = self._src.read(self._FEED)
        if not data:
            if self._in_frame:
                raise CorruptContentError("zstd: truncated frame")
            self._eof = True
            return
        try:
            while data:
                self._buf += self._dobj.decompress(data)
                self._in_frame = True
                if not self._dobj.eof:
                    break
                data = self._dobj.unused_data
                self._dobj = self._dctx.decompressobj()
                self._in_frame = False
        except zstandard.ZstdError as exc:
            raise CorruptContentError(f"zstd: {exc}") from exc

    def read(self, n: int = -1, /) -> bytes:
        while (n < 0 or len(self._buf) < n) and not self._eof:
            self._step()
        if n < 0:
            n = len(self._buf)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def close(self) -> None:
        self._buf.clear()


class SnappyFramedReader:
    """Decoder of the snappy framing format, chunk by chunk.

    Chunk headers are parsed here; each data chunk is decoded (and its CRC-32C checked) by
    cramjam, which is handed the chunk behind a stream identifier. Reserved unskippable chunk
    types, a missing leading stream identifier, oversized or truncated chunks raise
    `CorruptContentError`.
    """

    def __init__(self, src: BinaryIO) -> None:
        self._src = src
        self._buf = bytearray()  # Decoded bytes not yet returned.
        self._seen_identifier = False
        self._eof = False

    def _read_exact(self, n: int) -> bytes:
        parts: list[bytes] = []
        remaining = n
        while remaining:
            got = self._src.read(remaining)
            if not got:
                break
            parts.append(got)
            remaining -= len(got)
        return b"".join(parts)

    def _next_chunk(self) -> None:
        header = self._read_exact(4)
        if not header:
            self._eof = True
            return
        if len(header) < 4:
            raise CorruptContentError("snappy: truncated chunk header")
        kind = header[0]
        length = header[1] | (header[2] << 8) | (header[3] << 16)
        body = self._read_exact(length)
        if len(body) < length:
            raise CorruptContentError("snappy: truncated chunk")

        if kind == 0xFF:
            if header + body != SNAPPY_STREAM_IDENTIFIER:
                raise CorruptContentError("snappy: bad stream identifier")
            self._seen_identifier = True
            return
        if not self._seen_identifier:
            raise CorruptContentError("snappy: stream does not begin with a stream identifier")
        if kind in (0x00, 0x01):
            if length < 4 or (kind == 0x01 and length - 4 > _SNAPPY_MAX_BLOCK):
                raise CorruptContentError("snappy: bad chunk length")
            try:
                decoded = cramjam.snappy.decompress(SNAPPY_STREAM_IDENTIFIER + header + body)
            except cramjam.DecompressionError as exc:
                raise CorruptContentError(f"snappy: {exc}") from exc
            if len(decoded) > _SNAPPY_MAX_BLOCK:
                raise CorruptContentError("snappy: decoded chunk exceeds 64 KiB")
            self._buf += bytes(decoded)
        elif 0x02 <= kind <= 0x7F:
            raise CorruptContentError(f"snappy: reserved unskippable chunk type {kind:#x}")
        # 0x80..0xFE (skippable, padding): ignored.

    def read(self, n: int = -1, /) -> bytes:
        if n < 0:
            while not self._eof:
                self._next_chunk()
            out = bytes(self._buf)
            self._buf.clear()
            return out
        while len(self._buf) < n and not self._eof:
            self._next_chunk()
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def close(self) -> None:
        self._buf.clear()


def new_decompressor(codec: int, src: BinaryIO) -> Decompressor:
    """A `Decompressor` of the `codec`-encoded stream `src`.

    `read` raises `CorruptContentError` on malformed input. Raises `UnknownCodecError` for
    INVALID or unknown codecs.
    """
    _check(codec)
    if codec == pb.NONE:
        return _IdentityReader(src)
    if codec in (pb.GZIP, pb.GZIP_OFFLOAD_DECOMPRESSION):
        return _GzipReader(src)
    if codec == pb.ZSTANDARD:
        return _ZstdReader(src)
    return SnappyFramedReader(src)


def decompress_to(codec: int, src: BinaryIO, dst: BinaryIO) -> int:
    """Decompress all of `src` into `dst`; returns the number of decompressed bytes written."""
    r = new_decompressor(codec, src)
    n = 0
    try:
        while chunk := r.read(CHUNK_SIZE):
            dst.write(chunk)
            n += len(chunk)
    finally:
        r.close()
    return n


__all__ = [
    "CHUNK_SIZE",
    "Compressor",
    "CorruptContentError",
    "Decompressor",
    "SnappyFramedReader",
    "UnknownCodecError",
    "codec_name",
    "compress_file",
    "compress_stream",
    "decompress_to",
    "new_compressor",
    "new_decompressor",
]
