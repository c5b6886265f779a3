"""Channels kept per endpoint for a process's life: waiting for one to connect before
forwarding a request, and replacing one that has failed for too long.

A channel whose connection failed reports TRANSIENT_FAILURE and fails calls at once with its
last error ("Connection refused") until it reconnects, retrying within its reconnect backoff
(at most a second or two with our options). A process that was down and is back is reached
again only once that backoff ends: `connected` gives a channel that moment before a request
is forwarded on it.

gRPC Python's client has also had reconnection defects that left a channel failing for good
against a server that answers new connections again. A channel kept per endpoint (a broker's
peers, a client's brokers, a consumer's fellow consumers) would then fail every call to that
server until a restart. `StuckChannels` notices a channel that has stayed in
TRANSIENT_FAILURE for `STUCK_AFTER` seconds, as seen when its owner next hands it out, so
that the owner replaces it with a new one. Against a server that is really down, that costs
a new channel every `STUCK_AFTER` seconds, each failing at once as the old one did.

Rejected: a watcher task per channel (`wait_for_state_change`). It costs a task per endpoint
for the process's life, and it sees only the state changes that gRPC reports. Checking when
the channel is next used costs nothing while no call is made. Also rejected: `wait_for_ready`
on forwarded calls, which would hold a request for a process that is gone until the caller's
deadline instead of letting the caller re-resolve.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Hashable

import grpc
import grpc.aio

__all__ = ["CONNECT_WAIT", "STUCK_AFTER", "StuckChannels", "connected"]

STUCK_AFTER = 10.0
"""Seconds of uninterrupted TRANSIENT_FAILURE after which a channel is replaced: several
times the longest reconnect backoff used by the package's channels (2 s)."""

CONNECT_WAIT = 2.0
"""Seconds a request forwarded to another process waits for its channel to connect: beyond
the longest reconnect backoff of the channels that forward (1 s, plus gRPC's 20% jitter)."""

RETIRE_GRACE = 5.0
"""Seconds that calls still running on a replaced channel get before it is closed."""


async def connected(channel: grpc.aio.Channel, timeout: float = CONNECT_WAIT) -> None:
    """Give `channel` up to `timeout` seconds to connect, unless it is connected. Returns
    either way: a call made then fails as the channel does.

    A channel whose connection failed fails every call at once with its last error until its
    reconnect backoff ends. A process that was down and is back (registered, serving) is
    reached again only then: a request forwarded to it right after its restart must not fail
    "Connection refused" for the forwarder's stale view of it."""
    if channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await channel.channel_ready()


class StuckChannels:
    """Per channel key: since when its channel has been failing, seen at each hand-out."""

    def __init__(
        self, stuck_after: float = STUCK_AFTER, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stuck_after = stuck_after
        self._clock = clock
        self._failing_since: dict[Hashable, float] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self.replaced = 0
        """How many channels were found stuck (for logs and tests)."""

    def stuck(self, key: Hashable, channel: grpc.aio.Channel) -> bool:
        """Whether `channel` (the one kept under `key`) has been in TRANSIENT_FAILURE for
        `stuck_after` seconds: the caller then replaces it (and `retire`s the old one)."""
        state = channel.get_state(try_to_connect=False)
        if state != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            self._failing_since.pop(key, None)
            return False
        now = self._clock()
        since = self._failing_since.setdefault(key, now)
        if now - since < self.stuck_after:
            return False
        del self._failing_since[key]
        self.replaced += 1
        return True

    def retire(self, channel: grpc.aio.Channel) -> None:
        """Close a replaced channel in the background (calls on it get `RETIRE_GRACE`)."""
        task = asyncio.get_running_loop().create_task(channel.close(RETIRE_GRACE))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        """With the owner's own channels: end the closing of replaced ones at once."""
        retiring, self._retiring = self._retiring, set()
        for task in retiring:
            task.cancel()
        await asyncio.gather(*retiring, return_exceptions=True)
