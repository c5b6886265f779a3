"""The RocksDB store kind's part of a consumer process: fusefs processes started ahead.

A RocksDB store is recorded by a fusefs process of its own, which takes ~0.35 s to start (its
interpreter and imports; over a second on a loaded machine). A consumer process whose
application uses RocksDB stores keeps ``--fusefs-prestart`` of them started ahead
(`fusefs.mount.ServerPool`) from its own start: a store then mounts through one at once,
whether it is a promoted standby's, a new shard's, or the first of a restarted process (the
process it takes starts while the consumer announces itself and plays the shard's log).
Registered as a store kind (`consumer.store_hooks`) when this module is imported, which
`stores.rocksdb.store` does: a process whose application does not import RocksDB's store
starts none.

Rejected: starting the pool only once a standby's played files are a RocksDB's. A restarted
process's shard reaches STANDBY some 0.05 s after the process announced itself, and its
promotion would wait for the whole start of a fusefs process; a new shard's empty log shows
no RocksDB, so its store would start its own.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gazette.consumer import store_hooks
from gazette.fusefs.mount import PrestartedServer, ServerPool, collect_killed
from gazette.mainboilerplate.flags import env

__all__ = ["FUSEFS_PRESTART", "FusefsPrestart", "PrestartOptions", "take_prestarted"]

MAX_PRESTART = 64


@dataclass(frozen=True)
class PrestartOptions:
    prestart: int = 1
    """fusefs processes kept started ahead from the process's start (each store opened takes
    one: it mounts at once); 0: none."""


class FusefsPrestart:
    """The `StoreHook` of the RocksDB kind in one process: its pool of started fusefs
    processes (none if ``--fusefs-prestart 0``), and the collection of the fusefs processes
    of destroyed stores at shutdown. Made on the process's event loop (the runtime's
    start), the pool starts its first process at once."""

    def __init__(self, options: PrestartOptions) -> None:
        self.pool = ServerPool(size=options.prestart) if options.prestart else None
        if self.pool is not None and _loop_running():
            self.pool.reserve()

    def standby(self, is_linked: Callable[[str], bool]) -> bool:
        # Made outside an event loop, the pool starts with the first standby.
        if self.pool is not None:
            self.pool.reserve()
        return True

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        await collect_killed()


class _Kind:
    name = "rocksdb"

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--fusefs-prestart",
            type=int,
            default=int(env("CONSUMER_FUSEFS_PRESTART", str(PrestartOptions.prestart))),
            help="fusefs processes kept started ahead for the RocksDB stores of promoted "
            "standbys, new shards and a restart's shards, ~40 MB each (0: none) "
            "[CONSUMER_FUSEFS_PRESTART]",
        )

    def options(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> PrestartOptions:
        if not 0 <= args.fusefs_prestart <= MAX_PRESTART:
            parser.error(
                f"--fusefs-prestart must be within 0..{MAX_PRESTART}, not {args.fusefs_prestart}"
            )
        return PrestartOptions(prestart=args.fusefs_prestart)

    def start(self, options: object | None) -> FusefsPrestart:
        if not isinstance(options, PrestartOptions):
            options = PrestartOptions()
        return FusefsPrestart(options)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


FUSEFS_PRESTART = _Kind()
"""The RocksDB store kind (`consumer.store_hooks.StoreKind`)."""

store_hooks.register(FUSEFS_PRESTART)


def take_prestarted(
    hooks: Sequence[store_hooks.StoreHook], log_level: str | None
) -> PrestartedServer | None:
    """A fusefs process started ahead (of `log_level`) from the process's hook among
    `hooks`, if there is one ready."""
    hook = store_hooks.find_hook(hooks, FusefsPrestart)
    if hook is None or hook.pool is None:
        return None
    return hook.pool.take(log_level)
