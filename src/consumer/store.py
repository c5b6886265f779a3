"""The Store contract: durable, transactional state committed together with Checkpoints.

A minimal placeholder of upstream's ``consumer.Store`` until the consumer package (and
``consumer.proto``) exists: a `Checkpoint` is the marshaled ``consumer.Checkpoint`` message
(bytes), and a `Shard` is whatever the Service passes (stores here do not use it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Protocol, TypeAlias

__all__ = ["Checkpoint", "OpFuture", "Shard", "Store"]

Checkpoint: TypeAlias = bytes
"""A marshaled ``consumer.Checkpoint`` (b"" is the empty checkpoint of a new store)."""

Shard: TypeAlias = Any
"""The processing context of a shard; opaque to the stores implemented so far."""

OpFuture: TypeAlias = Awaitable[Any]
"""An operation in flight (an append, a commit): awaiting it raises if the operation failed."""


class Store(Protocol):
    """A durable, transactional store of application state and the Checkpoint producing it.

    Exactly-once processing requires that the application's mutations of one consumer
    transaction and the Checkpoint passed to `start_commit` commit atomically: either both are
    recovered, or neither.

    Ordering and concurrency, as upstream:

    - `start_commit` is never called while the future returned by the previous call is
      pending; the application may however keep mutating the store (the next transaction)
      while it is. A store must keep those mutations out of the committing transaction.
    - `restore_checkpoint` is called at shard start-up, before any `start_commit`.
    - `destroy` is called once nothing uses the store any more.
    """

    def start_commit(
        self, shard: Shard, checkpoint: Checkpoint, wait_for: Sequence[OpFuture]
    ) -> OpFuture:
        """Start committing the current transaction together with `checkpoint`.

        The commit must not become durable before every future of `wait_for` succeeded; a
        failure of one of them fails the commit. Returns a future which resolves once the
        commit is durable (for recorded stores: committed to the recovery log), and raises if
        it failed (the store is then unusable: crash-only).
        """
        ...

    async def restore_checkpoint(self, shard: Shard) -> Checkpoint:
        """The most recently committed Checkpoint (b"" for a new store)."""
        ...

    def destroy(self) -> None:
        """Release every resource of the store, including its local files."""
        ...
