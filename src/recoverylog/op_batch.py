"""Batches of file operations handed from a synchronous thread to a Recorder's loop.

The recorded stores (the SQLite VFS, the fusefs server) observe file operations on a thread
that must not await, queue them as `Op` tuples in the order they happened, and hand the batch
to the Recorder's event loop, where `apply_ops` records them in that order.
"""

from __future__ import annotations

from typing import Final

from recoverylog.recorder import Recorder

__all__ = ["CREATE", "LINK", "Op", "RENAME", "TRUNCATE", "UNLINK", "WRITE", "apply_ops"]

CREATE: Final = 0  # path: created (a new Fnode).
TRUNCATE: Final = 1  # path: truncated to zero (a new Fnode).
WRITE: Final = 2  # path, offset, data.
UNLINK: Final = 3  # path.
RENAME: Final = 4  # path -> data (the encoded target path).
LINK: Final = 5  # path (existing) -> data (the encoded new path).

Op = tuple[int, str, int, bytes]
"""(kind, path, offset, data); fields a kind does not use are 0 / b""."""


def apply_ops(rec: Recorder, ops: list[Op], *, exclusive_create: bool = False) -> None:
    """Record `ops` in order. Raises the Recorder's error (or RuntimeError for a write or
    link of a file the Recorder does not know) at the first op that fails."""
    for kind, path, offset, data in ops:
        if kind == WRITE:
            fnode = rec.fnode(path)
            if fnode is None:
                raise RuntimeError(f"write of unrecorded file {path!r}")
            rec.record_write(fnode, offset, data)
        elif kind == CREATE:
            rec.record_open(path, create=True, exclusive=exclusive_create)
        elif kind == TRUNCATE:
            rec.record_truncate(path)
        elif kind == UNLINK:
            rec.record_unlink(path)
        elif kind == RENAME:
            rec.record_rename(path, data.decode())
        elif kind == LINK:
            fnode = rec.fnode(path)
            if fnode is None:
                raise RuntimeError(f"link of unrecorded file {path!r}")
            rec.record_link(fnode, data.decode())
        else:
            raise ValueError(f"unknown file operation kind {kind}")
