"""Batches of file operations handed from a synchronous thread to a Recorder's loop.

The recorded stores (the SQLite VFS, the fusefs server) observe file operations on a thread
that must not await, queue them as `Op` tuples in the order they happened (`op_queue.OpQueue`,
which coalesces writes with a `WriteRun`), and hand the batch to the Recorder's event loop,
where `apply_ops` records them in that order; `from_thread` starts a barrier there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from gazette.recoverylog.recorder import Recorder

__all__ = [
    "CREATE",
    "LINK",
    "Op",
    "OpView",
    "RENAME",
    "TRUNCATE",
    "UNLINK",
    "WRITE",
    "WriteRun",
    "apply_ops",
    "from_thread",
]

T = TypeVar("T")

CREATE: Final = 0  # path: created (a new Fnode).
TRUNCATE: Final = 1  # path: truncated to zero (a new Fnode).
WRITE: Final = 2  # path, offset, data.
UNLINK: Final = 3  # path.
RENAME: Final = 4  # path -> data (the encoded target path).
LINK: Final = 5  # path (existing) -> data (the encoded new path).

Op = tuple[int, str, int, bytes]
"""(kind, path, offset, data); fields a kind does not use are 0 / b""."""

OpView = tuple[int, str, int, bytes | memoryview]
"""An `Op` whose data may be a view of a larger buffer (`apply_ops` copies what it keeps)."""


class WriteRun:
    """Contiguous writes to one file, coalesced into one `WRITE` op.

    `add` keeps the written pieces; `seal` joins them once (a store writes many small
    pieces, e.g. SQLite a WAL frame as a header and a page: growing one buffer would copy
    each piece more than once) and starts over.
    """

    __slots__ = ("_parts", "length", "offset", "path")

    def __init__(self) -> None:
        self.path: str | None = None
        self.offset = 0
        self.length = 0
        self._parts: list[bytes] = []

    def continues(self, path: str, offset: int) -> bool:
        """Whether a write of `path` at `offset` extends this run."""
        return self.path == path and self.offset + self.length == offset

    def start(self, path: str, offset: int) -> None:
        """Begin a run at `offset` of `path` (the run must be empty: `seal` it first)."""
        self.path, self.offset = path, offset

    def add(self, data: bytes) -> None:
        """Append `data` (bytes: kept as it is, not copied) to the run."""
        self._parts.append(data)
        self.length += len(data)

    def extend(self, path: str, offset: int, data: bytes) -> bool:
        """`add` `data` if a write of `path` at `offset` extends the run (`continues`);
        False, adding nothing, if it does not. (One call on the path of every write.)"""
        if self.path != path or self.offset + self.length != offset:
            return False
        self._parts.append(data)
        self.length += len(data)
        return True

    def seal(self) -> Op | None:
        """The run's WRITE op (None if no run is open); the run is then empty."""
        if self.path is None:
            return None
        parts = self._parts
        op = (WRITE, self.path, self.offset, parts[0] if len(parts) == 1 else b"".join(parts))
        self.clear()
        return op

    def clear(self) -> None:
        """Drop the run."""
        self.path, self.offset, self.length, self._parts = None, 0, 0, []


def apply_ops(rec: Recorder, ops: Sequence[OpView], *, exclusive_create: bool = False) -> None:
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
            rec.record_rename(path, bytes(data).decode())
        elif kind == LINK:
            fnode = rec.fnode(path)
            if fnode is None:
                raise RuntimeError(f"link of unrecorded file {path!r}")
            rec.record_link(fnode, bytes(data).decode())
        else:
            raise ValueError(f"unknown file operation kind {kind}")


def from_thread(
    loop: asyncio.AbstractEventLoop, start: Callable[[], asyncio.Future[T]]
) -> concurrent.futures.Future[T]:
    """Call `start` on `loop` from another thread; a concurrent future of the future it
    returns (its result or exception; cancelled if it is), or of what `start` raised.

    Cheaper than ``run_coroutine_threadsafe`` on the path of every synced commit: one loop
    callback and no task. Cancelling the returned future only stops relaying.
    """
    relayed: concurrent.futures.Future[T] = concurrent.futures.Future()

    def relay(fut: asyncio.Future[T]) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # Cancelled.
            if fut.cancelled():
                relayed.cancel()
            elif (err := fut.exception()) is not None:
                relayed.set_exception(err)
            else:
                relayed.set_result(fut.result())

    def begin() -> None:
        if relayed.cancelled():
            return
        try:
            fut = start()
        except BaseException as err:  # noqa: BLE001 - relayed to the waiting thread
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                relayed.set_exception(err)
            return
        fut.add_done_callback(relay)

    loop.call_soon_threadsafe(begin)
    return relayed
