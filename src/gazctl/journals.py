"""``gazctl journals ...``: list, apply, edit, read, append, fragments, prune, store-health,
export (to Parquet, `gazctl.export`), quarantined (`gazctl.quarantined`).

Each command opens one `JournalClient` to ``--broker`` for its duration. Label selectors
(``-l``) use Gazette's syntax: ``app=clicks, region in (us, eu), !deprecated``,
``name:prefix=examples/``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import datetime as dt
import json
import logging
import os
import random
import shlex
import signal
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc.aio
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import (
    AppendService,
    AsyncAppend,
    JournalClient,
    OffsetNotYetAvailable,
    PolledList,
    RetryReader,
    append,
    apply_journals_in_batches,
    fragment_store_health,
    list_all_fragments,
    list_all_journals,
    name_selector,
    watch_journals,
)
from gazette.broker.client.appender import RetryWindow
from gazette.broker.client.errors import (
    BrokerError,
    OffsetJump,
    describe_error,
    is_transient_rpc_error,
)
from gazette.broker.client.retry_reader import backoff
from gazette.broker.fragment.store import store_for_url
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.selector import format_label_selector, parse_label_selector
from gazette.broker.protocol.sha1sum import sha1sum_hex
from gazette.broker.protocol.validation import validate_journal_spec
from gazette.gazctl.export import add_journals_export
from gazette.gazctl.journalspace import (
    apply_changes,
    check_required,
    dump_tree,
    load_tree,
    tree_from_journals,
)
from gazette.gazctl.main import (
    GazctlError,
    Streams,
    journal_client,
    kept_edit_error,
    raise_if_txn_too_large,
)
from gazette.gazctl.output import apply_plan, render_table
from gazette.gazctl.quarantined import add_journals_quarantined
from gazette.gazctl.read_committed import CommittedMessages, committed_framing
from gazette.gazctl.spec_errors import in_yaml_terms
from gazette.gazctl.specyaml import format_duration, parse_duration
from gazette.message.framing_fixed import FIXED_FRAME_HEADER_LENGTH, FIXED_FRAME_WORD
from gazette.message.mapping import (
    MappingError,
    MappingFunc,
    direct_mapping,
    modulo_mapping,
    random_mapping,
    rendezvous_mapping,
)
from gazette.message.publisher import JournalBatcher

__all__ = ["register", "parse_time", "ReadGap"]

log = logging.getLogger(__name__)

Journals = list[pb.ListResponse.Journal]
T = TypeVar("T")


def register(groups: Any, common: argparse.ArgumentParser) -> None:
    """Add the ``journals`` group and its commands to the `groups` subparsers."""
    group = groups.add_parser("journals", help="interact with broker journals")
    cmds = group.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def cmd(
        name: str,
        help: str,
        handler: Callable[[argparse.Namespace, Streams], Coroutine[Any, Any, int]],
        *,
        selector: bool | None = False,
    ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = cmds.add_parser(
            name,
            help=help,
            description=help,
            parents=[common],
        )
        if selector is not False:
            p.add_argument(
                "-l",
                "--selector",
                required=bool(selector),
                default="",
                help="label selector of journals, e.g. 'app=clicks, name:prefix=logs/'",
            )
        p.set_defaults(handler=handler)
        return p

    p = cmd("list", "list journals matching a selector", cmd_list, selector=None)
    p.add_argument(
        "-o", "--format", choices=("table", "yaml", "json"), default="table", help="output format"
    )
    p.add_argument("-w", "--watch", action="store_true", help="keep listing as journals change")
    p.add_argument("-p", "--primary", action="store_true", help="show each journal's primary")
    p.add_argument(
        "-R",
        "--replicas",
        action="store_true",
        help="show every broker of each journal's route as zone#suffix ('*': the primary)",
    )
    p.add_argument("-L", "--label-columns", default="", help="comma-separated labels as columns")

    p = cmd("apply", "apply a hierarchical YAML of journal specs", cmd_apply)
    p.add_argument("--specs", default="-", help="YAML file of specs ('-': stdin)")
    p.add_argument("--dry-run", action="store_true", help="print the changes, apply nothing")
    p.add_argument(
        "--max-txn-size",
        type=int,
        default=0,
        help="changes per etcd transaction (0: all in one; etcd takes at most --max-txn-ops, "
        "128 by default; batches apply one after another, not atomically)",
    )

    p = cmd("edit", "edit journal specs in $EDITOR and apply them", cmd_edit, selector=True)
    p.add_argument(
        "--max-txn-size",
        type=int,
        default=0,
        help="changes per etcd transaction (0: all in one; etcd takes at most --max-txn-ops, "
        "128 by default; batches apply one after another, not atomically)",
    )

    p = cmd("read", "read journal content to stdout", cmd_read, selector=True)
    p.description = READ_HELP
    p.add_argument("-b", "--block", action="store_true", help="wait for new content at the head")
    p.add_argument("--tail", action="store_true", help="begin at the write head (not offset 0)")
    p.add_argument("--offsets", default="", help="JSON file of journal -> offset to begin at")
    p.add_argument("--offsets-out", default="", help="JSON file to write final offsets to")
    p.add_argument("-o", "--output", default="-", help="output file ('-': stdout)")
    p.add_argument("--from", dest="from_time", default="", help="skip fragments persisted before")
    p.add_argument(
        "--progress-interval", type=float, default=5.0, help="seconds between progress lines"
    )
    p.add_argument(
        "--allow-gaps",
        action="store_true",
        help="read past content that is missing (reporting each skipped range on stderr) "
        "instead of stopping there with exit status 3",
    )
    p.add_argument(
        "--committed",
        action="store_true",
        help="print only messages of committed transactions, each once, without "
        "acknowledgements (JSON-lines and CSV journals; see above)",
    )

    p = cmd("append", "append input to journals", cmd_append, selector=None)
    p.description = APPEND_HELP
    p.add_argument("--journal", default="", help="journal to append to (instead of -l)")
    p.add_argument("-i", "--input", default="-", help="input file ('-': stdin)")
    p.add_argument(
        "-f",
        "--framing",
        choices=("none", "lines", "fixed"),
        default="none",
        help="framing of records in the input (default %(default)s: one atomic append)",
    )
    p.add_argument(
        "-m",
        "--mapping",
        choices=("random", "modulo", "rendezvous", "direct"),
        default=None,
        help="mapping of records to the selected journals (default random; see above)",
    )
    p.add_argument(
        "--base64",
        action="store_true",
        help="partition keys under 'lines' framing are base64-encoded",
    )
    p.add_argument(
        "--retry-for",
        type=_retry_for,
        default=60.0,
        metavar="SECONDS",
        help="give up once an append has kept failing (unreachable brokers, no primary) for "
        "this long (default %(default)gs; 'forever' retries without end)",
    )

    p = cmd("fragments", "list fragments of journals", cmd_fragments, selector=True)
    p.add_argument("--from", dest="from_time", default="", help="persisted at or after")
    p.add_argument("--to", dest="to_time", default="", help="persisted before")
    p.add_argument("--url-ttl", default="", help="also sign fragment URLs valid this long")
    p.add_argument(
        "-o", "--format", choices=("table", "json"), default="table", help="output format"
    )

    p = cmd("prune", "delete fragments older than each journal's retention", cmd_prune)
    p.add_argument("-l", "--selector", required=True, help="label selector of journals")
    p.add_argument("--dry-run", action="store_true", help="report, delete nothing")

    p = cmd("store-health", "check the health of fragment stores", cmd_store_health, selector=None)
    p.add_argument(
        "--store",
        action="append",
        default=[],
        help="store URL (repeatable; default: stores of the selected journals)",
    )

    add_journals_export(cmds, common)
    add_journals_quarantined(cmds, common)


# --- helpers ----------------------------------------------------------------------------


def _retry_for(text: str) -> float | None:
    if text == "forever":
        return None
    try:
        return RetryWindow.checked(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds >= 0 or 'forever'"
        ) from None


def _selector(text: str) -> pb.LabelSelector:
    return parse_label_selector(text)


async def _retry_listing(
    selector: pb.LabelSelector, retry_for: float | None, list_once: Callable[[], Awaitable[T]]
) -> T:
    """`list_once()`, retried with backoff on transport errors (an unreachable broker) until
    they have kept failing for `retry_for` seconds (None: for ever), as an append's retries
    are: then raises `AppendRetriesExhausted` from the last error."""
    what = f"journals matching {format_label_selector(selector)!r}"
    window = RetryWindow(what, retry_for)
    attempt = 0
    while True:
        try:
            return await list_once()
        except grpc.aio.AioRpcError as err:
            if not is_transient_rpc_error(err):
                raise
            delay = window.failed(err, attempt, backoff(attempt))
            log.warning(
                "listing %s failed (will retry) attempt=%d err=%s",
                what,
                attempt,
                describe_error(err),
            )
        await asyncio.sleep(delay)
        attempt += 1


@contextlib.asynccontextmanager
async def _polled_listing(
    client: JournalClient, selector: pb.LabelSelector, retry_for: float | None
) -> AsyncIterator[PolledList]:
    """A started `PolledList` of `selector`, its first listing retried as `_retry_listing`."""
    listing = PolledList(client, selector, 30.0)
    await _retry_listing(selector, retry_for, listing.start)
    try:
        yield listing
    finally:
        await listing.close()


@contextlib.asynccontextmanager
async def _client(args: argparse.Namespace) -> AsyncIterator[JournalClient]:
    async with journal_client(args) as client:
        yield client


def parse_time(text: str, *, now: float | None = None) -> int:
    """Unix seconds from RFC 3339 (``2024-05-01T12:00:00Z``), a date, a unix timestamp, or a
    duration ago (``1h``, ``30m``). Raises GazctlError."""
    text = text.strip()
    now = time.time() if now is None else now
    if text.isdigit():
        if int(text) >= 1 << 63:
            raise GazctlError(f"invalid time {text!r} (unix seconds beyond 2^63-1)")
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        pass
    else:
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        return int(when.timestamp())
    try:
        ago = parse_duration(text.lstrip("-"))
    except ValidationError:
        raise GazctlError(
            f"invalid time {text!r} (expected RFC 3339, unix seconds, or a duration ago like '1h')"
        ) from None
    return int(now - ago.ToNanoseconds() / 1e9)


def _fmt_time(unix: int) -> str:
    if not unix:
        return "-"
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _labels_text(ls: pb.LabelSet) -> str:
    sel = pb.LabelSelector(include=ls)
    return format_label_selector(sel)


def _primary(j: pb.ListResponse.Journal) -> tuple[str, str]:
    r = j.route
    if 0 <= r.primary < len(r.members):
        m = r.members[r.primary]
        ep = r.endpoints[r.primary] if r.primary < len(r.endpoints) else ""
        return f"{m.zone}/{m.suffix}", ep
    return "<none>", ""


def _replicas(j: pb.ListResponse.Journal) -> str:
    """All brokers of the journal's route, in route order, as ``zone#suffix``; the primary
    carries a trailing ``*``."""
    r = j.route
    if not r.members:
        return "<none>"
    return ",".join(
        f"{m.zone}#{m.suffix}" + ("*" if i == r.primary else "") for i, m in enumerate(r.members)
    )


def _journal_json(j: pb.ListResponse.Journal) -> dict[str, Any]:
    doc = json_format.MessageToDict(j, preserving_proto_field_name=True)
    # proto3 JSON drops zero values, and primary 0 (the first member) is the usual primary:
    # always spell the route out, so that "no primary" (-1) and "the first" differ visibly.
    r = j.route
    doc["route"] = {
        "members": [{"zone": m.zone, "suffix": m.suffix} for m in r.members],
        "primary": r.primary if 0 <= r.primary < len(r.members) else -1,
        "endpoints": list(r.endpoints),
    }
    return doc


# --- list -------------------------------------------------------------------------------


def _render_list(journals: Journals, args: argparse.Namespace) -> str:
    if args.format == "json":
        return json.dumps([_journal_json(j) for j in journals], indent=2)
    if args.format == "yaml":
        if not journals:
            return "# no journals matched\n"
        tree = tree_from_journals(journals)
        if args.primary or args.replicas:
            # As each node's `comment` (ignored by apply), so the tree stays applicable.
            routes = {j.spec.name: _replicas(j) for j in journals}
            for node in tree.terminals():
                node.comment = f"route: {routes[node.name]}"
        return dump_tree(tree).rstrip("\n")
    label_cols = [c.strip() for c in args.label_columns.split(",") if c.strip()]
    header = ["NAME", *(c.upper() for c in label_cols)]
    if not label_cols:
        header.append("LABELS")
    if args.primary:
        header += ["PRIMARY", "ENDPOINT"]
    if args.replicas:
        header.append("REPLICAS")
    rows = []
    for j in journals:
        row = [j.spec.name]
        if label_cols:
            for c in label_cols:
                row.append(",".join(lb.value for lb in j.spec.labels.labels if lb.name == c))
        else:
            row.append(_labels_text(j.spec.labels))
        if args.primary:
            row += list(_primary(j))
        if args.replicas:
            row.append(_replicas(j))
        rows.append(row)
    return render_table(header, rows)


async def cmd_list(args: argparse.Namespace, io: Streams) -> int:
    sel = _selector(args.selector)
    async with _client(args) as client:
        if not args.watch:
            io.out(_render_list(await list_all_journals(client, sel), args))
            return 0
        watch = watch_journals(client, sel)
        try:
            async for journals in watch:
                if args.format == "json":
                    io.out(json.dumps([_journal_json(j) for j in journals]))
                else:
                    io.out(_render_list(journals, args))
                    io.out("---" if args.format == "yaml" else "")
        finally:
            await watch.aclose()
    return 0


# --- apply / edit -----------------------------------------------------------------------


async def _apply_tree_text(
    client: JournalClient, text: str, io: Streams, *, dry_run: bool, txn_size: int
) -> int:
    tree = load_tree(text)
    names = [n.name for n in tree.terminals()]
    current: dict[str, int] = {}
    if names:
        # Revisions of the journals as they exist now, for nodes that omit `revision`.
        for j in await list_all_journals(client):
            current[j.spec.name] = j.mod_revision
    changes = apply_changes(tree, current)
    check_required(changes)
    for ch in changes:
        if ch.HasField("upsert"):
            try:
                validate_journal_spec(ch.upsert)
            except ValidationError as err:
                raise in_yaml_terms(err, f"journal {ch.upsert.name}") from None
    req = pb.ApplyRequest(changes=changes)
    if dry_run:
        for line in apply_plan(req, lambda spec: spec.name):
            io.out(line)
        _note_replication_one(changes, io)
        return 0
    if not changes:
        io.err("nothing to apply")
        return 0
    try:
        resp = await apply_journals_in_batches(client, req, txn_size)
    except grpc.aio.AioRpcError as err:
        raise_if_txn_too_large(err, len(changes), txn_size)
        raise
    io.err(f"applied {len(changes)} change(s) at revision {resp.header.etcd.revision}")
    _note_replication_one(changes, io)
    return 0


def _note_replication_one(changes: Sequence[pb.ApplyRequest.Change], io: Streams) -> None:
    """Say what replication 1 promises, if an upserted spec asks for it, and warn of one
    without fragment stores, which can fork (docs/broker.md)."""
    specs = [ch.upsert for ch in changes if ch.HasField("upsert") and ch.upsert.replication == 1]
    names = [spec.name for spec in specs]
    if not names:
        return
    io.err(
        f"gazctl: note: replication 1 ({_shown(names)}): one broker holds what it acknowledged "
        "until the fragment is persisted; if that machine or disk is lost for good, those "
        "appends are lost (up to fragment.length bytes or one flush_interval; without "
        "--spool-sync also at a power loss), and while a crashed broker is away readers meet "
        "a hole. Use replication 2 or more to keep acknowledged appends (docs/broker.md)"
    )
    storeless = [spec.name for spec in specs if not spec.fragment.stores]
    if storeless:
        io.err(
            f"gazctl: warning: replication 1 without fragment.stores ({_shown(storeless)}): "
            "offsets cannot be reserved, so after a crash or pause of its broker another one "
            "starts again at its own head and hands out offsets the first one acknowledged: "
            "the journal forks, and its content lives and dies with one spool directory. Give "
            "it a store, or replication 2 or more (docs/broker.md)"
        )


def _shown(names: Sequence[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


async def cmd_apply(args: argparse.Namespace, io: Streams) -> int:
    text = await io.read_input(args.specs)
    async with _client(args) as client:
        return await _apply_tree_text(
            client, text, io, dry_run=args.dry_run, txn_size=args.max_txn_size
        )


_EDIT_HEADER = """\
# Edit the journal specifications below; they are applied when the editor exits.
# Set `delete: true` on a journal (or a directory of them) to delete it. Keep `revision`:
# it makes the apply fail if the journal changed meanwhile. Empty the file to cancel.
"""


async def cmd_edit(args: argparse.Namespace, io: Streams) -> int:
    async with _client(args) as client:
        journals = await list_all_journals(client, _selector(args.selector))
        if not journals:
            raise GazctlError(f"no journals match selector {args.selector!r}")
        original = _EDIT_HEADER + dump_tree(tree_from_journals(journals))
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="gazctl-", delete=False) as f:
            f.write(original)
            path = f.name
        try:
            editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
            rc = await asyncio.to_thread(subprocess.call, [*shlex.split(editor), path])
            if rc != 0:
                raise GazctlError(f"editor {editor!r} exited with status {rc}; nothing applied")
            edited = Path(path).read_text()
        finally:
            os.unlink(path)
        body = "\n".join(ln for ln in edited.splitlines() if not ln.lstrip().startswith("#"))
        if edited == original or not body.strip():
            io.err("no changes")
            return 0
        try:
            return await _apply_tree_text(
                client, edited, io, dry_run=False, txn_size=args.max_txn_size
            )
        except (ValidationError, GazctlError, BrokerError) as err:
            raise kept_edit_error(err, edited, "journals apply") from err


# --- read -------------------------------------------------------------------------------


READ_HELP = """\
Read the content of the journals selected by -l/--selector to stdout (or --output), from
offset 0 (or --offsets, or the write head with --tail) to each journal's write head, or on
and on with --block. Journals are read concurrently, each copied in whole fragments.

A journal may miss part of its content: fragments deleted from the store (by retention or
by hand) or never persisted before a broker failure, or offsets left unused when a primary
failed (see docs/broker.md). The broker then moves the read forward, past the missing
offsets. By default the read stops there: the content before the gap is written, gazctl
names the journal and the missing offsets, --offsets-out records the offset where the gap
begins, and the exit status is 3. With --allow-gaps the read goes on past each gap,
reporting the skipped range on stderr. Fragments skipped by --from are skipped by request
and are no gap.

With --committed, the read is what an exactly-once reader of the journals gets: messages
are decoded with each journal's framing and sequenced by their UUIDs, and only those of
committed transactions are printed, each once, in commit order, without the
acknowledgements (a raw read also shows messages of rolled-back or never-committed
transactions, and acknowledgements as records of their own). Each is printed as written,
one a line. It reads JSON-lines and CSV journals, from the beginning (or --tail); --offsets
and --offsets-out, which are raw byte offsets, are not taken.

  gazctl journals read -l name=my/journal
  gazctl journals read -l name=examples/word-count/counts --committed
  gazctl journals read -l app=clicks --block --tail
  gazctl journals read -l app=clicks --offsets o.json --offsets-out o.json --allow-gaps
"""


class ReadGap(GazctlError):
    """A read met a range of a journal that no longer exists (its fragments were deleted, by
    retention or by hand, or never persisted before a broker failure) and stopped there."""

    exit_status = 3


class _Gaps:
    """Which offset jumps of one journal's read are gaps in its content.

    A jump the read asked for is none: with ``--from``, fragments persisted before that time
    are skipped by request, which moves the read forward before its first byte. Any other
    jump skips content that readers of the journal would otherwise get.
    """

    def __init__(self, *, from_time: bool) -> None:
        self.from_time = from_time
        self.delivered = False  # Whether the read has returned content yet.
        self.pending: list[OffsetJump] = []

    def jumped(self, jump: OffsetJump) -> None:
        """`RetryReader.on_jump`: note `jump`, taken before the next content returned."""
        self.pending.append(jump)

    def take(self, delivering: bool) -> list[OffsetJump]:
        """The gaps among jumps noted since the last call; `delivering`: the read is about
        to return content (so later jumps are past its first byte)."""
        jumps, self.pending = self.pending, []
        requested = self.from_time and not self.delivered
        self.delivered = self.delivered or delivering
        return [] if requested else jumps


def _gap_text(jump: OffsetJump) -> str:
    return (
        f"journal {jump.journal}: offsets [{jump.from_offset}, {jump.to_offset}) are missing "
        f"({jump.skipped} bytes)"
    )


class _ReadState:
    def __init__(self, out: Any, io: Streams, *, allow_gaps: bool, from_time: bool) -> None:
        self.out = out
        self.io = io
        self.allow_gaps = allow_gaps
        self.from_time = from_time
        self.readers: dict[str, RetryReader] = {}
        self.done: dict[str, int] = {}
        self.bytes_read: dict[str, int] = {}

    def check_gaps(self, gaps: list[OffsetJump]) -> None:
        """Report `gaps` on stderr under ``--allow-gaps``; otherwise raise `ReadGap` for the
        first."""
        for gap in gaps:
            if not self.allow_gaps:
                raise ReadGap(
                    f"{_gap_text(gap)}: no fragment covers them (deleted, never persisted, "
                    f"or offsets a failed primary left unused); the read stopped at offset "
                    f"{gap.from_offset} (--allow-gaps reads past missing content)"
                )
            self.io.err(f"gazctl: skipped {_gap_text(gap)}")


async def _pump(rr: RetryReader, gaps: _Gaps, state: _ReadState) -> None:
    """Copy one journal to the output until its head (non-blocking) or cancellation.

    Raises `ReadGap` at a gap (unless ``--allow-gaps``): content before it is written, none
    after it, and the journal's final offset is where the gap begins.
    """
    journal = rr.journal
    buf = bytearray()
    stopped_at: int | None = None
    try:
        while True:
            try:
                data = await rr.read()
            except OffsetNotYetAvailable:
                data = b""
            # Content returned after a jump begins at the jump's end: check before using it.
            found = gaps.take(delivering=bool(data))
            if found and not state.allow_gaps:
                stopped_at = found[0].from_offset
            state.check_gaps(found)
            if not data:
                break
            buf += data
            frag = rr.reader.fragment
            # Write whole fragments (or 4 MiB) at once: appends of whole messages then stay
            # whole in output multiplexed from several journals.
            at_boundary = frag is None or rr.offset >= min(frag.end, rr.reader.write_head)
            if at_boundary or len(buf) >= 4 << 20:
                state.out.write(bytes(buf))
                state.out.flush()
                state.bytes_read[journal] = state.bytes_read.get(journal, 0) + len(buf)
                buf.clear()
    finally:
        if buf:
            state.out.write(bytes(buf))
            state.out.flush()
            state.bytes_read[journal] = state.bytes_read.get(journal, 0) + len(buf)
        if stopped_at is None:
            stopped_at = rr.offset if rr.offset >= 0 else 0
        state.done[journal] = stopped_at
        rr.close()


async def _pump_committed(
    rr: RetryReader, gaps: _Gaps, state: _ReadState, messages: CommittedMessages
) -> None:
    """Write one journal's committed messages, one a line, until its head (non-blocking)
    or cancellation. Raises `ReadGap` at a gap (unless ``--allow-gaps``), writing nothing
    read after it."""
    journal = rr.journal
    try:
        while True:
            try:
                payload: bytes | None = await messages.next()
            except (OffsetNotYetAvailable, StopAsyncIteration):
                payload = None
            state.check_gaps(gaps.take(delivering=payload is not None))
            if payload is None:
                break
            state.out.write(payload + b"\n")
            state.out.flush()
            state.bytes_read[journal] = state.bytes_read.get(journal, 0) + len(payload) + 1
    finally:
        state.done[journal] = rr.offset if rr.offset >= 0 else 0
        rr.close()


async def _progress(state: _ReadState, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        for name, rr in sorted(state.readers.items()):
            if name in state.done:
                continue
            state.io.err(
                f"read journal={name} offset={rr.offset} write_head={rr.reader.write_head} "
                f"bytes={state.bytes_read.get(name, 0)}"
            )


def _offset(value: object, journal: str, path: str) -> int:
    """An offset of the --offsets file `path`: an integer from -1 (the write head) to
    2^63-1. Raises GazctlError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value < 1 << 63:
        raise GazctlError(
            f"--offsets {path}: the offset of {journal} must be an integer from -1 to "
            f"{(1 << 63) - 1} (not {value!r})"
        )
    return value


async def cmd_read(args: argparse.Namespace, io: Streams) -> int:
    if args.committed and (args.offsets or args.offsets_out):
        # A committed read can't resume at a byte offset: a transaction begun before it
        # would be lost to the Sequencer, and its messages with it.
        raise GazctlError(
            "--committed reads each journal from its beginning (or --tail): --offsets and "
            "--offsets-out are offsets of raw reads"
        )
    begin: dict[str, int] = {}
    if args.offsets:
        try:
            loaded = json.loads(Path(args.offsets).read_text() or "{}")
        except json.JSONDecodeError as err:
            raise GazctlError(f"--offsets {args.offsets}: invalid JSON: {err}") from None
        if not isinstance(loaded, dict):
            raise GazctlError(f"--offsets {args.offsets}: expected a JSON object")
        begin = {str(k): _offset(v, k, args.offsets) for k, v in loaded.items()}
    from_unix = parse_time(args.from_time) if args.from_time else 0
    sel = _selector(args.selector)

    out: Any
    if args.output == "-":
        out = io.stdout
    else:
        out = open(args.output, "wb")  # noqa: SIM115 - closed below
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    state = _ReadState(out, io, allow_gaps=args.allow_gaps, from_time=bool(from_unix))
    try:
        async with _client(args) as client:
            polled = PolledList(client, sel, interval=10.0)
            await polled.start()
            try:
                if not polled.journals:
                    io.err(f"no journals match selector {args.selector!r}")
                await _read_loop(client, polled, state, args, begin, from_unix, stop)
            finally:
                await polled.close()
    except ReadGap:
        # Offsets where each read stopped (the gap's start for the journal with the gap).
        _write_offsets(args.offsets_out, {**begin, **state.done})
        raise
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)
        if out is not io.stdout:
            out.close()
    _write_offsets(args.offsets_out, {**begin, **state.done})
    return 0


def _write_offsets(path: str, offsets: dict[str, int]) -> None:
    """Write `offsets` as JSON to `path` (if given), replacing it atomically."""
    if not path:
        return
    tmp = path + ".temp"
    with open(tmp, "w") as f:
        json.dump(offsets, f, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


async def _read_loop(
    client: JournalClient,
    polled: PolledList,
    state: _ReadState,
    args: argparse.Namespace,
    begin: dict[str, int],
    from_unix: int,
    stop: asyncio.Event,
) -> None:
    tasks: dict[str, asyncio.Task[None]] = {}

    def start(journals: Journals) -> None:
        for j in journals:
            name = j.spec.name
            if name in state.readers:
                continue
            offset = begin.get(name, -1 if args.tail else 0)
            req = pb.ReadRequest(
                journal=name, offset=offset, block=args.block, begin_mod_time=from_unix
            )
            gaps = _Gaps(from_time=state.from_time)
            framing = committed_framing(j.spec) if args.committed else None
            rr = RetryReader(client, req, on_jump=gaps.jumped)
            state.readers[name] = rr
            pump = (
                _pump(rr, gaps, state)
                if framing is None
                else _pump_committed(rr, gaps, state, CommittedMessages(rr, j.spec, framing))
            )
            tasks[name] = asyncio.create_task(pump, name=f"read:{name}")

    progress = asyncio.create_task(_progress(state, args.progress_interval))
    stopper = asyncio.create_task(stop.wait())
    try:
        start(polled.journals)
        while True:
            running = [t for t in tasks.values() if not t.done()]
            if not running and not args.block:
                break
            update = asyncio.create_task(polled.updated())
            await asyncio.wait([*running, update, stopper], return_when=asyncio.FIRST_COMPLETED)
            if update.done():
                start(polled.journals)
            else:
                update.cancel()
            for t in tasks.values():
                if t.done() and not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            if stop.is_set():
                break
    finally:
        owned: list[asyncio.Task[Any]] = [progress, stopper, *tasks.values()]
        for t in owned:
            t.cancel()
        await asyncio.gather(*owned, return_exceptions=True)


# --- append -----------------------------------------------------------------------------


APPEND_HELP = """\
Append input (stdin, or --input) to journals selected by -l/--selector (or --journal).

With --framing none (the default) the whole input is one atomic append to one journal: the
selector must match exactly one journal, unless --mapping random is given, which picks one of
those matched at random.

With --framing lines, records are input lines; with --framing fixed, records are fixed frames
(a header of the bytes 66 33 93 36 and a little-endian uint32 length, then the payload). Each
record is mapped to one of the selected journals and appended whole, delimiter included;
records mapped to a journal keep their input order there.

--mapping random maps each record to a random journal. With modulo or rendezvous, each record
is preceded by its partition key, written with the same framing (a line, or a fixed frame
whose payload is the key), and the key's FNV-1a hash selects the journal as Gazette's
ModuloMapping / RendezvousMapping do (the same keys map to the same journals as with Go's
gazctl). --base64 decodes line keys from base64 first. With direct, each record is preceded
by the name of its journal, which must be one of the selected journals.

Unreachable brokers and journals without a primary are retried with backoff, for at most
--retry-for seconds per append (default 60): then the command fails, naming the last error.
The listing of the selected journals that an append starts with is retried alike.

  gazctl journals append -l name=my/journal -i ./fizzbuzz
  printf 'S2V5MQ==\\n{"msg": 1}\\n' | gazctl journals append -l topic=t -f lines -m modulo --base64
"""


class RecordError(GazctlError):
    """The input is not a stream of records of the chosen framing."""


class _Records:
    """Splits input chunks into records (and their partition keys), without I/O."""

    def __init__(self, framing: str, keyed: bool, base64_keys: bool) -> None:
        self.framing = framing
        self.keyed = keyed
        self.base64 = base64_keys
        self.buf = bytearray()
        self.pos = 0
        self.offset = 0  # Input offset of buf[pos], for error messages.
        self.key: bytes | None = None  # A key read, whose record hasn't arrived yet.

    def feed(self, data: bytes) -> None:
        if self.pos:
            del self.buf[: self.pos]
            self.pos = 0
        self.buf += data

    def _line(self, final: bool) -> bytes | None:
        nl = self.buf.find(b"\n", self.pos)
        if nl < 0:
            if not final or self.pos == len(self.buf):
                return None
            nl = len(self.buf)  # A last line without its newline gets one.
            out = bytes(self.buf[self.pos :]) + b"\n"
        else:
            out = bytes(self.buf[self.pos : nl + 1])
        self.offset += nl + 1 - self.pos
        self.pos = min(nl + 1, len(self.buf))
        return out

    def _fixed(self, final: bool) -> bytes | None:
        avail = len(self.buf) - self.pos
        if avail < FIXED_FRAME_HEADER_LENGTH:
            if final and avail:
                raise RecordError(f"input ends inside a fixed frame header at {self.offset}")
            return None
        head = bytes(self.buf[self.pos : self.pos + FIXED_FRAME_HEADER_LENGTH])
        if head[:4] != FIXED_FRAME_WORD:
            raise RecordError(f"no fixed frame header at input offset {self.offset} (desync)")
        size = FIXED_FRAME_HEADER_LENGTH + int.from_bytes(head[4:], "little")
        if avail < size:
            if final:
                raise RecordError(f"input ends inside the fixed frame at {self.offset}")
            return None
        out = bytes(self.buf[self.pos : self.pos + size])
        self.pos += size
        self.offset += size
        return out

    def _next(self, final: bool) -> bytes | None:
        return self._fixed(final) if self.framing == "fixed" else self._line(final)

    def records(self, final: bool = False) -> Iterator[tuple[bytes | None, bytes]]:
        """(key, record) pairs complete in the input fed so far (key None if not keyed).

        With `final`, the input has ended: a partial record is an error (a last line
        without its newline is completed), and so is a key without its record.
        """
        while True:
            if self.keyed and self.key is None:
                raw = self._next(final)
                if raw is None:
                    return
                self.key = self._decode_key(raw)
            record = self._next(final)
            if record is None:
                if final and self.key is not None:
                    raise RecordError("input ends with a partition key but no record")
                return
            key, self.key = self.key, None
            yield key, record

    def _decode_key(self, raw: bytes) -> bytes:
        if self.framing == "fixed":
            return raw[FIXED_FRAME_HEADER_LENGTH:]
        key = raw.rstrip(b"\r\n")
        if self.base64:
            try:
                return base64.b64decode(key, validate=True)
            except binascii.Error as err:
                raise RecordError(f"partition key {key[:40]!r} is not base64: {err}") from None
        return key


async def _resolve_append_journal(client: JournalClient, args: argparse.Namespace) -> str:
    if args.journal:
        if args.selector:
            raise GazctlError("give either --journal or -l/--selector, not both")
        return str(args.journal)
    if not args.selector:
        raise GazctlError("give --journal or -l/--selector")
    selector = _selector(args.selector)
    journals = await _retry_listing(
        selector, args.retry_for, lambda: list_all_journals(client, selector)
    )
    if args.mapping == "random" and journals:
        return random.choice(journals).spec.name
    if len(journals) != 1:
        names = ", ".join(j.spec.name for j in journals[:5]) or "none"
        raise GazctlError(
            f"selector {args.selector!r} must match exactly one journal (matched "
            f"{len(journals)}: {names}); give --mapping random to pick one of them"
        )
    return journals[0].spec.name


async def _input_chunks(args: argparse.Namespace, io: Streams) -> AsyncIterator[bytes]:
    if args.input == "-":
        async for chunk in _stdin_chunks(io):
            yield chunk
        return
    with open(args.input, "rb") as f:
        while chunk := await asyncio.to_thread(f.read, 1 << 20):
            yield chunk


async def _stdin_chunks(io: Streams, size: int = 1 << 20) -> AsyncIterator[bytes]:
    read = getattr(io.stdin, "read1", io.stdin.read)
    while chunk := await asyncio.to_thread(read, size):
        yield chunk


def _validate_append_args(args: argparse.Namespace) -> None:
    mapping = args.mapping or "random"
    if args.framing == "none" and mapping != "random":
        raise GazctlError("'none' --framing may only be used with 'random' --mapping")
    if args.base64 and (args.framing != "lines" or mapping == "random"):
        raise GazctlError("--base64 requires --framing 'lines' and a --mapping other than random")


def _append_mapping(mapping: str, partitions: Callable[[], Journals]) -> MappingFunc:
    def key(k: bytes) -> bytes:
        return k

    if mapping == "modulo":
        return modulo_mapping(key, partitions)
    if mapping == "rendezvous":
        return rendezvous_mapping(key, partitions)
    if mapping == "direct":
        return direct_mapping(key, partitions)
    return random_mapping(partitions)


async def cmd_append(args: argparse.Namespace, io: Streams) -> int:
    _validate_append_args(args)
    async with _client(args) as client:
        if args.framing == "none":
            journal = await _resolve_append_journal(client, args)
            req = pb.AppendRequest(journal=journal)
            resp = await append(client, req, _input_chunks(args, io), retry_for=args.retry_for)
            io.err(
                f"appended {resp.commit.end - resp.commit.begin} bytes to {journal} "
                f"[{resp.commit.begin}, {resp.commit.end})"
            )
            return 0

        if args.journal and args.selector:
            raise GazctlError("give either --journal or -l/--selector, not both")
        if not (args.journal or args.selector):
            raise GazctlError("give --journal or -l/--selector")
        selector = name_selector(args.journal) if args.journal else _selector(args.selector)
        mapping_name = args.mapping or "random"
        records = _Records(args.framing, mapping_name != "random", args.base64)
        count = 0
        touched: dict[str, AsyncAppend] = {}
        async with (
            _polled_listing(client, selector, args.retry_for) as listing,
            AppendService(client, retry_for=args.retry_for) as svc,
        ):
            if not listing.journals:
                raise GazctlError(f"no journals match {format_label_selector(selector)!r}")
            mapping = _append_mapping(mapping_name, lambda: listing.journals)
            # Chained: once a journal's append fails, none after it lands (no hole).
            batcher = JournalBatcher(svc, chain=True)
            in_flight: deque[AsyncAppend] = deque()

            def process(final: bool) -> None:
                nonlocal count
                for key, record in records.records(final):
                    try:
                        journal, _ = mapping(key)
                    except MappingError as err:
                        raise GazctlError(f"record {count + 1}: {err}") from None
                    log.debug("mapped record journal=%s key=%r", journal, key)
                    touched[journal] = batcher.write(journal, record)
                    count += 1

            try:
                async for chunk in _input_chunks(args, io):
                    records.feed(chunk)
                    process(final=False)
                    # Release what this chunk produced, bounding appends in flight (and memory).
                    in_flight.extend(batcher.flush())
                    while in_flight and (in_flight[0].is_done() or len(in_flight) > 64):
                        await in_flight.popleft().done()
                process(final=True)
            finally:
                batcher.flush()
            await batcher.barrier()
        unit = "line" if args.framing == "lines" else "record"
        if len(touched) == 1:
            [(journal, last)] = touched.items()
            resp = await last.done()
            where = f"{journal}; write head {resp.commit.end}"
        else:
            where = f"{len(touched)} journals"
        io.err(f"appended {count} {unit}(s) to {where}")
        return 0


# --- fragments --------------------------------------------------------------------------


def _fragments_request(args: argparse.Namespace, journal: str) -> pb.FragmentsRequest:
    req = pb.FragmentsRequest(journal=journal)
    if args.from_time:
        req.begin_mod_time = parse_time(args.from_time)
    if args.to_time:
        req.end_mod_time = parse_time(args.to_time)
    if args.url_ttl:
        req.signatureTTL.CopyFrom(parse_duration(args.url_ttl))
    return req


async def cmd_fragments(args: argparse.Namespace, io: Streams) -> int:
    async with _client(args) as client:
        journals = await list_all_journals(client, _selector(args.selector))
        results: list[tuple[str, list[pb.FragmentsResponse._Fragment]]] = []
        for j in journals:
            frags = await list_all_fragments(client, _fragments_request(args, j.spec.name))
            results.append((j.spec.name, frags))
    if args.format == "json":
        docs = []
        for _, frags in results:
            for f in frags:
                d = json_format.MessageToDict(f.spec, preserving_proto_field_name=True)
                d["begin"], d["end"] = f.spec.begin, f.spec.end
                d["mod_time"] = f.spec.mod_time
                d["sum"] = sha1sum_hex(f.spec.sum)
                if f.signed_url:
                    d["signed_url"] = f.signed_url
                docs.append(d)
        io.out(json.dumps(docs, indent=2))
        return 0
    header = ["JOURNAL", "BEGIN", "END", "SIZE", "CODEC", "PERSISTED", "STORE"]
    if args.url_ttl:
        header.append("URL")
    rows = []
    for name, frags in results:
        for f in frags:
            s = f.spec
            row = [
                name,
                str(s.begin),
                str(s.end),
                str(s.end - s.begin),
                pb.CompressionCodec.Name(s.compression_codec),
                _fmt_time(s.mod_time),
                s.backing_store or "-",
            ]
            if args.url_ttl:
                row.append(f.signed_url or "-")
            rows.append(row)
    io.out(render_table(header, rows))
    return 0


# --- prune ------------------------------------------------------------------------------


def _seconds(d: Duration) -> float:
    return d.ToNanoseconds() / 1e9


async def cmd_prune(args: argparse.Namespace, io: Streams) -> int:
    now = time.time()
    total_frags = total_bytes = 0
    verb = "would prune" if args.dry_run else "pruned"
    async with _client(args) as client:
        journals = await list_all_journals(client, _selector(args.selector))
        for j in journals:
            retention = _seconds(j.spec.fragment.retention)
            if retention <= 0:
                io.err(f"skip journal={j.spec.name}: retention is forever")
                continue
            horizon = int(now - retention)
            frags = await list_all_fragments(client, pb.FragmentsRequest(journal=j.spec.name))
            doomed = [
                f.spec for f in frags if f.spec.backing_store and 0 < f.spec.mod_time < horizon
            ]
            n_bytes = 0
            for i, frag in enumerate(doomed, 1):
                if not args.dry_run:
                    await store_for_url(frag.backing_store).remove(frag)
                n_bytes += frag.end - frag.begin
                if i % 100 == 0:
                    io.err(f"{verb} {i}/{len(doomed)} fragments of {j.spec.name}")
                io.out(
                    f"{verb} {j.spec.name} [{frag.begin}, {frag.end}) {frag.backing_store} "
                    f"persisted {_fmt_time(frag.mod_time)}"
                )
            io.err(
                f"{verb} journal={j.spec.name} fragments={len(doomed)} bytes={n_bytes} "
                f"retention={format_duration(j.spec.fragment.retention)}"
            )
            total_frags += len(doomed)
            total_bytes += n_bytes
    io.err(f"{verb} {total_frags} fragment(s), {total_bytes} bytes of content in total")
    return 0


# --- store-health -----------------------------------------------------------------------


async def cmd_store_health(args: argparse.Namespace, io: Streams) -> int:
    async with _client(args) as client:
        stores: Sequence[str] = list(args.store)
        if not stores:
            journals = await list_all_journals(client, _selector(args.selector))
            stores = sorted({s for j in journals for s in j.spec.fragment.stores})
            if not stores:
                raise GazctlError("no fragment stores: give --store or select journals with stores")
        unhealthy = 0
        for store in stores:
            try:
                await fragment_store_health(client, store)
            except BrokerError as err:
                unhealthy += 1
                io.out(f"UNHEALTHY {store}: {err.detail or err}")
            else:
                io.out(f"OK        {store}")
    return 1 if unhealthy else 0
