"""The life of an allocator member process (``gazette-broker``, ``gazette-consumer``).

`run_main` is a process's whole run: the umask, its flags, logging, then `serve` on an event
loop, and its exit status. `serve` drives a `MemberProcess` (the process's own parts) through
the life cycle both share:

1. `MemberProcess.start`: bind what must fail the start before the member is announced (the
   HTTP port), start the member, start serving. Raises `StartupError`.
2. The ready line (``broker ready ...``, ``consumer ready ...``) on stdout: harnesses and
   operators wait for it. SIGTERM/SIGINT now stop the process gracefully.
3. The background loops run (`MemberProcess.run`) until a signal, or until they fail.
4. Stopping: unless the loops failed, `drain` (bounded by the drain timeout; 0: none) hands
   the member's items to other members while the process still serves; then `stop_serving`
   (servers stop with a grace for requests in flight), the loops are cancelled and waited
   for, and `shutdown` releases the member. `close` runs last, also after a failed start.

A process whose loops failed because its etcd lease was lost (paused, or cut off from etcd,
past the lease TTL) has been fenced: its items belong to other members now. It stops like a
drained one (its `shutdown` runs: a broker persists its spools, a consumer stops its shards
cleanly), then `serve` raises that error (``fenced``: the allocator's `LeaseLostError`, passed
in, as this layer sits below the allocator); `run_main` logs the process's one line saying so
and exits with `EXIT_LEASE_LOST`, for a supervisor to restart it as a new member. Any other
failure of the loops is raised as it is (a traceback, status 1).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from gazette.mainboilerplate import gc_tuning

__all__ = [
    "EXIT_LEASE_LOST",
    "EXIT_STARTUP",
    "LOG_FORMAT",
    "UMASK",
    "MemberProcess",
    "StartupError",
    "find_error",
    "run_main",
    "serve",
]

EXIT_STARTUP = 2
"""Exit status of a process that could not start (as of a usage error)."""
EXIT_LEASE_LOST = 3
"""Exit status of a process whose etcd lease was lost while it ran."""

UMASK = 0o077
"""Everything a member process writes (spools, stores, recovery-log playbacks, the files of
the fusefs processes it starts) is its users' data: private to the process's user
(docs/file-modes.md). Set first, so it covers every file the process makes."""

LOG_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StartupError(Exception):
    """The process cannot start (its address in use, etcd unreachable, another process of
    the same id...): `run_main` prints ``{prog}: {message}`` and exits with `EXIT_STARTUP`."""


class MemberProcess(Protocol):
    """One process's parts of the shared life cycle (module docs), in the order `serve`
    calls them."""

    async def start(self) -> None:
        """Bind the HTTP server, start the member, start serving. Raises `StartupError`;
        releases the member again if serving fails to start (`close` still runs)."""
        ...

    def ready(self) -> str:
        """Mark the process ready (its health answers so) and return its ready line."""
        ...

    async def run(self) -> None:
        """The background loops, until cancelled; raising fails the process."""
        ...

    def stopping(self) -> None:
        """A stop began: say so on the health endpoint (the drain may follow)."""
        ...

    async def drain(self, timeout: float) -> object:
        """Hand this member's items over to other members, waiting `timeout` at most."""
        ...

    async def stop_serving(self) -> None:
        """Stop the servers, giving requests in flight a grace."""
        ...

    async def shutdown(self) -> None:
        """Release the member (its replicas, its lease); the loops have stopped."""
        ...

    async def close(self) -> None:
        """Release what `start` bound first (HTTP), if it did."""
        ...


E = TypeVar("E", bound=BaseException)


def find_error(err: BaseException, of_type: type[E]) -> E | None:
    """The error of type `of_type` that is `err` or is in it (the background loops run in a
    task group: an error of one comes wrapped in an exception group)."""
    if isinstance(err, of_type):
        return err
    if isinstance(err, BaseExceptionGroup):
        for inner in err.exceptions:
            found = find_error(inner, of_type)
            if found is not None:
                return found
    return None


async def serve(
    process: MemberProcess,
    drain_timeout: float,
    log: logging.Logger,
    *,
    fenced: type[BaseException],
) -> None:
    """Run `process` from its start to its shutdown (module docs). Raises `StartupError`;
    once stopped, the `fenced` error if one ended its loops, else what else failed them."""
    try:
        await process.start()
        await _serve(process, drain_timeout, log, fenced)
    finally:
        await process.close()


async def _serve(
    process: MemberProcess,
    drain_timeout: float,
    log: logging.Logger,
    fenced: type[BaseException],
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    print(process.ready(), flush=True)
    background = asyncio.create_task(process.run(), name="background")
    stopped = asyncio.create_task(stop.wait(), name="stop-signal")
    try:
        await asyncio.wait({background, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    log.info("stopping")
    process.stopping()
    if not background.done() and drain_timeout > 0:
        await process.drain(drain_timeout)
    await process.stop_serving()
    background.cancel()
    # Waited for, not awaited: had it failed, awaiting it would raise here, and the member
    # would be left to asyncio.run's teardown instead of its shutdown.
    await asyncio.wait({background})
    await process.shutdown()
    failure = None if background.cancelled() else background.exception()
    if failure is not None:
        lost = find_error(failure, fenced)
        if lost is not None:
            raise lost
        raise failure


C = TypeVar("C")


def run_main(
    prog: str,
    parse: Callable[[], C],
    log_level: Callable[[C], str],
    main: Callable[[C], Coroutine[Any, Any, None]],
    *,
    fenced: type[E],
    on_fenced: Callable[[C, E], None],
) -> None:
    """A member process's run: set the umask, `parse` its configuration (a usage error exits
    with status 2), log to stderr at `log_level`, and run `main` on a new event loop.
    `StartupError` exits with `EXIT_STARTUP` after ``{prog}: {message}`` on stderr; the
    `fenced` error (a lost lease) with `EXIT_LEASE_LOST` after `on_fenced` logged it (module
    docs)."""
    os.umask(UMASK)
    cfg = parse()
    logging.basicConfig(level=log_level(cfg).upper(), format=LOG_FORMAT, stream=sys.stderr)
    gc_tuning.tune()  # The process's code is imported by now.
    try:
        asyncio.run(main(cfg))
    except StartupError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        sys.exit(EXIT_STARTUP)
    except fenced as err:
        on_fenced(cfg, err)
        sys.exit(EXIT_LEASE_LOST)
