"""A local[2] SparkSession for the export tests (session scoped: starting Spark takes seconds)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gazette.testing.broker import BrokerProcess


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("gazette-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    try:
        yield session
    finally:
        session.stop()


def pausable_broker(etcd_endpoint: str, spool: Path, name: str) -> BrokerProcess:
    """A broker of one test's own, under its own etcd root, with a lease that outlives a
    SIGSTOP of several seconds: pausing the shared test brokers (4 s leases) could expire
    their membership and fail later tests. Use it as a context manager."""
    return BrokerProcess(
        etcd_endpoint,
        root=f"/test-{name}/{os.getpid()}",
        spool_dir=spool,
        extra_args=["--lease-ttl", "60"],
    )
