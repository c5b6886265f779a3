"""The errors every store raises, defined once beside the `Store` contract.

An application (or the runtime) catches "the store failed" or "the store is closed" without
knowing which store it has: each store raises these, or a subclass of them that adds detail.
Why a store failed is its ``__cause__`` (a fenced recovery log, a failed ``wait_for``
future, a broken fusefs process...).
"""

from __future__ import annotations

__all__ = ["StoreClosed", "StoreFailed"]


class StoreFailed(RuntimeError):
    """A commit of the store failed (the one raising this, or an earlier one): the store is
    unusable from then on (crash-only), and the runtime destroys it and recovers the shard
    afresh. ``__cause__`` is what failed the commit, kept whole: the runtime looks in its
    chain for a fenced Recorder (`gazette.consumer.store.fenced_by`)."""


class StoreClosed(RuntimeError):
    """The store was closed or destroyed: it takes no more work."""
