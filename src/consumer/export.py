"""Store exporters: how a recorded store's played-back files are read as rows.

An export (the Spark ``gazette-shards`` source, `gazette.consumer.spark`) plays a shard's
recovery log into a private directory and reads the store it finds there, read-only, without
running the store. How a store lays out its files (where the checkpoint is, which keys are the
store's own, how a database is rebuilt from recorded page files) is the store's business, so
each store package implements a `StoreExporter` beside its `Store`, and the export finds it by
the store's *kind* (``rocksdb``, ``sqlite``, ``json``): an exporter depends on the store, the
export only on this interface, and nothing here imports ``gazette.stores``.

Registering: a package declares its exporters as entry points of group
`ENTRY_POINT_GROUP`, named by kind, each naming a `StoreExporter` object::

    [project.entry-points."gazette.store_exporters"]
    rocksdb = "gazette.stores.rocksdb.export:EXPORTER"

`exporter(kind)` loads it on first use (loading imports the store package, which fails with
one line naming its extra if that is not installed). `register` adds one in-process (tests,
an application's own store).

Rejected: the export importing each store's modules by name (the export then depends on
every store, which depend on the consumer: a package cycle), and a registry filled by the
stores' imports (someone must still import every store package, and the driver and tasks of
Spark are separate processes).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence, Set
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol

from gazette.consumer.protocol import pb

__all__ = [
    "COLUMN_TYPES",
    "ENTRY_POINT_GROUP",
    "ExportRequest",
    "ExportedRows",
    "PlayedFiles",
    "StoreExportError",
    "StoreExporter",
    "UnknownStoreKind",
    "UnreadableStore",
    "detect_kind",
    "exporter",
    "register",
]

ENTRY_POINT_GROUP = "gazette.store_exporters"
"""The entry-point group naming each store kind's `StoreExporter`."""

COLUMN_TYPES = frozenset({"integer", "double", "string", "binary", "boolean"})
"""The types `StoreExporter.columns` names (an export maps them onto its own)."""


class StoreExportError(Exception):
    """A played store cannot be exported as asked (a bad query, a failed read...). The
    message says why; the export adds the shard."""


class UnreadableStore(StoreExportError):
    """The played files are not a readable store of the exporter's kind; `found` describes
    what is there instead (e.g. "a SQLite database without a checkpoint: ...")."""

    def __init__(self, found: str) -> None:
        super().__init__(found)
        self.found = found


class UnknownStoreKind(LookupError):
    """No exporter of a store kind is registered (no installed package declares one)."""

    def __init__(self, kind: str) -> None:
        super().__init__(
            f"no exporter of store kind {kind!r} is installed: install the package of that "
            f"store (declaring entry point {kind!r} in group {ENTRY_POINT_GROUP!r}), or "
            "reinstall gazette-py if the kind is one of its own (rocksdb, sqlite, json)"
        )
        self.kind = kind


@dataclass(frozen=True)
class PlayedFiles:
    """A store's files played back from its recovery log."""

    shard: str
    """The shard whose log was played (for messages and logs)."""
    directory: Path
    """The played files: the store's directory, private to the export (it may be modified)."""
    links: Mapping[str, int] = field(default_factory=dict)
    """Recorded path -> Fnode of the played files (the played FSM's links)."""


@dataclass(frozen=True)
class ExportRequest:
    """What to read of a played store. Each field applies to the kinds that say so."""

    batch_size: int = 65536
    """Rows per batch, at most."""
    key_prefix: bytes = b""
    """Key-value stores: only the application keys beginning with it (kept in the keys)."""
    split: tuple[int, int] = (0, 1)
    """Key-value stores: (index, count): only the keys of range `index` of `count` ranges,
    the same ranges wherever the same snapshot is played."""
    table: str = ""
    """SQL stores: every row of this table (else `query`)."""
    query: str = ""
    """SQL stores: the rows of this read-only query."""
    options: Mapping[str, str] = field(default_factory=dict)
    """Options of one kind of store, by the export's option name (e.g. ``rocksdb_scan``)."""


class ExportedRows(Protocol):
    """An opened played store: its checkpoint, and its rows as batches of columns."""

    @property
    def checkpoint(self) -> pb.Checkpoint:
        """The Checkpoint committed together with the exported state (empty: none)."""
        ...

    def __iter__(self) -> Iterator[Sequence[Any]]:
        """Batches of rows, each a sequence of columns (``pyarrow.Array`` or list), in the
        kind's column order: key-value stores (key, value); SQL stores the selected columns;
        document stores one column, the document as a JSON string. Raises
        `StoreExportError` if reading fails (possibly after batches were yielded)."""
        ...


class StoreExporter(Protocol):
    """Reads the played-back files of one kind of recorded store (module docs).

    An exporter holds no state of a particular store: one object serves every export of its
    kind, from any thread. Its methods may modify the played directory (rebuild a database
    from recorded pages, let a database roll back a hot journal): it is the export's copy.
    """

    kind: str
    """The store kind it reads, as the export names it (``rocksdb``)."""
    description: str
    """The store as a message names it ("a RocksDB")."""

    def recognizes(self, names: Set[str]) -> bool:
        """Whether a played directory holding the files `names` (top-level names, not
        empty) is a store of this kind."""
        ...

    def columns(self, played: PlayedFiles, request: ExportRequest) -> list[tuple[str, str]]:
        """(name, type in `COLUMN_TYPES`) of the columns `rows` yields for `request`, read
        from the played store (for kinds whose columns depend on it, e.g. a SQL query's).
        Raises `StoreExportError` if it cannot tell."""
        ...

    def rows(
        self, played: PlayedFiles, request: ExportRequest
    ) -> AbstractContextManager[ExportedRows]:
        """Open the played store read-only for `request`; closed on exit. Raises
        `UnreadableStore` if the files are not such a store, `StoreExportError` if the
        request cannot be served."""
        ...


_registered: dict[str, StoreExporter] = {}


def register(exporter: StoreExporter) -> None:
    """Make `exporter` the exporter of its kind in this process (before entry points)."""
    _registered[exporter.kind] = exporter


def exporter(kind: str) -> StoreExporter:
    """The exporter of store `kind`: registered in-process, else the entry point of that name
    (loaded once). Raises `UnknownStoreKind` if there is none, and what loading raises
    (`gazette._extras.MissingExtra` naming the extra a store needs)."""
    found = _registered.get(kind)
    if found is not None:
        return found
    return _load(kind)


@functools.cache
def _load(kind: str) -> StoreExporter:
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=kind):
        loaded: StoreExporter = ep.load()
        return loaded
    raise UnknownStoreKind(kind)


def _kinds() -> list[str]:
    names = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names | set(_registered))


def detect_kind(names: Set[str], expected: str = "") -> str | None:
    """The kind of the store whose played directory holds the files `names` (not empty):
    `expected` if its exporter recognizes them, else the first other kind that does and whose
    exporter loads, else None."""
    kinds = _kinds()
    if expected:
        kinds = [expected] + [k for k in kinds if k != expected]
    for kind in kinds:
        try:
            found = exporter(kind)
        except (ImportError, UnknownStoreKind):
            if kind == expected:
                raise
            continue
        if found.recognizes(names):
            return kind
    return None
