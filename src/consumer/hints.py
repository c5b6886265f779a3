"""FSMHints of a shard's recovery log, as stored in etcd.

Keys (as upstream's ShardSpec.HintPrimaryKey / HintBackupKeys):

- ``{hint_prefix}/{shard_id}.primary``: hints the shard's primary writes every few minutes
  (from its Recorder), guarded on its assignment so that a deposed primary cannot overwrite
  the hints of its successor;
- ``{hint_prefix}/{shard_id}.backup.N`` for N in [0, hint_backups): hints a new primary
  recovered from, written once playback completed. Each recovery shifts ``backup.N`` to
  ``backup.N+1`` (dropping the last) and writes the recovered hints as ``backup.0``, in one
  transaction which fails if any slot changed since it was read.

Values are Gazette's JSON encoding of FSMHints (`hints_to_json`); readers also accept binary
protobuf (JSON is told apart by a leading ``{``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from aetcd import rpc

from gazette.keyspace.etcd import Compare, Etcd, op_put, prefix_range_end
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.hints import hints_from_bytes, hints_to_json
from gazette.recoverylog.segments import InvalidHints, live_log_segments

__all__ = [
    "HintsConflict",
    "HintsGuardFailed",
    "backup_hints_key",
    "encode_hints",
    "load_hints",
    "primary_hints_key",
    "rotate_backup_hints",
    "store_primary_hints",
]

Encoding = Literal["json", "proto"]


class HintsGuardFailed(Exception):
    """The guard of a hints write did not hold (e.g. the shard's assignment changed)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"hints not written to {key}: the guard no longer holds")
        self.key = key


class HintsConflict(Exception):
    """Backup hints changed while they were being rotated (another primary recovered?)."""

    def __init__(self, shard: str) -> None:
        super().__init__(f"backup hints of shard {shard} changed while rotating them")
        self.shard = shard


def primary_hints_key(hint_prefix: str, shard: str) -> str:
    """``{hint_prefix}/{shard}.primary``."""
    return f"{hint_prefix}/{shard}.primary"


def backup_hints_key(hint_prefix: str, shard: str, n: int) -> str:
    """``{hint_prefix}/{shard}.backup.{n}``."""
    return f"{hint_prefix}/{shard}.backup.{n}"


def encode_hints(hints: rpb.FSMHints, encoding: Encoding = "json") -> bytes:
    """`hints` as stored: Gazette's JSON (the default, as upstream writes) or binary proto."""
    if encoding == "json":
        return hints_to_json(hints)
    if encoding == "proto":
        return hints.SerializeToString(deterministic=True)
    raise ValueError(f"unknown hints encoding {encoding!r}")


def _guards(guard: Compare | Sequence[Compare] | None) -> list[Compare]:
    if guard is None:
        return []
    if isinstance(guard, Compare):
        return [guard]
    return list(guard)


async def store_primary_hints(
    etcd: Etcd,
    hint_prefix: str,
    shard: str,
    hints: rpb.FSMHints,
    *,
    guard: Compare | Sequence[Compare] | None = None,
    encoding: Encoding = "json",
) -> int:
    """Write `hints` as the shard's primary hints; returns the etcd revision of the write.

    With `guard` (e.g. ``Compare(assignment_key, "create", assignment_create_revision)``, as
    upstream), the write happens only if every comparison holds, else `HintsGuardFailed` is
    raised. Raises `EtcdError` if etcd cannot be reached.
    """
    key = primary_hints_key(hint_prefix, shard)
    resp = await etcd.txn(_guards(guard), [op_put(key.encode(), encode_hints(hints, encoding))])
    if not resp.succeeded:
        raise HintsGuardFailed(key)
    return int(resp.header.revision)


async def rotate_backup_hints(
    etcd: Etcd,
    hint_prefix: str,
    shard: str,
    hints: rpb.FSMHints,
    backups: int,
    *,
    guard: Compare | Sequence[Compare] | None = None,
    encoding: Encoding = "json",
) -> None:
    """Store `hints` (just recovered from) as ``backup.0``, shifting older backups along.

    In one transaction, as upstream: ``backup.N`` moves to ``backup.N+1`` for each N up to the
    first empty slot (and ``backup.{backups-1}`` is dropped), provided no slot changed since
    it was read (`HintsConflict` otherwise) and `guard` holds (`HintsGuardFailed`). Does
    nothing when `backups` is zero.
    """
    if backups < 0:
        raise ValueError(f"backups must be >= 0 ({backups})")
    if backups == 0:
        return
    keys = [backup_hints_key(hint_prefix, shard, n).encode() for n in range(backups)]
    current = await _get_all(etcd, keys)

    compares = _guards(guard)
    ops = []
    value: bytes | None = encode_hints(hints, encoding)
    for key, kv in zip(keys, current, strict=True):
        if value is None:
            break
        ops.append(op_put(key, value))
        if kv is None:
            compares.append(Compare(key, "mod", 0))  # Still empty: nothing to shift on.
            value = None
        else:
            compares.append(Compare(key, "mod", int(kv.mod_revision)))
            value = bytes(kv.value)
    resp = await etcd.txn(compares, ops)
    if not resp.succeeded:
        if guard is not None and not await _holds(etcd, _guards(guard)):
            raise HintsGuardFailed(backup_hints_key(hint_prefix, shard, 0))
        raise HintsConflict(shard)


async def _holds(etcd: Etcd, compares: list[Compare]) -> bool:
    resp = await etcd.txn(compares, [])
    return bool(resp.succeeded)


async def _get_all(etcd: Etcd, keys: Sequence[bytes]) -> list[Any]:
    """The KeyValue of each of `keys` (None where absent), read in one snapshot."""
    ops = [rpc.RequestOp(request_range=rpc.RangeRequest(key=k)) for k in keys]
    resp = await etcd.txn([], ops)
    return [r.response_range.kvs[0] if r.response_range.kvs else None for r in resp.responses]


_BACKUP_N = re.compile(rb"0|[1-9][0-9]{0,8}")


async def load_hints(
    etcd: Etcd,
    hint_prefix: str,
    shard: str,
    *,
    backups: int | None = None,
    log: str | None = None,
) -> list[rpb.FSMHints | None]:
    """The shard's primary hints, then its backups ``backup.0``, ``backup.1``, ...

    An entry is None where no hints are stored. With `backups`, exactly that many backup
    slots are returned; by default, every ``backup.N`` present (up to the largest N). All
    are read in one etcd snapshot. Each value is decoded (JSON or binary proto) and checked
    to be consistent hints (and, with `log`, to be hints of `log`); `InvalidHints` names the
    offending key otherwise.
    """
    primary = primary_hints_key(hint_prefix, shard).encode()
    backup_prefix = f"{hint_prefix}/{shard}.backup.".encode()
    if backups is not None:
        keys = [primary] + [
            backup_hints_key(hint_prefix, shard, n).encode() for n in range(backups)
        ]
        values = [kv.value if kv is not None else None for kv in await _get_all(etcd, keys)]
    else:
        resp = await etcd.txn(
            [],
            [
                rpc.RequestOp(request_range=rpc.RangeRequest(key=primary)),
                rpc.RequestOp(
                    request_range=rpc.RangeRequest(
                        key=backup_prefix, range_end=prefix_range_end(backup_prefix)
                    )
                ),
            ],
        )
        kvs = resp.responses[0].response_range.kvs
        by_n: dict[int, bytes] = {}
        for kv in resp.responses[1].response_range.kvs:
            if _BACKUP_N.fullmatch(suffix := bytes(kv.key)[len(backup_prefix) :]):
                by_n[int(suffix)] = bytes(kv.value)
        keys = [primary] + [
            backup_prefix + str(n).encode() for n in range(max(by_n, default=-1) + 1)
        ]
        values = [bytes(kvs[0].value) if kvs else None] + [
            by_n.get(n) for n in range(len(keys) - 1)
        ]

    out: list[rpb.FSMHints | None] = []
    for key, value in zip(keys, values, strict=True):
        if value is None:
            out.append(None)
            continue
        try:
            hints = hints_from_bytes(bytes(value))
            if not hints.log:
                raise InvalidHints("hinted log not provided")
            live_log_segments(hints)
            if log is not None and hints.log != log:
                raise InvalidHints(f"hints.log {hints.log} is not the recovery log {log}")
        except (InvalidHints, ValueError) as err:
            raise InvalidHints(f"hints at {key.decode()}: {err}") from err
        out.append(hints)
    return out
