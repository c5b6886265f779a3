"""Review tests of consumer.replica with fakes (no etcd, no broker)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import gazette.consumer.replica as replica_mod
from gazette.consumer.protocol import pb
from gazette.consumer.replica import ReplicaContext, ShardReplica
from tests.consumer.fakes import JOURNAL, FakeReaders, FakeStore, outside
from tests.kit.eventually import eventually

Code = pb.ReplicaStatus.Code


class FailingApp:
    def new_store(self, shard: Any, recovered: Any) -> FakeStore:
        return FakeStore()

    def new_message(self, spec: Any) -> Any:
        raise NotImplementedError

    def consume_message(self, shard: Any, store: Any, env: Any, pub: Any) -> None:
        raise ValueError("boom: the application's own error")

    def finalize_txn(self, shard: Any, store: Any, pub: Any) -> None:
        pass


class OneMessageReaders(FakeReaders):
    def __init__(self, *args: Any) -> None:
        super().__init__()
        self.queue.put_nowait(outside(0))

    async def run(self) -> None:
        await asyncio.Event().wait()


class Assignment:
    key = "/review/assign/shard#z#s#0"
    create_revision = 1


async def test_failed_status_names_the_applications_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ReplicaStatus.errors must say why the shard failed. `_serve` runs the transaction
    loop inside an asyncio.TaskGroup (replica.py), which wraps the error in an
    ExceptionGroup; `_run` (replica.py) then reports
    "ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)"."""
    monkeypatch.setattr(replica_mod, "SourceReaders", OneMessageReaders)
    ctx = ReplicaContext(
        app=FailingApp(),  # type: ignore[arg-type]
        etcd=None,  # type: ignore[arg-type]
        client=None,  # type: ignore[arg-type]
        broker_endpoint="",
        workdir=tmp_path,
        root="/review",
        status_changed=lambda: None,
    )
    spec = pb.ShardSpec(id="shard", sources=[pb.ShardSpec.Source(journal=JOURNAL)])
    r = ShardReplica(ctx, spec, Assignment())
    r.start()
    r.promote()
    try:
        await eventually(lambda: r.status.code == Code.FAILED, what="FAILED", timeout=5)
        assert any("boom" in e for e in r.status.errors), list(r.status.errors)
    finally:
        await r.stop()


async def test_a_failing_wait_is_not_taken_for_a_promotion() -> None:
    """`_first_of` raises the error of the awaitable it waits on beside the task (a standby's
    wait that fails must not read as "promoted")."""

    async def fails() -> None:
        raise ValueError("the wait failed")

    play = asyncio.ensure_future(asyncio.Event().wait())
    try:
        with pytest.raises(ValueError, match="the wait failed"):
            await replica_mod._first_of(play, fails())
        await replica_mod._first_of(play, asyncio.sleep(0))  # Returns: it completed.
    finally:
        play.cancel()
