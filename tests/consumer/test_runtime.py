"""The consumer runtime end to end: etcd, a broker, and real `gazette-consumer` processes of
the counter application (tests/consumer/counter_app.py) with RocksDB stores over fusefs."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc.aio
import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import AppendService, JournalClient
from gazette.broker.client.list import apply_journals
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.main import EXIT_FENCED
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.iterators import ReadCommittedIter
from gazette.message.publisher import Publisher
from gazette.testing.broker import BrokerProcess
from gazette.testing.consumer import ConsumerProcess
from gazette.testing.etcd import EtcdServer
from tests.consumer.counter_app import POISON, Add, Total

REPO = Path(__file__).resolve().parents[2]
_names = itertools.count()


def journal_spec(name: str, store: Path, content_type: str) -> bpb.JournalSpec:
    frag = bpb.JournalSpec.Fragment(
        length=1 << 24, compression_codec=bpb.NONE, refresh_interval=Duration(seconds=60)
    )
    frag.stores.append(f"file://{store}/")
    spec = bpb.JournalSpec(name=name, replication=1, fragment=frag)
    spec.labels.labels.add(name="content-type", value=content_type)
    return spec


class Setup:
    """Journals, shard specs and consumer processes of one test."""

    def __init__(self, etcd: EtcdServer, broker: BrokerProcess, tmp: Path, shards: int) -> None:
        n = next(_names)
        self.prefix = f"counter-{os.getpid()}-{n}"
        self.root = f"/test-consumer/{os.getpid()}/{n}"
        self.etcd, self.broker, self.tmp = etcd, broker, tmp
        self.inputs = [f"{self.prefix}/in-{i}" for i in range(shards)]
        self.output = f"{self.prefix}/out"
        self.shard_ids = [f"shard-{i:03d}" for i in range(shards)]
        self.consumers: list[ConsumerProcess] = []

    async def create_journals(self, client: JournalClient) -> None:
        store = self.tmp / "fragments"
        store.mkdir(exist_ok=True)
        specs = [journal_spec(j, store, CONTENT_TYPE_JSON_LINES) for j in self.inputs]
        specs.append(journal_spec(self.output, store, CONTENT_TYPE_JSON_LINES))
        specs += [
            journal_spec(f"{self.prefix}/recovery/{s}", store, "application/x-gazette-recoverylog")
            for s in self.shard_ids
        ]
        changes = [bpb.ApplyRequest.Change(upsert=s) for s in specs]
        await apply_journals(client, bpb.ApplyRequest(changes=changes))

    def shard_specs(self, hot_standbys: int) -> list[pb.ShardSpec]:
        return [
            pb.ShardSpec(
                id=sid,
                sources=[pb.ShardSpec.Source(journal=j)],
                recovery_log_prefix=f"{self.prefix}/recovery",
                hint_prefix=f"/test-hints/{self.prefix}",
                hint_backups=2,
                max_txn_duration=Duration(nanos=200_000_000),
                hot_standbys=hot_standbys,
            )
            for sid, j in zip(self.shard_ids, self.inputs, strict=True)
        ]

    def consumer(self, i: int) -> ConsumerProcess:
        c = ConsumerProcess(
            "tests.consumer.counter_app:Counter",
            self.etcd.endpoint,
            [self.broker.endpoint],
            root=self.root,
            zone=f"z{i % 2}",
            suffix=f"consumer-{i}",
            workdir=self.tmp / f"consumer-{i}",
            extra_env={"COUNTER_OUTPUT": self.output, "PYTHONPATH": str(REPO)},
            extra_args=["--hint-interval", "1"],
        )
        self.consumers.append(c)
        return c

    def close(self) -> None:
        for c in self.consumers:
            c.kill()


@pytest.fixture
def setup_factory(
    etcd_server: EtcdServer, broker: BrokerProcess, tmp_path: Path
) -> Iterator[list[Setup]]:
    made: list[Setup] = []
    yield made
    for s in made:
        s.close()


async def apply_shards(stub: pb_grpc.ShardStub, specs: list[pb.ShardSpec]) -> None:
    req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=s) for s in specs])
    resp = await stub.Apply(req)
    assert resp.status == pb.OK, resp


async def shard_status(stub: pb_grpc.ShardStub) -> dict[str, list[int]]:
    resp = await stub.List(pb.ListRequest())
    return {s.spec.id: [st.code for st in s.status] for s in resp.shards}


async def wait_for(cond: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ok = await cond()  # type: ignore[operator]
        if ok:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def stat_through(
    stub: pb_grpc.ShardStub, shard: str, journal: str, offset: int
) -> pb.StatResponse:
    resp: pb.StatResponse = await stub.Stat(
        pb.StatRequest(shard=shard, read_through={journal: offset}), timeout=60
    )
    assert resp.status == pb.OK, resp
    return resp


async def committed_totals(client: JournalClient, journal: str, end: int) -> list[Total]:
    req = bpb.ReadRequest(journal=journal, offset=0, end_offset=end, block=True)
    it = ReadCommittedIter(client, req, None, lambda _s: Total())
    out = []
    try:
        while True:
            try:
                env = await it.next()
            except StopAsyncIteration:
                break
            if env.message.key:  # ACKs carry no key
                out.append(env.message)
    finally:
        it.close()
    return out


async def write_head(client: JournalClient, journal: str) -> int:
    stub = client.stub_for(journal)
    resp = await stub.Read(bpb.ReadRequest(journal=journal, offset=-1, metadata_only=True)).read()
    return int(resp.write_head)


async def primary_of(stub: pb_grpc.ShardStub, shard: str) -> str:
    resp = await stub.List(pb.ListRequest())
    for sh in resp.shards:
        if sh.spec.id == shard and sh.route.primary >= 0:
            return str(sh.route.members[sh.route.primary].suffix)
    return ""


async def feed(
    client: JournalClient, journal: str, stop: asyncio.Event, expected: dict[str, int]
) -> None:
    """Publish Adds (committed) until `stop`; `expected` sums what was acknowledged."""
    async with AppendService(client) as svc:
        pub = Publisher(svc)
        mapping = lambda _m: (journal, CONTENT_TYPE_JSON_LINES)  # noqa: E731
        i = 0
        while not stop.is_set():
            batch = {}
            for _ in range(20):
                key = f"k{i % 7}"
                batch[key] = batch.get(key, 0) + i
                pub.publish_committed(mapping, Add(key, i))
                i += 1
            await pub.barrier()
            for k, v in batch.items():
                expected[k] = expected.get(k, 0) + v
            await asyncio.sleep(0.02)


async def check_totals(
    client: JournalClient, stub: pb_grpc.ShardStub, s: Setup, expected: dict[str, int]
) -> None:
    """Once the shard read its input through, the committed totals are exactly `expected`:
    each key's totals strictly increase (no duplicate, no rollback) and end at its sum."""
    head = await write_head(client, s.inputs[0])
    await stat_through(stub, "shard-000", s.inputs[0], head)
    out_head = await write_head(client, s.output)
    final: dict[str, int] = {}
    for t in await committed_totals(client, s.output, out_head):
        assert t.total > final.get(t.key, -1), f"total of {t.key} repeated or went back"
        final[t.key] = t.total
    assert final == expected


async def test_counts_survive_primary_kills_with_a_hot_standby(
    setup_factory: list[Setup],
    etcd_server: EtcdServer,
    broker: BrokerProcess,
    client: JournalClient,
    tmp_path: Path,
) -> None:
    s = Setup(etcd_server, broker, tmp_path, shards=1)
    setup_factory.append(s)
    await s.create_journals(client)
    procs = {c.suffix: c for c in (s.consumer(0).start(), s.consumer(1).start())}
    async with (
        grpc.aio.insecure_channel(s.consumers[0].endpoint) as ch0,
        grpc.aio.insecure_channel(s.consumers[1].endpoint) as ch1,
    ):
        stubs = {
            s.consumers[0].suffix: pb_grpc.ShardStub(ch0),
            s.consumers[1].suffix: pb_grpc.ShardStub(ch1),
        }
        stub = stubs["consumer-0"]
        await apply_shards(stub, s.shard_specs(hot_standbys=1))

        def ready_on(stub: pb_grpc.ShardStub) -> object:
            async def ready() -> bool:
                try:
                    st = await shard_status(stub)
                except grpc.aio.AioRpcError:
                    return False
                return sorted(st.get("shard-000", [])) == [
                    pb.ReplicaStatus.STANDBY,
                    pb.ReplicaStatus.PRIMARY,
                ]

            return ready

        await wait_for(ready_on(stub), "a primary and a standby")
        expected: dict[str, int] = {}
        stop = asyncio.Event()
        feeder = asyncio.create_task(feed(client, s.inputs[0], stop, expected))
        takeovers = []
        for _ in range(3):
            await asyncio.sleep(0.5)
            victim = await primary_of(stub, "shard-000")
            survivor = next(k for k in procs if k != victim)
            t0 = time.monotonic()
            procs[victim].kill()

            async def promoted(survivor: str = survivor) -> bool:
                return await primary_of(stubs[survivor], "shard-000") == survivor

            await wait_for(promoted, "the standby's promotion")
            takeovers.append(time.monotonic() - t0)
            procs[victim].start()
            await wait_for(ready_on(stubs[survivor]), "a new standby")
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
        # Primaries wrote hints (every second here), and each takeover rotated the hints it
        # recovered from into the backups.
        hints = await stub.GetHints(pb.GetHintsRequest(shard="shard-000"))
        assert hints.status == pb.OK
        assert hints.primary_hints.hints.log == f"{s.prefix}/recovery/shard-000"
        assert len(hints.primary_hints.hints.live_nodes) > 0
        assert [h.hints.log for h in hints.backup_hints] == [hints.primary_hints.hints.log] * 2


def ready_on(stub: pb_grpc.ShardStub, codes: list[int]) -> object:
    async def ready() -> bool:
        try:
            st = await shard_status(stub)
        except grpc.aio.AioRpcError:
            return False
        return sorted(st.get("shard-000", [])) == sorted(codes)

    return ready


async def test_zombie_primary_cannot_commit_after_handoff(
    setup_factory: list[Setup],
    etcd_server: EtcdServer,
    broker: BrokerProcess,
    client: JournalClient,
    tmp_path: Path,
) -> None:
    """A primary frozen (SIGSTOP) until its lease expired and the standby took over, then
    resumed, must not commit anything: its recovery log is fenced by the hand-off."""
    s = Setup(etcd_server, broker, tmp_path, shards=1)
    setup_factory.append(s)
    await s.create_journals(client)
    procs = {c.suffix: c for c in (s.consumer(0).start(), s.consumer(1).start())}
    async with (
        grpc.aio.insecure_channel(s.consumers[0].endpoint) as ch0,
        grpc.aio.insecure_channel(s.consumers[1].endpoint) as ch1,
    ):
        stubs = {"consumer-0": pb_grpc.ShardStub(ch0), "consumer-1": pb_grpc.ShardStub(ch1)}
        await apply_shards(stubs["consumer-0"], s.shard_specs(hot_standbys=1))
        both = [pb.ReplicaStatus.STANDBY, pb.ReplicaStatus.PRIMARY]
        await wait_for(ready_on(stubs["consumer-0"], both), "a primary and a standby")
        expected: dict[str, int] = {}
        stop = asyncio.Event()
        feeder = asyncio.create_task(feed(client, s.inputs[0], stop, expected))
        await asyncio.sleep(1.0)
        zombie = await primary_of(stubs["consumer-0"], "shard-000")
        survivor = next(k for k in procs if k != zombie)
        procs[zombie].pause()
        try:

            async def promoted() -> bool:
                return await primary_of(stubs[survivor], "shard-000") == survivor

            await wait_for(promoted, "the standby's promotion")
            await asyncio.sleep(1.0)  # The new primary commits transactions.
        finally:
            procs[zombie].resume()
        await asyncio.sleep(2.0)  # The zombie wakes up with a transaction to commit.
        stop.set()
        await feeder
        await check_totals(client, stubs[survivor], s, expected)
        # The zombie learns its lease is gone and exits by itself: a fenced exit, which its
        # log says plainly (no ERROR, no traceback) and its exit status names.
        assert procs[zombie].proc is not None
        code = await asyncio.to_thread(procs[zombie].proc.wait, 30)
        log = procs[zombie].tail_log(200_000)
        assert code == EXIT_FENCED, log[-3000:]
        assert "fenced: the lease of member z" in log, log[-3000:]
        # (" ERROR ": the fusefs process's log lines, which tell a fence from a failure.)
        for bad in ("level=ERROR", " ERROR ", "Traceback", "Event loop is closed", "Cancelled"):
            assert bad not in log, log[-6000:]


async def test_graceful_exit_hands_off_without_standbys(
    setup_factory: list[Setup],
    etcd_server: EtcdServer,
    broker: BrokerProcess,
    client: JournalClient,
    tmp_path: Path,
) -> None:
    """SIGTERM of the primary of a shard with zero standbys: a new replica on the other
    process reaches STANDBY before the old primary lets go; processing resumes quickly and
    the totals stay exact."""
    s = Setup(etcd_server, broker, tmp_path, shards=1)
    setup_factory.append(s)
    await s.create_journals(client)
    procs = {c.suffix: c for c in (s.consumer(0).start(), s.consumer(1).start())}
    async with (
        grpc.aio.insecure_channel(s.consumers[0].endpoint) as ch0,
        grpc.aio.insecure_channel(s.consumers[1].endpoint) as ch1,
    ):
        stubs = {"consumer-0": pb_grpc.ShardStub(ch0), "consumer-1": pb_grpc.ShardStub(ch1)}
        await apply_shards(stubs["consumer-0"], s.shard_specs(hot_standbys=0))
        await wait_for(ready_on(stubs["consumer-0"], [pb.ReplicaStatus.PRIMARY]), "a primary")
        expected: dict[str, int] = {}
        stop = asyncio.Event()
        feeder = asyncio.create_task(feed(client, s.inputs[0], stop, expected))
        await asyncio.sleep(1.0)
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
                await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample())
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        await asyncio.to_thread(procs[leaving].stop)
        stopped_in = time.monotonic() - t0
        await wait_for(
            ready_on(stubs[staying], [pb.ReplicaStatus.PRIMARY]), "the primary on the other process"
        )
        await asyncio.sleep(1.0)
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
    setup_factory: list[Setup],
    etcd_server: EtcdServer,
    broker: BrokerProcess,
    client: JournalClient,
    tmp_path: Path,
) -> None:
    """SIGKILL of the fusefs process recording a primary's RocksDB store (the application's
    I/O then fails with "Transport endpoint is not connected"): the shard does not stay
    FAILED. With a hot standby, the standby takes over and the process that lost its fusefs
    serves a new standby; without, a replica assigned anew recovers it. Totals stay exact."""
    s = Setup(etcd_server, broker, tmp_path, shards=1)
    setup_factory.append(s)
    await s.create_journals(client)
    procs = {c.suffix: c for c in (s.consumer(0).start(), s.consumer(1).start())}
    async with (
        grpc.aio.insecure_channel(s.consumers[0].endpoint) as ch0,
        grpc.aio.insecure_channel(s.consumers[1].endpoint) as ch1,
    ):
        stubs = {"consumer-0": pb_grpc.ShardStub(ch0), "consumer-1": pb_grpc.ShardStub(ch1)}
        await apply_shards(stubs["consumer-0"], s.shard_specs(hot_standbys=hot_standbys))
        codes = [pb.ReplicaStatus.PRIMARY] + [pb.ReplicaStatus.STANDBY] * hot_standbys
        await wait_for(ready_on(stubs["consumer-0"], codes), "the shard's replicas")
        expected: dict[str, int] = {}
        stop = asyncio.Event()
        feeder = asyncio.create_task(feed(client, s.inputs[0], stop, expected))
        try:
            await asyncio.sleep(1.0)
            victim = await primary_of(stubs["consumer-0"], "shard-000")
            os.kill(fusefs_pid(procs[victim]), signal.SIGKILL)

            async def handed_over() -> bool:
                log = procs[victim].log_path.read_bytes()
                return b"gave its assignment up (recording lost)" in log

            await wait_for(handed_over, "the replica to give its assignment up")
            if hot_standbys:
                survivor = next(k for k in procs if k != victim)

                async def promoted() -> bool:
                    return await primary_of(stubs[survivor], "shard-000") == survivor

                await wait_for(promoted, "the standby's promotion")
            await wait_for(ready_on(stubs["consumer-0"], codes), "the shard's replicas again")
            await asyncio.sleep(1.0)  # The new primary commits transactions.
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


@pytest.mark.parametrize("status", ["primary", "failed"])
async def test_last_consumer_exits_without_waiting_out_the_drain(
    status: str,
    setup_factory: list[Setup],
    etcd_server: EtcdServer,
    broker: BrokerProcess,
    client: JournalClient,
    tmp_path: Path,
) -> None:
    """SIGTERM to the only consumer of an application, whose shard is PRIMARY or FAILED: no
    other member can take it, so the process exits at once instead of waiting out
    --drain-timeout (60 s by default)."""
    s = Setup(etcd_server, broker, tmp_path, shards=1)
    setup_factory.append(s)
    await s.create_journals(client)
    proc = s.consumer(0).start()
    async with grpc.aio.insecure_channel(proc.endpoint) as ch:
        stub = pb_grpc.ShardStub(ch)
        await apply_shards(stub, s.shard_specs(hot_standbys=1))
        await wait_for(ready_on(stub, [pb.ReplicaStatus.PRIMARY]), "a primary")
        if status == "failed":
            async with AppendService(client) as svc:
                pub = Publisher(svc)
                pub.publish_committed(
                    lambda _m: (s.inputs[0], CONTENT_TYPE_JSON_LINES), Add(POISON, 1)
                )
                await pub.barrier()
            await wait_for(ready_on(stub, [pb.ReplicaStatus.FAILED]), "the shard FAILED")
    t0 = time.monotonic()
    await asyncio.to_thread(proc.stop)
    took = time.monotonic() - t0
    log = proc.tail_log(100_000)
    assert took < 10.0, f"SIGTERM to exit took {took:.1f}s:\n{log[-3000:]}"
    assert "no other member can take the shards left" in log, log[-3000:]
    assert "drain timed out" not in log


async def test_spec_changes_apply_to_a_running_shard(
    setup_factory: list[Setup],
    etcd_server: EtcdServer,
    broker: BrokerProcess,
    client: JournalClient,
    tmp_path: Path,
) -> None:
    """A new max_txn_duration applies without a restart; a new source restarts the replica,
    which then reads it too, and the totals stay exact."""
    s = Setup(etcd_server, broker, tmp_path, shards=2)  # Two input journals; one shard used.
    setup_factory.append(s)
    await s.create_journals(client)
    proc = s.consumer(0).start()
    async with grpc.aio.insecure_channel(proc.endpoint) as ch:
        stub = pb_grpc.ShardStub(ch)
        spec = s.shard_specs(hot_standbys=0)[0]
        await apply_shards(stub, [spec])
        await wait_for(ready_on(stub, [pb.ReplicaStatus.PRIMARY]), "a primary")
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
        await asyncio.sleep(0.5)
        assert "shard restarted" not in proc.tail_log(100_000)
        spec.sources.add(journal=s.inputs[1])
        resp = await stub.List(pb.ListRequest())
        req = pb.ApplyRequest(
            changes=[
                pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=resp.shards[0].mod_revision)
            ]
        )
        assert (await stub.Apply(req)).status == pb.OK
        await wait_for(
            lambda: _true(b"shard restarted (spec) shard=shard-000" in proc.log_path.read_bytes()),
            "the replica's restart",
        )
        await wait_for(ready_on(stub, [pb.ReplicaStatus.PRIMARY]), "the primary again")
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


async def _true(value: bool) -> bool:
    return value


async def stop_after(stop: asyncio.Event, seconds: float) -> None:
    await asyncio.sleep(seconds)
    stop.set()
