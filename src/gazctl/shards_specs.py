"""``gazctl shards list | stat | apply | edit | unassign``: shard specs, assignments and
progress, through a consumer's ``consumer.Shard`` service (`gazctl.consumers` picks the
consumer; see `gazctl.shards` for the group's overview)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from gazette.broker.client import JournalClient, get_journal
from gazette.broker.client.errors import JournalNotFound
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.labels import value_of
from gazette.broker.protocol.selector import parse_label_selector
from gazette.consumer.protocol import pb
from gazette.consumer.shard_client import (
    ShardClient,
    apply_batches,
    apply_shards,
    list_shards,
    stat_shard,
    unassign_shards,
)
from gazette.consumer.spec import recovery_log_of, validate_shard_spec
from gazette.gazctl.consumers import (
    DEFAULT_CONSUMER,
    ConsumerError,
    Consumers,
    add_consumer_client_flags,
)
from gazette.gazctl.main import (
    GazctlError,
    Streams,
    journal_client,
    kept_edit_error,
    raise_if_txn_too_large,
)
from gazette.gazctl.output import apply_plan, render_table
from gazette.gazctl.shardspace import apply_changes, dump_set, load_set, set_from_list
from gazette.gazctl.spec_errors import in_yaml_terms
from gazette.message.framing import UnknownFramingError, framing_for

__all__ = ["DEFAULT_CONSUMER", "register_spec_commands"]

RECOVERY_LOG_CONTENT_TYPE = "application/x-gazette-recoverylog"
UNASSIGN_BATCH = 100  # shards per Unassign request, as upstream
STAT_TIMEOUT = 60.0

Handler = Callable[[argparse.Namespace, Streams], Coroutine[Any, Any, int]]
Shards = list[pb.ListResponse.Shard]


def register_spec_commands(cmds: Any, common: argparse.ArgumentParser) -> None:
    """Add ``list``, ``apply``, ``edit`` and ``unassign`` to the ``shards`` subparsers."""

    def cmd(
        name: str, help: str, handler: Handler, *, selector: bool | None = False
    ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = cmds.add_parser(
            name, help=help, description=help, parents=[common]
        )
        p.set_defaults(handler=handler)
        p.add_argument(
            "--consumer",
            "--consumer.address",
            dest="consumer",
            default=os.environ.get("CONSUMER_ADDRESS", DEFAULT_CONSUMER),
            help="gRPC address of a consumer process (gazette-consumer --listen), e.g. "
            "127.0.0.1:8090 or http://host:8090; several, comma-separated, are tried in turn "
            "while one is down (env CONSUMER_ADDRESS; default %(default)s)",
        )
        add_consumer_client_flags(p)
        if selector is not False:
            p.add_argument(
                "-l",
                "--selector",
                required=bool(selector),
                default="",
                help="label selector of shards, e.g. 'app=word-count' or 'id in (a, b)'",
            )
        return p

    p = cmd("list", "list shards, their status and route", cmd_list, selector=None)
    p.add_argument(
        "-o", "--format", choices=("table", "yaml", "json"), default="table", help="output format"
    )
    p.add_argument(
        "--lag",
        action="store_true",
        help="show each source's unread bytes (its write head, from --broker, less the "
        "shard's read-through offset)",
    )
    p.add_argument("-L", "--label-columns", default="", help="comma-separated labels as columns")

    p = cmd(
        "stat",
        "show shards' progress: the offsets each has read its sources through and "
        "published its outputs through (asked of each shard's primary)",
        cmd_stat,
        selector=True,
    )
    p.add_argument(
        "--read-through",
        action="append",
        default=[],
        metavar="JOURNAL=OFFSET",
        help="first wait until each selected shard reading JOURNAL has read it through OFFSET "
        "(repeatable), e.g. the offset an append returned",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=STAT_TIMEOUT,
        help="seconds to wait for each shard's answer",
    )
    p.add_argument(
        "-o", "--format", choices=("table", "json"), default="table", help="output format"
    )

    p = apply_p = cmd("apply", "apply a YAML of shard specs (common: / shards:)", cmd_apply)
    p.add_argument("--specs", default="-", help="YAML file of specs ('-': stdin)")
    p.add_argument("--dry-run", action="store_true", help="print the changes, apply nothing")
    p.add_argument(
        "--max-txn-size",
        type=int,
        default=0,
        help="changes per etcd transaction (0: all in one; etcd takes at most --max-txn-ops, "
        "128 by default; batches apply one after another, not atomically)",
    )

    p = cmd("edit", "edit shard specs in $EDITOR and apply them", cmd_edit, selector=True)
    p.add_argument(
        "--max-txn-size",
        type=int,
        default=0,
        help="changes per etcd transaction (0: all in one; etcd takes at most --max-txn-ops, "
        "128 by default; batches apply one after another, not atomically)",
    )
    for parser in (apply_p, p):
        parser.add_argument(
            "--skip-journal-check",
            action="store_true",
            help="do not ask --broker whether sources and recovery logs exist with the "
            "right content types",
        )

    p = cmd(
        "unassign",
        "remove shards' primary (and failed) assignments, for the allocator to reassign them",
        cmd_unassign,
        selector=True,
    )
    p.add_argument(
        "--failed", action="store_true", help="only remove assignments of FAILED replicas"
    )
    p.add_argument("--dry-run", action="store_true", help="print the shards, change nothing")


def _selector(text: str) -> bpb.LabelSelector | None:
    return parse_label_selector(text) if text else None


# --- list -------------------------------------------------------------------------------


def _code(status: pb.ReplicaStatus) -> str:
    return pb.ReplicaStatus.Code.Name(status.code)


def primary_status(shard: pb.ListResponse.Shard) -> str:
    """The status code of the shard's primary, or ``<none>`` without one."""
    r = shard.route
    if 0 <= r.primary < len(shard.status):
        return _code(shard.status[r.primary])
    return "<none>"


def route_text(shard: pb.ListResponse.Shard) -> str:
    """Each assigned consumer as ``zone#suffix:STATUS``, in route order; ``*`` marks the
    primary."""
    r = shard.route
    if not r.members:
        return "<none>"
    parts = []
    for i, m in enumerate(r.members):
        status = _code(shard.status[i]) if i < len(shard.status) else "?"
        parts.append(f"{m.zone}#{m.suffix}{'*' if i == r.primary else ''}:{status}")
    return ",".join(parts)


def failure_text(shard: pb.ListResponse.Shard) -> str:
    """The errors of the shard's replicas that have any (FAILED ones), each as
    ``zone#suffix: error``, its first line only (``-o json`` has them whole); "" if none."""
    parts = []
    for i, st in enumerate(shard.status):
        if not st.errors:
            continue
        m = shard.route.members[i] if i < len(shard.route.members) else None
        who = f"{m.zone}#{m.suffix}" if m is not None else f"replica {i}"
        first = "; ".join((e.strip().splitlines() or [""])[0] for e in st.errors)
        parts.append(f"{who}: {first}")
    return " | ".join(parts)


def _shard_json(shard: pb.ListResponse.Shard, lag: dict[str, int] | None) -> dict[str, Any]:
    doc = json_format.MessageToDict(shard, preserving_proto_field_name=True)
    r = shard.route
    # proto3 JSON drops zero values, and a primary at index 0 is the usual case: spell it out.
    doc["route"] = {
        "members": [{"zone": m.zone, "suffix": m.suffix} for m in r.members],
        "primary": r.primary if 0 <= r.primary < len(r.members) else -1,
        "endpoints": list(r.endpoints),
    }
    doc["status"] = [
        {"code": _code(s), **({"errors": list(s.errors)} if s.errors else {})} for s in shard.status
    ]
    if lag is not None:
        doc["lag"] = lag
    return doc


async def _write_head(client: JournalClient, journal: str) -> int:
    """The journal's write head, from a non-blocking metadata read at offset -1."""
    req = bpb.ReadRequest(journal=journal, offset=-1, block=False, metadata_only=True)
    call = client.stub_for(journal, primary=False).Read(req)
    try:
        async for resp in call:
            if resp.status not in (bpb.OK, bpb.OFFSET_NOT_YET_AVAILABLE):
                raise GazctlError(
                    f"reading the write head of {journal}: {bpb.Status.Name(resp.status)}"
                )
            client.update_route(journal, resp.header if resp.HasField("header") else None)
            return int(resp.write_head)
    finally:
        call.cancel()
    raise GazctlError(f"reading the write head of {journal}: no response")


async def shard_lag(
    consumers: Consumers, jc: JournalClient, shard: pb.ListResponse.Shard
) -> dict[str, int]:
    """Bytes of each source journal the shard has yet to read: write head - read through."""
    stat = await consumers.call(lambda sc: stat_shard(sc, shard.spec.id))
    out: dict[str, int] = {}
    for journal, offset in sorted(stat.read_through.items()):
        out[journal] = max(0, await _write_head(jc, journal) - offset)
    return out


def _render(shards: Shards, args: argparse.Namespace, lags: dict[str, dict[str, int]]) -> str:
    if args.format == "json":
        return json.dumps(
            [_shard_json(s, lags.get(s.spec.id) if args.lag else None) for s in shards],
            indent=2,
        )
    if args.format == "yaml":
        if not shards:
            return "# no shards matched"
        return dump_set(set_from_list(shards)).rstrip("\n")
    label_cols = [c.strip() for c in args.label_columns.split(",") if c.strip()]
    header = ["ID", "STATUS", "ROUTE", *(c.upper() for c in label_cols)]
    if args.lag:
        header.append("LAG")
    # Last, as errors are free text: the column is there when a listed shard has any.
    failures = [failure_text(s) for s in shards]
    if any(failures):
        header.append("ERRORS")
    rows = []
    for s, failure in zip(shards, failures, strict=True):
        row = [s.spec.id, primary_status(s), route_text(s)]
        for c in label_cols:
            values = [lb.value for lb in s.spec.labels.labels if lb.name == c]
            row.append(",".join(values) if values else "<none>")
        if args.lag:
            lag = lags.get(s.spec.id, {})
            row.append(", ".join(f"{j}:{n}" for j, n in lag.items()) or "-")
        if any(failures):
            row.append(failure or "-")
        rows.append(row)
    return render_table(header, rows)


async def cmd_list(args: argparse.Namespace, io: Streams) -> int:
    selector = _selector(args.selector)
    async with Consumers.of_args(args, io) as consumers:
        shards = await consumers.call(lambda sc: list_shards(sc, selector))
        lags: dict[str, dict[str, int]] = {}
        if args.lag and shards:
            async with journal_client(args) as jc:
                for s in shards:
                    lags[s.spec.id] = await shard_lag(consumers, jc, s)
    io.out(_render(shards, args, lags))
    return 0


# --- stat -------------------------------------------------------------------------------


def _read_through_args(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        journal, sep, offset = item.rpartition("=")
        try:
            out[journal.strip()] = int(offset)
        except ValueError:
            sep = ""
        if not sep or not journal.strip() or out.get(journal.strip(), 0) < 0:
            raise GazctlError(f"--read-through {item!r}: expected JOURNAL=OFFSET (OFFSET >= 0)")
    return out


def _primary(shard: pb.ListResponse.Shard) -> str:
    r = shard.route
    if 0 <= r.primary < len(r.members):
        m = r.members[r.primary]
        return f"{m.zone}#{m.suffix}"
    return "<none>"


def _offsets_text(offsets: Any) -> str:
    return ", ".join(f"{j}:{o}" for j, o in sorted(offsets.items())) or "-"


async def _stat(sc: ShardClient, req: pb.StatRequest, timeout: float) -> pb.StatResponse:
    """Stat, whatever status it answers (the caller shows it)."""
    resp: pb.StatResponse = await sc.stub.Stat(req, timeout=timeout)
    return resp


async def cmd_stat(args: argparse.Namespace, io: Streams) -> int:
    wanted = _read_through_args(args.read_through)
    selector = _selector(args.selector)
    async with Consumers.of_args(args, io) as consumers:
        shards = await consumers.call(lambda sc: list_shards(sc, selector))
        if not shards:
            raise GazctlError(f"no shards match selector {args.selector!r}")
        read = {src.journal for s in shards for src in s.spec.sources}
        unread = sorted(set(wanted) - read)
        if unread:
            raise GazctlError(f"--read-through: no selected shard reads {', '.join(unread)}")
        stats: list[tuple[pb.ListResponse.Shard, pb.StatResponse]] = []
        for shard in shards:
            sources = {src.journal for src in shard.spec.sources}
            req = pb.StatRequest(
                shard=shard.spec.id,
                read_through={j: o for j, o in wanted.items() if j in sources},
            )
            try:
                resp = await consumers.call(partial(_stat, req=req, timeout=args.timeout))
            except ConsumerError as err:
                cause = err.__cause__
                if isinstance(cause, grpc.aio.AioRpcError) and (
                    cause.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                ):
                    raise GazctlError(
                        f"shard {shard.spec.id}: no answer within {args.timeout:g}s (--timeout)"
                        + (": has it read through --read-through yet?" if req.read_through else "")
                    ) from err
                raise GazctlError(f"shard {shard.spec.id}: {err}") from err
            stats.append((shard, resp))
    if args.format == "json":
        docs = [
            {
                "id": shard.spec.id,
                "status": pb.Status.Name(resp.status),
                "primary": _primary(shard),
                "read_through": dict(sorted(resp.read_through.items())),
                "publish_at": dict(sorted(resp.publish_at.items())),
            }
            for shard, resp in stats
        ]
        io.out(json.dumps(docs, indent=2))
    else:
        header = ["ID", "STATUS", "PRIMARY", "READ_THROUGH", "PUBLISH_AT"]
        rows = [
            [
                shard.spec.id,
                pb.Status.Name(resp.status),
                _primary(shard),
                _offsets_text(resp.read_through),
                _offsets_text(resp.publish_at),
            ]
            for shard, resp in stats
        ]
        io.out(render_table(header, rows))
    failed = [f"{sh.spec.id} ({pb.Status.Name(r.status)})" for sh, r in stats if r.status != pb.OK]
    if failed:
        raise GazctlError(f"Stat failed for shard(s) {', '.join(failed)}")
    return 0


# --- apply / edit -----------------------------------------------------------------------


async def verify_referenced_journals(jc: JournalClient, req: pb.ApplyRequest) -> None:
    """Check, as upstream's gazctl does before applying, that every upserted shard's sources
    exist with a content type having a message framing, and that its recovery log exists
    with the recovery-log content type. Raises GazctlError naming the shard and journal."""
    cache: dict[str, bpb.JournalSpec] = {}

    async def lookup(shard: str, name: str) -> bpb.JournalSpec:
        if name not in cache:
            try:
                cache[name] = await get_journal(jc, name)
            except JournalNotFound:
                raise GazctlError(f"shard {shard}: journal {name} does not exist") from None
        return cache[name]

    for ch in req.changes:
        if not ch.HasField("upsert"):
            continue
        shard = ch.upsert.id
        for src in ch.upsert.sources:
            content_type = value_of((await lookup(shard, src.journal)).labels, "content-type")
            try:
                framing_for(content_type or "")
            except UnknownFramingError as err:
                raise GazctlError(f"shard {shard}: source {src.journal}: {err}") from None
        log = recovery_log_of(ch.upsert)
        if log:
            content_type = value_of((await lookup(shard, log)).labels, "content-type")
            if content_type != RECOVERY_LOG_CONTENT_TYPE:
                raise GazctlError(
                    f"shard {shard}: recovery log {log} has content-type {content_type or ''!r}, "
                    f"expected {RECOVERY_LOG_CONTENT_TYPE!r}"
                )


async def _apply_text(
    consumers: Consumers,
    args: argparse.Namespace,
    text: str,
    io: Streams,
    *,
    dry_run: bool,
    txn_size: int,
) -> int:
    shard_set = load_set(text)
    current: dict[str, int] = {}
    if shard_set.shards:
        # Revisions of the shards as they exist now, for entries that omit `revision`.
        current = {s.spec.id: s.mod_revision for s in await consumers.call(list_shards)}
    changes = apply_changes(shard_set, current)
    for ch in changes:
        if ch.HasField("upsert"):
            try:
                validate_shard_spec(ch.upsert)
            except ValidationError as err:
                raise in_yaml_terms(err, f"shard {ch.upsert.id}") from None
    req = pb.ApplyRequest(changes=changes)
    if not args.skip_journal_check and any(ch.HasField("upsert") for ch in changes):
        async with journal_client(args) as jc:
            await verify_referenced_journals(jc, req)
    if dry_run:
        for line in apply_plan(req, lambda spec: spec.id):
            io.out(line)
        return 0
    if not changes:
        io.err("nothing to apply")
        return 0
    try:
        # One call per batch: a fail-over to another consumer retries only the batch that
        # failed (those before it are applied, and would now fail their revision checks).
        resp = pb.ApplyResponse()
        for batch in apply_batches(req, txn_size):
            resp = await consumers.call(partial(apply_shards, request=batch))
    except ConsumerError as err:
        raise_if_txn_too_large(err.__cause__ or err, len(changes), txn_size)
        raise
    io.err(f"applied {len(changes)} change(s) at revision {resp.header.etcd.revision}")
    return 0


async def cmd_apply(args: argparse.Namespace, io: Streams) -> int:
    text = await io.read_input(args.specs)
    async with Consumers.of_args(args, io) as consumers:
        return await _apply_text(
            consumers, args, text, io, dry_run=args.dry_run, txn_size=args.max_txn_size
        )


_EDIT_HEADER = """\
# Edit the shard specifications below; they are applied when the editor exits. A shard's
# empty fields take the value under `common`. Set `delete: true` on a shard to delete it.
# Keep `revision`: it makes the apply fail if the shard changed meanwhile. Empty the file
# to cancel.
"""


async def cmd_edit(args: argparse.Namespace, io: Streams) -> int:
    selector = _selector(args.selector)
    async with Consumers.of_args(args, io) as consumers:
        shards = await consumers.call(lambda sc: list_shards(sc, selector))
        if not shards:
            raise GazctlError(f"no shards match selector {args.selector!r}")
        original = _EDIT_HEADER + dump_set(set_from_list(shards))
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
            return await _apply_text(
                consumers, args, edited, io, dry_run=False, txn_size=args.max_txn_size
            )
        except (ValidationError, GazctlError) as err:
            raise kept_edit_error(err, edited, "shards apply") from err


# --- unassign ---------------------------------------------------------------------------


async def cmd_unassign(args: argparse.Namespace, io: Streams) -> int:
    selector = _selector(args.selector)
    async with Consumers.of_args(args, io) as consumers:
        listed = await consumers.call(lambda sc: list_shards(sc, selector))
        shards = {s.spec.id: s for s in listed}
        ids = [
            sid
            for sid, s in shards.items()
            if not args.failed or any(st.code == pb.ReplicaStatus.FAILED for st in s.status)
        ]
        done: list[str] = []
        for i in range(0, len(ids), UNASSIGN_BATCH):
            batch = ids[i : i + UNASSIGN_BATCH]
            done += await consumers.call(
                partial(
                    unassign_shards, shards=batch, only_failed=args.failed, dry_run=args.dry_run
                )
            )
    verb = "would unassign" if args.dry_run else "unassigned"
    for sid in done:
        io.out(f"{verb} {sid} (was {route_text(shards[sid])})")
    io.err(f"{verb} {len(done)} of {len(shards)} selected shard(s)")
    return 0
