"""The ``file:///abs/dir/`` fragment store: fragments as files under a local directory.

Useful for single machines, tests, and shared filesystems (NFS). The URL path is the absolute
root directory (ending in '/'); query arguments ``find`` and ``replace`` rewrite content paths
(see `Rewriter`). The root must exist: a missing root is reported, never created, so a
forgotten mount does not silently fill the local disk.

Writes are atomic: content is compressed into a hidden temporary file in the destination
directory, fsynced, and renamed into place, so readers never see a partial fragment. Objects'
mod_time is the file's mtime. GZIP_OFFLOAD_DECOMPRESSION is rejected: nothing would decompress
it on the way out.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import tempfile
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

from gazette.broker.fragment.codecs import CHUNK_SIZE
from gazette.broker.fragment.store import (
    HEALTH_PROBE_CONTENT,
    HEALTH_PROBE_PATH,
    FragmentStoreError,
    compress_verified,
    content_path,
    decompress_verified,
    parse_listed,
    parse_store_query,
    rewriter_from,
    with_store,
)
from gazette.broker.protocol import protocol_pb2 as pb

_TEMP_PREFIX = ".partial-"


class FileStore:
    """A `FragmentStore` over a local directory. See the module docstring."""

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "file":
            raise FragmentStoreError(f"store {url}: not a file:// URL")
        if parsed.netloc not in ("", "localhost"):
            raise FragmentStoreError(f"store {url}: file:// URLs take no host")
        root = urllib.parse.unquote(parsed.path)
        if not root.startswith("/") or not root.endswith("/"):
            raise FragmentStoreError(f"store {url}: path must be absolute and end in '/'")
        self.root = root
        self.rewriter = rewriter_from(parse_store_query(url, parsed.query, ("find", "replace")))

    def __repr__(self) -> str:
        return f"FileStore({self.url!r})"

    def path_of(self, fragment: pb.Fragment) -> Path:
        """The file holding `fragment` in this store."""
        return Path(self.root + self.rewriter.rewrite(content_path(fragment)))

    def _err(self, op: str, path: Path | str, exc: BaseException) -> FragmentStoreError:
        return FragmentStoreError(f"store {self.url}: {op} {path}: {exc}")

    # -- list ------------------------------------------------------------------------------

    async def list(self, journal: str) -> list[pb.Fragment]:
        return await asyncio.to_thread(self._list, journal)

    def _list(self, journal: str) -> builtins.list[pb.Fragment]:
        top = Path(self.root + self.rewriter.rewrite(journal + "/"))
        out: builtins.list[pb.Fragment] = []
        if not top.is_dir():
            return out

        def on_error(exc: OSError) -> None:
            raise self._err("listing", top, exc)

        for dirpath, _dirnames, filenames in os.walk(top, onerror=on_error):
            for name in filenames:
                if name.startswith(_TEMP_PREFIX):
                    continue  # In-progress writes.
                full = Path(dirpath) / name
                try:
                    mtime = int(full.stat().st_mtime)
                except FileNotFoundError:
                    continue  # Removed while listing.
                except OSError as exc:
                    raise self._err("stat", full, exc) from exc
                rel = full.relative_to(top).as_posix()
                frag = parse_listed(self.url, journal, rel, mtime)
                if frag is not None:
                    out.append(frag)
        return out

    # -- exists / persist ------------------------------------------------------------------

    async def exists(self, fragment: pb.Fragment) -> bool:
        path = self.path_of(fragment)
        try:
            return await asyncio.to_thread(path.exists)
        except OSError as exc:
            raise self._err("stat", path, exc) from exc

    async def persist(self, fragment: pb.Fragment, local_path: Path) -> pb.Fragment:
        if fragment.compression_codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
            raise FragmentStoreError(
                f"store {self.url}: GZIP_OFFLOAD_DECOMPRESSION is incompatible with file:// stores"
            )
        return await asyncio.to_thread(self._persist, fragment, local_path)

    def _persist(self, fragment: pb.Fragment, local_path: Path) -> pb.Fragment:
        dest = self.path_of(fragment)
        where = f"store {self.url}: persisting {dest}"
        if not os.path.isdir(self.root):
            raise FragmentStoreError(f"store {self.url}: root directory {self.root} is missing")
        try:
            st = dest.stat()
            return with_store(fragment, self.url, int(st.st_mtime))  # Already persisted.
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._err("stat", dest, exc) from exc

        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=_TEMP_PREFIX + dest.name, dir=dest.parent)
        except OSError as exc:
            raise self._err("creating temporary file for", dest, exc) from exc
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as f:
                compress_verified(fragment, local_path, f, where)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest)
            _fsync_dir(dest.parent)
            st = dest.stat()
        except OSError as exc:
            raise self._err("persisting", dest, exc) from exc
        finally:
            tmp.unlink(missing_ok=True)
        return with_store(fragment, self.url, int(st.st_mtime))

    # -- reads -----------------------------------------------------------------------------

    async def fetch(self, fragment: pb.Fragment, dest: Path) -> None:
        await asyncio.to_thread(self._fetch, fragment, dest)

    def _fetch(self, fragment: pb.Fragment, dest: Path) -> None:
        path = self.path_of(fragment)
        try:
            with open(path, "rb") as src:
                decompress_verified(fragment, src, dest, f"store {self.url}: fetching {path}")
        except OSError as exc:
            raise self._err("fetching", path, exc) from exc

    async def open_raw(self, fragment: pb.Fragment) -> AsyncIterator[bytes]:
        path = self.path_of(fragment)
        try:
            f = await asyncio.to_thread(open, path, "rb")
        except OSError as exc:
            raise self._err("opening", path, exc) from exc
        try:
            while True:
                try:
                    chunk = await asyncio.to_thread(f.read, CHUNK_SIZE)
                except OSError as exc:
                    raise self._err("reading", path, exc) from exc
                if not chunk:
                    return
                yield chunk
        finally:
            f.close()

    async def sign_get_url(self, fragment: pb.Fragment, ttl_seconds: float) -> str:
        # Like upstream: the bare path behind file://, not percent-encoded, with no expiry.
        return "file://" + str(self.path_of(fragment))

    # -- remove / health -------------------------------------------------------------------

    async def remove(self, fragment: pb.Fragment) -> None:
        """Delete the fragment's file. Removing an absent fragment is not an error (as with
        S3's DeleteObject)."""
        path = self.path_of(fragment)
        try:
            await asyncio.to_thread(path.unlink, True)
        except OSError as exc:
            raise self._err("removing", path, exc) from exc

    async def health(self) -> None:
        await asyncio.to_thread(self._health)

    def _health(self) -> None:
        root = Path(self.root)
        if not root.is_dir():
            raise FragmentStoreError(
                f"store {self.url}: root directory {self.root} does not exist or is not a directory"
            )
        probe = Path(self.root + self.rewriter.rewrite(HEALTH_PROBE_PATH))
        try:
            probe.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=probe.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(HEALTH_PROBE_CONTENT)
                os.replace(tmp_name, probe)
            finally:
                Path(tmp_name).unlink(missing_ok=True)
            got = probe.read_bytes()
        except OSError as exc:
            raise self._err("health check of", probe, exc) from exc
        if got != HEALTH_PROBE_CONTENT:
            raise FragmentStoreError(
                f"store {self.url}: health check of {probe}: read back {got!r}, "
                f"wrote {HEALTH_PROBE_CONTENT!r}"
            )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
