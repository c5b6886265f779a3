"""One playback of a snapshot shared by the tasks of a host (real broker, real RocksDB; the
tasks are threads and processes, each with its own lock file descriptor, as Spark's Python
workers are)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rocksdict import AccessType, Options, Rdict

import gazette.consumer.spark.shared_playback as shared
from gazette.broker.client import JournalClient
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import pb
from gazette.consumer.spark import playback
from gazette.consumer.spark.errors import ExportError, InvalidOption
from gazette.consumer.spark.options import ShardsOptions
from gazette.consumer.spark.resolve import ShardPlan
from gazette.consumer.spark.shared_playback import shared_played_shard, shared_root, snapshot_name
from gazette.recoverylog.hints import hints_to_json
from gazette.stores.rocksdb.store import RocksDBStore
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.consumer.spark.conftest import pausable_broker
from tests.kit.specs import RECOVERY_LOG, apply_specs, journal_spec

KEYS = 300


async def _recorded_shard(broker: BrokerProcess, tmp: Path, log: str) -> tuple[ShardPlan, int]:
    """A RocksDB store of KEYS keys recorded into `log`; its plan and the log's write head."""
    async with JournalClient(broker.endpoint) as client:
        await apply_specs(client, [journal_spec(log, refresh=600, content_type=RECOVERY_LOG)])
        store = await RocksDBStore.open(broker.endpoint, log, tmp / "live")
        try:
            for i in range(KEYS):
                store.put(b"k%04d" % i, b"v%d" % i)
            await store.start_commit(None, pb.Checkpoint(), [])  # type: ignore[arg-type]
            hints = await store.build_hints()
        finally:
            await store.close()
        req = bpb.ReadRequest(journal=log, offset=-1, block=False, metadata_only=True)
        call = client.stub_for(log, primary=False).Read(req)
        resp = await call.read()
        assert isinstance(resp, bpb.ReadResponse)
        head = int(resp.write_head)
        call.cancel()
    assert head > 0
    plan = ShardPlan(shard="shard-a", log=log, hints_key="", hints_json=hints_to_json(hints))
    return plan, head


@pytest.fixture
async def recorded(broker: BrokerProcess, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    log = f"spark-shared/{request.node.name[:40]}/log"
    return await _recorded_shard(broker, tmp_path, log)


@pytest.fixture
def plays(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The shards played (the real playback, counted)."""
    played: list[str] = []
    real = playback.play

    async def counted(plan: ShardPlan, *args: Any, **kwargs: Any) -> Any:
        played.append(plan.shard)
        return await real(plan, *args, **kwargs)

    monkeypatch.setattr(shared, "play", counted)
    yield played


def _keys(directory: Path) -> list[bytes]:
    db = Rdict(str(directory), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        keys = [k for k in db.keys() if isinstance(k, bytes)]
        return [k for k in keys if not k.startswith(b"\x00")]
    finally:
        db.close()


def _names(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in shared_root(str(tmp_path)).iterdir())


def test_concurrent_tasks_share_one_playback(
    recorded: Any, broker: BrokerProcess, tmp_path: Path, plays: list[str]
) -> None:
    plan, head = recorded
    tasks = 3
    inside = threading.Barrier(tasks, timeout=60)
    seen: list[tuple[Path, int]] = []
    errors: list[BaseException] = []

    def task() -> None:
        try:
            with shared_played_shard(plan, [broker.endpoint], str(tmp_path), head) as played:
                inside.wait()  # Every task holds the snapshot at once.
                seen.append((played.directory, len(_keys(played.directory))))
                inside.wait()
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=task) for _ in range(tasks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert plays == ["shard-a"]  # Played once, read by all three.
    assert len({d for d, _ in seen}) == 1
    assert [n for _, n in seen] == [KEYS] * tasks
    assert list(shared_root(str(tmp_path)).iterdir()) == []  # The last reader removed it.


def test_a_later_task_plays_again_and_each_removes_its_snapshot(
    recorded: Any, broker: BrokerProcess, tmp_path: Path, plays: list[str]
) -> None:
    plan, head = recorded
    for _ in range(2):
        with shared_played_shard(plan, [broker.endpoint], str(tmp_path), head) as played:
            assert len(_keys(played.directory)) == KEYS
            assert played.write_head >= head
        assert list(shared_root(str(tmp_path)).iterdir()) == []
    assert plays == ["shard-a", "shard-a"]


_HOLDER = """
import sys, time
from gazette.consumer.spark.resolve import ShardPlan
from gazette.consumer.spark.shared_playback import shared_played_shard
plan = ShardPlan(shard="shard-a", log=sys.argv[1], hints_key="", hints_json=sys.argv[2].encode())
with shared_played_shard(plan, [sys.argv[3]], sys.argv[4], int(sys.argv[5])) as played:
    print(played.directory, flush=True)
    time.sleep(600)
"""


def test_a_killed_task_leaves_a_snapshot_the_next_one_reuses_and_removes(
    recorded: Any, broker: BrokerProcess, tmp_path: Path, plays: list[str]
) -> None:
    plan, head = recorded
    args = [plan.log, plan.hints_json.decode(), broker.endpoint, str(tmp_path), str(head)]
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        directory = Path(holder.stdout.readline().strip())
        assert directory.is_dir()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    name = snapshot_name(plan, head)
    assert (shared_root(str(tmp_path)) / f"{name}.lock").exists()  # Left behind by the kill.

    with shared_played_shard(plan, [broker.endpoint], str(tmp_path), head) as played:
        assert played.directory == directory
        assert len(_keys(played.directory)) == KEYS
    assert plays == []  # Complete: reused, not played again.
    assert list(shared_root(str(tmp_path)).iterdir()) == []


def test_abandoned_snapshots_are_swept_unless_held(
    recorded: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    plan, head = recorded
    root = shared_root(str(tmp_path))
    for name in ("abandoned", "partial", "held"):
        (root / name).mkdir()
        (root / name / "some-file").write_bytes(b"x")
        (root / f"{name}.lock").touch()
    held = os.open(root / "held.lock", os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_SH)  # Another task reads "held".
        with shared_played_shard(plan, [broker.endpoint], str(tmp_path), head):
            left = sorted(p.name for p in root.iterdir())
            assert "abandoned" not in left and "partial.lock" not in left
            assert {"held", "held.lock"} <= set(left)
    finally:
        os.close(held)
    assert sorted(p.name for p in root.iterdir()) == ["held", "held.lock"]


def test_a_failed_playback_leaves_nothing_and_the_next_task_plays(
    recorded: Any, broker: BrokerProcess, tmp_path: Path, plays: list[str]
) -> None:
    plan, head = recorded
    missing = ShardPlan(plan.shard, "spark-shared/no-such/log", "", plan.hints_json)
    with pytest.raises(Exception, match="no-such"):
        with shared_played_shard(missing, [broker.endpoint], str(tmp_path), head):
            pytest.fail("played a log that does not exist")
    # Only the failure's record (for the tasks that were waiting) is left.
    assert _names(tmp_path) == [f"{snapshot_name(missing, head)}.failed"]

    # A partial playback left by a killed player (no played.json) is played over.
    name = snapshot_name(plan, head)
    (shared_root(str(tmp_path)) / name / "store").mkdir(parents=True)
    (shared_root(str(tmp_path)) / name / "store" / "CURRENT").write_bytes(b"garbage")
    with shared_played_shard(plan, [broker.endpoint], str(tmp_path), head) as played:
        assert len(_keys(played.directory)) == KEYS
    assert plays == ["shard-a", "shard-a"]
    assert _names(tmp_path) == [f"{snapshot_name(missing, head)}.failed"]


def test_tasks_waiting_for_a_failed_playback_fail_with_its_error_at_once(
    recorded: Any, broker: BrokerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks waiting for a shared playback that fails do not each play it again in turn
    (with an unreachable broker, one `broker_timeout` after another): they fail with its
    error. A task that comes after the failure plays again."""
    import time

    from gazette.consumer.spark.errors import BrokersUnresponsive, SharedPlaybackFailed

    plan, head = recorded
    plays: list[float] = []
    real = playback.play

    async def failing(*args: Any, **kwargs: Any) -> Any:
        plays.append(time.monotonic())
        await asyncio.sleep(1.0)  # Meanwhile the other tasks look, and wait.
        raise BrokersUnresponsive("no broker answered (a test's)")

    monkeypatch.setattr(shared, "play", failing)
    tasks = 3
    errors: list[BaseException] = []
    ended: list[float] = []

    def task() -> None:
        try:
            with shared_played_shard(plan, [broker.endpoint], str(tmp_path), head):
                pytest.fail("a failed playback yielded a snapshot")
        except BaseException as err:
            errors.append(err)
        ended.append(time.monotonic())

    threads = [threading.Thread(target=task) for _ in range(tasks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(plays) == 1, "each waiting task played the failed snapshot again"
    assert [type(e) for e in errors].count(BrokersUnresponsive) == 1
    waiting = [e for e in errors if isinstance(e, SharedPlaybackFailed)]
    assert len(waiting) == tasks - 1
    for err in waiting:
        assert "shard 'shard-a'" in str(err)
        assert "BrokersUnresponsive: no broker answered (a test's)" in str(err)
    assert max(ended) - plays[0] < 1.0 + 5.0  # Once, not one failure after another.
    assert _names(tmp_path) == [f"{snapshot_name(plan, head)}.failed"]

    # Later, the same snapshot is played again (a task retry, the next query).
    monkeypatch.setattr(shared, "play", real)
    with shared_played_shard(plan, [broker.endpoint], str(tmp_path), head) as played:
        assert len(_keys(played.directory)) == KEYS

    # Failure records are swept once old.
    record = shared_root(str(tmp_path)) / f"{snapshot_name(plan, head)}.failed"
    old = time.time() - 2 * shared._FAILED_KEPT
    os.utime(record, (old, old))
    shared._sweep(shared_root(str(tmp_path)), keep="")
    assert _names(tmp_path) == []


def test_a_playback_that_reads_nothing_fails_after_the_broker_timeout(
    recorded: Any, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """An unreachable or hung broker: the journal client retries without end, so a task
    would hang for ever; it fails with `BrokersUnresponsive` once nothing was read for
    ``broker_timeout`` seconds, leaving no snapshot behind."""
    import socket
    import time

    from gazette.consumer.spark.errors import BrokersUnresponsive

    plan, head = recorded
    refusing = socket.socket()  # Bound, never listening: connections are refused.
    refusing.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{refusing.getsockname()[1]}"
    try:
        t0 = time.monotonic()
        with pytest.raises(
            BrokersUnresponsive, match=r"shard 'shard-a'.*made no progress for 1.5s"
        ):
            with playback.played_shard(plan, [dead], str(tmp_path), head, stall_timeout=1.5):
                pytest.fail("played from an unreachable broker")
        assert 1.5 <= time.monotonic() - t0 < 8
    finally:
        refusing.close()

    # A broker of this test's own (its own etcd root, a lease outliving the pause): stopping
    # it cannot disturb the module's broker, whose 4 s lease would expire.
    private = pausable_broker(etcd_server.endpoint, tmp_path / "private-spool", "stall")
    with private:
        plan, head = asyncio.run(_recorded_shard(private, tmp_path / "private", "stall/log"))
        assert private.proc is not None
        os.kill(private.proc.pid, signal.SIGSTOP)  # Connected, but it answers nothing.
        try:
            with pytest.raises(BrokersUnresponsive, match="fragment stores reachable"):
                with shared_played_shard(plan, [private.endpoint], str(tmp_path), head, 1.5):
                    pytest.fail("played from a stopped broker")
        finally:
            os.kill(private.proc.pid, signal.SIGCONT)
        assert _names(tmp_path) == [f"{snapshot_name(plan, head)}.failed"]
        with shared_played_shard(plan, [private.endpoint], str(tmp_path), head, 1.5) as played:
            assert len(_keys(played.directory)) == KEYS


async def test_the_stall_watchdog_counts_log_reads_and_fragment_fetches_as_progress() -> None:
    import asyncio
    import time

    from gazette.broker.client.metrics import CLIENT
    from gazette.consumer.spark.errors import BrokersUnresponsive
    from gazette.consumer.spark.playback import _watch

    plan = ShardPlan("shard-w", "log/w", "", b"{}")
    read = [0]

    async def trickle(count: list[int] | None) -> None:
        for _ in range(6):  # 1.2 s in all, more than the timeout, progressing every 0.2 s.
            await asyncio.sleep(0.2)
            if count is None:
                CLIENT.fetched_bytes += 100  # A fragment downloading from its store.
            else:
                count[0] += 100

    for counted in (read, None):
        playing = asyncio.ensure_future(trickle(counted))
        t0 = time.monotonic()
        await _watch(playing, lambda: read[0], plan, ["b"], 0.5)
        assert playing.done() and time.monotonic() - t0 >= 1.1

    # A playback that never progresses.
    stuck = asyncio.ensure_future(asyncio.sleep(30))
    t0 = time.monotonic()
    with pytest.raises(BrokersUnresponsive, match="made no progress for 0.5s"):
        await _watch(stuck, lambda: read[0], plan, ["b"], 0.5)
    assert 0.5 <= time.monotonic() - t0 < 1.5
    stuck.cancel()


def test_a_failed_playback_does_not_wait_for_the_download_it_abandoned() -> None:
    import asyncio
    import time

    from gazette.consumer.spark.errors import BrokersUnresponsive

    async def stalled() -> None:
        asyncio.get_running_loop().run_in_executor(None, time.sleep, 3)  # A hung fetch.
        # Fails while the fetch it started still runs.
        await asyncio.sleep(0.05)
        raise BrokersUnresponsive("stalled")

    t0 = time.monotonic()
    with pytest.raises(BrokersUnresponsive):
        playback.run_playback(stalled())
    assert time.monotonic() - t0 < 1.5

    async def fine() -> int:
        return await asyncio.get_running_loop().run_in_executor(None, lambda: 7)

    assert playback.run_playback(fine()) == 7


def test_broker_timeout_option() -> None:
    base = {"etcd": "e", "root": "/r", "broker": "b", "shards": "shard-1", "store": "rocksdb"}
    assert ShardsOptions.parse(base).broker_timeout == 60.0
    assert ShardsOptions.parse({**base, "broker_timeout": "0"}).broker_timeout == 0.0
    assert ShardsOptions.parse({**base, "broker_timeout": " 2.5"}).broker_timeout == 2.5
    for bad, match in (("-1", "seconds >= 0"), ("soon", "not a number"), ("inf", "finite number")):
        with pytest.raises(InvalidOption, match=f"'broker_timeout'.*{match}"):
            ShardsOptions.parse({**base, "broker_timeout": bad})


def test_share_playback_option() -> None:
    base = {"etcd": "e", "root": "/r", "broker": "b", "shards": "shard-1", "store": "rocksdb"}
    assert ShardsOptions.parse(base).share_playback is True
    assert ShardsOptions.parse({**base, "share_playback": "FALSE"}).share_playback is False
    with pytest.raises(InvalidOption, match="share_playback.*must be true or false"):
        ShardsOptions.parse({**base, "share_playback": "yes"})
    with pytest.raises(InvalidOption, match="read_through.*must be true or false"):
        ShardsOptions.parse({**base, "read_through": "1"})


def test_the_shared_directory_must_be_the_users_own(tmp_path: Path) -> None:
    root = shared_root(str(tmp_path))
    assert root.stat().st_mode & 0o777 == 0o700
    assert shared_root(str(tmp_path)) == root  # Existing: fine.
    root.rmdir()
    (tmp_path / "elsewhere").mkdir()
    root.symlink_to(tmp_path / "elsewhere")  # Placed there by someone else.
    with pytest.raises(ExportError, match="is not a directory of user"):
        shared_root(str(tmp_path))
    root.unlink()
    root.mkdir()
    if os.getuid() == 0:  # As CI runs: root can make it another user's.
        os.chown(root, 12345, 12345)
        with pytest.raises(ExportError, match="set option tmpdir"):
            shared_root(str(tmp_path))


def test_a_task_done_first_leaves_the_snapshot_to_those_still_reading(
    recorded: Any, broker: BrokerProcess, tmp_path: Path, plays: list[str]
) -> None:
    plan, head = recorded
    both = threading.Barrier(2, timeout=60)
    first_done = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def task(first: bool) -> None:
        try:
            with shared_played_shard(plan, [broker.endpoint], str(tmp_path), head) as played:
                both.wait()
                if not first:
                    assert first_done.wait(timeout=60)
                    # The other task released: the snapshot is still whole for this one.
                    seen.append(len(_keys(played.directory)))
            if first:
                first_done.set()
        except BaseException as err:
            errors.append(err)
            first_done.set()

    threads = [threading.Thread(target=task, args=(first,)) for first in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert seen == [KEYS] and plays == ["shard-a"]
    assert list(shared_root(str(tmp_path)).iterdir()) == []


def test_interrupted_removals_and_snapshots_of_an_earlier_boot_are_not_used(
    recorded: Any, broker: BrokerProcess, tmp_path: Path, plays: list[str]
) -> None:
    plan, head = recorded
    root = shared_root(str(tmp_path))
    name = snapshot_name(plan, head)
    with shared_played_shard(plan, [broker.endpoint], str(tmp_path), head):
        # A copy as a task killed mid-removal leaves it: renamed away, partly deleted.
        shutil.copytree(root / name, root / f".trash-{name}-0000")
        # And a complete-looking copy played before a reboot, of an equal plan (other name).
        again = ShardPlan(plan.shard, plan.log, "", plan.hints_json + b"\n")
        stale = snapshot_name(again, head)
        shutil.copytree(root / name, root / stale)
        meta = json.loads((root / stale / "played.json").read_text())
        assert meta["boot"]  # This host's boot id.
        (root / stale / "played.json").write_text(json.dumps({**meta, "boot": "earlier"}))
    assert plays == ["shard-a"]
    with shared_played_shard(again, [broker.endpoint], str(tmp_path), head):
        assert plays == ["shard-a", "shard-a"]  # Played again, not reused.
        assert not any(p.name.startswith(".trash-") for p in root.iterdir())  # Swept.
    assert list(root.iterdir()) == []
