"""The consumer runtime end to end: etcd, a broker, and real `gazette-consumer` processes of
the counter application (tests/consumer/counter_app.py) with RocksDB stores over fusefs."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Callable

import grpc.aio
import pytest

from gazette.broker.client import AppendService, JournalClient, append
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.main import EXIT_FENCED
from gazette.consumer.protocol import pb
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.publisher import Publisher
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.author import author_fence
from gazette.recoverylog.codec import encode_op
from gazette.testing.consumer import ConsumerProcess
from tests.consumer.counter_app import POISON, Add
from tests.consumer.support import (
    BATCH_COUNTER,
    COUNTER,
    PROCESS_TIMEOUT,
    Setup,
    apply_shards,
    caught_up,
    check_totals,
    committed_totals,
    feed,
    primary_of,
    until_primary,
    until_ready,
    write_head,
)
from tests.kit.eventually import eventually

PRIMARY, STANDBY, FAILED = (
    pb.ReplicaStatus.PRIMARY,
    pb.ReplicaStatus.STANDBY,
    pb.ReplicaStatus.FAILED,
)


@pytest.mark.parametrize(
    ("app", "kills"),
    [(COUNTER, 3), (BATCH_COUNTER, 2)],
    ids=["consume_message", "consume_messages"],
)
async def test_counts_survive_primary_kills_with_a_hot_standby(
    app: str, kills: int, new_setup: Callable[..., Setup], client: JournalClient
) -> None:
    s = new_setup(app=app)
    await s.create_journals(client)
    procs = s.start(2)
    async with s.stubs() as stubs:
        stub = stubs["consumer-0"]
        await apply_shards(stub, s.shard_specs(hot_standbys=1))
        await until_ready(stub, [STANDBY, PRIMARY], "a primary and a standby")
        expected: dict[str, int] = {}
        stop = asyncio.Event()
        feeder = asyncio.create_task(feed(client, s.inputs[0], stop, expected))
        takeovers = []
        for _ in range(kills):
            await asyncio.sleep(0.5)  # The primary processes input until it is killed.
            victim = await primary_of(stub, "shard-000")
            survivor = next(k for k in procs if k != victim)
            t0 = time.monotonic()
            procs[victim].kill()
            await until_primary(stubs[survivor], survivor, "the standby's promotion")
            takeovers.append(time.monotonic() - t0)
            procs[victim].start()
            await until_ready(stubs[survivor], [STANDBY, PRIMARY], "a new standby")
            assert not feeder.done()
        stop.set()
        await feeder
        await check_totals(
            client, stubs[await primary_of(stubs["consumer-0"], "shard-000")], s, expected
        )
        print(f"takeovers after SIGKILL (lease TTL 3 s): {[round(t, 2) for t in takeovers]}")
        # Standbys kept a fusefs process ready: the promoted ones mounted through it.
        logs = b"".join(p.log_path.read_bytes() for p in procs.values())
        assert logs.count(b"prestarted=True") >= 2, logs.count(b"prestarted=False")
        if app == BATCH_COUNTER:
            # The batch path was taken, with runs of several messages.
            runs = [int(n) for n in re.findall(rb"largest_run=(\d+)", logs)]
            assert max(runs, default=0) > 1, runs

        # The primary writes hints a second after its recovery, then every second (here): a
        # primary may have served for less than that so far, so this waits for its first
        # write. Each takeover rotated the hints it recovered from into the backups.
        async def primary_hints_written() -> pb.GetHintsResponse | None:
            resp = await stub.GetHints(pb.GetHintsRequest(shard="shard-000"))
            assert resp.status == pb.OK
            return resp if resp.primary_hints.HasField("hints") else None

        hints = await eventually(
            primary_hints_written, what="the primary's hints", timeout=10, interval=0.1
        )
        assert hints.primary_hints.hints.log == f"{s.prefix}/recovery/shard-000"
        assert len(hints.primary_hints.hints.live_nodes) > 0
        assert [h.hints.log for h in hints.backup_hints] == [hints.primary_hints.hints.log] * 2


async def test_zombie_primary_cannot_commit_after_handoff(
    new_setup: Callable[..., Setup],
    client: JournalClient,
) -> None:
    """A primary frozen (SIGSTOP) until its lease expired and the standby took over, then
    resumed, must not commit anything: its recovery log is fenced by the hand-off."""
    s = new_setup()
    await s.create_journals(client)
    procs = s.start(2)
    async with s.stubs() as stubs:
        await apply_shards(stubs["consumer-0"], s.shard_specs(hot_standbys=1))
        await until_ready(stubs["consumer-0"], [STANDBY, PRIMARY], "a primary and a standby")
        expected: dict[str, int] = {}
        stop = asyncio.Event()
        feeder = asyncio.create_task(feed(client, s.inputs[0], stop, expected))
        await asyncio.sleep(1.0)  # The primary processes input until it freezes.
        zombie = await primary_of(stubs["consumer-0"], "shard-000")
        survivor = next(k for k in procs if k != zombie)
        procs[zombie].pause()
        try:
            await until_primary(stubs[survivor], survivor, "the standby's promotion")
            await caught_up(client, stubs[survivor], s.inputs[0])  # It commits transactions.
        finally:
            procs[zombie].resume()
        # The zombie wakes up with a transaction to commit, learns its lease is gone and
        # exits by itself (the input still flowing): a fenced exit, which its log says
        # plainly (no ERROR, no traceback) and its exit status names.
        assert procs[zombie].proc is not None
        code = await asyncio.to_thread(procs[zombie].proc.wait, 30)
        stop.set()
        await feeder
        await check_totals(client, stubs[survivor], s, expected)
        log = procs[zombie].tail_log(200_000)
        assert code == EXIT_FENCED, log[-3000:]
        assert "fenced: the lease of member z" in log, log[-3000:]
        # (" ERROR ": the fusefs process's log lines, which tell a fence from a failure.)
        for bad in ("level=ERROR", " ERROR ", "Traceback", "Event loop is closed", "Cancelled"):
            assert bad not in log, log[-6000:]


async def test_graceful_exit_hands_off_without_standbys(
    new_setup: Callable[..., Setup],
    client: JournalClient,
) -> None:
    """SIGTERM of the primary of a shard with zero standbys: a new replica on the other
    process reaches STANDBY before the old primary lets go; processing resumes quickly and
    the totals stay exact."""
    s = new_setup()
    await s.create_journals(client)
    procs = s.start(2)
    async with s.stubs() as stubs:
        await apply_shards(stubs["consumer-0"], s.shard_specs(hot_standbys=0))
        await until_ready(stubs["consumer-0"], [PRIMARY], "a primary")
        expected: dict[str, int] = {}
        stop = asyncio.Event()
        feeder = asyncio.create_task(feed(client, s.inputs[0], stop, expected))
        await asyncio.sleep(1.0)  # The primary processes input until it is stopped.
        leaving = await primary_of(stubs["consumer-0"], "shard-000")
        staying = next(k for k in procs if k != leaving)
        # Progress as the committed read-through of the shard, sampled while it moves.
        samples: list[tuple[float, int]] = []

        async def sample() -> None:
            while not stop.is_set():
                try:
                    resp = await stubs[staying].Stat(pb.StatRequest(shard="shard-000"), timeout=5)
                    if resp.status == pb.OK:
                        samples.append((time.monotonic(), resp.read_through[s.inputs[0]]))
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.02)  # The sampling period.

        sampler = asyncio.create_task(sample())
        await asyncio.sleep(0.5)  # Samples of the progress before the stop.
        t0 = time.monotonic()
        await asyncio.to_thread(procs[leaving].stop)
        stopped_in = time.monotonic() - t0
        await until_ready(stubs[staying], [PRIMARY], "the primary on the other process")
        await caught_up(client, stubs[staying], s.inputs[0])  # Processing resumed.
        stop.set()
        await feeder
        await sampler
        await check_totals(client, stubs[staying], s, expected)
        # The longest time read-through did not move while input kept arriving.
        stall, last_t, last_v = 0.0, samples[0][0], samples[0][1]
        for t, v in samples:
            if v != last_v:
                stall = max(stall, t - last_t)
                last_t, last_v = t, v
        print(f"graceful hand-off: SIGTERM to exit {stopped_in:.2f}s, longest stall {stall:.2f}s")
        assert stall < 5.0, f"processing stalled {stall:.2f}s during the hand-off"


def fusefs_pid(proc: ConsumerProcess) -> int:
    """The pid of the fusefs process that last mounted a store for `proc`."""
    found = re.findall(rb"fusefs ready pid=(\d+) mountpoint=", proc.log_path.read_bytes())
    assert found, proc.tail_log()
    return int(found[-1])


@pytest.mark.parametrize("hot_standbys", [1, 0])
async def test_a_killed_fusefs_process_hands_the_shard_over(
    hot_standbys: int,
    new_setup: Callable[..., Setup],
    client: JournalClient,
) -> None:
    """SIGKILL of the fusefs process recording a primary's RocksDB store (the application's
    I/O then fails with "Transport endpoint is not connected"): the shard does not stay
    FAILED. With a hot standby, the standby takes over and the process that lost its fusefs
    serves a new standby; without, a replica assigned anew recovers it. Totals stay exact."""
    s = new_setup()
    await s.create_journals(client)
    procs = s.start(2)
    async with s.stubs() as stubs:
        await apply_shards(stubs["consumer-0"], s.shard_specs(hot_standbys=hot_standbys))
        codes = [PRIMARY] + [STANDBY] * hot_standbys
        await until_ready(stubs["consumer-0"], codes, "the shard's replicas")
        expected: dict[str, int] = {}
        stop = asyncio.Event()
        feeder = asyncio.create_task(feed(client, s.inputs[0], stop, expected))
        try:
            await asyncio.sleep(1.0)  # The primary processes input until its fusefs dies.
            victim = await primary_of(stubs["consumer-0"], "shard-000")
            os.kill(fusefs_pid(procs[victim]), signal.SIGKILL)

            await eventually(
                lambda: (
                    b"gave its assignment up (recording lost)"
                    in procs[victim].log_path.read_bytes()
                ),
                what="the replica to give its assignment up",
                timeout=PROCESS_TIMEOUT,
            )
            if hot_standbys:
                survivor = next(k for k in procs if k != victim)
                await until_primary(stubs[survivor], survivor, "the standby's promotion")
            await until_ready(stubs["consumer-0"], codes, "the shard's replicas again")
            primary = await primary_of(stubs["consumer-0"], "shard-000")
            await caught_up(client, stubs[primary], s.inputs[0])  # It commits transactions.
            assert not feeder.done()
        finally:
            stop.set()
            await asyncio.wait({feeder}, timeout=30)
        await feeder
        primary = await primary_of(stubs["consumer-0"], "shard-000")
        await check_totals(client, stubs[primary], s, expected)
        log = procs[victim].tail_log(200_000)
        assert "shard lost its store's recording process; handing it over" in log, log[-3000:]
        assert "shard failed" not in log, log[-3000:]


async def test_a_primary_fenced_while_still_assigned_hands_the_shard_over(
    new_setup: Callable[..., Setup], client: JournalClient
) -> None:
    """The recovery log's registers stop naming the primary's author while it still holds its
    assignment (as when a broker restarted on registers older than the route's): its Recorder
    is fenced, but the shard does not stay FAILED. The replica gives the assignment up, one
    assigned anew recovers the log, fences it to its own author, and processing resumes;
    totals stay exact."""
    s = new_setup()
    await s.create_journals(client)
    procs = s.start(1)
    (name,) = procs
    async with s.stubs() as stubs:
        await apply_shards(stubs[name], s.shard_specs(hot_standbys=0))
        await until_ready(stubs[name], [PRIMARY], "the shard's primary")
        expected: dict[str, int] = {}
        stop = asyncio.Event()
        feeder = asyncio.create_task(feed(client, s.inputs[0], stop, expected))
        try:
            await asyncio.sleep(1.0)  # The primary records transactions.
            log_name = f"{s.prefix}/recovery/shard-000"
            current = await append(client, bpb.AppendRequest(journal=log_name), b"")
            stale = bpb.AppendRequest(
                journal=log_name,
                subtract_registers=current.registers,
                union_registers=author_fence(0xDEAD),
            )
            # A no-op of another author (players skip it) carries the register change.
            resp = await append(client, stale, encode_op(rpb.RecordedOp(author=0xDEAD)))
            assert resp.registers == author_fence(0xDEAD), resp
            await eventually(
                lambda: (
                    b"gave its assignment up (recorder fenced)" in procs[name].log_path.read_bytes()
                ),
                what="the replica to give its assignment up",
                timeout=PROCESS_TIMEOUT,
            )
            await until_ready(stubs[name], [PRIMARY], "the shard's primary again")
            await caught_up(client, stubs[name], s.inputs[0])  # It commits transactions.
            assert not feeder.done()
        finally:
            stop.set()
            await asyncio.wait({feeder}, timeout=30)
        await feeder
        await check_totals(client, stubs[name], s, expected)


@pytest.mark.parametrize("status", ["primary", "failed"])
async def test_last_consumer_exits_without_waiting_out_the_drain(
    status: str,
    new_setup: Callable[..., Setup],
    client: JournalClient,
) -> None:
    """SIGTERM to the only consumer of an application, whose shard is PRIMARY or FAILED: no
    other member can take it, so the process exits at once instead of waiting out
    --drain-timeout (60 s by default)."""
    s = new_setup()
    await s.create_journals(client)
    proc = s.start(1)["consumer-0"]
    async with s.stubs() as stubs:
        stub = stubs["consumer-0"]
        await apply_shards(stub, s.shard_specs(hot_standbys=1))
        await until_ready(stub, [PRIMARY], "a primary")
        if status == "failed":
            async with AppendService(client) as svc:
                pub = Publisher(svc)
                pub.publish_committed(
                    lambda _m: (s.inputs[0], CONTENT_TYPE_JSON_LINES), Add(POISON, 1)
                )
                await pub.barrier()
            await until_ready(stub, [FAILED], "the shard FAILED")
    t0 = time.monotonic()
    await asyncio.to_thread(proc.stop)
    took = time.monotonic() - t0
    log = proc.tail_log(100_000)
    assert took < 10.0, f"SIGTERM to exit took {took:.1f}s:\n{log[-3000:]}"
    assert "no other member can take the shards left" in log, log[-3000:]
    assert "drain timed out" not in log


async def test_spec_changes_apply_to_a_running_shard(
    new_setup: Callable[..., Setup],
    client: JournalClient,
) -> None:
    """A new max_txn_duration applies without a restart; a new source restarts the replica,
    which then reads it too, and the totals stay exact."""
    s = new_setup(shards=2)  # Two input journals; one shard used.
    await s.create_journals(client)
    proc = s.start(1)["consumer-0"]
    async with s.stubs() as stubs:
        stub = stubs["consumer-0"]
        spec = s.shard_specs(hot_standbys=0)[0]
        await apply_shards(stub, [spec])
        await until_ready(stub, [PRIMARY], "a primary")
        expected: dict[str, int] = {}
        stop = asyncio.Event()
        await asyncio.wait_for(
            asyncio.gather(feed(client, s.inputs[0], stop, expected), stop_after(stop, 0.5)), 30
        )
        spec.max_txn_duration.FromNanoseconds(50_000_000)
        resp = await stub.List(pb.ListRequest())
        req = pb.ApplyRequest(
            changes=[
                pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=resp.shards[0].mod_revision)
            ]
        )
        assert (await stub.Apply(req)).status == pb.OK
        await asyncio.sleep(0.5)  # A restart, were there one, would have happened.
        assert "shard restarted" not in proc.tail_log(100_000)
        spec.sources.add(journal=s.inputs[1])
        resp = await stub.List(pb.ListRequest())
        req = pb.ApplyRequest(
            changes=[
                pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=resp.shards[0].mod_revision)
            ]
        )
        assert (await stub.Apply(req)).status == pb.OK
        await eventually(
            lambda: b"shard restarted (spec) shard=shard-000" in proc.log_path.read_bytes(),
            what="the replica's restart",
            timeout=PROCESS_TIMEOUT,
        )
        await until_ready(stub, [PRIMARY], "the primary again")
        stop = asyncio.Event()
        await asyncio.wait_for(
            asyncio.gather(feed(client, s.inputs[1], stop, expected), stop_after(stop, 0.5)), 30
        )
        head0 = await write_head(client, s.inputs[0])
        head1 = await write_head(client, s.inputs[1])
        resp2: pb.StatResponse = await stub.Stat(
            pb.StatRequest(
                shard="shard-000", read_through={s.inputs[0]: head0, s.inputs[1]: head1}
            ),
            timeout=60,
        )
        assert resp2.status == pb.OK
        out_head = await write_head(client, s.output)
        final: dict[str, int] = {}
        for t in await committed_totals(client, s.output, out_head):
            final[t.key] = t.total
        assert final == expected


async def stop_after(stop: asyncio.Event, seconds: float) -> None:
    await asyncio.sleep(seconds)  # How long the feed goes on.
    stop.set()
