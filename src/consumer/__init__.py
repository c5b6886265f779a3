"""Consumers: applications whose state lives in Stores recorded to Gazette journals.

The `Store` contract and its errors (`consumer.store`, `consumer.store_errors`: every store
raises `StoreFailed` and `StoreClosed`), the recovery of a recorded store's files
(`consumer.recovery`), how each kind of store is read by an export (`consumer.export`), the
runtime of shards and transactions, the `Resolver` applications find a shard's primary with
(`consumer.resolver`), and the generated messages of the consumer protocol
(`consumer.protocol`).
"""

from gazette.consumer.recovery import recover
from gazette.consumer.resolver import Resolution, Resolver, ResolverStopped
from gazette.consumer.store import Checkpoint, OpFuture, RecoveredLog, Shard, Store
from gazette.consumer.store_errors import StoreClosed, StoreFailed

__all__ = [
    "Checkpoint",
    "OpFuture",
    "RecoveredLog",
    "Resolution",
    "Resolver",
    "ResolverStopped",
    "Shard",
    "Store",
    "StoreClosed",
    "StoreFailed",
    "recover",
]
