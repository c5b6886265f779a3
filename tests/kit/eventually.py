"""Waiting for a condition with a deadline: `eventually` (in a coroutine) and
`eventually_blocking` (in a plain test or a thread).

A check is a function of no arguments, sync or async. It holds when it returns a true value
without raising AssertionError; anything else raised fails the wait at once (a check that
tolerates a transient error, an RPC to a process still starting, says so with `ignoring`).
A wait that times out fails with an AssertionError naming `what` it waited for, with the
check's last value or assertion, so a failure reads as the property, not as a bare timeout."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class _Last:
    """What the check last said: its value, or the assertion it raised."""

    def __init__(self) -> None:
        self.said = "never ran"

    def failure(self, what: str, timeout: float) -> AssertionError:
        return AssertionError(f"waited {timeout:g} s for {what} (last: {self.said})")


def _held(value: object, last: _Last) -> bool:
    last.said = repr(value)[:500]
    return bool(value)


async def eventually(
    check: Callable[[], T | Awaitable[T]],
    *,
    what: str,
    timeout: float = 30.0,
    interval: float = 0.01,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `check` every `interval` seconds until it holds; return its value. Fails when
    `timeout` seconds pass first. Cancelling the caller cancels the wait (and a pending
    async check)."""
    deadline = time.monotonic() + timeout
    last = _Last()
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if _held(value, last):
                return value  # type: ignore[return-value]
        except AssertionError as err:
            last.said = f"AssertionError: {err}"
        except ignoring as err:
            last.said = f"{type(err).__name__}: {err}"
        if time.monotonic() >= deadline:
            raise last.failure(what, timeout)
        await asyncio.sleep(interval)


def eventually_blocking(
    check: Callable[[], T],
    *,
    what: str,
    timeout: float = 30.0,
    interval: float = 0.05,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """`eventually` for a sync check, sleeping the calling thread between calls."""
    deadline = time.monotonic() + timeout
    last = _Last()
    while True:
        try:
            value = check()
            if _held(value, last):
                return value
        except AssertionError as err:
            last.said = f"AssertionError: {err}"
        except ignoring as err:
            last.said = f"{type(err).__name__}: {err}"
        if time.monotonic() >= deadline:
            raise last.failure(what, timeout)
        time.sleep(interval)
