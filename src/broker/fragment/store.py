"""Fragment stores: where persisted fragments live (``file://`` directories, ``s3://`` buckets).

A store is named by the URL written in a JournalSpec's ``fragment.stores``. Fragments are kept
under content-addressed names (see `content_path`), compressed with the fragment's codec, so
any broker, Go or Python, lists, reads and persists the same objects.

`FragmentStore` is the interface brokers use; `store_for_url` returns the (cached) store of a
URL. Helpers shared by the implementations (content paths with find/replace rewriting, verified
decompression, verified compression of a local spool file) live here too.

All blocking work (SDK calls, file copies, compression) runs in worker threads via
`asyncio.to_thread`. Cancelling an awaiting caller abandons the wait; the thread runs to its
end, and temporary files are cleaned up by it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from gazette.broker.fragment.codecs import (
    CHUNK_SIZE,
    CorruptContentError,
    UnknownCodecError,
    codec_name,
    new_compressor,
    new_decompressor,
)
from gazette.broker.protocol import fragment_name
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.sha1sum import is_zero, sha1sum_hex

log = logging.getLogger(__name__)


class FragmentStoreError(Exception):
    """A fragment store operation failed. The message names the store URL and the path."""


class FragmentCorrupted(FragmentStoreError):
    """Fragment content does not match its name: wrong length or SHA1 sum."""


@runtime_checkable
class FragmentStore(Protocol):
    """A place persisted fragments are listed, written, read and removed.

    Every method raises `FragmentStoreError` (naming the store URL and object path) when the
    store fails; callers may retry. Methods are safe to call concurrently.
    """

    url: str
    """The store URL exactly as written in the JournalSpec."""

    async def list(self, journal: str) -> list[pb.Fragment]:
        """Every fragment under the journal's prefix, including postfix subdirectories.

        Fragments are parsed from content names, with backing_store = `url`, mod_time = the
        object's modification time (unix seconds) and path_postfix set. Objects whose names
        are not fragment names are skipped with a warning.
        """
        ...

    async def exists(self, fragment: pb.Fragment) -> bool:
        """Whether the fragment's content path exists in this store."""
        ...

    async def persist(self, fragment: pb.Fragment, local_path: Path) -> pb.Fragment:
        """Compress `local_path` and write it at the fragment's content path.

        `local_path` holds exactly end - begin bytes of uncompressed content whose SHA1 is
        fragment.sum (checked while compressing: a mismatch raises `FragmentCorrupted` and
        nothing is written). Idempotent: if the path already exists nothing is written.
        Returns a copy of `fragment` with backing_store = `url` and mod_time set.
        """
        ...

    async def fetch(self, fragment: pb.Fragment, dest: Path) -> None:
        """Download and decompress the fragment into `dest`.

        The content is verified to be end - begin bytes with SHA1 fragment.sum; otherwise
        `FragmentCorrupted` is raised and `dest` is not created (content is staged in a
        temporary file beside it and renamed into place only once verified).
        """
        ...

    def open_raw(self, fragment: pb.Fragment) -> AsyncIterator[bytes]:
        """The stored (compressed) bytes of the fragment, in chunks; ``async for`` over it.

        No verification happens here: readers decompress and check as they go.
        """
        ...

    async def sign_get_url(self, fragment: pb.Fragment, ttl_seconds: float) -> str:
        """A URL from which the bearer may GET the stored bytes for `ttl_seconds`."""
        ...

    async def remove(self, fragment: pb.Fragment) -> None:
        """Delete the fragment's object."""
        ...

    async def health(self) -> None:
        """Probe the store (write, read back and list a small object under ``.test/``).

        Raises `FragmentStoreError` describing the problem.
        """
        ...


# ---------------------------------------------------------------------------------------------
# URL arguments and paths.


@dataclass(frozen=True)
class Rewriter:
    """Find/replace of the first occurrence of `find` in a journal-relative content path.

    Lets a new journal naming scheme keep reading fragments written under old names. Empty
    `find` leaves paths as they are.
    """

    find: str = ""
    replace: str = ""

    def rewrite(self, rel: str) -> str:
        if not self.find:
            return rel
        return rel.replace(self.find, self.replace, 1)


def parse_store_query(url: str, query: str, allowed: tuple[str, ...]) -> dict[str, str]:
    """Parse URL query arguments, matching names case-insensitively against `allowed`.

    Returns a dict keyed by the `allowed` spelling. Unknown or repeated arguments raise
    `FragmentStoreError`.
    """
    by_lower = {a.lower(): a for a in allowed}
    out: dict[str, str] = {}
    for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        name = by_lower.get(key.lower())
        if name is None:
            raise FragmentStoreError(
                f"store {url}: unknown URL argument {key!r} (expected one of {list(allowed)})"
            )
        if name in out:
            raise FragmentStoreError(f"store {url}: URL argument {key!r} repeated")
        out[name] = value
    return out


def rewriter_from(args: Mapping[str, str]) -> Rewriter:
    return Rewriter(find=args.get("find", ""), replace=args.get("replace", ""))


def content_path(fragment: pb.Fragment) -> str:
    """The journal-relative content path: ``journal[/postfix]/<begin>-<end>-<sha1><ext>``."""
    try:
        return fragment_name.content_path(fragment)
    except ValueError as exc:
        raise FragmentStoreError(f"fragment of {fragment.journal!r}: {exc}") from None


def with_store(fragment: pb.Fragment, url: str, mod_time: int) -> pb.Fragment:
    """A copy of `fragment` with backing_store and mod_time set."""
    out = pb.Fragment()
    out.CopyFrom(fragment)
    out.backing_store = url
    out.mod_time = mod_time
    return out


def parse_listed(url: str, journal: str, rel: str, mod_time: int) -> pb.Fragment | None:
    """A fragment of an object listed at `rel` under ``journal/``, or None (logged) if its
    name is not a fragment name."""
    try:
        frag = fragment_name.parse_relative_path(journal, rel)
    except ValueError as exc:
        log.warning(
            "skipping unparseable fragment name store=%s journal=%s path=%s err=%s",
            url,
            journal,
            rel,
            exc,
        )
        return None
    frag.backing_store = url
    frag.mod_time = mod_time
    return frag


# ---------------------------------------------------------------------------------------------
# Verified compression and decompression (blocking; run in a thread).


def _fragment_desc(fragment: pb.Fragment) -> str:
    return f"{fragment.journal}@[{fragment.begin}, {fragment.end})"


def compress_verified(fragment: pb.Fragment, local_path: Path, dst: BinaryIO, where: str) -> None:
    """Compress `local_path` into `dst` with the fragment's codec, checking its length and
    SHA1 against `fragment` as it is read. `where` names the store and path for errors."""
    expected = fragment.end - fragment.begin
    h = hashlib.sha1()
    n = 0
    try:
        w = new_compressor(fragment.compression_codec, dst)
    except UnknownCodecError as exc:
        raise FragmentStoreError(f"{where}: {exc}") from None
    with open(local_path, "rb") as src:
        while chunk := src.read(CHUNK_SIZE):
            n += len(chunk)
            if n > expected:
                break
            h.update(chunk)
            w.write(chunk)
    w.close()
    check_content(fragment, n, h.digest(), f"{where} (local file {local_path})")


def verify_local(fragment: pb.Fragment, local_path: Path, where: str) -> None:
    """Check that `local_path` holds the fragment's uncompressed content."""
    expected = fragment.end - fragment.begin
    h = hashlib.sha1()
    n = 0
    with open(local_path, "rb") as src:
        while chunk := src.read(CHUNK_SIZE):
            n += len(chunk)
            if n > expected:
                break
            h.update(chunk)
    check_content(fragment, n, h.digest(), f"{where} (local file {local_path})")


def check_content(fragment: pb.Fragment, length: int, digest: bytes, where: str) -> None:
    """Raise `FragmentCorrupted` unless (length, digest) match the fragment."""
    expected = fragment.end - fragment.begin
    if length != expected:
        raise FragmentCorrupted(
            f"{where}: fragment {_fragment_desc(fragment)} has "
            f"{'more than ' if length > expected else ''}{length} content bytes, "
            f"expected {expected}"
        )
    # Empty content is conventionally summed as all zeros rather than SHA1("").
    if length == 0 and is_zero(fragment.sum):
        return
    if digest.hex() != sha1sum_hex(fragment.sum):
        raise FragmentCorrupted(
            f"{where}: fragment {_fragment_desc(fragment)} SHA1 mismatch: content has "
            f"{digest.hex()}, name says {sha1sum_hex(fragment.sum)}"
        )


def decompress_verified(fragment: pb.Fragment, src: BinaryIO, dest: Path, where: str) -> None:
    """Decompress `src` into `dest`, verifying length and SHA1 before `dest` appears.

    Raises `FragmentCorrupted` (content mismatch or undecodable data) or `OSError`.
    """
    expected = fragment.end - fragment.begin
    try:
        reader = new_decompressor(fragment.compression_codec, src)
    except UnknownCodecError as exc:
        raise FragmentStoreError(f"{where}: {exc}") from None
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".fetching", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha1()
        n = 0
        with os.fdopen(fd, "wb") as out:
            try:
                while chunk := reader.read(CHUNK_SIZE):
                    n += len(chunk)
                    if n > expected:
                        break
                    h.update(chunk)
                    out.write(chunk)
            except CorruptContentError as exc:
                raise FragmentCorrupted(
                    f"{where}: fragment {_fragment_desc(fragment)} "
                    f"({codec_name(fragment.compression_codec)}) does not decode: {exc}"
                ) from exc
            finally:
                reader.close()
        check_content(fragment, n, h.digest(), where)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------
# Store registry.

_stores: dict[str, FragmentStore] = {}
_stores_lock = threading.Lock()


def store_for_url(url: str) -> FragmentStore:
    """The store of `url`, constructed on first use and cached per exact URL string.

    Raises `FragmentStoreError` for an unsupported scheme or malformed URL.
    """
    with _stores_lock:
        store = _stores.get(url)
        if store is not None:
            return store
        parsed = urllib.parse.urlsplit(url)
        if not parsed.path.endswith("/"):
            raise FragmentStoreError(f"store {url}: URL path must end in '/'")
        if parsed.scheme == "file":
            from gazette.broker.fragment.store_file import FileStore

            store = FileStore(url)
        elif parsed.scheme == "s3":
            from gazette.broker.fragment.store_s3 import S3Store

            store = S3Store(url)
        else:
            raise FragmentStoreError(
                f"store {url}: unsupported fragment store scheme {parsed.scheme!r} "
                "(supported: file, s3)"
            )
        _stores[url] = store
        return store


def clear_store_cache() -> None:
    """Forget cached stores (tests; configuration reloads)."""
    with _stores_lock:
        _stores.clear()


HEALTH_PROBE_PATH = ".test/health-check"
HEALTH_PROBE_CONTENT = b"health-check\n"

__all__ = [
    "FragmentCorrupted",
    "FragmentStore",
    "FragmentStoreError",
    "Rewriter",
    "clear_store_cache",
    "content_path",
    "store_for_url",
]
