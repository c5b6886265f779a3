"""The kit's waits: a check holds when it returns a true value; a false value or an
AssertionError is retried until the deadline, which fails naming what it waited for."""

from __future__ import annotations

import itertools

import pytest

from tests.kit.eventually import eventually, eventually_blocking


async def test_returns_the_value_of_the_check_once_it_holds() -> None:
    calls = itertools.count(1)
    assert await eventually(lambda: next(calls) >= 3 and "three", what="three calls") == "three"


async def test_awaits_an_async_check_and_retries_its_assertions() -> None:
    calls = itertools.count(1)

    async def check() -> int:
        n = next(calls)
        assert n >= 3, f"call {n}"
        return n

    assert await eventually(check, what="three calls") == 3


@pytest.mark.parametrize(
    "check, last",
    [
        (lambda: [], "last: []"),
        (lambda: _fail("not yet"), "last: AssertionError: not yet"),
    ],
)
async def test_a_timeout_names_what_did_not_hold_and_the_last_answer(
    check: object, last: str
) -> None:
    with pytest.raises(AssertionError, match="waited 0.05 s for the thing") as err:
        await eventually(check, what="the thing", timeout=0.05)  # type: ignore[arg-type]
    assert last in str(err.value)


async def test_other_errors_fail_at_once_unless_ignored() -> None:
    with pytest.raises(ConnectionError):
        await eventually(_refuse, what="a connection", timeout=5)
    calls = itertools.count(1)

    def flaky() -> bool:
        if next(calls) < 3:
            _refuse()
        return True

    assert await eventually(flaky, what="a connection", ignoring=(ConnectionError,))


def test_blocking_wait() -> None:
    calls = itertools.count(1)
    assert eventually_blocking(lambda: next(calls) >= 2, what="two calls", interval=0.001)
    with pytest.raises(AssertionError, match="waited 0.01 s for never"):
        eventually_blocking(lambda: False, what="never", timeout=0.01, interval=0.001)


def _fail(msg: str) -> bool:
    raise AssertionError(msg)


def _refuse() -> bool:
    raise ConnectionError("refused")
