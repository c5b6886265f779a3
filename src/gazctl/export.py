"""``gazctl journals export`` and ``gazctl shards export``: Parquet files through Spark.

    gazctl journals export --to deltas.parquet -l app.gazette.dev/message-type=NGramDelta \\
        --schema 'ngram STRING, delta BIGINT'
    gazctl shards export --to counts.parquet --etcd 127.0.0.1:2379 --root /gazette/consumers/wc \\
        -l app=word-count --store rocksdb

Both are conveniences over the Spark data sources of `consumer.spark` (``gazette-journals``,
``gazette-shards``): they start a local Spark session (``--master``, default ``local[2]``; an
active session of the same process is reused, and left running), load the source with the
options given, and write the DataFrame as Parquet. Options the source rejects (no journals or
shards matched, bad selectors, missing hints, ...) fail before any job runs, as one
``gazctl: error:`` line. Progress (tasks done per stage) goes to stderr while the job runs.

``shards export`` checks before Spark starts (which takes seconds, tens of them on a busy
machine) what it can check alone: the options, that etcd answers within
`ETCD_CHECK_TIMEOUT`, and that the selected shards exist with hints of the kind asked for
(the source's own `resolve_shards`). A mistyped ``--etcd`` or shard then fails in a second
or two rather than after Spark's start and the source's etcd retries. The source resolves
the shards again when the query is planned (the check is no snapshot it could use: the
shards may change in between, and the source serves any Spark session).

Both reach the brokers as gazctl's other commands do: the TLS files of ``--cert-file``,
``--cert-key-file``, ``--trusted-ca-file`` and the token of ``--auth-token`` become the
source's ``broker_*`` options; ``--auth-keys`` goes through this process's
``BROKER_AUTH_KEYS``, which the source reads (keys are never an option: query plans show
options, `consumer.spark.broker_options`).

A ``local`` master keeps the session on loopback. Any other master gets a driver that
executors on other machines can reach back (`driver_address`), and ``--to`` may be a URI
(``hdfs://``, ``s3a://``): on a cluster the executors write the part files, so the output
must be a file system they and the driver share (docs/spark.md, *Running on a cluster*).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gazette.consumer.spec import ShardKeys
from gazette.gazctl.etcd_tls import add_etcd_tls_flags, etcd_tls_of
from gazette.gazctl.main import GazctlError, Streams
from gazette.keyspace.etcd import Etcd, EtcdError
from gazette.mainboilerplate.etcd_endpoints import InvalidEndpoint, parse_endpoints

__all__ = [
    "add_journals_export",
    "add_shards_export",
    "check_shards",
    "driver_address",
    "export_parquet",
    "journals_options",
    "shards_options",
    "spark_error_message",
]

DEFAULT_MASTER = "local[2]"

ETCD_CHECK_TIMEOUT = 2.0
"""Seconds ``shards export`` gives etcd to answer before Spark starts."""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--to", required=True, help="output Parquet path (a directory Spark writes)")
    p.add_argument(
        "--mode",
        choices=("error", "overwrite", "append"),
        default="error",
        help="if the output exists: fail (default), replace it, or add to it",
    )
    p.add_argument("--master", default=DEFAULT_MASTER, help="Spark master (default %(default)s)")
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark configuration property of the session, e.g. spark.executor.memory=1g "
        "(repeatable)",
    )
    p.add_argument(
        "-O",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra option of the data source (repeatable)",
    )
    p.add_argument(
        "--progress-interval", type=float, default=2.0, help="seconds between progress lines"
    )


def add_journals_export(cmds: Any, common: argparse.ArgumentParser) -> None:
    """Add ``journals export`` to the `cmds` subparsers."""
    help = "export journal messages to Parquet (through a local Spark session)"
    p: argparse.ArgumentParser = cmds.add_parser(
        "export", help=help, description=help, parents=[common]
    )
    p.add_argument("-l", "--selector", required=True, help="label selector of journals")
    p.add_argument(
        "--committed",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="only messages of committed transactions, once each (default); "
        "--no-committed: every message in journal order",
    )
    p.add_argument("--acks", action="store_true", help="keep transaction acknowledgements")
    p.add_argument("--message", default="", help="message type to decode into (module:Class)")
    p.add_argument("--schema", default="", help="DDL of the message columns")
    _common(p)
    p.set_defaults(handler=cmd_journals_export)


def add_shards_export(cmds: Any, common: argparse.ArgumentParser) -> None:
    """Add ``shards export`` to the `cmds` subparsers."""
    help = "export the state of consumer shards to Parquet (through a local Spark session)"
    p: argparse.ArgumentParser = cmds.add_parser(
        "export", help=help, description=help, parents=[common]
    )
    p.add_argument(
        "--etcd",
        default=os.environ.get("ETCD_ADDRESS", "127.0.0.1:2379"),
        help="etcd endpoints, comma-separated (env ETCD_ADDRESS; default %(default)s)",
    )
    add_etcd_tls_flags(p)
    p.add_argument("--root", required=True, help="the consumer application's etcd root")
    sel = p.add_mutually_exclusive_group(required=True)
    sel.add_argument("--shards", default="", help="comma-separated shard ids")
    sel.add_argument("-l", "--selector", default="", help="label selector of shards")
    p.add_argument("--hints", default="primary", help="primary (default) or backup.N")
    p.add_argument(
        "--store", required=True, choices=("rocksdb", "sqlite", "json"), help="the store kind"
    )
    p.add_argument("--table", default="", help="SQLite: the table to export")
    p.add_argument("--query", default="", help="SQLite: a query to export")
    p.add_argument("--decoder", default="", help="RocksDB: module:function decoding key, value")
    p.add_argument("--schema", default="", help="DDL of the decoded (or queried) columns")
    p.add_argument(
        "--checkpoint",
        default="",
        choices=("full", "offsets", "none"),
        help="what each row's checkpoint column holds: the serialized Checkpoint (full, the "
        "default), its read-through offsets only (offsets), or no such column (none)",
    )
    _common(p)
    p.set_defaults(handler=cmd_shards_export)


def _pairs(flag: str, items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise GazctlError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out


def _extra(args: argparse.Namespace) -> dict[str, str]:
    return _pairs("--option", args.option)


def journals_options(args: argparse.Namespace) -> dict[str, str]:
    """The gazette-journals options of a ``journals export`` command line."""
    opts = {
        "broker": args.broker,
        "selector": args.selector,
        "committed": "true" if args.committed else "false",
        "acks": "true" if args.acks else "false",
    }
    if args.zone:
        opts["zone"] = args.zone
    if args.message:
        opts["message"] = args.message
    if args.schema:
        opts["schema"] = args.schema
    return {**opts, **_broker_options(args), **_extra(args)}


def _broker_options(args: argparse.Namespace) -> dict[str, str]:
    """The broker client options of gazctl's broker flags (module docs)."""
    opts = {}
    for option, flag in (
        ("broker_cert_file", "cert_file"),
        ("broker_cert_key_file", "cert_key_file"),
        ("broker_trusted_ca_file", "trusted_ca_file"),
        ("broker_auth_token", "auth_token"),
    ):
        value = getattr(args, flag, None)
        if value:
            opts[option] = str(value)
    return opts


def _export_keys(args: argparse.Namespace) -> None:
    """Hand ``--auth-keys`` to the source (and Spark's workers) through the environment."""
    keys = getattr(args, "auth_keys", None)
    if keys:
        os.environ["BROKER_AUTH_KEYS"] = keys


def shards_options(args: argparse.Namespace) -> dict[str, str]:
    """The gazette-shards options of a ``shards export`` command line."""
    try:
        parse_endpoints(args.etcd)
    except InvalidEndpoint as err:
        raise GazctlError(f"--etcd: {err}") from err
    tls = etcd_tls_of(args)
    opts = {
        "etcd": args.etcd,
        "root": args.root,
        "broker": args.broker,
        "hints": args.hints,
        "store": args.store,
    }
    if args.shards:
        opts["shards"] = args.shards
    else:
        opts["selector"] = args.selector
    for name in ("table", "query", "decoder", "schema", "checkpoint"):
        if getattr(args, name):
            opts[name] = getattr(args, name)
    if tls is not None:
        for name, file in (
            ("etcd_cert_file", tls.cert_file),
            ("etcd_cert_key_file", tls.key_file),
            ("etcd_trusted_ca_file", tls.ca_file),
        ):
            if file is not None:
                opts[name] = str(file)
    return {**opts, **_broker_options(args), **_extra(args)}


async def cmd_journals_export(args: argparse.Namespace, io: Streams) -> int:
    opts = journals_options(args)
    _export_keys(args)
    await asyncio.to_thread(export_parquet, "gazette-journals", opts, args, io)
    return 0


async def check_shards(options: dict[str, str]) -> None:
    """Raise GazctlError if the gazette-shards `options` are invalid, etcd does not answer
    within `ETCD_CHECK_TIMEOUT`, or a selected shard is missing or lacks the hints asked for:
    what the source's planning would raise, without starting Spark."""
    try:
        from gazette.consumer.spark.errors import ExportError
        from gazette.consumer.spark.options import ShardsOptions
        from gazette.consumer.spark.resolve import resolve_shards
    except ImportError as err:
        raise GazctlError(f"the gazette-shards data source is not available: {err}") from None
    try:
        opts = ShardsOptions.parse(options)
    except ExportError as err:
        raise GazctlError(str(err)) from None
    try:
        async with Etcd(opts.etcd, timeout=ETCD_CHECK_TIMEOUT, tls=opts.etcd_tls) as etcd:
            await etcd.get_prefix(ShardKeys(opts.root).items.encode())
    except EtcdError as err:
        raise GazctlError(
            f"etcd does not answer ({err}): check --etcd (env ETCD_ADDRESS)"
        ) from None
    try:
        await resolve_shards(opts)
    except (ExportError, EtcdError) as err:
        raise GazctlError(str(err)) from None


async def cmd_shards_export(args: argparse.Namespace, io: Streams) -> int:
    opts = shards_options(args)
    _export_keys(args)
    await check_shards(opts)
    await asyncio.to_thread(export_parquet, "gazette-shards", opts, args, io)
    return 0


# --- Spark ----------------------------------------------------------------------------------

_ERROR_LINE = re.compile(
    r"^\s*(?:[\w.]+\.)?(JournalsSourceError|InvalidOption|ShardNotFound|NoShardsMatched|"
    r"MissingHints|WrongStoreKind|ExportError|UnknownFramingError|ValidationError|BrokerError|"
    r"JournalNotFound|\w+Error): (.*)$"
)


def spark_error_message(err: BaseException) -> str:
    """The line of a Spark exception that says what went wrong in our Python code (Spark wraps
    errors of data sources in a JVM exception whose text holds the Python traceback)."""
    text = str(err)
    found = ""
    for line in text.splitlines():
        m = _ERROR_LINE.match(line)
        if m and "Traceback" not in line and m.group(1) not in ("Py4JJavaError",):
            found = m.group(2).strip()
            if m.group(1) in ("JournalsSourceError", "InvalidOption", "ExportError") or (
                m.group(1) in ("ShardNotFound", "NoShardsMatched", "MissingHints", "WrongStoreKind")
            ):
                return _strip_sqlstate(found)
    if found:
        return _strip_sqlstate(found)
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return _strip_sqlstate(first)


def _strip_sqlstate(text: str) -> str:
    return re.sub(r"\s*SQLSTATE: \w+\)?\s*$", "", text).strip()


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith(("local[", "local-cluster["))


def driver_address(master: str) -> str:
    """The address of this machine that executors of cluster `master` reach it at: the one
    its traffic to the (first) master host leaves from (a UDP socket "connected" to it sends
    nothing; the kernel only picks the route and the source address). ``SPARK_LOCAL_IP``
    wins unless it is a loopback address (as set for one-machine sessions) and the master
    is not on loopback. A master that is not ``spark://host:port`` (YARN, Kubernetes) gives
    "", leaving the choice to Spark. Raises `GazctlError` if the master host has no route."""
    chosen = os.environ.get("SPARK_LOCAL_IP", "")
    if chosen and not _loopback(chosen):
        return chosen
    m = re.match(r"^spark://\[?([^\],/]+?)\]?:(\d+)", master)
    if m is None:
        return chosen
    host, port = m.group(1), int(m.group(2))
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return str(s.getsockname()[0])
    except OSError as err:
        raise GazctlError(f"--master {master}: no route to its host ({err})") from None


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def _session(master: str, conf: dict[str, str], io: Streams) -> tuple[Any, bool]:
    """(SparkSession, whether we started it)."""
    local = _is_local(master)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    # The active session is per thread; a running SparkContext means a session of this process
    # (e.g. a notebook's, or a test's) that getOrCreate returns and that we must leave running.
    running = SparkContext._active_spark_context is not None
    active = SparkSession.getActiveSession()
    if active is not None or running:
        return active or SparkSession.builder.getOrCreate(), False
    io.err(f"starting Spark ({master})")
    t0 = time.monotonic()
    builder = (
        SparkSession.builder.master(master)
        .appName("gazctl-export")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # Executors start their Python workers with this interpreter, at this path.
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
    )
    driver = "127.0.0.1" if local else driver_address(master)
    if driver:
        # Executors of a cluster connect back to the driver: it must not be on loopback.
        builder = builder.config("spark.driver.host", driver)
        builder = builder.config("spark.driver.bindAddress", driver)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    io.err(f"Spark started in {time.monotonic() - t0:.1f}s")
    return session, True


def _progress(spark: Any, io: Streams, interval: float, stop: threading.Event) -> None:
    tracker = spark.sparkContext.statusTracker()
    last = ""
    while not stop.wait(interval):
        parts = []
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                parts.append(
                    f"stage={sid} tasks_done={info.numCompletedTasks}/{info.numTasks} "
                    f"running={info.numActiveTasks}"
                )
        line = " ".join(parts)
        if line and line != last:
            io.err(f"export progress {line}")
            last = line


def _register(spark: Any, fmt: str) -> None:
    if fmt == "gazette-journals":
        from gazette.consumer.spark.journals_source import GazetteJournalsDataSource

        spark.dataSource.register(GazetteJournalsDataSource)
        return
    try:
        import gazette.consumer.spark as cs
    except ImportError as err:
        raise GazctlError(f"the {fmt} data source is not available: {err}") from None
    cs.register(spark)


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _parquet_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    files = [path] if path.is_file() else sorted(path.glob("*.parquet"))
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def export_parquet(
    fmt: str,
    options: dict[str, str],
    args: argparse.Namespace,
    io: Streams,
    *,
    transform: Callable[[Any], Any] | None = None,
) -> int:
    """Load data source `fmt` with `options` and write it as Parquet to ``args.to``; returns
    the number of rows written. Raises GazctlError for the source's and Spark's failures."""
    uri = bool(_URI.match(args.to))
    out = args.to if uri else str(Path(args.to).expanduser().resolve())
    if args.mode == "error" and not uri and Path(out).exists():
        raise GazctlError(f"{out} exists (use --mode overwrite to replace it)")
    spark, started = _session(args.master, _pairs("--conf", getattr(args, "conf", [])), io)
    try:
        from pyspark.errors import PySparkException

        _register(spark, fmt)
        t0 = time.monotonic()
        reader = spark.read.format(fmt)
        for k, v in options.items():
            reader = reader.option(k, v)
        try:
            df = reader.load()
        except PySparkException as err:
            raise GazctlError(f"{fmt}: {spark_error_message(err)}") from None
        if transform is not None:
            df = transform(df)
        parts = df.rdd.getNumPartitions()
        io.err(f"export {fmt}: {parts} partition(s), planned in {time.monotonic() - t0:.1f}s")
        stop = threading.Event()
        progress = threading.Thread(
            target=_progress, args=(spark, io, args.progress_interval, stop), daemon=True
        )
        progress.start()
        t1 = time.monotonic()
        try:
            df.write.mode(args.mode).parquet(out)
        except PySparkException as err:
            raise GazctlError(f"{fmt}: export failed: {spark_error_message(err)}") from None
        finally:
            stop.set()
            progress.join()
        # A URI names a file system Spark reaches and this process may not: Spark counts.
        rows = spark.read.parquet(out).count() if uri else _parquet_rows(Path(out))
        took = time.monotonic() - t1
        rate = rows / took if took > 0 else 0.0
        io.err(f"wrote {rows} rows to {out} in {took:.1f}s ({rate:,.0f} rows/s)")
        return rows
    finally:
        if started:
            spark.stop()
