"""Consumers: applications whose state lives in Stores recorded to Gazette journals.

So far: the `Store` contract (`consumer.store`) and the generated messages of the consumer
protocol (`consumer.protocol`); the Service, shards and transactions come with the consumer
issue.
"""

from gazette.consumer.store import Checkpoint, OpFuture, RecoveredLog, Shard, Store

__all__ = ["Checkpoint", "OpFuture", "RecoveredLog", "Shard", "Store"]
