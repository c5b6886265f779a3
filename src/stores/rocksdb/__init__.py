"""The RocksDB store: rocksdict on a fusefs mount, recorded into a recovery log
(docs/rocksdb-store.md)."""

from gazette._extras import require

require("the RocksDB store", "rocksdb", "rocksdict", "pyfuse3", "trio")

from gazette.stores.rocksdb.store import (
    CHECKPOINT_KEY,
    MAX_MANIFEST_FILE_SIZE,
    InvalidKey,
    RocksDBStore,
    recorded_options,
)

__all__ = [
    "CHECKPOINT_KEY",
    "MAX_MANIFEST_FILE_SIZE",
    "InvalidKey",
    "RocksDBStore",
    "recorded_options",
]
