"""``gazctl shards ...``: consumer shards' specs and assignments, and their recovery logs.

Spec commands talk to a consumer process's ``consumer.Shard`` service (``--consumer``, env
CONSUMER_ADDRESS; several addresses are tried in turn, `gazctl.consumers`): ``list`` (with
``--lag``, which also asks ``--broker`` for the write heads of the shards' sources), ``stat``
(the offsets each shard read through and published at, optionally once it read through given
offsets), ``apply`` and ``edit`` (the hierarchical YAML of `gazctl.shardspace`), and
``unassign``. Selectors (``-l``) match shard labels and the ``id`` meta-label:
``-l 'id in (shard-1, shard-2)'``.

    gazctl shards list -l app=word-count --lag
    gazctl shards stat -l app=word-count --read-through words/part-000=1234
    gazctl shards apply --specs shards.yaml
    gazctl shards unassign -l app=word-count --failed

Recovery-log tools read hints from files (``--hints FILE``, Gazette's JSON or binary FSMHints)
or from etcd, where shards store them (``--etcd``, ``--hint-prefix``, ``--shard``: the keys
``{hint_prefix}/{shard}.primary`` and ``.backup.N``); the recovery log and hint keys are given
explicitly.

    gazctl shards recover --log recovery/shard-a --hints hints.json --dir /tmp/shard-a
    gazctl shards prune --log recovery/shard-a --etcd 127.0.0.1:2379 \\
        --hint-prefix /app/hints --shard shard-a --dry-run
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from gazette.consumer.hints import load_hints
from gazette.gazctl.etcd_tls import add_etcd_tls_flags, etcd_tls_of
from gazette.gazctl.export import add_shards_export
from gazette.gazctl.main import GazctlError, Streams, journal_client
from gazette.gazctl.prune import prune_log
from gazette.gazctl.shards_specs import register_spec_commands
from gazette.keyspace.etcd import Etcd, EtcdError
from gazette.mainboilerplate.etcd_endpoints import InvalidEndpoint, parse_endpoints
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.hints import hints_from_bytes
from gazette.recoverylog.player import PlaybackError, PlaybackProgress, Player
from gazette.recoverylog.prune import PruneError
from gazette.recoverylog.segments import InconsistentSegments, InvalidHints, live_log_segments

__all__ = ["register"]

DEFAULT_ETCD = "127.0.0.1:2379"

Handler = Callable[[argparse.Namespace, Streams], Coroutine[Any, Any, int]]


def register(groups: Any, common: argparse.ArgumentParser) -> None:
    """Add the ``shards`` group and its commands to the `groups` subparsers."""
    group = groups.add_parser(
        "shards", help="interact with consumer shards (specs, assignments, recovery logs)"
    )
    cmds = group.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register_spec_commands(cmds, common)

    def cmd(name: str, help: str, handler: Handler) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = cmds.add_parser(
            name, help=help, description=help, parents=[common]
        )
        p.set_defaults(handler=_one_line_errors(handler))
        p.add_argument("--log", required=True, help="the recovery log journal")
        g = p.add_argument_group("hints in etcd")
        g.add_argument(
            "--etcd",
            default=None,
            help="etcd endpoints to read hints from, comma-separated (env ETCD_ADDRESS; "
            f"default {DEFAULT_ETCD} "
            "when --hint-prefix is given)",
        )
        add_etcd_tls_flags(g)
        g.add_argument("--hint-prefix", default="", help="the shards' ShardSpec.hint_prefix")
        return p

    p = cmd("recover", "play a recovery log into a local directory", cmd_recover)
    p.add_argument("--hints", default="", help="FSMHints file (JSON or binary proto)")
    p.add_argument("--shard", default="", help="shard id whose hints (in etcd) to use")
    p.add_argument(
        "--backup",
        type=int,
        default=None,
        help="use the shard's backup.N hints (default: primary, else the newest backup)",
    )
    p.add_argument("--dir", required=True, help="directory to recover into")
    p.add_argument("--force", action="store_true", help="replace the content of a non-empty --dir")
    p.add_argument(
        "--progress-interval", type=float, default=1.0, help="seconds between progress lines"
    )

    p = cmd("prune", "delete recovery log fragments which no hints need", cmd_prune)
    p.add_argument(
        "--hints",
        action="append",
        default=[],
        metavar="FILE",
        help="FSMHints file of a shard (repeatable: every shard and backup which may be played)",
    )
    p.add_argument(
        "--shard",
        action="append",
        default=[],
        help="shard id whose primary and backup hints (in etcd) to honour (repeatable)",
    )
    p.add_argument("--dry-run", action="store_true", help="report, delete nothing")

    add_shards_export(cmds, common)


def _one_line_errors(handler: Handler) -> Handler:
    async def run(args: argparse.Namespace, io: Streams) -> int:
        try:
            return await handler(args, io)
        except (PruneError, InvalidHints, InconsistentSegments, PlaybackError, EtcdError) as err:
            raise GazctlError(str(err)) from err

    return run


# --- hints ------------------------------------------------------------------------------


def read_hints_file(path: str, log: str) -> rpb.FSMHints:
    """Hints from a file (JSON or binary proto), checked to be consistent hints of `log`."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise GazctlError(f"reading hints {path}: {err.strerror or err}") from err
    try:
        hints = hints_from_bytes(data)
        _check(hints, log)
    except (InvalidHints, ValueError) as err:
        raise GazctlError(f"hints {path}: {err}") from err
    return hints


def _check(hints: rpb.FSMHints, log: str) -> None:
    if hints.log != log:
        raise InvalidHints(f"hints are of log {hints.log!r}, not {log!r}")
    live_log_segments(hints)


def _etcd_endpoint(args: argparse.Namespace) -> str:
    if not args.hint_prefix:
        raise GazctlError("give --hints FILE, or --hint-prefix and --shard to read hints from etcd")
    endpoints = str(args.etcd or os.environ.get("ETCD_ADDRESS") or DEFAULT_ETCD)
    try:
        parse_endpoints(endpoints)
    except InvalidEndpoint as err:
        raise GazctlError(f"--etcd: {err}") from err
    return endpoints


async def _etcd_hints(args: argparse.Namespace, shards: list[str]) -> dict[str, list[Any]]:
    async with Etcd(_etcd_endpoint(args), tls=etcd_tls_of(args)) as etcd:
        return {s: await load_hints(etcd, args.hint_prefix, s, log=args.log) for s in shards}


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def progress_line(p: PlaybackProgress) -> str:
    """One line of playback progress: bytes read of bytes to read, rate and ETA."""
    pct = 100.0 * p.bytes_read / p.bytes_to_read if p.bytes_to_read else 100.0
    eta = p.eta
    return (
        f"recover log={p.log} state={p.state.value} read {_fmt_bytes(p.bytes_read)} / "
        f"{_fmt_bytes(p.bytes_to_read)} ({pct:.0f}%) at {_fmt_bytes(p.rate)}/s "
        f"eta {'?' if eta is None else f'{eta:.0f}s'}"
    )


# --- recover ----------------------------------------------------------------------------


async def _recover_hints(args: argparse.Namespace, io: Streams) -> rpb.FSMHints | None:
    if args.hints:
        if args.shard:
            raise GazctlError("give either --hints or --shard, not both")
        return read_hints_file(args.hints, args.log)
    if not args.shard:
        raise GazctlError("give --hints FILE, or --shard (with --hint-prefix) to read from etcd")
    sets = (await _etcd_hints(args, [args.shard]))[args.shard]
    if args.backup is not None:
        index = args.backup + 1
        if args.backup < 0 or index >= len(sets) or sets[index] is None:
            raise GazctlError(f"shard {args.shard} has no backup.{args.backup} hints")
        hints: rpb.FSMHints | None = sets[index]
        source = f"backup.{args.backup}"
    else:
        picked = next(((i, h) for i, h in enumerate(sets) if h is not None), None)
        if picked is None:
            io.err(f"shard {args.shard} has no hints: playing {args.log} from its beginning")
            return None
        hints = picked[1]
        source = "primary" if picked[0] == 0 else f"backup.{picked[0] - 1}"
    io.err(f"using {source} hints of shard {args.shard}")
    return hints


async def cmd_recover(args: argparse.Namespace, io: Streams) -> int:
    directory = Path(args.dir)
    if directory.exists() and any(directory.iterdir()) and not args.force:
        raise GazctlError(f"{directory} is not empty (give --force to replace its content)")
    hints = await _recover_hints(args, io)
    directory.mkdir(parents=True, exist_ok=True)

    def report(p: PlaybackProgress) -> None:
        io.err(progress_line(p))

    async with journal_client(args) as client:
        player = Player(
            client,
            args.log,
            hints,
            directory,
            on_progress=report,
            progress_interval=args.progress_interval,
        )
        t0 = time.perf_counter()
        fsm = await player.play()
        elapsed = time.perf_counter() - t0
    p = player.progress
    io.err(
        f"recovered log={args.log} dir={directory} files={len(fsm.links)} "
        f"properties={len(fsm.properties)} read={p.bytes_read} head={player.write_head} "
        f"seconds={elapsed:.2f} rate={_fmt_bytes(p.bytes_read / elapsed if elapsed else 0)}/s"
    )
    return 0


# --- prune ------------------------------------------------------------------------------


async def cmd_prune(args: argparse.Namespace, io: Streams) -> int:
    if not args.hints and not args.shard:
        raise GazctlError("give --hints FILE..., or --shard ID... (with --hint-prefix)")
    sets: dict[str, list[rpb.FSMHints | None]] = {}
    for path in args.hints:
        sets[f"file {path}"] = [read_hints_file(path, args.log)]
    if args.shard:
        sets.update(await _etcd_hints(args, args.shard))
    verb = "would prune" if args.dry_run else "pruned"

    def progress(i: int, n: int, frag: Any) -> None:
        io.out(f"{verb} {frag.journal} [{frag.begin}, {frag.end}) {frag.backing_store}")
        if i % 100 == 0:
            io.err(f"{verb} {i}/{n} fragments of {args.log}")

    async with journal_client(args) as client:
        result = await prune_log(client, args.log, sets, dry_run=args.dry_run, progress=progress)
    io.err(
        f"{verb} journal={args.log} fragments={len(result.deleted)} "
        f"bytes={result.bytes_deleted} kept_fragments={len(result.kept)} "
        f"kept_bytes={result.bytes_kept} hint_sets={sum(len(v) for v in sets.values())}"
    )
    return 0
