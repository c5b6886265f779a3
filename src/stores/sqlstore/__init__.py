"""The SQL store: application rows and a fenced checkpoint row in a remote SQL database.

`SQLStore` implements the consumer Store contract over any DB-API 2.0 driver (tested with
psycopg 3 against PostgreSQL, and with sqlite3); `Fenced` is the error of a commit by an
instance whose shard was restored by a newer one since. `stores.sqlstore.testing` runs a
throwaway PostgreSQL server. Design: docs/consumer-stores.md.
"""

from gazette.stores.sqlstore.store import (
    CHECKPOINTS_TABLE,
    DIALECTS,
    Dialect,
    Fenced,
    SQLStore,
    detect_dialect,
    detect_placeholder,
)

__all__ = [
    "CHECKPOINTS_TABLE",
    "DIALECTS",
    "Dialect",
    "Fenced",
    "SQLStore",
    "detect_dialect",
    "detect_placeholder",
]
