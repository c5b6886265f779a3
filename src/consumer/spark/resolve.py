"""Driver side of the shards export: which shards, from which hints.

`resolve_shards` reads the consumer application's ShardSpecs and the selected shards' hints
straight from etcd (one snapshot per shard, as `load_hints` reads them), so that every
problem a user can fix (an unknown shard, a selector matching nothing, hints not written yet,
a store of another kind) is raised before Spark runs any job.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from gazette.broker.protocol.selector import matches, parse_label_selector
from gazette.consumer.hints import backup_hints_key, load_hints, primary_hints_key
from gazette.consumer.protocol import pb
from gazette.consumer.spark.errors import (
    BrokersUnresponsive,
    ExportError,
    MissingHints,
    NoShardsMatched,
    ShardNotFound,
    WrongStoreKind,
)
from gazette.consumer.spark.options import ShardsOptions
from gazette.consumer.spec import ShardKeys, recovery_log_of, shard_labels
from gazette.keyspace.etcd import Etcd
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.hints import hints_to_json
from gazette.recoverylog.segments import InvalidHints

__all__ = [
    "AUTO_SPLIT_BYTES",
    "ROCKSDB_MARKER",
    "ShardPlan",
    "ShardSplit",
    "estimated_bytes",
    "plan_splits",
    "plan_splits_sync",
    "resolve_shards",
    "resolve_shards_sync",
]

T = TypeVar("T")

ROCKSDB_MARKER = "/IDENTITY"
"""A property every recorded RocksDB has in its hints (RocksDB writes IDENTITY at creation,
and the Recorder keeps it as a property) and no other store has."""


@dataclass(frozen=True)
class ShardPlan:
    """What a task needs to export one shard (picklable: it is a partition's value)."""

    shard: str
    log: str
    """The shard's recovery log."""
    hints_key: str
    """The etcd key the hints were read from."""
    hints_json: bytes
    """The hints (Gazette's JSON encoding)."""


async def resolve_shards(opts: ShardsOptions) -> list[ShardPlan]:
    """The selected shards (by id order) and their hints of kind ``opts.hints``.

    Raises `ShardNotFound`, `NoShardsMatched`, `MissingHints`, `WrongStoreKind` (a RocksDB
    asked for but the hints lack RocksDB's IDENTITY, or the reverse), `ExportError` for
    hints which do not parse, and `EtcdError` if etcd cannot be reached.
    """
    keys = ShardKeys(opts.root)
    async with Etcd(opts.etcd, tls=opts.etcd_tls) as etcd:
        resp = await etcd.get_prefix(keys.items.encode())
        specs: dict[str, pb.ShardSpec] = {}
        for kv in resp.kvs:
            spec = pb.ShardSpec.FromString(bytes(kv.value))
            specs[spec.id] = spec

        if opts.shards:
            for shard in opts.shards:
                if shard not in specs:
                    raise ShardNotFound(shard, opts.root)
            selected = [specs[s] for s in sorted(opts.shards)]
        else:
            selector = parse_label_selector(opts.selector)
            selected = [s for _, s in sorted(specs.items()) if matches(selector, shard_labels(s))]
            if not selected:
                raise NoShardsMatched(
                    f"no shard matches selector {opts.selector!r} "
                    f"({len(specs)} shards under {keys.items})"
                )

        out = []
        for spec in selected:
            out.append(await _plan(etcd, spec, opts))
        return out


async def _plan(etcd: Etcd, spec: pb.ShardSpec, opts: ShardsOptions) -> ShardPlan:
    log = recovery_log_of(spec)
    if not log:
        raise MissingHints(spec.id, "has no recovery log (recovery_log_prefix is empty)")
    n = opts.backup_index
    try:
        hints = await load_hints(etcd, spec.hint_prefix, spec.id, log=log)
    except InvalidHints as err:
        raise ExportError(f"shard {spec.id!r}: {err}") from err
    if n is None:
        key = primary_hints_key(spec.hint_prefix, spec.id)
        found = hints[0]
    else:
        key = backup_hints_key(spec.hint_prefix, spec.id, n)
        found = hints[1 + n] if 1 + n < len(hints) else None
    if found is None:
        kinds = ["primary"] if hints[0] is not None else []
        kinds += [f"backup.{i}" for i, h in enumerate(hints[1:]) if h is not None]
        have = f"hints present: {', '.join(kinds)}" if kinds else "no hints at all yet"
        if n is None:
            advice = (
                "the shard's primary writes them periodically once it is up (consumer "
                "--hint-interval): wait for them, or export from hints=backup.0"
            )
        else:
            advice = "backup hints are written when a primary recovers the shard"
        raise MissingHints(spec.id, f"no {opts.hints} hints at {key} ({have}); {advice}")
    _check_kind(spec.id, found, opts.store)
    return ShardPlan(shard=spec.id, log=log, hints_key=key, hints_json=hints_to_json(found))


def _check_kind(shard: str, hints: rpb.FSMHints, store: str) -> None:
    if not hints.live_nodes:
        return  # Hints of an empty log: nothing to tell by.
    rocksdb = any(p.path == ROCKSDB_MARKER for p in hints.properties)
    if store == "rocksdb" and not rocksdb:
        raise WrongStoreKind(shard, store, f"no RocksDB (its hints lack {ROCKSDB_MARKER})")
    if store != "rocksdb" and rocksdb:
        raise WrongStoreKind(shard, store, "a RocksDB (its hints hold RocksDB's IDENTITY)")


def resolve_shards_sync(opts: ShardsOptions) -> list[ShardPlan]:
    """`resolve_shards` from synchronous code (a Spark driver-side Python worker)."""
    return asyncio.run(resolve_shards(opts))


AUTO_SPLIT_BYTES = 4 << 20
"""With ``splits=auto``, a RocksDB shard gets one split per this many bytes of live log
content (what playback reads), up to its share of the driver's cores: a split must be large
enough that its playback outweighs a task's start (docs/spark.md)."""


@dataclass(frozen=True)
class ShardSplit:
    """One input partition: key range `index` of `count` of a shard's store as recorded
    through `end_offset` of its log (every split of a shard plays to the same offset, so all
    see one snapshot)."""

    plan: ShardPlan
    end_offset: int
    index: int = 0
    count: int = 1
    estimated_bytes: int = 0
    """What playing the shard reads (live hinted segments and the log after them)."""


def estimated_bytes(hints: rpb.FSMHints, end_offset: int) -> int:
    """Bytes of `hints.log` a Player reads playing to `end_offset`: the union of the live
    hinted segments (one of unknown extent reaching to the next or to the end), and the log
    after the last of them."""
    intervals = []
    for node in hints.live_nodes:
        for seg in node.segments:
            if seg.log and seg.log != hints.log:
                continue
            last = seg.last_offset or end_offset
            intervals.append((seg.first_offset, max(seg.first_offset, min(last, end_offset))))
    intervals.sort()
    total, reach = 0, 0
    for begin, end in intervals:
        begin = max(begin, reach)
        if end > begin:
            total += end - begin
            reach = end
    return total + max(0, end_offset - reach)


def _auto_splits(opts: ShardsOptions, estimate: int, shards: int) -> int:
    cores = os.cpu_count() or 1
    share = max(1, -(-cores // shards))
    return max(1, min(estimate // AUTO_SPLIT_BYTES, share))


async def plan_splits(opts: ShardsOptions) -> list[ShardSplit]:
    """The input partitions of an export: `resolve_shards`, then for each shard the current
    write head of its recovery log (learnt by an empty append, as a Player does; the state to
    export) and its splits: RocksDB shards ``opts.splits`` each (auto: by size, see
    `AUTO_SPLIT_BYTES`), other stores one."""
    from gazette.broker.client import JournalNotFound, append
    from gazette.broker.protocol import protocol_pb2 as bpb
    from gazette.recoverylog.hints import hints_from_json

    plans = await resolve_shards(opts)
    out: list[ShardSplit] = []
    async with opts.journal_client() as client:
        for plan in plans:
            try:
                resp = await _bounded(
                    append(client, bpb.AppendRequest(journal=plan.log)), opts, plan
                )
            except JournalNotFound:
                raise ExportError(
                    f"shard {plan.shard!r}: its recovery log {plan.log!r} is not a journal "
                    f"of brokers {', '.join(opts.brokers)}"
                ) from None
            end = int(resp.commit.end)
            estimate = estimated_bytes(hints_from_json(plan.hints_json), end)
            if opts.store != "rocksdb":
                count = 1
            elif opts.splits:
                count = opts.splits
            else:
                count = _auto_splits(opts, estimate, len(plans))
            out.extend(ShardSplit(plan, end, i, count, estimate) for i in range(count))
    return out


async def _bounded(call: Awaitable[T], opts: ShardsOptions, plan: ShardPlan) -> T:
    """`call` (the empty append learning `plan`'s log's write head), raising
    `BrokersUnresponsive` if it takes over option ``broker_timeout``."""
    from gazette.consumer.spark.stall import within

    def late() -> Exception:
        return BrokersUnresponsive(
            f"shard {plan.shard!r}: no broker of {', '.join(opts.brokers)} answered within "
            f"{opts.broker_timeout:g}s (learning the write head of recovery log {plan.log!r}): "
            "are they reachable? (options broker, broker_timeout)"
        )

    return await within(call, opts.broker_timeout, late)


def plan_splits_sync(opts: ShardsOptions) -> list[ShardSplit]:
    """`plan_splits` from synchronous code."""
    return asyncio.run(plan_splits(opts))
