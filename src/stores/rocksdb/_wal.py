"""WalFiles: makes a recorded RocksDB's WAL durable by syncing its files on the fusefs mount.

An fsync (or fdatasync) on the mount returns once every operation fusefs has recorded so far
is committed to the recovery log, so syncing the WAL files after a write makes that write,
and everything before it, durable. The store syncs from a thread of its own (`os.fdatasync`
releases the GIL, which rocksdict's synced writes would hold for the whole round trip).

Two costs are kept off each commit: the WAL files are found by listing the *backing*
directory (a local readdir; the mount's would be three FUSE requests), and each WAL file is
opened once and kept open until RocksDB deletes it (instead of an open, flush and release
per commit). Used from one thread at a time.

A sync succeeds only if it synced a WAL file through the mount. Once the mount is gone (its
fusefs process died and the mount was detached), the mountpoint is a plain directory: RocksDB
may go on creating files there, unrecorded, and a WAL of the backing directory is not found
under the mountpoint. Taking that for a WAL deleted meanwhile would acknowledge commits that
were never synced; so a file missing under the mountpoint but present in the backing
directory, a file opened on another device than the mount's, or a sync that synced nothing,
fails the sync.
"""

from __future__ import annotations

import contextlib
import errno
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
        self._dev = os.stat(mountpoint).st_dev  # The mount's, as it is opened on it.
        self._closed = False
        self.syncs = 0
        """Number of `sync` calls that synced at least one file."""

    def sync(self) -> None:
        """Sync every WAL file: returns once everything recorded so far is in the log.

        Raises `NoWal` when there is no WAL file, and OSError: EIO from fusefs when the log
        cannot be appended (e.g. it was fenced), ENOTCONN or ECONNABORTED once the mount is
        gone, EIO when no WAL file could be synced. A WAL that RocksDB deleted meanwhile needs
        nothing: it deletes a WAL only once the memtables it backed are flushed to SSTs, and
        it syncs those SSTs (and the MANIFEST naming them) first, which on the mount commits
        them, and everything recorded before, to the log. Raises RuntimeError once
        `close` was called."""
        if self._closed:
            raise RuntimeError("the WAL files are closed (the store is closing)")
        for _ in range(2):  # Listed again once if every WAL listed was deleted meanwhile.
            if self._sync_listed():
                # Still mounted after the sync: a write made before it went to a file on the
                # mount (once detached, RocksDB creates its files in the directory beneath).
                if os.stat(self._mountpoint).st_dev != self._dev:
                    raise OSError(errno.ENOTCONN, f"the fusefs mount {self._mountpoint} is gone")
                self.syncs += 1
                return
        raise OSError(
            errno.EIO, f"no WAL file could be synced through the mount {self._mountpoint}"
        )

    def _sync_listed(self) -> bool:
        """Sync the WAL files listed now; whether any was synced."""
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
                    self._check_deleted(name)
                    continue  # Deleted since the listing.
                if os.fstat(fd).st_dev != self._dev:
                    os.close(fd)
                    raise self._detached(name)
                self._fds[name] = fd
            try:
                os.fdatasync(fd)
            except FileNotFoundError:
                # Deleted since the listing (the kernel's sync of its attributes finds no
                # file on the mount); anything else is an error.
                self._check_deleted(name)
            else:
                synced = True
        return synced

    def _check_deleted(self, name: str) -> None:
        """Raise unless WAL `name`, not found under the mountpoint, was deleted (a file of
        the backing directory the mount does not show: the mount is gone)."""
        if (self._backing / name).exists():
            raise self._detached(name)

    def _detached(self, name: str) -> OSError:
        return OSError(
            errno.ENOTCONN,
            f"{self._mountpoint} no longer shows the recorded WAL {name}: the fusefs mount is gone",
        )

    def close_files(self) -> None:
        """Close the files kept open (they are opened again when synced next)."""
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def close(self) -> None:
        """Close the files kept open (before the database closes or the mount stops); later
        `sync` calls raise."""
        self._closed = True
        self.close_files()
