"""Spark export of Gazette data: PySpark (Spark 4) Python data sources.

- ``gazette-shards`` (`GazetteShardsDataSource`): the state of consumer shards (RocksDB,
  SQLite or JSON stores), played back from their recovery logs, one partition per shard;
- ``gazette-journals`` (`consumer.spark.journals_source`): messages of journals.

Call `register(spark)` once per SparkSession, then ``spark.read.format(...)``. See
docs/spark.md.
"""

from __future__ import annotations

from gazette._extras import require

require("the Spark export", "spark", "pyspark", "pyarrow")

from typing import Any

from gazette.consumer.spark.errors import (
    BrokersUnresponsive,
    ExportError,
    InvalidOption,
    MissingHints,
    NoShardsMatched,
    ShardNotFound,
    WrongStoreKind,
)
from gazette.consumer.spark.shards_source import GazetteShardsDataSource

__all__ = [
    "BrokersUnresponsive",
    "ExportError",
    "GazetteShardsDataSource",
    "InvalidOption",
    "MissingHints",
    "NoShardsMatched",
    "ShardNotFound",
    "WrongStoreKind",
    "register",
]


def register(spark: Any) -> None:
    """Register the ``gazette-shards`` and ``gazette-journals`` data sources with `spark`
    (a SparkSession). The journals source is registered if its module is present."""
    spark.dataSource.register(GazetteShardsDataSource)
    try:
        from gazette.consumer.spark.journals_source import GazetteJournalsDataSource
    except ImportError:
        return
    spark.dataSource.register(GazetteJournalsDataSource)
