"""What a kind of store adds to a consumer process beside its stores.

Some stores need something of the whole process, not of one shard: RocksDB's stores are
recorded by fusefs processes, and a process keeps some started ahead of need so that a
promoted standby mounts at once. Such a store's module registers a `StoreKind` when it is
imported (`register`); an application imports the stores it uses, so the kinds a process has
are those of its application. The consumer runtime knows no kind by name:

- ``gazette-consumer`` imports the application's module before it parses its flags, and each
  registered kind adds its own flags (`StoreKind.add_flags`) and reads them back
  (`StoreKind.options`, kept in ``ConsumerConfig.store_options`` under the kind's name);
- the runtime starts one `StoreHook` per kind (`StoreKind.start`), hands them to every
  replica, and closes them at shutdown, after its replicas stopped;
- a standby replica asks each hook, while it tails its log, whether its played files are of
  the hook's kind (`StoreHook.standby`): the hook then prepares for the promotion;
- a store finds its kind's hook in ``RecoveredLog.store_hooks``.

Rejected: flags and start-up of every store kind in the generic consumer configuration and
runtime (they named fusefs, and a process of SQLite stores carried RocksDB's pool); a hook
the application must pass explicitly (every RocksDB application would repeat it).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

__all__ = ["StoreHook", "StoreKind", "find_hook", "register", "registered"]


class StoreHook(Protocol):
    """A store kind's part of one running consumer process (`StoreKind.start`).

    Called on the event loop. `standby` must not block; `close` is awaited once, when no
    replica of the process runs any more.
    """

    def standby(self, is_linked: Callable[[str], bool]) -> bool:
        """A standby replica tails its recovery log; `is_linked(path)` says whether `path`
        is among its played files so far. If they are of this kind's store, prepare for the
        standby's promotion and return True; return True also if there is nothing to prepare.
        False: ask again later (the primary may create the files later). Not called for the
        replica once it returned True."""
        ...

    async def close(self) -> None:
        """Release what the hook holds (at the process's shutdown)."""
        ...


class StoreKind(Protocol):
    """A kind of store that adds flags and a `StoreHook` to the consumer processes whose
    application uses it. `name` keys its options in ``ConsumerConfig.store_options``."""

    name: str

    def add_flags(self, parser: argparse.ArgumentParser) -> None:
        """Add this kind's flags to `parser` (``gazette-consumer``'s)."""
        ...

    def options(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
        """This kind's options from the parsed `args`; invalid ones exit through `parser`."""
        ...

    def start(self, options: Any | None) -> StoreHook:
        """The hook of one process, given the kind's `options` (None: its defaults, for a
        configuration not parsed from flags)."""
        ...


_KINDS: dict[str, StoreKind] = {}

H = TypeVar("H")


def register(kind: StoreKind) -> None:
    """Register `kind` (again: the later registration replaces the earlier)."""
    _KINDS[kind.name] = kind


def registered() -> list[StoreKind]:
    """The registered kinds, in the order they were first registered."""
    return list(_KINDS.values())


def find_hook(hooks: Sequence[StoreHook], of_type: type[H]) -> H | None:
    """The hook of type `of_type` among `hooks`, if there is one."""
    return next((h for h in hooks if isinstance(h, of_type)), None)
