"""Hand-over helpers between a recording thread and the Recorder's loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from gazette.recoverylog.op_batch import WRITE, WriteRun, from_thread


def test_a_write_run_joins_its_pieces_once_sealed() -> None:
    run = WriteRun()
    assert run.seal() is None
    run.start("db-wal", 100)
    header, page = b"h" * 24, b"p" * 4096
    run.add(header)
    assert run.continues("db-wal", 124)
    assert not run.continues("db-wal", 100)
    assert not run.continues("db", 124)
    run.add(page)
    assert run.continues("db-wal", 124 + 4096)
    assert run.seal() == (WRITE, "db-wal", 100, header + page)
    assert run.path is None and run.length == 0
    assert run.seal() is None


def test_a_write_run_of_one_piece_keeps_it() -> None:
    run = WriteRun()
    run.start("f", 0)
    piece = b"x" * 100_000
    run.add(piece)
    op = run.seal()
    assert op is not None and op[3] is piece


def test_a_write_run_extends_only_with_a_contiguous_write_of_its_file() -> None:
    run = WriteRun()
    assert not run.extend("f", 0, b"a")  # No run is open.
    run.start("f", 10)
    assert run.extend("f", 10, b"ab")
    assert not run.extend("f", 11, b"x")  # Overlaps.
    assert not run.extend("f", 13, b"x")  # Leaves a hole.
    assert not run.extend("g", 12, b"x")  # Another file.
    assert run.extend("f", 12, b"cd")
    assert run.seal() == (WRITE, "f", 10, b"abcd")


async def _outcome(fut: concurrent.futures.Future[object]) -> object:
    """What a thread waiting on `fut` gets: its result, or what it raises."""
    out: list[object] = []

    def wait() -> None:
        try:
            out.append(fut.result(timeout=10))
        except BaseException as err:  # noqa: BLE001 - the outcome under test
            out.append(err)

    await asyncio.get_running_loop().run_in_executor(None, wait)
    return out[0]


async def test_from_thread_relays_the_future_started_on_the_loop() -> None:
    loop = asyncio.get_running_loop()
    started: list[int] = []
    inner: asyncio.Future[object] = loop.create_future()

    def start() -> asyncio.Future[object]:
        started.append(threading.get_ident())
        return inner

    relayed = await loop.run_in_executor(None, from_thread, loop, start)
    await asyncio.sleep(0)
    assert started == [threading.get_ident()]  # Started on the loop's thread.
    assert not relayed.done()
    inner.set_result("committed")
    assert await _outcome(relayed) == "committed"


async def test_from_thread_relays_failures_and_cancellation() -> None:
    loop = asyncio.get_running_loop()

    def broken() -> asyncio.Future[object]:
        raise RuntimeError("the recorder is broken")

    err = await _outcome(await loop.run_in_executor(None, from_thread, loop, broken))
    assert isinstance(err, RuntimeError) and "broken" in str(err)

    failing: asyncio.Future[object] = loop.create_future()
    relayed = from_thread(loop, lambda: failing)
    await asyncio.sleep(0)
    failing.set_exception(ValueError("fenced"))
    err = await _outcome(relayed)
    assert isinstance(err, ValueError)

    cancelled: asyncio.Future[object] = loop.create_future()
    relayed = from_thread(loop, lambda: cancelled)
    await asyncio.sleep(0)
    cancelled.cancel()
    assert isinstance(await _outcome(relayed), concurrent.futures.CancelledError)


async def test_a_cancelled_relay_neither_starts_nor_fails() -> None:
    loop = asyncio.get_running_loop()
    started: list[bool] = []

    def start() -> asyncio.Future[object]:
        started.append(True)
        return loop.create_future()

    relayed = from_thread(loop, start)
    assert relayed.cancel()
    await asyncio.sleep(0.01)
    assert started == []

    inner: asyncio.Future[object] = loop.create_future()
    relayed = from_thread(loop, lambda: inner)
    await asyncio.sleep(0)
    assert relayed.cancel()  # The waiter gave up (e.g. the store was discarded)...
    inner.set_result("late")  # ...and the late outcome is dropped quietly.
    await asyncio.sleep(0)
    with pytest.raises(concurrent.futures.CancelledError):
        relayed.result(timeout=0)
