"""Hints in etcd: primary and rotated backup keys, against a real etcd."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator

import pytest

from gazette.consumer.hints import (
    HintsConflict,
    HintsGuardFailed,
    backup_hints_key,
    encode_hints,
    load_hints,
    primary_hints_key,
    rotate_backup_hints,
    store_primary_hints,
)
from gazette.keyspace.etcd import Compare, Etcd
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.hints import hints_from_bytes
from gazette.recoverylog.segments import InvalidHints
from gazette.testing.etcd import EtcdServer

_names = itertools.count()
LOG = "recovery/logs/shard-a"


@pytest.fixture
async def etcd(etcd_server: EtcdServer) -> AsyncIterator[Etcd]:
    async with Etcd(etcd_server.endpoint) as client:
        yield client


@pytest.fixture
def prefix() -> str:
    return f"/test-hints/{os.getpid()}-{next(_names)}/hints"


def hints(version: int) -> rpb.FSMHints:
    h = rpb.FSMHints(log=LOG)
    node = h.live_nodes.add(fnode=version)
    node.segments.add(
        author=0xA1, first_seq_no=version, first_offset=100 * version, last_seq_no=version + 2
    )
    h.properties.add(path="/IDENTITY", content=f"v{version}")
    return h


def test_keys_follow_upstream_layout() -> None:
    assert primary_hints_key("/app/hints", "shard-a") == "/app/hints/shard-a.primary"
    assert backup_hints_key("/app/hints", "shard-a", 2) == "/app/hints/shard-a.backup.2"


async def test_store_and_load_primary(etcd: Etcd, prefix: str) -> None:
    assert await load_hints(etcd, prefix, "s") == [None]
    assert await load_hints(etcd, prefix, "s", backups=2) == [None, None, None]
    await store_primary_hints(etcd, prefix, "s", hints(1))
    raw = (await etcd.get(primary_hints_key(prefix, "s").encode())).kvs[0].value
    assert raw.startswith(b'{"log":"recovery/logs/shard-a","live_nodes":[{"fnode":1,')
    assert await load_hints(etcd, prefix, "s") == [hints(1)]
    await store_primary_hints(etcd, prefix, "s", hints(2), encoding="proto")
    assert await load_hints(etcd, prefix, "s", backups=1, log=LOG) == [hints(2), None]


async def test_guarded_primary_write(etcd: Etcd, prefix: str) -> None:
    assignment = f"{prefix}/assignment".encode()
    put = await etcd.put(assignment, b"")
    guard = Compare(assignment, "create", int(put.header.revision))
    await store_primary_hints(etcd, prefix, "s", hints(1), guard=guard)
    await etcd.delete(assignment)
    await etcd.put(assignment, b"")  # A new assignment: the old guard fails.
    with pytest.raises(HintsGuardFailed, match=r"\.primary"):
        await store_primary_hints(etcd, prefix, "s", hints(2), guard=[guard])
    assert await load_hints(etcd, prefix, "s") == [hints(1)]


async def test_rotation_shifts_backups_and_drops_the_oldest(etcd: Etcd, prefix: str) -> None:
    await store_primary_hints(etcd, prefix, "s", hints(9))
    await rotate_backup_hints(etcd, prefix, "s", hints(1), 3)
    assert await load_hints(etcd, prefix, "s") == [hints(9), hints(1)]
    await rotate_backup_hints(etcd, prefix, "s", hints(2), 3)
    assert await load_hints(etcd, prefix, "s", backups=3) == [hints(9), hints(2), hints(1), None]
    await rotate_backup_hints(etcd, prefix, "s", hints(3), 3)
    await rotate_backup_hints(etcd, prefix, "s", hints(4), 3)
    assert await load_hints(etcd, prefix, "s") == [hints(9), hints(4), hints(3), hints(2)]
    await rotate_backup_hints(etcd, prefix, "s", hints(5), 0)  # No backups kept: a no-op.
    assert await load_hints(etcd, prefix, "s", backups=3) == [
        hints(9),
        hints(4),
        hints(3),
        hints(2),
    ]
    # Values are shifted verbatim (a proto value stays proto).
    await etcd.put(backup_hints_key(prefix, "s", 0).encode(), encode_hints(hints(6), "proto"))
    await rotate_backup_hints(etcd, prefix, "s", hints(7), 3)
    raw = (await etcd.get(backup_hints_key(prefix, "s", 1).encode())).kvs[0].value
    assert hints_from_bytes(raw) == hints(6) and not raw.startswith(b"{")


async def test_rotation_stops_at_the_first_empty_slot(etcd: Etcd, prefix: str) -> None:
    # backup.1 is empty: backup.0 moves there, and backup.2 is left alone.
    await etcd.put(backup_hints_key(prefix, "s", 0).encode(), encode_hints(hints(1)))
    await etcd.put(backup_hints_key(prefix, "s", 2).encode(), encode_hints(hints(10)))
    await rotate_backup_hints(etcd, prefix, "s", hints(2), 3)
    assert await load_hints(etcd, prefix, "s") == [None, hints(2), hints(1), hints(10)]


async def test_rotation_is_guarded(etcd: Etcd, prefix: str) -> None:
    assignment = f"{prefix}/assignment".encode()
    await etcd.put(assignment, b"")
    guard = Compare(assignment, "create", 0)  # Never holds: the key exists.
    with pytest.raises(HintsGuardFailed):
        await rotate_backup_hints(etcd, prefix, "s", hints(1), 2, guard=guard)
    assert await load_hints(etcd, prefix, "s") == [None]


async def test_concurrent_rotation_conflicts(
    etcd: Etcd, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gazette.consumer.hints as he

    await rotate_backup_hints(etcd, prefix, "s", hints(1), 2)
    real_get_all = he._get_all

    async def racing_get_all(e: Etcd, keys: list[bytes]) -> list[object]:
        out = await real_get_all(e, keys)
        await etcd.put(keys[0], encode_hints(hints(5)))  # Another primary rotated meanwhile.
        return out

    monkeypatch.setattr(he, "_get_all", racing_get_all)
    with pytest.raises(HintsConflict):
        await rotate_backup_hints(etcd, prefix, "s", hints(2), 2)
    monkeypatch.undo()
    assert await load_hints(etcd, prefix, "s") == [None, hints(5)]


async def test_load_rejects_bad_hints_naming_the_key(etcd: Etcd, prefix: str) -> None:
    await etcd.put(backup_hints_key(prefix, "s", 1).encode(), b"{not json")
    with pytest.raises(InvalidHints, match=r"s\.backup\.1"):
        await load_hints(etcd, prefix, "s")
    bad = hints(3)
    bad.live_nodes[0].fnode = 4  # Not the seq_no of its first segment.
    await etcd.put(backup_hints_key(prefix, "s", 1).encode(), encode_hints(bad))
    with pytest.raises(InvalidHints, match="Fnode"):
        await load_hints(etcd, prefix, "s")
    await etcd.put(backup_hints_key(prefix, "s", 1).encode(), encode_hints(hints(3)))
    with pytest.raises(InvalidHints, match="not the recovery log"):
        await load_hints(etcd, prefix, "s", log="other/log")
    # Keys which merely share the prefix are not backups.
    await etcd.put(f"{prefix}/s.backup.01".encode(), b"junk")
    await etcd.put(f"{prefix}/s.backup.x".encode(), b"junk")
    assert await load_hints(etcd, prefix, "s") == [None, None, hints(3)]
