"""File modes read back by the tests that data files are private to their owner (0600 files,
0700 directories: docs/file-modes.md)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

OPEN_UMASK = 0o022
"""The umask the processes under test are started with: the common default, which lets every
local user read what a process creates unless the process narrows it itself."""


@contextlib.contextmanager
def open_umask() -> Iterator[None]:
    """Run the block (the starts of the processes under test, which inherit it) with
    `OPEN_UMASK`, whatever umask the test runner has, so that a test of the processes' own
    modes cannot pass by the runner's grace."""
    previous = os.umask(OPEN_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def entries(root: Path) -> dict[Path, int]:
    """Mode bits (``S_IMODE``) of `root` and every directory and regular file beneath it
    (symbolic links, whose modes mean nothing, are left out; they are not followed)."""
    found = {root: stat.S_IMODE(root.lstat().st_mode)}
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(parent, name)
            try:
                st = path.lstat()
            except FileNotFoundError:  # Removed while walking (a rolled spool, a temp file).
                continue
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                found[path] = stat.S_IMODE(st.st_mode)
    return found


def not_private(found: dict[Path, int]) -> dict[str, str]:
    """The entries of `found` that another local user could read, list or write (any group
    or other permission bit), as ``{path: octal mode}``."""
    return {str(p): oct(mode) for p, mode in sorted(found.items()) if mode & 0o077}
