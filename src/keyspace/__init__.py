"""etcd, as brokers, consumers and gazctl use it: a small typed asyncio client (`etcd`) and a
decoded, watched mirror of a key prefix (`keyspace`).

The allocator (`gazette.allocator`) is built on top: it reads members, items and assignments
from a `KeySpace` and writes assignments with `Etcd` transactions.
"""

from gazette.keyspace.etcd import Compare, Etcd, EtcdError
from gazette.keyspace.keyspace import KeySpace, KeyValue

__all__ = ["Compare", "Etcd", "EtcdError", "KeySpace", "KeyValue"]
