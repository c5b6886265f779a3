"""The RocksDB store kind's part of a consumer process: fusefs processes started ahead.

A RocksDB store is recorded by a fusefs process of its own, which takes ~0.35 s to start. A
consumer process whose application uses RocksDB stores keeps ``--fusefs-prestart`` of them
started ahead (`fusefs.mount.ServerPool`) once a standby of a RocksDB shard is here: a
promoted standby's store then mounts through one at once. Registered as a store kind
(`consumer.store_hooks`) when this module is imported, which `stores.rocksdb.store` does.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gazette.consumer import store_hooks
from gazette.fusefs.mount import PrestartedServer, ServerPool, collect_killed
from gazette.mainboilerplate.flags import env

__all__ = ["FUSEFS_PRESTART", "FusefsPrestart", "PrestartOptions", "take_prestarted"]

MAX_PRESTART = 64

CURRENT = "/CURRENT"
"""A file every RocksDB has: a standby whose played files link it will open a RocksDB."""


@dataclass(frozen=True)
class PrestartOptions:
    prestart: int = 1
    """fusefs processes kept started ahead once a standby of a RocksDB shard is here (each
    promotion of such a standby takes one: it mounts at once); 0: none."""


class FusefsPrestart:
    """The `StoreHook` of the RocksDB kind in one process: its pool of started fusefs
    processes (none if ``--fusefs-prestart 0``), and the collection of the fusefs processes
    of destroyed stores at shutdown."""

    def __init__(self, options: PrestartOptions) -> None:
        self.pool = ServerPool(size=options.prestart) if options.prestart else None

    def standby(self, is_linked: Callable[[str], bool]) -> bool:
        if self.pool is None:
            return True
        if not is_linked(CURRENT):
            return False
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
            help="fusefs processes kept started ahead for promotions of RocksDB standbys, "
            "~40 MB each (0: none) [CONSUMER_FUSEFS_PRESTART]",
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
