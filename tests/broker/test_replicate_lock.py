"""A Replicate stream waits for its replica's lock only while its route holds
(broker.replicate_api.acquire_unless): the lock's holder may be this broker's own pipeline,
waiting for the primary of the old route, which waits for this stream's answer."""

from __future__ import annotations

import asyncio

from gazette.broker.replicate_api import acquire_unless


async def test_a_free_lock_is_acquired() -> None:
    lock, stop = asyncio.Lock(), asyncio.get_running_loop().create_future()
    assert await acquire_unless(lock, stop)
    assert lock.locked()


async def test_a_route_change_ends_the_wait_and_leaves_the_lock_to_its_holder() -> None:
    lock, stop = asyncio.Lock(), asyncio.get_running_loop().create_future()
    await lock.acquire()  # the pipeline of the new route holds it
    waiting = asyncio.create_task(acquire_unless(lock, stop))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    stop.set_result(None)
    assert await asyncio.wait_for(waiting, 1) is False
    lock.release()
    # No waiter was left behind in the lock's queue.
    assert await asyncio.wait_for(lock.acquire(), 1)


async def test_a_route_already_changed_is_not_waited_for() -> None:
    lock, stop = asyncio.Lock(), asyncio.get_running_loop().create_future()
    stop.set_result(None)
    assert await acquire_unless(lock, stop) is False
    assert not lock.locked()


async def test_a_lock_handed_over_as_the_route_changes_is_given_back() -> None:
    lock, stop = asyncio.Lock(), asyncio.get_running_loop().create_future()
    await lock.acquire()
    waiting = asyncio.create_task(acquire_unless(lock, stop))
    # Time for the waiter to queue on the lock.
    await asyncio.sleep(0.01)
    lock.release()  # the waiter is handed the lock ...
    stop.set_result(None)  # ... in the same turn as the route changes
    assert await asyncio.wait_for(waiting, 1) is False
    assert not lock.locked()


async def test_cancelling_the_stream_never_leaves_the_lock_held() -> None:
    lock, stop = asyncio.Lock(), asyncio.get_running_loop().create_future()
    await lock.acquire()
    waiting = asyncio.create_task(acquire_unless(lock, stop))
    # Time for the waiter to queue on the lock.
    await asyncio.sleep(0.01)
    lock.release()
    waiting.cancel()
    try:
        await waiting
    except asyncio.CancelledError:
        pass
    await asyncio.sleep(0)
    assert not lock.locked()
