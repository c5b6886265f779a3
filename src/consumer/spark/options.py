"""Options of ``spark.read.format("gazette-shards")``, parsed and checked in one place.

Spark hands a data source its options as strings (keys case-insensitive); `ShardsOptions.parse`
turns them into a frozen value, raising `InvalidOption` for anything missing, unknown or
malformed, so that a typo fails on the driver at ``load()`` rather than in a task.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gazette.auth.client_settings import ClientSettings
from gazette.auth.tls import ClientTLS, TLSConfigError, TLSFlags
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.selector import parse_label_selector
from gazette.consumer.spark.broker_options import (
    BROKER_CLIENT_OPTIONS,
    BrokerOptionError,
    broker_client_options,
)
from gazette.consumer.spark.errors import InvalidOption

if TYPE_CHECKING:
    from gazette.broker.client import JournalClient
from gazette.consumer.spec import validate_shard_id

__all__ = [
    "CHECKPOINT_MODES",
    "DEFAULT_BROKER_TIMEOUT",
    "ROCKSDB_SCANS",
    "STORES",
    "ShardsOptions",
    "load_decoder",
]

STORES = ("rocksdb", "sqlite", "json")
CHECKPOINT_MODES = ("full", "offsets", "none")
"""Values of option ``checkpoint``: what each row's ``checkpoint`` column holds."""
ROCKSDB_SCANS = ("auto", "native", "rocksdict")
"""Values of option ``rocksdb_scan``: how a RocksDB shard's keys are read."""

_ETCD_TLS = TLSFlags("etcd_cert_file", "etcd_cert_key_file", "etcd_trusted_ca_file")
"""The options of the etcd connection's TLS files (gazctl's --etcd-cert-file ...)."""

_KNOWN = frozenset(
    {
        "etcd",
        _ETCD_TLS.cert,
        _ETCD_TLS.key,
        _ETCD_TLS.ca,
        "root",
        "checkpoint",
        "read_through",
        "broker",
        "shards",
        "selector",
        "hints",
        "store",
        "table",
        "query",
        "decoder",
        "schema",
        "key_prefix",
        "batch_size",
        "tmpdir",
        "splits",
        "share_playback",
        "rocksdb_scan",
        "broker_timeout",
        *BROKER_CLIENT_OPTIONS,
    }
)
_HINTS = re.compile(r"primary|backup\.(0|[1-9][0-9]{0,8})")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_DEFAULT_BATCH = 65536
DEFAULT_BROKER_TIMEOUT = 60.0
"""Seconds of option ``broker_timeout`` by default."""
_MAX_SPLITS = 1024


@dataclass(frozen=True)
class ShardsOptions:
    """Checked options (see docs/spark.md for each)."""

    etcd: str
    root: str
    brokers: tuple[str, ...]
    shards: tuple[str, ...]
    """Shard ids asked for by `shards` (empty: select by `selector`)."""
    selector: str
    """A label selector (``gazctl -l`` syntax, ``id`` included), "" with `shards`."""
    hints: str
    """``primary`` or ``backup.N``."""
    store: str
    table: str
    query: str
    decoder: str
    """``module:function`` decoding RocksDB (key, value) to a dict of columns, or ""."""
    schema: str
    """Spark DDL of the decoded (RocksDB) or selected (SQLite) columns, or ""."""
    key_prefix: bytes
    batch_size: int
    read_through: bool
    """Whether rows carry the checkpoint's read-through offsets as a map column (the
    serialized checkpoint is always there; a map per row costs Spark ~1 s per 1M rows)."""
    tmpdir: str
    splits: int
    """Input partitions per RocksDB shard (key ranges of one snapshot); 0: automatic."""
    share_playback: bool = True
    """RocksDB: whether the tasks of a host reading one snapshot play it once
    (`consumer.spark.shared_playback`) rather than each into a directory of its own."""
    checkpoint: str = "full"
    """What each row's ``checkpoint`` column holds: ``full``, the serialized Checkpoint;
    ``offsets``, a Checkpoint of the sources' read-through offsets only (no producer states
    nor ACK intents, whose size grows with the producers a shard has seen); ``none``, no
    such column."""
    broker_timeout: float = DEFAULT_BROKER_TIMEOUT
    """Seconds without an answer from the brokers after which planning fails, and without a
    byte of the log read after which a task's playback fails (`BrokersUnresponsive`); 0:
    wait for ever (the client retries an unreachable broker without end)."""
    rocksdb_scan: str = "auto"
    """How RocksDB keys are read: ``auto``, through the native scanner
    (`stores.rocksdb.scan`) when it is built and can open the database, else through
    rocksdict; ``native``, only through the scanner (an error otherwise); ``rocksdict``."""
    etcd_tls: ClientTLS | None = None
    """The TLS of the etcd connection (options ``etcd_cert_file``, ``etcd_cert_key_file``,
    ``etcd_trusted_ca_file``); None: TLS only to ``https://`` endpoints."""
    broker_client: ClientSettings = ClientSettings()
    """TLS and authorization of the broker client (options ``broker_cert_file``,
    ``broker_cert_key_file``, ``broker_trusted_ca_file``, ``broker_auth_token``, else the
    driver's ``BROKER_*`` environment: `consumer.spark.broker_options`)."""

    def journal_client(self) -> JournalClient:
        """A client of the brokers, with `broker_client`'s TLS and authorization."""
        from gazette.broker.client import JournalClient

        return JournalClient(
            list(self.brokers), tls=self.broker_client.tls(), auth=self.broker_client.authorizer()
        )

    @property
    def backup_index(self) -> int | None:
        """N of ``backup.N``, None for the primary hints."""
        return None if self.hints == "primary" else int(self.hints.split(".", 1)[1])

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> ShardsOptions:
        opts = {str(k).lower(): str(v) for k, v in raw.items()}
        unknown = sorted(set(opts) - _KNOWN)
        if unknown:
            raise InvalidOption(unknown[0], f"unknown option (known: {', '.join(sorted(_KNOWN))})")

        def required(name: str) -> str:
            value = opts.get(name, "").strip()
            if not value:
                raise InvalidOption(name, "required")
            return value

        etcd = required("etcd")
        etcd_tls = _etcd_tls(opts)
        root = required("root")
        if not root.startswith("/") or root.endswith("/"):
            raise InvalidOption("root", f"must be absolute, without a trailing '/' ({root!r})")
        brokers = tuple(b.strip() for b in required("broker").split(",") if b.strip())
        try:
            broker_client = broker_client_options(opts)
        except BrokerOptionError as err:
            raise InvalidOption(err.option, str(err)) from None

        shards: tuple[str, ...] = ()
        selector = opts.get("selector", "").strip()
        if "shards" in opts:
            if selector:
                raise InvalidOption("shards", "give either shards or selector, not both")
            shards = tuple(dict.fromkeys(s.strip() for s in opts["shards"].split(",") if s.strip()))
            if not shards:
                raise InvalidOption("shards", "no shard id given")
            for shard in shards:
                try:
                    validate_shard_id(shard)
                except ValidationError as err:
                    raise InvalidOption("shards", f"invalid shard id {shard!r}: {err}") from None
        elif selector:
            try:
                parse_label_selector(selector)
            except ValidationError as err:
                raise InvalidOption("selector", str(err)) from None
        else:
            raise InvalidOption("shards", "give shards (ids) or selector (labels)")

        hints = opts.get("hints", "primary").strip()
        if not _HINTS.fullmatch(hints):
            raise InvalidOption("hints", f"must be 'primary' or 'backup.N', not {hints!r}")

        store = required("store").lower()
        if store not in STORES:
            raise InvalidOption("store", f"must be one of {', '.join(STORES)}, not {store!r}")

        table = opts.get("table", "").strip()
        query = opts.get("query", "").strip()
        decoder = opts.get("decoder", "").strip()
        schema = opts.get("schema", "").strip()
        key_prefix = opts.get("key_prefix", "")
        if store != "sqlite" and (table or query):
            raise InvalidOption("table" if table else "query", "only for store=sqlite")
        if store != "rocksdb" and (decoder or key_prefix):
            raise InvalidOption("decoder" if decoder else "key_prefix", "only for store=rocksdb")
        if store == "json" and schema:
            raise InvalidOption("schema", "not for store=json (its state is one JSON column)")
        if store == "sqlite":
            if bool(table) == bool(query):
                raise InvalidOption("table", "store=sqlite needs exactly one of table or query")
            if table and not _IDENTIFIER.fullmatch(table):
                raise InvalidOption("table", f"not a plain SQL identifier: {table!r}")
        if store == "rocksdb" and bool(decoder) != bool(schema):
            raise InvalidOption(
                "decoder" if schema else "schema",
                "decoder and schema go together (schema: the DDL of the decoded columns)",
            )
        if decoder:
            load_decoder(decoder)  # Fails on the driver, not in every task.

        try:
            batch_size = int(opts.get("batch_size", str(_DEFAULT_BATCH)))
        except ValueError:
            raise InvalidOption("batch_size", "not an integer") from None
        if batch_size <= 0:
            raise InvalidOption("batch_size", f"must be > 0 ({batch_size})")

        read_through = _boolean(opts, "read_through", "false")
        checkpoint = opts.get("checkpoint", "full").strip().lower()
        if checkpoint not in CHECKPOINT_MODES:
            raise InvalidOption(
                "checkpoint", f"must be one of {', '.join(CHECKPOINT_MODES)}, not {checkpoint!r}"
            )
        share_playback = _boolean(opts, "share_playback", "true")
        raw_timeout = opts.get("broker_timeout", str(DEFAULT_BROKER_TIMEOUT)).strip()
        try:
            broker_timeout = float(raw_timeout)
        except ValueError:
            raise InvalidOption(
                "broker_timeout", f"not a number of seconds: {raw_timeout!r}"
            ) from None
        if not 0 <= broker_timeout < float("inf"):
            raise InvalidOption(
                "broker_timeout",
                f"must be a finite number of seconds >= 0 (0: none), not {raw_timeout}",
            )
        rocksdb_scan = opts.get("rocksdb_scan", "auto").strip().lower()
        if rocksdb_scan not in ROCKSDB_SCANS:
            raise InvalidOption(
                "rocksdb_scan", f"must be one of {', '.join(ROCKSDB_SCANS)}, not {rocksdb_scan!r}"
            )
        if "rocksdb_scan" in opts and store != "rocksdb":
            raise InvalidOption("rocksdb_scan", "only for store=rocksdb shards")

        raw_splits = opts.get("splits", "auto").strip().lower()
        if raw_splits == "auto":
            splits = 0
        else:
            try:
                splits = int(raw_splits)
            except ValueError:
                raise InvalidOption("splits", f"'auto' or a number, not {raw_splits!r}") from None
            if not 1 <= splits <= _MAX_SPLITS:
                raise InvalidOption("splits", f"must be within 1..{_MAX_SPLITS} ({splits})")
            if splits > 1 and store != "rocksdb":
                raise InvalidOption("splits", "only store=rocksdb shards are split (by key range)")

        return cls(
            etcd=etcd,
            root=root,
            brokers=brokers,
            shards=shards,
            selector=selector,
            hints=hints,
            store=store,
            table=table,
            query=query,
            decoder=decoder,
            schema=schema,
            key_prefix=key_prefix.encode(),
            batch_size=batch_size,
            read_through=read_through,
            tmpdir=opts.get("tmpdir", "").strip(),
            splits=splits,
            share_playback=share_playback,
            checkpoint=checkpoint,
            rocksdb_scan=rocksdb_scan,
            broker_timeout=broker_timeout,
            etcd_tls=etcd_tls,
            broker_client=broker_client,
        )


def _etcd_tls(opts: Mapping[str, str]) -> ClientTLS | None:
    """The etcd TLS of the options, its files checked (`InvalidOption` naming the option)."""
    names = (_ETCD_TLS.cert, _ETCD_TLS.key, _ETCD_TLS.ca)
    cert, key, ca = (opts.get(name, "").strip() or None for name in names)
    if cert is None and key is None and ca is None:
        return None
    tls = ClientTLS(ca, cert, key, flags=_ETCD_TLS)
    try:
        tls.check()
    except TLSConfigError as err:
        # The message begins with the option it is about.
        option = next(name for name in names if str(err).startswith(f"{name} "))
        raise InvalidOption(option, str(err).removeprefix(option).strip()) from None
    return tls


def _boolean(opts: Mapping[str, str], name: str, default: str) -> bool:
    value = opts.get(name, default).strip().lower()
    if value not in ("true", "false"):
        raise InvalidOption(name, f"must be true or false, not {value!r}")
    return value == "true"


def load_decoder(spec: str) -> Callable[[bytes, bytes], Mapping[str, Any]]:
    """The function named ``module:function`` (`InvalidOption` if it cannot be imported)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise InvalidOption("decoder", f"expected 'module:function', not {spec!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise InvalidOption("decoder", f"cannot load {spec!r}: {err}") from None
    if not callable(fn):
        raise InvalidOption("decoder", f"{spec!r} is not callable")
    out: Callable[[bytes, bytes], Mapping[str, Any]] = fn
    return out
