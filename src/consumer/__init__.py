"""Consumers: applications whose state lives in Stores recorded to Gazette journals.

Only the `Store` contract exists so far (`consumer.store`); the Service, shards and
transactions come with the consumer issue.
"""

from consumer.store import Checkpoint, OpFuture, Shard, Store

__all__ = ["Checkpoint", "OpFuture", "Shard", "Store"]
