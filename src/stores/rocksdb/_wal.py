"""WalFiles: makes a recorded RocksDB's WAL durable by syncing its files on the fusefs mount.

An fsync (or fdatasync) on the mount returns once every operation fusefs has recorded so far
is committed to the recovery log, so syncing the WAL files after a write makes that write,
and everything before it, durable. The store syncs from a thread of its own (`os.fdatasync`
releases the GIL, which rocksdict's synced writes would hold for the whole round trip).

Two costs are kept off each commit: the WAL files are found by listing the *backing*
directory (a local readdir; the mount's would be three FUSE requests), and each WAL file is
opened once and kept open until RocksDB deletes it (instead of an open, flush and release
per commit). Used from one thread at a time.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["NoWal", "WalFiles"]


class NoWal(RuntimeError):
    """The database has no WAL file on the mount (its `wal_dir` is elsewhere), so its
    writes are not recorded: no commit may be reported durable."""


class WalFiles:
    """The WAL files (``*.log``) of a database whose directory is `mountpoint`, a fusefs
    mount of `backing` (module docs)."""

    def __init__(self, backing: Path, mountpoint: Path) -> None:
        self._backing = backing
        self._mountpoint = mountpoint
        self._fds: dict[str, int] = {}
        self._closed = False
        self.syncs = 0
        """Number of `sync` calls that synced at least one file."""

    def sync(self) -> None:
        """Sync every WAL file: returns once everything recorded so far is in the log.

        Raises `NoWal` when there is no WAL file, and OSError (EIO from fusefs when the log
        cannot be appended, e.g. it was fenced). A WAL that RocksDB deleted meanwhile needs
        nothing: it deletes a WAL only once the memtables it backed are flushed to SSTs, and
        it syncs those SSTs (and the MANIFEST naming them) first, which on the mount commits
        them, and everything recorded before, to the log. Raises RuntimeError once
        `close` was called."""
        if self._closed:
            raise RuntimeError("the WAL files are closed (the store is closing)")
        names = {n for n in os.listdir(self._backing) if n.endswith(".log")}
        if not names:
            raise NoWal(
                f"no WAL file (*.log) in {self._mountpoint}: the database's WAL must be on "
                "the mount (do not set wal_dir)"
            )
        for gone in self._fds.keys() - names:
            # Deleted by RocksDB: its content is dead, so an error writing it back is moot
            # (and the descriptor is released whatever close returns).
            with contextlib.suppress(OSError):
                os.close(self._fds.pop(gone))
        synced = False
        for name in sorted(names):
            fd = self._fds.get(name)
            if fd is None:
                try:
                    fd = os.open(self._mountpoint / name, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue  # Deleted since the listing.
                self._fds[name] = fd
            try:
                os.fdatasync(fd)
            except FileNotFoundError:
                # Deleted since the listing (the kernel's sync of its attributes finds no
                # file on the mount); anything else is an error.
                if (self._backing / name).exists():
                    raise
            else:
                synced = True
        self.syncs += synced

    def close(self) -> None:
        """Close the files kept open (before the database closes or the mount stops); later
        `sync` calls raise."""
        self._closed = True
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
