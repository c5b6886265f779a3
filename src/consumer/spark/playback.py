"""Task side of the shards export: play a shard's recovery log into a private temporary
directory, open the store found there read-only, and turn it into Arrow record batches.

Playback only reads the log (and appends an empty barrier to learn its write head, as every
Player does): the live primary, its files and its log are untouched. The played directory is
the store as recorded through the log's write head at playback time, which is at or after the
hints' state; each row carries the Checkpoint committed together with that state (read from
the played store itself), so rows and checkpoint always agree.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from gazette.consumer.protocol import pb
from gazette.consumer.spark.errors import BrokersUnresponsive, ExportError, WrongStoreKind
from gazette.consumer.spark.resolve import ShardPlan
from gazette.recoverylog.hints import hints_from_json

if TYPE_CHECKING:
    from gazette.stores.rocksdb.scan import ScanStream

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
]

log = logging.getLogger(__name__)

T = TypeVar("T")

BASE_COLUMNS = ("shard", "checkpoint")
"""Columns every exported row begins with (then ``read_through`` if asked for)."""
READ_THROUGH_COLUMN = "read_through"

_SQLITE_DB = "primary.db"


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
) -> PlayedShard:
    """Play `plan`'s log from its hints into `directory` (through `end_offset` if given, else
    through the log's write head). `stall_timeout` > 0: raise `BrokersUnresponsive` once the
    playback has made no progress for that many seconds (no byte of the log read, nor of a
    fragment fetched from its store): the journal client retries unreachable brokers
    without end."""
    from gazette.broker.client import JournalClient
    from gazette.recoverylog.player import EXIT_AT_HEAD, Player

    t0 = time.monotonic()
    async with JournalClient(list(brokers)) as client:
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
) -> Iterator[PlayedShard]:
    """Play `plan`'s log from its hints into a new temporary directory (under `tmpdir`, or
    the system's), yield it, and remove it whatever happens. Plays through `end_offset` of
    the log if given (every split of a shard plays the same snapshot), else through its write
    head. Raises the Player's errors (`DataLoss` if the hinted log content is gone, ...), and
    `BrokersUnresponsive` after `stall_timeout` seconds without progress (`play`)."""
    base = Path(tempfile.mkdtemp(prefix="gazette-shard-export-", dir=tmpdir or None)).resolve()
    try:
        played = run_playback(play(plan, brokers, base / "store", end_offset, stall_timeout))
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


def detect_store(directory: Path) -> str:
    """The kind of store in played `directory`: ``rocksdb``, ``sqlite``, ``json``, ``empty``
    (nothing recorded yet), or a description of what is there."""
    names = {p.name for p in directory.iterdir()} if directory.exists() else set()
    if not names:
        return "empty"
    if "CURRENT" in names or "IDENTITY" in names or any(n.startswith("MANIFEST-") for n in names):
        return "rocksdb"
    if any(n.startswith(_SQLITE_DB) for n in names):
        return "sqlite"
    if "state.json" in names or "next.json" in names:
        return "json"
    return "unknown files (" + ", ".join(sorted(names)[:5]) + ")"


_KIND_NAMES = {"rocksdb": "a RocksDB", "sqlite": "a SQLite database", "json": "a JSON store"}


def check_store(played: PlayedShard, store: str) -> bool:
    """Whether the played directory holds a store of kind `store` (False: it is empty).
    Raises `WrongStoreKind` if it holds something else."""
    found = detect_store(played.directory)
    if found == "empty":
        return False
    if found != store:
        raise WrongStoreKind(played.plan.shard, store, _KIND_NAMES.get(found, found))
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

    def batch(self, columns: Sequence[pa.Array]) -> pa.RecordBatch:
        n = len(columns[0]) if columns else 0
        zeros = pa.nulls(n, pa.int32()).fill_null(0)
        base = [a.take(zeros) for a in self._base]
        return pa.RecordBatch.from_arrays(base + list(columns), schema=self.schema)

    def one_row(self, *values: Any) -> pa.RecordBatch:
        cols = [pa.array([v], f.type) for v, f in zip(values, self.rest, strict=True)]
        return self.batch(cols)


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

    `split` (index, count): only the keys of range `index` of `count` (`keyranges`), which
    are the same ranges wherever the same snapshot is played. `checkpoint_mode`: option
    ``checkpoint`` (as for `json_batches` and `sqlite_batches`). `scan`: option
    ``rocksdb_scan``: ``auto`` reads through the native scanner (`stores.rocksdb.scan`)
    when it is built and can open the database, else through rocksdict; ``native`` only
    through the scanner; ``rocksdict`` never through it."""
    from gazette.stores.rocksdb import scan as native
    from gazette.stores.rocksdb.store import CHECKPOINT_KEY

    if not check_store(played, "rocksdb"):
        return
    shard = played.plan.shard
    scanner = None if scan == "rocksdict" else native.find()
    if scanner is None and scan == "native":
        raise ExportError(
            f"shard {shard!r}: option rocksdb_scan=native, but {native.not_found_reason()}"
        )
    if scanner is None and scan == "auto":
        _note_no_scanner()
    strict = scan == "native"
    start = max(key_prefix, b"\x01")
    stop = _successor(key_prefix)
    count = split[1]
    raw_checkpoint: bytes | None = None
    if scanner is None or count > 1:
        # Split points need rocksdict (the SST files' metadata), which reads the checkpoint.
        raw_checkpoint, bounds = _open_for_export(played, start, stop, split)
        if bounds is None:
            return
        start, stop = bounds
    stream: native.ScanStream | None = None
    if scanner is not None:
        try:
            # With one split, the scanner reads the checkpoint first: one open of the database.
            stream = native.ScanStream(
                played.directory,
                start,
                stop,
                batch_rows=batch_size,
                get=CHECKPOINT_KEY if count == 1 else None,
                binary=scanner,
            )
        except native.ScanError as err:
            _scan_failed(shard, err, strict)
        if count == 1:
            if stream is not None:
                raw_checkpoint = stream.got
            else:
                raw_checkpoint, _ = _open_for_export(played, start, stop, split)
    try:
        checkpoint = pb.Checkpoint()
        if raw_checkpoint is not None:
            checkpoint.ParseFromString(raw_checkpoint)
        builder = _BatchBuilder(schema, shard, checkpoint, checkpoint_mode)
        cut = len(key_prefix)
        pairs: Iterator[tuple[pa.Array | list[bytes], pa.Array | list[bytes]]]
        if stream is not None:
            pairs = _scanned_pairs(played, stream, start, stop, batch_size, strict=strict)
        else:
            pairs = _rocksdict_pairs(played, start, stop, batch_size)
        for keys, values in pairs:
            if decoder is None:
                cols = [_as_array(keys), _as_array(values)]
            else:
                cols = _decode(shard, decoder, _as_list(keys), _as_list(values), cut, builder.rest)
            yield builder.batch(cols)
    finally:
        if stream is not None:
            stream.close()  # If it was not read to its end (an error, or a consumer stopped).


def _scan_failed(shard: str, err: Exception, strict: bool) -> None:
    """The native scanner could not read a shard: an `ExportError` if `strict`, else a
    warning (the caller reads through rocksdict)."""
    if strict:
        raise ExportError(f"shard {shard!r}: {err}") from err
    log.warning("shard=%s: reading through rocksdict: %s", shard, err)


_noted_no_scanner = False


def _note_no_scanner() -> None:
    """Logs once per process that RocksDB shards are read the slow way."""
    global _noted_no_scanner
    if not _noted_no_scanner:
        _noted_no_scanner = True
        log.info(
            "the native RocksDB scanner is not built: reading through rocksdict, ~3x slower "
            "(python -m gazette.stores.rocksdb.scan build)"
        )


def _as_array(items: pa.Array | list[bytes]) -> pa.Array:
    return items if isinstance(items, pa.Array) else pa.array(items, pa.binary())


def _as_list(items: pa.Array | list[bytes]) -> list[bytes]:
    return items.to_pylist() if isinstance(items, pa.Array) else items


def _open_for_export(
    played: PlayedShard, start: bytes, stop: bytes | None, split: tuple[int, int]
) -> tuple[bytes | None, tuple[bytes, bytes | None] | None]:
    """Through rocksdict: the store's checkpoint value, and the [start, stop) key range of
    `split` within [`start`, `stop`) (None: the split has no keys)."""
    from rocksdict import AccessType, Options, Rdict

    from gazette.consumer.spark.keyranges import range_of
    from gazette.stores.rocksdb.store import CHECKPOINT_KEY

    db = Rdict(str(played.directory), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        raw = db.get(CHECKPOINT_KEY)
        index, count = split
        if count > 1:
            points = _split_points(db, count, start, stop)
            lo, hi = range_of(points, index, start)
            log.info(
                "split shard=%s index=%d of=%d from=%r to=%r",
                played.plan.shard,
                index,
                count,
                lo,
                hi,
            )
            if lo == hi:
                return (None if raw is None else bytes(raw)), None
            if hi is not None:
                stop = hi if stop is None else min(stop, hi)
            start = lo
    finally:
        db.close()
    return (None if raw is None else bytes(raw)), (start, stop)


def _scanned_pairs(
    played: PlayedShard,
    stream: ScanStream,
    start: bytes,
    stop: bytes | None,
    batch_size: int,
    *,
    strict: bool,
) -> Iterator[tuple[pa.Array | list[bytes], pa.Array | list[bytes]]]:
    """[`start`, `stop`) from `stream` (a scan of that range); through rocksdict if the
    scanner fails before its first batch (unless `strict`)."""
    from gazette.stores.rocksdb import scan as native

    try:
        yield from stream
    except native.ScanUnavailable as err:
        _scan_failed(played.plan.shard, err, strict)
        yield from _rocksdict_pairs(played, start, stop, batch_size)
    except native.ScanError as err:
        raise ExportError(f"shard {played.plan.shard!r}: {err}") from err
    finally:
        stream.close()


def _rocksdict_pairs(
    played: PlayedShard, start: bytes, stop: bytes | None, batch_size: int
) -> Iterator[tuple[pa.Array | list[bytes], pa.Array | list[bytes]]]:
    """[`start`, `stop`) through rocksdict, as lists of keys and of values."""
    from rocksdict import AccessType, Options, Rdict

    db = Rdict(str(played.directory), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        items: Iterator[tuple[bytes, bytes]] = db.items(from_key=start)  # type: ignore[assignment]
        while True:
            # Two lists filled as the pairs come (not a list of the pairs, unzipped after):
            # a quarter less time per key, most of it not keeping a tuple per key alive.
            keys: list[bytes] = []
            values: list[bytes] = []
            add_key, add_value = keys.append, values.append
            for k, v in itertools.islice(items, batch_size):
                add_key(k)
                add_value(v)
            done = len(keys) < batch_size
            # Keys are ordered: those below `stop` come first.
            if stop is not None and keys and keys[-1] >= stop:
                n = bisect.bisect_left(keys, stop)
                del keys[n:], values[n:]
                done = True
            if keys:
                yield keys, values
            if done:
                break
        del items
    finally:
        db.close()


def _split_points(db: Any, count: int, lo: bytes, hi: bytes | None) -> list[bytes]:
    """`keyranges.split_points` of `db`'s SST files, cut to the first and last keys in
    [`lo`, `hi`) (no points if there are none)."""
    from gazette.consumer.spark.keyranges import clip, split_points, sst_files

    it = db.iter()
    try:
        it.seek(lo)
        if not it.valid():
            return []
        first = bytes(it.key())
        if hi is None:
            it.seek_to_last()
        else:
            it.seek_for_prev(hi)
            if it.valid() and bytes(it.key()) >= hi:
                it.prev()
        if not it.valid():
            return []
        last = bytes(it.key())
    finally:
        del it
    if last < first:
        return []
    return split_points(clip(sst_files(db.live_files()), first, last), count, lo, hi)


def _successor(prefix: bytes) -> bytes | None:
    """The least key greater than every key with `prefix` (None: there is none)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


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


def json_batches(
    played: PlayedShard, schema: pa.Schema, *, checkpoint_mode: str = "full"
) -> Iterator[pa.RecordBatch]:
    """One row: the state as a JSON string (no row for a store that never committed)."""
    from gazette.stores.jsonfile.store import STATE_FILE, decode_state_file

    if not check_store(played, "json"):
        return
    path = played.directory / STATE_FILE
    if not path.exists():
        return
    try:
        checkpoint, state = decode_state_file(path.read_bytes())
    except ValueError as err:
        raise WrongStoreKind(
            played.plan.shard, "json", f"an unreadable {STATE_FILE}: {err}"
        ) from err
    builder = _BatchBuilder(schema, played.plan.shard, checkpoint, checkpoint_mode)
    yield builder.one_row(json.dumps(state, separators=(",", ":"), sort_keys=True))


def _open_sqlite(played: PlayedShard) -> Any:
    """The played database, rebuilt from its page files, opened on the default VFS (a private
    copy: SQLite may roll back a hot journal or replay the WAL there; nothing is recorded)."""
    import apsw

    from gazette.stores.sqlite.store import rebuild_played

    rebuild_played(played.directory, played.links)
    db = played.directory / _SQLITE_DB
    if not db.exists():
        raise WrongStoreKind(played.plan.shard, "sqlite", f"no {_SQLITE_DB}")
    return apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READWRITE)


def _select(table: str, query: str) -> str:
    return f'SELECT * FROM "{table}"' if table else query


def sqlite_columns(played: PlayedShard, table: str, query: str) -> list[tuple[str, str]]:
    """(name, Spark SQL type) of the table's or query's columns in the played database:
    declared types by SQLite's affinity rules; for expressions, the first row's types."""
    import apsw
    import apsw.ext

    if not check_store(played, "sqlite"):
        raise ExportError(
            f"shard {played.plan.shard!r}: its store is empty, so the columns of "
            f"{table or query!r} cannot be inferred; give the schema option"
        )
    conn = _open_sqlite(played)
    try:
        sql = _select(table, query)
        try:
            info = apsw.ext.query_info(conn, sql)
        except apsw.SQLError as err:
            raise ExportError(f"shard {played.plan.shard!r}: {sql!r}: {err}") from err
        if not info.is_readonly:
            raise ExportError(f"query must only read: {query!r}")
        sample: tuple[Any, ...] | None = None
        if any(decl is None for _, decl in info.description or ()):
            for row in conn.execute(f"SELECT * FROM ({sql}) LIMIT 1"):
                sample = tuple(row)
        out = []
        for i, (name, decl) in enumerate(info.description or ()):
            out.append((name, _spark_type(decl, sample[i] if sample is not None else None)))
        return out
    finally:
        conn.close()


def _spark_type(decl: str | None, sample: Any) -> str:
    if decl:
        d = decl.upper()
        if "INT" in d:
            return "BIGINT"
        if "CHAR" in d or "CLOB" in d or "TEXT" in d:
            return "STRING"
        if "BLOB" in d:
            return "BINARY"
        if "REAL" in d or "FLOA" in d or "DOUB" in d:
            return "DOUBLE"
        if "BOOL" in d:
            return "BOOLEAN"
        if "DATE" in d or "TIME" in d:
            return "STRING"
        return "DOUBLE"  # NUMERIC affinity.
    if isinstance(sample, bool | int):
        return "BIGINT"
    if isinstance(sample, float):
        return "DOUBLE"
    if isinstance(sample, bytes):
        return "BINARY"
    return "STRING"


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
    import apsw

    if not check_store(played, "sqlite"):
        return
    conn = _open_sqlite(played)
    try:
        conn.execute("BEGIN")
        try:
            rows = list(conn.execute("SELECT checkpoint FROM gazette_checkpoint WHERE id = 0"))
        except apsw.SQLError as err:
            raise WrongStoreKind(
                played.plan.shard, "sqlite", f"a SQLite database without a checkpoint: {err}"
            ) from err
        checkpoint = pb.Checkpoint.FromString(bytes(rows[0][0])) if rows else pb.Checkpoint()
        builder = _BatchBuilder(schema, played.plan.shard, checkpoint, checkpoint_mode)
        fields = builder.rest
        cursor = conn.execute(_select(table, query))
        width = len(fields)
        while True:
            chunk = list(itertools.islice(cursor, batch_size))
            if not chunk:
                break
            if len(chunk[0]) != width:
                raise ExportError(
                    f"shard {played.plan.shard!r}: {len(chunk[0])} columns selected, the "
                    f"schema has {width}"
                )
            cols = []
            for i, f in enumerate(fields):
                values = [_convert(r[i], f.type) for r in chunk]
                try:
                    cols.append(pa.array(values, f.type))
                except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
                    raise ExportError(
                        f"shard {played.plan.shard!r}: column {f.name!r} ({f.type}): {err}"
                    ) from err
            yield builder.batch(cols)
        conn.execute("COMMIT")
    finally:
        conn.close()


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
