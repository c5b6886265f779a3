"""The ``gazette-journals`` Spark data source: messages of journals as a DataFrame.

    spark.read.format("gazette-journals")
        .option("broker", "127.0.0.1:8080")
        .option("selector", "app.gazette.dev/message-type=NGramDelta")
        .option("schema", "ngram STRING, delta BIGINT")
        .load()

The driver lists the journals matching ``selector`` and reads each one's write head while the
query is planned, before any job runs; each journal is one input partition, read from offset
0 up to that head, so the job ends even while producers keep appending. Executors decode
frames with the journal's framing (its ``content-type`` label) and, with ``committed`` true
(the default), feed them through a `Sequencer` as `ReadCommittedIter` does: only messages of
committed transactions, once each, in commit order.

Options (all strings):

- ``broker``: broker endpoint(s), comma-separated (required).
- ``selector``: label selector of the journals, as ``gazctl -l`` takes it (required).
- ``committed``: ``true`` (default) or ``false`` (every message in journal order: duplicates,
  rolled-back transactions and acknowledgements included, as `ReadUncommittedIter`).
- ``acks``: ``false`` (default) leaves out transaction acknowledgements (ACK_TXN messages, which
  carry no data of their own); ``true`` keeps every message the reader returns.
- ``message``: ``module:Class``, the message type to decode into (a `JSONMessage`/`CSVMessage`
  dataclass, or a generated protobuf class, wrapped in `ProtoMessage`). Columns are the
  message's attributes of the same names. Without it, JSON lines decode into a document,
  CSV records into their fields, and other framings into the raw frame payload. A column
  ``message_X`` takes the message's ``X`` when there is no ``message_X``: the way to export
  fields named like the envelope columns (a dataclass's defaults do so by themselves).
- ``schema``: DDL of the message columns (e.g. ``ngram STRING, delta BIGINT``). Defaults: a
  dataclass ``message``'s fields; ``doc STRING`` (the JSON text) for JSON lines; ``fields
  ARRAY<STRING>`` for CSV; ``payload BINARY`` otherwise. With JSON and no ``message``, columns
  are the document's top-level keys; with CSV, the record's fields in order.
- ``end``: ``head`` (the only value): read to each journal's write head at planning time.
- ``zone``: the client's zone, to prefer same-zone brokers.
- ``batch_rows``: rows per Arrow batch (default 8192).
- ``broker_timeout``: seconds planning may wait for the brokers' answers, and a task's read
  may make no progress (no byte read from the brokers or fetched from fragment stores),
  before either fails with `JournalsSourceError` (default 60; ``0``: wait for ever, as the
  client retries unreachable brokers without end).
- ``broker_cert_file``, ``broker_cert_key_file``, ``broker_trusted_ca_file``,
  ``broker_auth_token``: TLS and authorization of the broker client, else the driver's
  ``BROKER_*`` environment (`consumer.spark.broker_options`).

Every row has the columns ``journal STRING, begin BIGINT, end BIGINT, uuid STRING,
producer STRING, clock BIGINT, flags INT`` (the message's journal byte range and its UUID
decoded: producer as 12 hex digits, the 60-bit clock, the 10 flag bits; null without a UUID)
followed by the message columns. Bad options, no matching journal, journals of an unknown or
mixed framing raise `JournalsSourceError` from planning (Spark wraps it in an
AnalysisException) before any job runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import importlib
import typing
import uuid as _uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc.aio
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from gazette.auth.client_settings import ClientSettings
from gazette.broker.client import BrokerError, JournalClient, list_all_journals
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.labels import value_of
from gazette.broker.protocol.selector import parse_label_selector
from gazette.consumer.spark.broker_options import (
    BROKER_CLIENT_OPTIONS,
    BrokerOptionError,
    broker_client_options,
)
from gazette.consumer.spark.errors import ExportError
from gazette.consumer.spark.options import DEFAULT_BROKER_TIMEOUT
from gazette.message.envelope import Envelope
from gazette.message.framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_LABEL,
    UnknownFramingError,
    framing_for,
)
from gazette.message.framing_json import encode_json
from gazette.message.iterators import ReadCommittedIter, ReadUncommittedIter
from gazette.message.uuid import Flags

__all__ = [
    "GazetteJournalsDataSource",
    "JournalsSourceError",
    "JournalsOptions",
    "JournalPlan",
    "META_COLUMNS",
    "resolve_journals",
    "envelope_meta",
]

META_COLUMNS = (
    "journal STRING, begin BIGINT, end BIGINT, uuid STRING, producer STRING, clock BIGINT, "
    "flags INT"
)
"""DDL of the columns every row starts with."""
_META_NAMES = ("journal", "begin", "end", "uuid", "producer", "clock", "flags")
_PREFIX = "message_"
_NODE_MASK = (1 << 48) - 1
_ACK = int(Flags.ACK_TXN)
_KNOWN_OPTIONS = frozenset(
    {
        "broker",
        "selector",
        "committed",
        "acks",
        "message",
        "schema",
        "end",
        "zone",
        "batch_rows",
        "broker_timeout",
        *BROKER_CLIENT_OPTIONS,
    }
)


class JournalsSourceError(ExportError, ValueError):
    """Bad options of the gazette-journals source, or journals it can't read."""


def _bool_option(options: dict[str, str], name: str, default: bool) -> bool:
    text = options.get(name)
    if text is None or text == "":
        return default
    low = text.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise JournalsSourceError(f"option {name}={text!r}: expected true or false")


@dataclass(frozen=True)
class JournalsOptions:
    """The source's options, validated (see the module doc)."""

    brokers: tuple[str, ...]
    selector: str
    committed: bool = True
    acks: bool = False
    message: str = ""
    schema: str = ""
    zone: str = ""
    batch_rows: int = 8192
    broker_timeout: float = DEFAULT_BROKER_TIMEOUT
    """Seconds a task's read may make no progress (no message, no byte read or fetched)
    before it fails; 0: wait for ever (the client retries unreachable brokers without end)."""
    broker_client: ClientSettings = ClientSettings()
    """TLS and authorization of the broker client (`consumer.spark.broker_options`)."""

    def journal_client(self) -> JournalClient:
        """A client of the brokers, with `broker_client`'s TLS and authorization."""
        return JournalClient(
            list(self.brokers),
            zone=self.zone,
            tls=self.broker_client.tls(),
            auth=self.broker_client.authorizer(),
        )

    @classmethod
    def parse(cls, options: typing.Mapping[str, str]) -> JournalsOptions:
        """Validate `options` (case-insensitive keys); raises JournalsSourceError."""
        opts = {k.lower(): str(v) for k, v in options.items() if k.lower() != "path"}
        unknown = sorted(set(opts) - _KNOWN_OPTIONS)
        if unknown:
            known = ", ".join(sorted(_KNOWN_OPTIONS))
            raise JournalsSourceError(f"unknown option(s) {', '.join(unknown)} (known: {known})")
        brokers = tuple(b.strip() for b in opts.get("broker", "").split(",") if b.strip())
        if not brokers:
            raise JournalsSourceError("option broker is required (e.g. 127.0.0.1:8080)")
        selector = opts.get("selector", "").strip()
        if not selector:
            raise JournalsSourceError(
                "option selector is required (e.g. name:prefix=examples/ or app=clicks)"
            )
        try:
            parse_label_selector(selector)
        except Exception as err:
            raise JournalsSourceError(f"option selector={selector!r}: {err}") from None
        end = opts.get("end", "head").strip().lower()
        if end != "head":
            raise JournalsSourceError(f"option end={end!r}: only 'head' is supported")
        try:
            batch_rows = int(opts.get("batch_rows", "8192"))
        except ValueError:
            batch_rows = 0
        if batch_rows < 1:
            raise JournalsSourceError(
                f"option batch_rows={opts.get('batch_rows')!r}: expected a positive integer"
            )
        raw_timeout = opts.get("broker_timeout", str(DEFAULT_BROKER_TIMEOUT)).strip()
        try:
            broker_timeout = float(raw_timeout)
        except ValueError:
            broker_timeout = -1.0
        if not 0 <= broker_timeout < float("inf"):
            raise JournalsSourceError(
                f"option broker_timeout={raw_timeout!r}: expected a finite number of seconds "
                ">= 0 (0: none)"
            )
        message = opts.get("message", "").strip()
        if message:
            load_message_class(message)  # Fails here, on the driver, if it can't be imported.
        try:
            broker_client = broker_client_options(opts)
        except BrokerOptionError as err:
            raise JournalsSourceError(f"option {err.option}: {err}") from None
        return cls(
            brokers=brokers,
            selector=selector,
            committed=_bool_option(opts, "committed", True),
            acks=_bool_option(opts, "acks", False),
            message=message,
            schema=opts.get("schema", "").strip(),
            zone=opts.get("zone", "").strip(),
            batch_rows=batch_rows,
            broker_timeout=broker_timeout,
            broker_client=broker_client,
        )


def load_message_class(ref: str) -> type:
    """The class named by ``module:Class`` (``module.Class`` is accepted too)."""
    mod_name, sep, attr = ref.partition(":")
    if not sep:
        mod_name, _, attr = ref.rpartition(".")
    if not mod_name or not attr:
        raise JournalsSourceError(f"option message={ref!r}: expected module:Class")
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as err:
        raise JournalsSourceError(f"option message={ref!r}: {err}") from None
    if not isinstance(obj, type):
        raise JournalsSourceError(f"option message={ref!r} is not a class")
    return obj


# --- Messages of no declared type ---------------------------------------------------------


class _JSONDoc:
    """A JSON-lines message decoded into its document; its UUID under the key "uuid"."""

    __slots__ = ("doc", "_uuid")

    def __init__(self) -> None:
        self.doc: dict[str, Any] = {}
        self._uuid: _uuid.UUID | None | bool = False  # False: not parsed yet.

    def load_json(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self._uuid = False

    def get_uuid(self) -> _uuid.UUID | None:
        u = self._uuid
        if u is False:
            u = None
            text = self.doc.get("uuid")
            if isinstance(text, str) and text:
                try:
                    u = _uuid.UUID(text)
                except ValueError:
                    pass
            self._uuid = u  # Parsed once: the Sequencer and the row both need it.
        assert u is not True
        return u


class _CSVRecord:
    """A CSV record: its UUID (first column) and the fields after it."""

    __slots__ = ("uuid", "fields")

    def __init__(self) -> None:
        self.uuid: _uuid.UUID | None = None
        self.fields: list[str] = []

    def set_uuid(self, uuid: _uuid.UUID) -> None:
        self.uuid = uuid

    def get_uuid(self) -> _uuid.UUID | None:
        return self.uuid

    def load_csv_row(self, row: list[str]) -> None:
        self.fields = row


class _RawPayload:
    """A frame's payload, undecoded (its UUID, if any, is unknown to us)."""

    __slots__ = ("payload",)

    def __init__(self) -> None:
        self.payload = b""

    def ParseFromString(self, data: bytes) -> None:  # noqa: N802 -- the fixed framing's name
        self.payload = bytes(data)

    def get_uuid(self) -> _uuid.UUID | None:
        return None


# --- Planning (driver) ----------------------------------------------------------------------


@dataclass(frozen=True)
class JournalPlan:
    """One journal to read: an input partition. `spec` is the serialized JournalSpec."""

    journal: str
    spec: bytes
    content_type: str
    end: int


async def _write_head(client: JournalClient, journal: str) -> int:
    """The journal's write head, from a non-blocking metadata read at offset -1."""
    req = pb.ReadRequest(journal=journal, offset=-1, block=False, metadata_only=True)
    call = client.stub_for(journal, primary=False).Read(req)
    try:
        async for resp in call:
            if resp.status not in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
                raise JournalsSourceError(
                    f"reading the write head of journal {journal}: {pb.Status.Name(resp.status)}"
                )
            client.update_route(journal, resp.header if resp.HasField("header") else None)
            return int(resp.write_head)
    finally:
        call.cancel()
    raise JournalsSourceError(f"reading the write head of journal {journal}: no response")


async def resolve_journals_async(opts: JournalsOptions) -> list[JournalPlan]:
    """The journals `opts` selects, with their framings and write heads (sorted by name).

    Raises JournalsSourceError if none matches or a journal has no known framing.
    """
    async with opts.journal_client() as client:
        journals = await list_all_journals(client, parse_label_selector(opts.selector))
        if not journals:
            raise JournalsSourceError(
                f"no journals match selector {opts.selector!r} (broker {opts.brokers[0]})"
            )
        plans = []
        for j in sorted(journals, key=lambda j: j.spec.name):
            spec = j.spec
            content_type = value_of(spec.labels, CONTENT_TYPE_LABEL)
            if not content_type:
                raise JournalsSourceError(
                    f"journal {spec.name} has no {CONTENT_TYPE_LABEL!r} label naming its framing"
                )
            try:
                framing_for(content_type)
            except UnknownFramingError as err:
                raise JournalsSourceError(f"journal {spec.name}: {err}") from None
            end = await _write_head(client, spec.name)
            plans.append(JournalPlan(spec.name, spec.SerializeToString(), content_type, end))
        return plans


def resolve_journals(opts: JournalsOptions) -> list[JournalPlan]:
    """`resolve_journals_async` run on a new event loop (Spark calls us synchronously).
    Broker failures are raised as JournalsSourceError, in one line."""
    from gazette.consumer.spark.stall import within

    def late() -> Exception:
        return JournalsSourceError(
            f"listing journals of selector {opts.selector!r}: no answer from broker(s) "
            f"{','.join(opts.brokers)} within {opts.broker_timeout:g}s: are they reachable? "
            "(options broker, broker_timeout)"
        )

    try:
        return asyncio.run(within(resolve_journals_async(opts), opts.broker_timeout, late))
    except grpc.aio.AioRpcError as err:
        raise JournalsSourceError(
            f"listing journals of selector {opts.selector!r} at broker(s) "
            f"{','.join(opts.brokers)} failed: {err.code().name}: {err.details()}"
        ) from None
    except BrokerError as err:
        raise JournalsSourceError(
            f"listing journals of selector {opts.selector!r} failed: {err}"
        ) from None


_SIMPLE_DDL = {str: "STRING", int: "BIGINT", float: "DOUBLE", bool: "BOOLEAN", bytes: "BINARY"}


def _dataclass_ddl(cls: type) -> str:
    from gazette.message._dataclass_message import field_types, optional_of

    cols = []
    for f, tp in field_types(cls):
        if f.name == getattr(cls, "uuid_field", "uuid"):
            continue
        inner = optional_of(tp) or tp
        if isinstance(inner, type) and issubclass(inner, enum.Enum):
            ddl = "STRING"
        else:
            ddl = _SIMPLE_DDL.get(inner, "STRING")  # Anything else: as JSON text.
        name = f"message_{f.name}" if f.name in _META_NAMES else f.name
        cols.append(f"`{name}` {ddl}")
    return ", ".join(cols)


def message_ddl(opts: JournalsOptions, content_type: str) -> str:
    """DDL of the message columns (`schema`, or the default for the framing / message)."""
    if opts.schema:
        return opts.schema
    if opts.message:
        cls = load_message_class(opts.message)
        if dataclasses.is_dataclass(cls):
            return _dataclass_ddl(cls)
        raise JournalsSourceError(
            f"option message={opts.message!r} is not a dataclass: give the columns in option schema"
        )
    if content_type == CONTENT_TYPE_JSON_LINES:
        return "doc STRING"
    if content_type == CONTENT_TYPE_CSV:
        return "fields ARRAY<STRING>"
    return "payload BINARY"


def check_plans(opts: JournalsOptions, plans: Sequence[JournalPlan]) -> str:
    """The one content type of `plans`; JournalsSourceError if they mix framings or a
    committed read can't be sequenced."""
    types_ = sorted({p.content_type for p in plans})
    if len(types_) > 1:
        listing = ", ".join(f"{p.journal} ({p.content_type})" for p in plans)
        raise JournalsSourceError(
            f"selector {opts.selector!r} matches journals of different framings ({listing}); "
            "select journals of one content-type"
        )
    content_type = types_[0]
    known = (CONTENT_TYPE_JSON_LINES, CONTENT_TYPE_CSV)
    if opts.committed and not opts.message and content_type not in known:
        raise JournalsSourceError(
            f"journals of {content_type} carry their UUIDs in a message type: give option "
            "message=module:Class to read committed messages, or committed=false"
        )
    return content_type


# --- Reading (executors) --------------------------------------------------------------------


def envelope_meta(env: Envelope) -> tuple[str | None, str | None, int | None, int | None]:
    """(uuid, producer hex, clock, flags) of an envelope's message; Nones without a UUID.
    Decoded as the Sequencer does (no version or variant check)."""
    get = getattr(env.message, "get_uuid", None)
    u = get() if get is not None else None
    if u is None:
        return None, None, None, None
    i: int = u.int
    ts = ((i >> 64) & 0x0FFF) << 48 | ((i >> 80) & 0xFFFF) << 32 | (i >> 96) & 0xFFFFFFFF
    return str(u), f"{i & _NODE_MASK:012x}", ts << 4 | (i >> 58) & 0xF, (i >> 48) & 0x3FF


class _Columns:
    """How message columns are taken from a decoded message."""

    def __init__(self, opts: JournalsOptions, content_type: str, fields: list[Any]) -> None:
        self.names = [f.name for f in fields]
        # A column `message_X` takes the message's X when it has no `message_X` itself: that
        # is how fields named like the envelope columns (producer, uuid, ...) are exported.
        self.keys = [(n, n[len(_PREFIX) :] if n.startswith(_PREFIX) else "") for n in self.names]
        self.kind = "attr"
        if not opts.message:
            if content_type == CONTENT_TYPE_JSON_LINES:
                self.kind = "doc" if not opts.schema else "keys"
            elif content_type == CONTENT_TYPE_CSV:
                self.kind = "fields" if not opts.schema else "positions"
            else:
                self.kind = "payload"

    def values(self, msg: Any) -> list[Any]:
        kind = self.kind
        if kind == "doc":
            return [encode_json(msg.doc)]
        if kind == "keys":
            doc = msg.doc
            return [doc.get(n, doc.get(k) if k else None) for n, k in self.keys]
        if kind == "fields":
            return [msg.fields]
        if kind == "positions":
            f = msg.fields
            return [f[i] if i < len(f) else None for i in range(len(self.names))]
        if kind == "payload":
            return [msg.payload]
        inner = getattr(msg, "msg", msg)  # ProtoMessage's message.
        return [
            getattr(inner, n) if hasattr(inner, n) else getattr(inner, k, None) if k else None
            for n, k in self.keys
        ]


def _to_arrow_value(v: Any, t: pa.DataType) -> Any:
    if v is None:
        return None
    if isinstance(v, enum.Enum):
        v = v.value
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        if isinstance(v, str):
            return v
        if isinstance(v, _uuid.UUID):
            return str(v)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return encode_json(dataclasses.asdict(v))
        try:
            return encode_json(v)
        except (TypeError, ValueError):
            return str(v)
    if isinstance(v, _uuid.UUID) and pa.types.is_binary(t):
        return v.bytes
    return v


class _Batcher:
    """Accumulates the rows of one journal column-wise and cuts Arrow RecordBatches."""

    def __init__(self, schema: pa.Schema, columns: _Columns, journal: str) -> None:
        self.schema = schema
        self.columns = columns
        self.journal = journal
        self._reset()

    def _reset(self) -> None:
        self.begin: list[int] = []
        self.end: list[int] = []
        self.uuid: list[str | None] = []
        self.producer: list[str | None] = []
        self.clock: list[int | None] = []
        self.flags: list[int | None] = []
        self.msg: list[list[Any]] = [[] for _ in self.columns.names]
        self.rows = 0

    def add(self, env: Envelope, meta: tuple[Any, ...]) -> None:
        self.begin.append(env.begin)
        self.end.append(env.end)
        u, producer, clock, flags = meta
        self.uuid.append(u)
        self.producer.append(producer)
        self.clock.append(clock)
        self.flags.append(flags)
        values = self.columns.values(env.message)
        if len(values) == 1:
            self.msg[0].append(values[0])
        else:
            for col, v in zip(self.msg, values, strict=True):
                col.append(v)
        self.rows += 1

    def cut(self) -> pa.RecordBatch:
        fields = list(self.schema)
        n = self.rows
        meta = [[self.journal] * n, self.begin, self.end]
        meta += [self.uuid, self.producer, self.clock, self.flags]
        arrays = [pa.array(col, type=f.type) for f, col in zip(fields, meta, strict=False)]
        for f, col in zip(fields[len(_META_NAMES) :], self.msg, strict=True):
            try:
                arrays.append(pa.array(col, type=f.type))
                continue
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
                pass  # Values Arrow doesn't take as they are (UUIDs, enums, ints as text...).
            try:
                arrays.append(pa.array([_to_arrow_value(v, f.type) for v in col], type=f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as err:
                raise JournalsSourceError(
                    f"journal {self.journal} offsets [{self.begin[0]}, {self.end[-1]}): "
                    f"column {f.name} ({f.type}): {err}"
                ) from err
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        self._reset()
        return batch


def _new_message_func(opts: JournalsOptions, content_type: str) -> Any:
    if opts.message:
        cls = load_message_class(opts.message)
        if hasattr(cls, "DESCRIPTOR") and hasattr(cls, "ParseFromString"):
            from gazette.message.proto_message import ProtoMessage

            return lambda _spec: ProtoMessage(cls())
        return lambda _spec: cls()
    if content_type == CONTENT_TYPE_JSON_LINES:
        return lambda _spec: _JSONDoc()
    if content_type == CONTENT_TYPE_CSV:
        return lambda _spec: _CSVRecord()
    return lambda _spec: _RawPayload()


async def read_journal(opts: JournalsOptions, plan: JournalPlan) -> AsyncIterator[Envelope]:
    """Envelopes of `plan.journal` from offset 0 to `plan.end`, committed or not per `opts`
    (ACKs included)."""
    if plan.end <= 0:
        return  # An end_offset of 0 would mean "no end".
    spec = pb.JournalSpec.FromString(plan.spec)
    new_message = _new_message_func(opts, plan.content_type)
    req = pb.ReadRequest(journal=plan.journal, offset=0, end_offset=plan.end, block=True)
    async with opts.journal_client() as client:
        it: ReadCommittedIter | ReadUncommittedIter
        if opts.committed:
            it = ReadCommittedIter(client, req, spec, new_message)
        else:
            it = ReadUncommittedIter(client, req, spec, new_message)
        try:
            async for env in it:
                yield env
        finally:
            it.close()


def _drive(
    agen: AsyncIterator[pa.RecordBatch],
    stall_timeout: float = 0.0,
    journal: str = "",
    brokers: str = "",
) -> Iterator[pa.RecordBatch]:
    """Iterate an async iterator from synchronous code, on a loop of its own (one loop turn
    per batch, not per message: entering the loop costs more than decoding a message).
    `stall_timeout` > 0: raise `JournalsSourceError` once reading `journal` made no progress
    for that many seconds (`consumer.spark.stall`)."""
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                yield loop.run_until_complete(_next(agen, stall_timeout, journal, brokers))
            except StopAsyncIteration:
                break
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            loop.run_until_complete(aclose())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _next(
    agen: AsyncIterator[pa.RecordBatch], stall_timeout: float, journal: str, brokers: str
) -> pa.RecordBatch:
    if stall_timeout <= 0:
        return await agen.__anext__()
    from gazette.consumer.spark.stall import watch

    pending = asyncio.ensure_future(agen.__anext__())

    def stalled() -> Exception:
        return JournalsSourceError(
            f"journal {journal}: reading it made no progress for {stall_timeout:g}s: are its "
            f"brokers ({brokers}) and fragment stores reachable? (option broker_timeout)"
        )

    try:
        await watch(pending, lambda: None, stall_timeout, stalled)
    except BaseException:
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pending
        raise
    return await pending


async def _batches(
    opts: JournalsOptions, plan: JournalPlan, schema: pa.Schema, columns: _Columns
) -> AsyncIterator[pa.RecordBatch]:
    batcher = _Batcher(schema, columns, plan.journal)
    acks = opts.acks
    envelopes = read_journal(opts, plan)
    try:
        async for env in envelopes:
            meta = envelope_meta(env)
            if not acks and meta[3] is not None and meta[3] & _ACK:
                continue  # An acknowledgement: transaction control, no data of its own.
            batcher.add(env, meta)
            if batcher.rows >= opts.batch_rows:
                yield batcher.cut()
    finally:
        await envelopes.aclose()  # type: ignore[attr-defined]
    if batcher.rows:
        yield batcher.cut()


def read_batches(
    opts: JournalsOptions, plan: JournalPlan, schema: pa.Schema, columns: _Columns
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the rows of one journal."""
    batches = _batches(opts, plan, schema, columns)
    return _drive(batches, opts.broker_timeout, plan.journal, ", ".join(opts.brokers))


# --- The Spark API --------------------------------------------------------------------------


class _JournalPartition(InputPartition):
    def __init__(self, plan: JournalPlan) -> None:
        super().__init__(plan.journal)
        self.plan = plan


class _JournalsReader(DataSourceReader):
    def __init__(
        self, opts: JournalsOptions, plans: list[JournalPlan], content_type: str, schema: StructType
    ) -> None:
        self.opts = opts
        self.plans = plans
        self.content_type = content_type
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        return [_JournalPartition(p) for p in self.plans]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        from pyspark.sql.pandas.types import to_arrow_schema

        if not isinstance(partition, _JournalPartition):
            return  # Spark's InputPartition(None) when there are no partitions.
        arrow_schema = to_arrow_schema(self.schema)
        fields = list(self.schema.fields)[len(_META_NAMES) :]
        columns = _Columns(self.opts, self.content_type, fields)
        yield from read_batches(self.opts, partition.plan, arrow_schema, columns)


class GazetteJournalsDataSource(DataSource):
    """``spark.read.format("gazette-journals")``: messages of journals (module doc)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._opts = JournalsOptions.parse(options)
        self._plans: list[JournalPlan] | None = None
        self._content_type = ""

    @classmethod
    def name(cls) -> str:
        return "gazette-journals"

    def _plan(self) -> tuple[list[JournalPlan], str]:
        if self._plans is None:
            plans = resolve_journals(self._opts)
            self._content_type = check_plans(self._opts, plans)
            self._plans = plans
        return self._plans, self._content_type

    def schema(self) -> str:
        _, content_type = self._plan()
        return f"{META_COLUMNS}, {message_ddl(self._opts, content_type)}"

    def reader(self, schema: StructType) -> DataSourceReader:
        plans, content_type = self._plan()
        names = [f.name for f in schema.fields]
        if tuple(names[: len(_META_NAMES)]) != _META_NAMES:
            raise JournalsSourceError(
                f"schema must begin with the columns {', '.join(_META_NAMES)} (got {names})"
            )
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise JournalsSourceError(
                f"option schema repeats column(s) {', '.join(dupes)} (the first columns are "
                f"{', '.join(_META_NAMES)})"
            )
        return _JournalsReader(self._opts, plans, content_type, schema)
