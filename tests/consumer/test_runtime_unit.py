"""Review tests of consumer.runtime with a fake keyspace and etcd (no etcd, no broker)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import gazette.consumer.replica as replica_mod
from gazette.allocator.model import assignment_key
from gazette.consumer.protocol import pb
from gazette.consumer.store import RecordingLost
from tests.consumer.fakes import (
    JOURNAL,
    ROOT,
    TXN_REVISION,
    FakeEtcd,
    FakeStore,
    IdleApp,
    IdleReaders,
    make_runtime,
    outside,
)
from tests.kit.eventually import eventually

Code = pb.ReplicaStatus.Code


async def test_stat_returns_when_its_shard_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Stat waiting for read_through must not outlive the shard: upstream answers
    SHARD_STOPPED (Status 5) when the shard is cancelled while the request waits. Here
    `stat` (runtime.py) waits on `Shard.wait_read_through` alone; `Shard.stopping` is set
    by `ShardReplica.stop` but nothing observes it, and SHARD_STOPPED is never returned, so
    the RPC hangs until the client's deadline (forever without one)."""
    monkeypatch.setattr(replica_mod, "SourceReaders", IdleReaders)
    rt, ks, me = make_runtime(tmp_path)
    akey = assignment_key(ROOT, "shard", me, 0)
    ks.put(akey, pb.ReplicaStatus())
    await rt._reconcile_once()
    replica = rt.replicas["shard"]
    await eventually(lambda: replica.status.code == Code.PRIMARY, what="PRIMARY", timeout=5)
    stat = asyncio.create_task(
        rt.stat(pb.StatRequest(shard="shard", read_through={JOURNAL: 100}), None)
    )
    await asyncio.sleep(0.1)  # Stat waits (nothing is read).
    assert not stat.done()
    # Unassigned: the replica stops.
    del ks.kvs[akey]
    await rt._reconcile_once()
    try:
        await eventually(lambda: not rt._stopping, what="the replica to stop", timeout=3)
        await asyncio.wait({stat}, timeout=0.5)
        assert stat.done(), "Stat still waits on a shard stopped 0.5s ago"
    finally:
        stat.cancel()
        await asyncio.gather(stat, return_exceptions=True)
        for r in list(rt.replicas.values()):
            await r.stop()


async def test_stat_ignores_read_through_of_journals_the_shard_does_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upstream: "Offsets of journals not read by this shard are ignored" (ResolveArgs
    .ReadThrough), so a caller can name every journal it appended to in one request. Stat
    answered INVALID_ARGUMENT for them. Offsets of the shard's sources are still waited for."""
    monkeypatch.setattr(replica_mod, "SourceReaders", IdleReaders)
    rt, ks, me = make_runtime(tmp_path)
    ks.put(assignment_key(ROOT, "shard", me, 0), pb.ReplicaStatus())
    await rt._reconcile_once()
    replica = rt.replicas["shard"]
    await eventually(lambda: replica.status.code == Code.PRIMARY, what="PRIMARY", timeout=5)
    try:
        async with asyncio.timeout(2):
            resp = await rt.stat(
                pb.StatRequest(shard="shard", read_through={"other/journal": 100}), None
            )
        assert resp.status == pb.OK
        both = {JOURNAL: 100, "other/journal": 100}
        stat = asyncio.create_task(rt.stat(pb.StatRequest(shard="shard", read_through=both), None))
        await asyncio.wait({stat}, timeout=0.2)
        assert not stat.done(), "Stat did not wait for the shard's source"
        stat.cancel()
        await asyncio.gather(stat, return_exceptions=True)
    finally:
        for r in list(rt.replicas.values()):
            await r.stop()


class HangingCommitStore(FakeStore):
    def start_commit(self, shard: Any, cp: pb.Checkpoint, wait_for: Any) -> asyncio.Future[None]:
        super().start_commit(shard, cp, wait_for)
        return asyncio.get_running_loop().create_future()  # Never completes.


class HangingApp(IdleApp):
    def new_store(self, shard: Any, recovered: Any) -> FakeStore:
        return HangingCommitStore()


class OneMessageReaders(IdleReaders):
    def __init__(self, *args: Any) -> None:
        super().__init__()
        self.queue.put_nowait(outside(0))


async def test_reassigned_shard_waits_for_its_stopping_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unassigned then assigned again while the old replica still stops (its commit in
    flight: Transactions.run waits up to 10s): a second replica must not start on the same
    directory meanwhile (the old one's `_release` rmtree's it, and playback wipes the
    old store's files). Regression test of the working-tree fix in runtime.py."""
    monkeypatch.setattr(replica_mod, "SourceReaders", OneMessageReaders)
    rt, ks, me = make_runtime(tmp_path)
    rt.app = HangingApp()  # type: ignore[assignment]
    akey = assignment_key(ROOT, "shard", me, 0)
    ks.put(akey, pb.ReplicaStatus())
    await rt._reconcile_once()
    old = rt.replicas["shard"]
    await eventually(
        lambda: old.store is not None and old.store.commits,  # type: ignore[attr-defined]
        what="a commit in flight",
        timeout=5,
    )
    del ks.kvs[akey]
    await rt._reconcile_once()  # Stops the old replica (slowly).
    ks.put(akey, pb.ReplicaStatus())
    await rt._reconcile_once()  # Assigned here again.
    await asyncio.sleep(0.3)  # Time a new replica would take to start.
    try:
        assert old._task is not None and not old._task.done(), "old replica stopped at once"
        assert "shard" not in rt.replicas, "a new replica runs beside the one still stopping"
    finally:
        for r in list(rt.replicas.values()):
            await r.stop()
        for t in list(rt._stopping.values()) if isinstance(rt._stopping, dict) else rt._stopping:
            t.cancel()


class RecordingEtcd(FakeEtcd):
    """Keeps the operations of every transaction."""

    def __init__(self) -> None:
        self.ops: list[Any] = []

    async def txn(self, compares: Any, ops: Any) -> Any:
        self.ops.extend(ops)
        return await super().txn(compares, ops)


class LostRecordingStore(FakeStore):
    """A store whose recording process has died: its commits fail, and it says why."""

    def __init__(self) -> None:
        super().__init__(fail_commits=True)

    def recording_lost(self) -> RecordingLost:
        return RecordingLost("the recording process exited")


class LostRecordingApp(IdleApp):
    def new_store(self, shard: Any, recovered: Any) -> FakeStore:
        return LostRecordingStore()


async def test_a_lost_recording_gives_the_assignment_up_once_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica FAILED because its store lost its recording process: the process removes
    its assignment (a standby, or a replica assigned anew, takes over) instead of
    advertising FAILED. The shard's next replica here losing it again within
    RECORDING_LOST_INTERVAL stays FAILED (advertised), for the operator."""
    monkeypatch.setattr(replica_mod, "SourceReaders", OneMessageReaders)
    rt, ks, me = make_runtime(tmp_path)
    rt.app = LostRecordingApp()  # type: ignore[assignment]
    etcd = rt.member.etcd = RecordingEtcd()  # type: ignore[assignment]
    akey = assignment_key(ROOT, "shard", me, 0)
    try:
        for attempt in range(2):
            etcd.ops.clear()
            ks.put(akey, pb.ReplicaStatus())
            await rt._reconcile_once()
            replica = rt.replicas["shard"]
            await eventually(
                lambda r=replica: r.status.code == Code.FAILED,  # type: ignore[misc]
                what="FAILED",
                timeout=5,
            )
            assert replica.recording_lost is not None
            await rt._reconcile_once()
            deletes = [op for op in etcd.ops if op.HasField("request_delete_range")]
            puts = [
                pb.ReplicaStatus.FromString(op.request_put.value)
                for op in etcd.ops
                if op.HasField("request_put")
            ]
            if attempt == 0:
                # Given up: removed, never advertised FAILED; the replica stops.
                assert [op.request_delete_range.key for op in deletes] == [akey.encode()]
                # ... and the delete is in the mirror before the replica stops (else a
                # reconcile would start a new replica for the deleted assignment).
                assert ks.awaited == [TXN_REVISION]
                assert all(st.code != Code.FAILED for st in puts), puts
                assert "shard" not in rt.replicas
                del ks.kvs[akey]
                await eventually(lambda: not rt._stopping, what="the replica to stop", timeout=5)
            else:
                # Lost again within the interval: left FAILED, and advertised so.
                assert deletes == []
                assert [st.code for st in puts][-1:] == [Code.FAILED], puts
                assert rt.replicas["shard"] is replica
    finally:
        for r in list(rt.replicas.values()):
            await r.stop()
