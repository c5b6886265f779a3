"""The SQLite store's exporter (`gazette.consumer.export`): a played database rebuilt from its
recorded page files, and a table's or a read-only query's rows read from it, with the
checkpoint committed in the same database (table ``gazette_checkpoint``).

The database is opened on SQLite's default VFS, not the recording one: it is the export's
private copy, where SQLite may roll back a hot journal or replay the WAL; nothing is recorded.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence, Set
from typing import Any

import apsw
import apsw.ext

from gazette.consumer.export import (
    ExportedRows,
    ExportRequest,
    PlayedFiles,
    StoreExportError,
    UnreadableStore,
)
from gazette.consumer.protocol import pb
from gazette.stores.sqlite.store import DB_NAME, rebuild_played

__all__ = ["EXPORTER", "SQLiteExporter"]


class SQLiteExporter:
    """Reads a played SQLite store (module docs)."""

    kind = "sqlite"
    description = "a SQLite database"

    def recognizes(self, names: Set[str]) -> bool:
        return any(n.startswith(DB_NAME) for n in names)

    def columns(self, played: PlayedFiles, request: ExportRequest) -> list[tuple[str, str]]:
        """The table's or query's columns: declared types by SQLite's affinity rules; for
        expressions, the first row's types."""
        conn = _open(played)
        try:
            sql = _select(request)
            try:
                info = apsw.ext.query_info(conn, sql)
            except apsw.SQLError as err:
                raise StoreExportError(f"{sql!r}: {err}") from err
            if not info.is_readonly:
                raise StoreExportError(f"query must only read: {request.query!r}")
            sample: tuple[Any, ...] | None = None
            if any(decl is None for _, decl in info.description or ()):
                for row in conn.execute(f"SELECT * FROM ({sql}) LIMIT 1"):
                    sample = tuple(row)
            out = []
            for i, (name, decl) in enumerate(info.description or ()):
                out.append((name, _column_type(decl, sample[i] if sample is not None else None)))
            return out
        finally:
            conn.close()

    @contextlib.contextmanager
    def rows(self, played: PlayedFiles, request: ExportRequest) -> Iterator[ExportedRows]:
        conn = _open(played)
        try:
            conn.execute("BEGIN")
            try:
                rows = list(conn.execute("SELECT checkpoint FROM gazette_checkpoint WHERE id = 0"))
            except apsw.SQLError as err:
                raise UnreadableStore(f"a SQLite database without a checkpoint: {err}") from err
            checkpoint = pb.Checkpoint.FromString(bytes(rows[0][0])) if rows else pb.Checkpoint()
            yield _Rows(conn, checkpoint, request)
        finally:
            conn.close()


EXPORTER = SQLiteExporter()


class _Rows:
    def __init__(self, conn: apsw.Connection, checkpoint: pb.Checkpoint, request: ExportRequest):
        self.checkpoint = checkpoint
        self._conn = conn
        self._request = request

    def __iter__(self) -> Iterator[Sequence[Any]]:
        cursor = self._conn.execute(_select(self._request))
        while True:
            chunk = list(itertools.islice(cursor, self._request.batch_size))
            if not chunk:
                break
            yield [list(col) for col in zip(*chunk, strict=True)]
        self._conn.execute("COMMIT")


def _open(played: PlayedFiles) -> apsw.Connection:
    """The played database, rebuilt from its page files."""
    rebuild_played(played.directory, dict(played.links))
    db = played.directory / DB_NAME
    if not db.exists():
        raise UnreadableStore(f"no {DB_NAME}")
    return apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READWRITE)


def _select(request: ExportRequest) -> str:
    return f'SELECT * FROM "{request.table}"' if request.table else request.query


def _column_type(decl: str | None, sample: Any) -> str:
    """A column's type in `gazette.consumer.export.COLUMN_TYPES`: by SQLite's affinity rules
    from its declared type, else (an expression) from a sample value."""
    if decl:
        d = decl.upper()
        if "INT" in d:
            return "integer"
        if "CHAR" in d or "CLOB" in d or "TEXT" in d:
            return "string"
        if "BLOB" in d:
            return "binary"
        if "REAL" in d or "FLOA" in d or "DOUB" in d:
            return "double"
        if "BOOL" in d:
            return "boolean"
        if "DATE" in d or "TIME" in d:
            return "string"
        return "double"  # NUMERIC affinity.
    if isinstance(sample, bool | int):
        return "integer"
    if isinstance(sample, float):
        return "double"
    if isinstance(sample, bytes):
        return "binary"
    return "string"
