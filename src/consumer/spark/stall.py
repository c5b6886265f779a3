"""Failing a read that makes no progress, for option ``broker_timeout`` of both sources.

The journal client retries unreachable brokers without end (as upstream's does), which is
right for a consumer but would leave a Spark task, or a query's planning, waiting for ever on
a wrong ``broker`` option or a hung broker. `watch` turns "no progress for that long" into an
error. Progress is whatever the caller counts (bytes of the log played, messages read) plus
the bytes this process's client fetched from fragment stores: a large fragment downloads
whole before its first byte is returned, and must not look like a stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gazette.broker.client.metrics import CLIENT

__all__ = ["client_progress", "watch", "within"]

T = TypeVar("T")


def client_progress() -> tuple[int, int]:
    """Bytes this process's journal client has read and fetched from fragment stores."""
    return sum(CLIENT.read_bytes.values()), CLIENT.fetched_bytes


async def watch(
    pending: asyncio.Future[Any],
    progress: Callable[[], object],
    timeout: float,
    stalled: Callable[[], Exception],
) -> None:
    """Returns once `pending` is done; raises `stalled()` if neither `progress()` nor
    `client_progress()` changes for `timeout` seconds before that (`pending` is left to the
    caller, to cancel)."""

    def now_seen() -> tuple[object, tuple[int, int]]:
        return progress(), client_progress()

    seen, since = now_seen(), time.monotonic()
    while not pending.done():
        await asyncio.wait({pending}, timeout=min(1.0, timeout / 4))
        now = time.monotonic()
        current = now_seen()
        if current != seen:
            seen, since = current, now
        elif not pending.done() and now - since >= timeout:
            raise stalled()


async def within(call: Awaitable[T], timeout: float, late: Callable[[], Exception]) -> T:
    """`call`'s result, or `late()` raised (the call cancelled) if it takes over `timeout`
    seconds; 0: no bound. (Errors of the call itself, a `TimeoutError` too, pass through.)"""
    if timeout <= 0:
        return await call
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise late()
    return task.result()
