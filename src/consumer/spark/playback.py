"""Task side of the shards export: play a shard's recovery log into a private temporary
directory, open the store found there read-only through its kind's exporter
(`gazette.consumer.export`: each store package provides one), and turn its rows into Arrow
record batches.

Playback only reads the log (and appends an empty barrier to learn its write head, as every
Player does): the live primary, its files and its log are untouched. The played directory is
the store as recorded through the log's write head at playback time, which is at or after the
hints' state; each row carries the Checkpoint committed together with that state (read from
the played store itself), so rows and checkpoint always agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from gazette.auth.client_settings import ClientSettings
from gazette.consumer.export import (
    ExportRequest,
    PlayedFiles,
    StoreExportError,
    UnknownStoreKind,
    UnreadableStore,
    detect_kind,
    exporter,
)
from gazette.consumer.protocol import pb
from gazette.consumer.spark.errors import BrokersUnresponsive, ExportError, WrongStoreKind
from gazette.consumer.spark.resolve import ShardPlan
from gazette.recoverylog.hints import hints_from_json

__all__ = [
    "BASE_COLUMNS",
    "LARGE_CHECKPOINT",
    "READ_THROUGH_COLUMN",
    "PlayedShard",
    "checkpoint_columns",
    "detect_store",
    "json_batches",
    "offsets_only",
    "play",
    "played_shard",
    "rocksdb_batches",
    "sqlite_batches",
    "sqlite_columns",
    "store_batches",
    "store_columns",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

BASE_COLUMNS = ("shard", "checkpoint")
"""Columns every exported row begins with (then ``read_through`` if asked for)."""
READ_THROUGH_COLUMN = "read_through"


@dataclass
class PlayedShard:
    """A shard's store played into `directory` (removed by `played_shard` afterwards)."""

    plan: ShardPlan
    directory: Path
    links: dict[str, int]
    """Recorded path -> Fnode of the played files."""
    write_head: int
    """Offset of the recovery log through which the store was played."""
    seconds: float


async def play(
    plan: ShardPlan,
    brokers: Sequence[str],
    directory: Path,
    end_offset: int,
    stall_timeout: float = 0.0,
    *,
    client_settings: ClientSettings | None = None,
) -> PlayedShard:
    """Play `plan`'s log from its hints into `directory` (through `end_offset` if given, else
    through the log's write head), reading from the brokers with the TLS and authorization
    of `client_settings` (None: none). `stall_timeout` > 0: raise `BrokersUnresponsive` once
    the playback has made no progress for that many seconds (no byte of the log read, nor of
    a fragment fetched from its store): the journal client retries unreachable brokers
    without end."""
    from gazette.broker.client import JournalClient
    from gazette.recoverylog.player import EXIT_AT_HEAD, Player

    t0 = time.monotonic()
    settings = client_settings or ClientSettings()
    tls, auth = settings.tls(), settings.authorizer()
    async with JournalClient(list(brokers), tls=tls, auth=auth) as client:
        hints = hints_from_json(plan.hints_json)
        player = Player(client, plan.log, hints, directory, end_offset=end_offset)
        playing = asyncio.ensure_future(player.play(until=EXIT_AT_HEAD))
        try:
            if stall_timeout > 0:
                await _watch(playing, lambda: player.bytes_read, plan, brokers, stall_timeout)
            fsm = await playing
        finally:
            if not playing.done():
                playing.cancel()
                # Its own error (if any) is a consequence of ours, which goes on.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await playing
        links = dict(fsm.links)
        head = player.write_head
    return PlayedShard(plan, directory, links, head, time.monotonic() - t0)


def run_playback(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, except that when it fails it does not wait for the threads of the
    loop's default executor: a fragment download abandoned by a stall (`play`) could hold it
    as long as the store takes to answer."""
    loop = asyncio.new_event_loop()
    ok = False
    try:
        out = loop.run_until_complete(coro)
        ok = True
        return out
    finally:
        try:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            if ok:
                loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()  # Shuts the default executor down without waiting.


async def _watch(
    playing: asyncio.Future[Any],
    read: Callable[[], int],
    plan: ShardPlan,
    brokers: Sequence[str],
    stall_timeout: float,
) -> None:
    """Returns once `playing` is done; raises `BrokersUnresponsive` if neither `read()` (the
    log bytes read) nor the client's traffic changes for `stall_timeout` seconds before
    that (`consumer.spark.stall`)."""
    from gazette.consumer.spark.stall import watch

    def stalled() -> Exception:
        return BrokersUnresponsive(
            f"shard {plan.shard!r}: playback of its recovery log {plan.log!r} made no "
            f"progress for {stall_timeout:g}s ({read()} bytes of it read before; "
            f"brokers {', '.join(brokers)}): are they and the fragment stores reachable? "
            "(option broker_timeout)"
        )

    await watch(playing, read, stall_timeout, stalled)


@contextlib.contextmanager
def played_shard(
    plan: ShardPlan,
    brokers: Sequence[str],
    tmpdir: str = "",
    end_offset: int = 0,
    stall_timeout: float = 0.0,
    *,
    client_settings: ClientSettings | None = None,
) -> Iterator[PlayedShard]:
    """Play `plan`'s log from its hints into a new temporary directory (under `tmpdir`, or
    the system's), yield it, and remove it whatever happens. Plays through `end_offset` of
    the log if given (every split of a shard plays the same snapshot), else through its write
    head. Raises the Player's errors (`DataLoss` if the hinted log content is gone, ...), and
    `BrokersUnresponsive` after `stall_timeout` seconds without progress (`play`, which
    `client_settings` go to)."""
    base = Path(tempfile.mkdtemp(prefix="gazette-shard-export-", dir=tmpdir or None)).resolve()
    try:
        played = run_playback(
            play(
                plan,
                brokers,
                base / "store",
                end_offset,
                stall_timeout,
                client_settings=client_settings,
            )
        )
        log.info(
            "played shard=%s log=%s write_head=%d files=%d seconds=%.2f",
            plan.shard,
            plan.log,
            played.write_head,
            len(played.links),
            played.seconds,
        )
        yield played
    finally:
        shutil.rmtree(base, ignore_errors=True)


def detect_store(directory: Path, expected: str = "") -> str:
    """The kind of store in played `directory` (`gazette.consumer.export.detect_kind`;
    `expected` is tried first), ``empty`` (nothing recorded yet), or a description of what
    is there."""
    names = {p.name for p in directory.iterdir()} if directory.exists() else set()
    if not names:
        return "empty"
    kind = detect_kind(names, expected)
    if kind is not None:
        return kind
    return "unknown files (" + ", ".join(sorted(names)[:5]) + ")"


def _description(kind: str) -> str:
    try:
        return exporter(kind).description
    except (ImportError, UnknownStoreKind):
        return kind


def check_store(played: PlayedShard, store: str) -> bool:
    """Whether the played directory holds a store of kind `store` (False: it is empty).
    Raises `WrongStoreKind` if it holds something else, `ExportError` if no exporter of
    `store` is installed."""
    try:
        found = detect_store(played.directory, store)
    except UnknownStoreKind as err:
        raise ExportError(str(err)) from err
    if found == "empty":
        return False
    if found != store:
        raise WrongStoreKind(played.plan.shard, store, _description(found))
    return True


def checkpoint_columns(checkpoint: pb.Checkpoint) -> tuple[bytes, list[tuple[str, int]]]:
    """The checkpoint (serialized) and its per-source read_through offsets."""
    read_through = sorted((j, int(s.read_through)) for j, s in checkpoint.sources.items())
    return checkpoint.SerializeToString(deterministic=True), read_through


def offsets_only(checkpoint: pb.Checkpoint) -> pb.Checkpoint:
    """A Checkpoint holding only `checkpoint`'s read-through offsets (option
    ``checkpoint=offsets``)."""
    out = pb.Checkpoint()
    for journal, source in checkpoint.sources.items():
        out.sources[journal].read_through = source.read_through
    return out


LARGE_CHECKPOINT = 4096
"""Bytes of a serialized checkpoint past which a ``checkpoint=full`` export logs a warning:
every row carries a copy (a million rows of a 4 KiB checkpoint are 4 GB for Spark)."""


class _BatchBuilder:
    """Builds record batches of `schema` whose base columns repeat one shard's values;
    `mode` is option ``checkpoint`` (``none``: `schema` has no checkpoint column)."""

    def __init__(
        self, schema: pa.Schema, shard: str, checkpoint: pb.Checkpoint, mode: str = "full"
    ) -> None:
        self.schema = schema
        if mode == "offsets":
            checkpoint = offsets_only(checkpoint)
        cp, read_through = checkpoint_columns(checkpoint)
        self._base = [pa.array([shard], schema.field("shard").type)]
        if mode != "none":
            if mode == "full" and len(cp) > LARGE_CHECKPOINT:
                log.warning(
                    "shard=%s: every row carries its %d-byte checkpoint; option "
                    "checkpoint=offsets keeps only its read-through offsets",
                    shard,
                    len(cp),
                )
            self._base.append(pa.array([cp], schema.field("checkpoint").type))
        if READ_THROUGH_COLUMN in schema.names[: len(self._base) + 1]:
            field = schema.field(READ_THROUGH_COLUMN)
            self._base.append(pa.array([read_through], field.type))
        self.rest = [schema.field(i) for i in range(len(self._base), len(schema))]
        self._repeated: tuple[int, list[pa.Array]] = (-1, [])

    def batch(self, columns: Sequence[pa.Array]) -> pa.RecordBatch:
        n = len(columns[0]) if columns else 0
        if self._repeated[0] != n:
            # Batches are mostly of one size: build the repeated base columns once for it
            # (rebuilding them cost the task ~0.05 s per million rows).
            zeros = pa.nulls(n, pa.int32()).fill_null(0)
            self._repeated = (n, [a.take(zeros) for a in self._base])
        return pa.RecordBatch.from_arrays(self._repeated[1] + list(columns), schema=self.schema)

    def one_row(self, *values: Any) -> pa.RecordBatch:
        cols = [pa.array([v], f.type) for v, f in zip(values, self.rest, strict=True)]
        return self.batch(cols)


def store_batches(
    played: PlayedShard,
    schema: pa.Schema,
    store: str,
    request: ExportRequest,
    *,
    decoder: Callable[[bytes, bytes], Mapping[str, Any]] | None = None,
    checkpoint_mode: str = "full",
) -> Iterator[pa.RecordBatch]:
    """The rows of the played store of kind `store`, read by its exporter
    (`gazette.consumer.export`) as `request` asks, each beginning with the base columns;
    none if the store is empty. `decoder` (key-value stores): the columns of each (key
    without `request.key_prefix`, value), instead of the key and value. `checkpoint_mode`:
    option ``checkpoint``. Raises `WrongStoreKind` if the played files are another store,
    `ExportError` if they cannot be read as asked."""
    if not check_store(played, store):
        return
    shard = played.plan.shard
    files = PlayedFiles(shard, played.directory, played.links)
    try:
        with exporter(store).rows(files, request) as opened:
            builder = _BatchBuilder(schema, shard, opened.checkpoint, checkpoint_mode)
            fields = builder.rest
            width = len(fields)
            cut = len(request.key_prefix)
            for columns in opened:
                if decoder is not None:
                    keys, values = columns
                    cols = _decode(shard, decoder, _as_list(keys), _as_list(values), cut, fields)
                else:
                    if len(columns) != width:
                        raise ExportError(
                            f"shard {shard!r}: {len(columns)} columns selected, the schema "
                            f"has {width}"
                        )
                    cols = [_as_array(shard, c, f) for c, f in zip(columns, fields, strict=True)]
                yield builder.batch(cols)
    except UnreadableStore as err:
        raise WrongStoreKind(shard, store, err.found) from err
    except StoreExportError as err:
        raise ExportError(f"shard {shard!r}: {err}") from err


def _as_array(shard: str, column: pa.Array | Sequence[Any], field: pa.Field) -> pa.Array:
    if isinstance(column, pa.Array) and column.type == field.type:
        return column
    values = column.to_pylist() if isinstance(column, pa.Array) else column
    if not pa.types.is_binary(field.type):
        values = [_convert(v, field.type) for v in values]
    try:
        return pa.array(values, field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise ExportError(f"shard {shard!r}: column {field.name!r} ({field.type}): {err}") from err


def _as_list(items: pa.Array | Sequence[Any]) -> list[Any]:
    return items.to_pylist() if isinstance(items, pa.Array) else list(items)


def _decode(
    shard: str,
    decoder: Callable[[bytes, bytes], Mapping[str, Any]],
    keys: list[bytes],
    values: list[bytes],
    cut: int,
    fields: Sequence[pa.Field],
) -> list[pa.Array]:
    names = [f.name for f in fields]
    out: list[list[Any]] = [[] for _ in names]
    for k, v in zip(keys, values, strict=True):
        row = decoder(k[cut:], v)
        for i, name in enumerate(names):
            out[i].append(row.get(name))
    try:
        return [pa.array(col, f.type) for col, f in zip(out, fields, strict=True)]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise ExportError(f"shard {shard!r}: decoded rows do not fit the schema: {err}") from err


def _convert(value: Any, typ: pa.DataType) -> Any:
    # SQLite is dynamically typed: a value may differ from its column's declared type.
    if value is None:
        return None
    if pa.types.is_string(typ) and not isinstance(value, str):
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    if pa.types.is_boolean(typ):
        return bool(value)
    if pa.types.is_floating(typ) and isinstance(value, int):
        return float(value)
    return value


def rocksdb_batches(
    played: PlayedShard,
    schema: pa.Schema,
    *,
    key_prefix: bytes = b"",
    decoder: Callable[[bytes, bytes], Mapping[str, Any]] | None = None,
    batch_size: int = 65536,
    split: tuple[int, int] = (0, 1),
    checkpoint_mode: str = "full",
    scan: str = "auto",
) -> Iterator[pa.RecordBatch]:
    """Application keys (not the store's 0x00 keys) under `key_prefix`, in key order, as
    (key, value) or as `decoder`'s columns (given the key without `key_prefix`).

    `split` (index, count): only the keys of range `index` of `count`, which are the same
    ranges wherever the same snapshot is played. `scan`: option ``rocksdb_scan``: ``auto``
    reads through the store's native scanner when it is built and can open the database, else
    through rocksdict; ``native`` only through the scanner; ``rocksdict`` never through it."""
    request = ExportRequest(
        batch_size=batch_size,
        key_prefix=key_prefix,
        split=split,
        options={"rocksdb_scan": scan},
    )
    return store_batches(
        played, schema, "rocksdb", request, decoder=decoder, checkpoint_mode=checkpoint_mode
    )


def json_batches(
    played: PlayedShard, schema: pa.Schema, *, checkpoint_mode: str = "full"
) -> Iterator[pa.RecordBatch]:
    """One row: the state as a JSON string (no row for a store that never committed)."""
    return store_batches(played, schema, "json", ExportRequest(), checkpoint_mode=checkpoint_mode)


_SPARK_TYPES = {
    "integer": "BIGINT",
    "double": "DOUBLE",
    "string": "STRING",
    "binary": "BINARY",
    "boolean": "BOOLEAN",
}


def store_columns(played: PlayedShard, store: str, request: ExportRequest) -> list[tuple[str, str]]:
    """(name, Spark SQL type) of the columns the played store's exporter yields for
    `request` (a SQL store's: its table's or query's)."""
    shard = played.plan.shard
    if not check_store(played, store):
        what = request.table or request.query
        raise ExportError(
            f"shard {shard!r}: its store is empty, so the columns of {what!r} cannot be "
            "inferred; give the schema option"
        )
    files = PlayedFiles(shard, played.directory, played.links)
    try:
        columns = exporter(store).columns(files, request)
    except UnreadableStore as err:
        raise WrongStoreKind(shard, store, err.found) from err
    except StoreExportError as err:
        raise ExportError(f"shard {shard!r}: {err}") from err
    return [(name, _SPARK_TYPES[typ]) for name, typ in columns]


def sqlite_columns(played: PlayedShard, table: str, query: str) -> list[tuple[str, str]]:
    """(name, Spark SQL type) of the table's or query's columns in the played database."""
    return store_columns(played, "sqlite", ExportRequest(table=table, query=query))


def sqlite_batches(
    played: PlayedShard,
    schema: pa.Schema,
    *,
    table: str,
    query: str,
    batch_size: int = 65536,
    checkpoint_mode: str = "full",
) -> Iterator[pa.RecordBatch]:
    """The table's or query's rows, with the checkpoint committed in the same database."""
    request = ExportRequest(batch_size=batch_size, table=table, query=query)
    return store_batches(played, schema, "sqlite", request, checkpoint_mode=checkpoint_mode)
