"""The SQLite store: an embedded SQLite database (APSW) recorded through a VFS of its own.

`SQLiteStore` implements the consumer Store contract; `RecordingVFS` records the database's
files (main databases as page stores, journals and WALs as files) through a `RecorderBridge`
into a recovery-log `Recorder`. The design is in docs/sqlite-store.md.
"""

from gazette._extras import require

require("the SQLite store", "sqlite", "apsw")

from gazette.stores.sqlite.bridge import RecorderBridge
from gazette.stores.sqlite.pagestore import CorruptPageFile, PageStore, rebuild
from gazette.stores.sqlite.store import (
    DB_NAME,
    DEFAULT_PAGE_SIZE,
    JOURNAL_MODES,
    SQLiteStore,
    recover,
)
from gazette.stores.sqlite.vfs import RecordingVFS

__all__ = [
    "DB_NAME",
    "DEFAULT_PAGE_SIZE",
    "JOURNAL_MODES",
    "CorruptPageFile",
    "PageStore",
    "RecorderBridge",
    "RecordingVFS",
    "SQLiteStore",
    "rebuild",
    "recover",
]
