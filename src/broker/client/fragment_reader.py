"""Direct reads of persisted fragments from their store URLs, with SHA1 verification.

When a read is made with ``do_not_proxy``, a broker may answer with a fragment's URL (a
``file://`` path, or a presigned ``http(s)://`` URL) instead of streaming its content. This module
fetches such a fragment, decompresses it with its codec, and checks both its length and the
SHA1 of its uncompressed content against the `pb.Fragment` the broker described. Nothing is
handed to the caller before the whole fragment has been verified: decompressed content is
spooled (in memory up to a bound, then in an anonymous temporary file) while it is hashed.

All functions here block (file and network I/O, decompression); `Reader` runs them in a worker
thread.
"""

from __future__ import annotations

import hashlib
import tempfile
import urllib.parse
import urllib.request
from typing import IO, BinaryIO, cast

from gazette.broker.client.metrics import CLIENT
from gazette.broker.fragment.codecs import CorruptContentError, UnknownCodecError, decompress_to
from gazette.broker.fragment.store import FragmentCorrupted
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.sha1sum import sha1sum_to_digest

__all__ = ["VerifiedFragment", "fetch_verified_fragment", "SPOOL_IN_MEMORY_LIMIT"]

SPOOL_IN_MEMORY_LIMIT = 8 << 20
"""Decompressed fragment content up to this size is verified in memory; larger spills to disk."""

_HTTP_TIMEOUT = 60.0


class _HashingSink:
    """A write-only sink that hashes and counts what passes through to `dst`."""

    def __init__(self, dst: IO[bytes]) -> None:
        self.dst = dst
        self.sha1 = hashlib.sha1()
        self.size = 0

    def write(self, data: bytes, /) -> int:
        self.sha1.update(data)
        self.size += len(data)
        CLIENT.fetched_bytes += len(data)  # From a worker thread: a progress signal only.
        return self.dst.write(data)


class VerifiedFragment:
    """Verified, decompressed content of one fragment, readable from a journal offset.

    `offset` is the journal offset of the next byte `read` returns; it starts at the offset
    passed to `fetch_verified_fragment` and ends at `fragment.end`.
    """

    def __init__(self, fragment: pb.Fragment, content: IO[bytes], offset: int) -> None:
        self.fragment = fragment
        self.offset = offset
        self._content = content
        self._content.seek(offset - fragment.begin)

    @property
    def remaining(self) -> int:
        """Bytes between `offset` and the fragment's end."""
        return self.fragment.end - self.offset

    def read(self, n: int) -> bytes:
        """Up to `n` verified bytes at `offset` (b"" at the fragment's end)."""
        n = min(n, self.remaining)
        if n <= 0:
            return b""
        data = self._content.read(n)
        self.offset += len(data)
        return data

    def close(self) -> None:
        self._content.close()


def _open_url(url: str, codec: int) -> tuple[BinaryIO, int]:
    """Open the raw bytes of a fragment URL, and the codec they are actually encoded with."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        # Like Gazette's file store, the path follows file:// verbatim (not percent-encoded:
        # journal names may contain '%').
        path = url[len("file://") :]
        return open(path, "rb"), codec  # noqa: SIM115 - closed by the caller
    if parsed.scheme in ("http", "https"):
        req = urllib.request.Request(url)
        if codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
            # The store may decompress for us; if it does, bytes arrive as plain content.
            req.add_header("Accept-Encoding", "identity")
        elif codec == pb.GZIP:
            req.add_header("Accept-Encoding", "gzip")
        resp = urllib.request.urlopen(req, timeout=_HTTP_TIMEOUT)  # noqa: S310
        if codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
            encoding = (resp.headers.get("Content-Encoding") or "").lower()
            codec = pb.GZIP if encoding == "gzip" else pb.NONE
        return cast(BinaryIO, resp), codec
    raise ValueError(f"unsupported fragment URL scheme {parsed.scheme!r} ({url})")


def fetch_verified_fragment(
    fragment: pb.Fragment,
    url: str,
    offset: int,
    *,
    spool_limit: int = SPOOL_IN_MEMORY_LIMIT,
) -> VerifiedFragment:
    """Fetch, decompress and verify `fragment` from `url`; return it positioned at `offset`.

    Raises `FragmentCorrupted` when the content cannot be decompressed, has the wrong length,
    or its SHA1 differs from `fragment.sum`; OSError / urllib errors when it cannot be fetched;
    ValueError for an unsupported URL scheme or an `offset` outside the fragment. On any
    failure no content is returned and temporary files are removed.
    """
    if not fragment.begin <= offset <= fragment.end:
        raise ValueError(f"offset {offset} is outside fragment [{fragment.begin}, {fragment.end})")
    spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=spool_limit)  # noqa: SIM115
    try:
        raw, codec = _open_url(url, fragment.compression_codec)
        sink = _HashingSink(spool)
        try:
            decompress_to(codec, raw, cast(BinaryIO, sink))
        except (CorruptContentError, UnknownCodecError) as err:
            raise FragmentCorrupted(f"{url}: cannot decompress: {err}") from err
        finally:
            raw.close()
        want = fragment.end - fragment.begin
        if sink.size != want:
            raise FragmentCorrupted(
                f"{url}: decompressed {sink.size} bytes, fragment "
                f"[{fragment.begin}, {fragment.end}) has {want}"
            )
        expect = sha1sum_to_digest(fragment.sum)
        if sink.sha1.digest() != expect:
            raise FragmentCorrupted(
                f"{url}: SHA1 {sink.sha1.hexdigest()} of content differs from "
                f"fragment sum {expect.hex()}"
            )
        return VerifiedFragment(fragment, spool, offset)
    except BaseException:
        spool.close()
        raise
