"""``spark.read.format("gazette-shards")``: the state of consumer shards as a DataFrame.

The driver resolves the shards and their hints from etcd when the DataFrame is loaded
(`resolve_shards`: errors a user can fix are raised there, before any job) and again when a
query is planned (so each query plays from current hints), learning then each recovery log's
write head: the snapshot the query exports. A shard is one input partition, or for RocksDB
several (option ``splits``), each a key range of the same snapshot. Each task plays its
shard's recovery log from the hints through that offset into a temporary directory, opens the
store it finds read-only, yields Arrow record batches of its range and removes the directory:
the live primary is never touched. See docs/spark.md for the options and schemas.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from gazette.consumer.spark.errors import ExportError
from gazette.consumer.spark.options import ShardsOptions, load_decoder
from gazette.consumer.spark.playback import (
    BASE_COLUMNS,
    READ_THROUGH_COLUMN,
    json_batches,
    played_shard,
    rocksdb_batches,
    sqlite_batches,
    sqlite_columns,
)
from gazette.consumer.spark.resolve import ShardSplit, plan_splits_sync, resolve_shards_sync
from gazette.consumer.spark.shared_playback import shared_played_shard

__all__ = ["BASE_DDL", "GazetteShardsDataSource", "GazetteShardsReader", "ShardPartition"]

BASE_DDL = "shard STRING, checkpoint BINARY"
"""Columns every row begins with by default: the shard, and the serialized
``consumer.Checkpoint`` committed with the exported state (option ``checkpoint``)."""

READ_THROUGH_DDL = f"{READ_THROUGH_COLUMN} MAP<STRING, BIGINT>"
"""With option ``read_through=true``, next: the checkpoint's read-through offset of each
source journal."""


def base_ddl(opts: ShardsOptions) -> str:
    """The DDL of the columns every row of `opts`'s export begins with."""
    ddl = BASE_DDL if opts.checkpoint != "none" else "shard STRING"
    return f"{ddl}, {READ_THROUGH_DDL}" if opts.read_through else ddl


def base_columns(opts: ShardsOptions) -> tuple[str, ...]:
    base = BASE_COLUMNS if opts.checkpoint != "none" else BASE_COLUMNS[:1]
    return (*base, READ_THROUGH_COLUMN) if opts.read_through else base


_ROCKSDB_DDL = "key BINARY, value BINARY"
_JSON_DDL = "state STRING"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class ShardPartition(InputPartition):
    """One shard, or one key range of a shard, to export."""

    def __init__(self, split: ShardSplit) -> None:
        super().__init__(split)
        self.split = split


class GazetteShardsDataSource(DataSource):
    """The ``gazette-shards`` data source (module docs). Options are checked at once."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.opts = ShardsOptions.parse(dict(options))

    @classmethod
    def name(cls) -> str:
        return "gazette-shards"

    def schema(self) -> str:
        """The DDL of the rows. Resolves the shards (raising what `resolve_shards` raises);
        for SQLite without a ``schema`` option, plays the first shard to learn the columns."""
        opts = self.opts
        plans = resolve_shards_sync(opts)
        base = base_ddl(opts)
        if opts.store == "json":
            return f"{base}, {_JSON_DDL}"
        if opts.schema:
            return f"{base}, {opts.schema}"
        if opts.store == "rocksdb":
            return f"{base}, {_ROCKSDB_DDL}"
        with played_shard(
            plans[0],
            opts.brokers,
            opts.tmpdir,
            stall_timeout=opts.broker_timeout,
            client_settings=opts.broker_client,
        ) as played:
            columns = sqlite_columns(played, opts.table, opts.query)
        reserved = (*BASE_COLUMNS, READ_THROUGH_COLUMN)
        clash = [n for n, _ in columns if n.lower() in reserved]
        if clash:
            raise ExportError(f"selected columns {clash} clash with the columns {reserved}")
        return ", ".join([base] + [f"{_quote(n)} {t}" for n, t in columns])

    def reader(self, schema: StructType) -> GazetteShardsReader:
        names = [f.name for f in schema.fields]
        base = base_columns(self.opts)
        if tuple(names[: len(base)]) != base:
            raise ExportError(f"the schema must begin with {base_ddl(self.opts)} (got {names})")
        reserved = (*BASE_COLUMNS, READ_THROUGH_COLUMN)
        clash = [n for n in names[len(base) :] if n.lower() in reserved]
        if clash:
            raise ExportError(f"columns {clash} of the schema clash with the columns {reserved}")
        return GazetteShardsReader(self.opts, schema)


class GazetteShardsReader(DataSourceReader):
    """Plans the shards' splits and exports one per task."""

    def __init__(self, opts: ShardsOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        return [ShardPartition(split) for split in plan_splits_sync(self.opts)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, ShardPartition):
            return  # Spark's InputPartition(None) when there are no partitions.
        from pyspark.sql.pandas.types import to_arrow_schema

        opts = self.opts
        arrow = to_arrow_schema(self.schema, timezone="UTC")
        split = partition.split
        share = opts.store == "rocksdb" and opts.share_playback
        playing = shared_played_shard if share else played_shard
        with playing(
            split.plan,
            opts.brokers,
            opts.tmpdir,
            split.end_offset,
            opts.broker_timeout,
            client_settings=opts.broker_client,
        ) as played:
            if opts.store == "rocksdb":
                decoder = load_decoder(opts.decoder) if opts.decoder else None
                yield from rocksdb_batches(
                    played,
                    arrow,
                    key_prefix=opts.key_prefix,
                    decoder=decoder,
                    batch_size=opts.batch_size,
                    split=(split.index, split.count),
                    checkpoint_mode=opts.checkpoint,
                    scan=opts.rocksdb_scan,
                )
            elif opts.store == "sqlite":
                yield from sqlite_batches(
                    played,
                    arrow,
                    table=opts.table,
                    query=opts.query,
                    batch_size=opts.batch_size,
                    checkpoint_mode=opts.checkpoint,
                )
            else:
                yield from json_batches(played, arrow, checkpoint_mode=opts.checkpoint)
