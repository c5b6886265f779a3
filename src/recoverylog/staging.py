"""Staging: the directory a Player plays into, and the Fnode files it fills before they go live.

While playing, every Fnode (a file across all its links) is a file ``.fnodes/<fnode>`` of the
playback directory, written at the offsets of its recorded writes. Only once playback
completes are the live Fnodes hard-linked at their paths and the property files written
(`make_live`), all or nothing; ``.fnodes`` is then removed. A playback that fails or is
cancelled never leaves a partial tree: the staging directory may remain, and the next playback
wipes it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.playback_errors import UnsafeDirectory, UnsafePath

__all__ = [
    "FNODE_STAGING_DIR",
    "StagedFiles",
    "check_playback_directory",
    "make_live",
    "relative_path",
    "wipe",
]

recovered_bytes = 0
"""Bytes this process's Players wrote to local files (upstream's
``gazette_recoverylog_recovered_bytes_total``; the consumer's /debug/metrics renders it)."""

FNODE_STAGING_DIR = ".fnodes"
"""Subdirectory of the playback directory in which Fnodes are staged while playing."""

_MAX_OPEN_FILES = 256


class StagedFiles:
    """Fnode files under the staging directory, with a bounded cache of open descriptors."""

    def __init__(self, root: Path, max_open: int = _MAX_OPEN_FILES) -> None:
        self.root = root
        self.live: set[int] = set()
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._max_open = max_open
        self._prefix = os.path.join(root, "")  # Plain strings: pathlib costs per op add up.

    def path(self, fnode: int) -> str:
        return f"{self._prefix}{fnode}"

    def _cache(self, fnode: int, fd: int) -> None:
        self._fds[fnode] = fd
        while len(self._fds) > self._max_open:
            _, old = self._fds.popitem(last=False)
            os.close(old)

    def create(self, fnode: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        self._cache(fnode, os.open(self.path(fnode), flags, 0o666))
        self.live.add(fnode)

    def write(self, fnode: int, offset: int, data: bytes) -> None:
        fd = self._fds.get(fnode)
        if fd is None:
            fd = os.open(self.path(fnode), os.O_WRONLY | os.O_CLOEXEC)
            self._cache(fnode, fd)
        else:
            self._fds.move_to_end(fnode)
        n = os.pwrite(fd, data, offset)
        while n < len(data):  # Short writes are rare, but allowed.
            n += os.pwrite(fd, memoryview(data)[n:], offset + n)
        global recovered_bytes
        recovered_bytes += n

    def remove(self, fnode: int) -> None:
        fd = self._fds.pop(fnode, None)
        if fd is not None:
            os.close(fd)
        os.unlink(self.path(fnode))
        self.live.discard(fnode)

    def close(self) -> None:
        fds, self._fds = self._fds, OrderedDict()
        for fd in fds.values():
            os.close(fd)


def check_playback_directory(directory: Path) -> Path:
    """The resolved `directory`, or `UnsafeDirectory` if a Player must not wipe it.

    Refused: the root and top-level directories, the user's home and its ancestors, the
    current directory and its ancestors, and anything which exists but is not a directory.
    """
    path = Path(directory).resolve()
    if len(path.parts) < 3:
        raise UnsafeDirectory(f"refusing to play into {path}: too close to the root")
    for what, other in (("home", Path.home()), ("current", Path.cwd())):
        other = other.resolve()
        if path == other or path in other.parents:
            raise UnsafeDirectory(f"refusing to play into {path}: it holds the {what} directory")
    if path.exists() and not path.is_dir():
        raise UnsafeDirectory(f"refusing to play into {path}: not a directory")
    return path


async def wipe(directory: Path) -> None:
    """Empty `directory` (made if missing) and make its staging directory, in a thread.

    If cancelled, waits for the thread before re-raising: no wipe outlives the call, so that
    a later playback never races one still running.
    """
    await _in_thread_to_completion(_wipe, directory)


def _wipe(directory: Path) -> None:
    # The directory itself is kept: it may be a mount point.
    directory.mkdir(parents=True, exist_ok=True)
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    (directory / FNODE_STAGING_DIR).mkdir()


async def _in_thread_to_completion(fn: Callable[[Path], None], arg: Path) -> None:
    task = asyncio.ensure_future(asyncio.to_thread(fn, arg))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                continue
        raise


def relative_path(path: str) -> PurePosixPath:
    """Recorded `path` (``/a/b``) relative to the playback directory, or `UnsafePath` if it
    would leave it (``..``, empty components) or land in the staging directory."""
    parts = path.lstrip("/").split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] == FNODE_STAGING_DIR:
        raise UnsafePath(f"log path {path!r} does not name a file within the playback directory")
    return PurePosixPath(*parts)


def make_live(directory: Path, fsm: FSM, files: StagedFiles) -> None:
    """Link staged Fnodes at their paths and write properties; all or nothing.

    Synchronous, so that cancellation cannot interrupt it; on failure every path linked
    so far is removed again.
    """
    if fsm.has_remaining_hints():
        raise AssertionError("completing playback with unused hints")
    if files.live != set(fsm.live_nodes):
        raise AssertionError(
            f"staged Fnodes {sorted(files.live)} != live Fnodes {sorted(fsm.live_nodes)}"
        )
    made: set[PurePosixPath] = {PurePosixPath()}  # Parent directories made so far.

    def target_of(path: str) -> str:
        rel = relative_path(path)
        if rel.parent not in made:
            os.makedirs(directory / rel.parent, exist_ok=True)
            made.add(rel.parent)
        return os.path.join(directory, rel)

    try:
        for fnode, node in fsm.live_nodes.items():
            staged = files.path(fnode)
            for link in sorted(node.links):
                os.link(staged, target_of(link))
        for path, content in fsm.properties.items():
            with open(target_of(path), "x", encoding="utf-8", newline="") as f:
                f.write(content)
    except BaseException:
        for child in directory.iterdir():
            if child.name == FNODE_STAGING_DIR:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        raise
    shutil.rmtree(directory / FNODE_STAGING_DIR)
