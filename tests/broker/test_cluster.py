"""A replicated cluster of three real broker processes on one etcd.

Journals are allocated by the brokers' allocator leader; appends commit only once every replica
acknowledged them; non-primary brokers proxy; a SIGKILLed primary loses no acknowledged append
and every replica (and the fragment store) ends up with identical bytes.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gazette.allocator.model import MemberID, member_key
from gazette.broker.client import AppendService, JournalClient, RetryReader
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.broker.protocol.direct_framing import RESPONSE
from gazette.keyspace.etcd import Etcd
from gazette.testing.broker import BrokerProcess
from gazette.testing.cluster import BrokerCluster
from gazette.testing.etcd import EtcdServer
from tests.broker.cluster_support import create, primary_suffix, produce, route, stubs, wait_route
from tests.broker.conftest import append, read_all
from tests.broker.raw_direct import Raw, committed
from tests.kit import specs
from tests.kit.eventually import eventually

_names = itertools.count()


class Cluster(BrokerCluster):
    """Three brokers (zones a, b, a) and the file:// store their journals use."""

    def __init__(self, etcd: EtcdServer, root: str, spool_root: Path, store: Path) -> None:
        super().__init__(
            etcd.endpoint, root=root, spool_root=spool_root, extra_args=["--drain-timeout", "20"]
        )
        self.store = store


@pytest.fixture(scope="module")
def cluster(etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = f"/test-cluster/{os.getpid()}/{next(_names)}"
    store = tmp_path_factory.mktemp("cluster-store")
    with Cluster(etcd_server, root, tmp_path_factory.mktemp("cluster"), store) as c:
        yield c


def spec(name: str, store: Path, replication: int = 3) -> pb.JournalSpec:
    return specs.journal_spec(
        name, store, replication=replication, length=64 << 10, refresh=1, labels={"app": "cluster"}
    )


async def test_replicated_appends_are_identical_on_every_replica(cluster: Cluster) -> None:
    async with stubs(cluster) as st:
        s = spec(f"cluster/identical-{next(_names)}", cluster.store)
        await create(st[0], s)
        r = await wait_route(st[0], s.name, 3)
        zones = {m.zone for m in r.members}
        assert zones == {"zone-a", "zone-b"}
        sent = b""
        for i in range(20):
            chunk = f"record {i} ".encode() * (i + 1)
            resp = await append(st[i % 3], s.name, chunk)
            assert resp.status == pb.OK, resp
            assert resp.commit.begin == len(sent)
            sent += chunk
        for i, stub in enumerate(st):
            content, _ = await read_all(stub, s.name, do_not_proxy=True)
            assert content == sent, f"replica b{i} differs"


async def unreplicated(
    cluster: Cluster, stub: pb_grpc.JournalStub, prefix: str
) -> tuple[pb.JournalSpec, str, int]:
    """A new journal of one replica: its spec, its primary's suffix, and the index of a broker
    that is not its primary."""
    s = spec(f"cluster/{prefix}-{next(_names)}", cluster.store, replication=1)
    await create(stub, s)
    primary = primary_suffix(await wait_route(stub, s.name, 1))
    other = next(i for i, b in enumerate(cluster.brokers) if b.suffix != primary)
    return s, primary, other


async def test_non_primary_brokers_proxy(cluster: Cluster) -> None:
    async with stubs(cluster) as st:
        s, primary, other = await unreplicated(cluster, st[0], "proxy")
        resp = await append(st[other], s.name, b"via a proxy\n")
        assert resp.status == pb.OK
        assert resp.header.process_id.suffix == primary  # answered by the primary
        content, _ = await read_all(st[other], s.name)
        assert content == b"via a proxy\n"
        # Without proxying, a broker that is not the primary says so, with the route.
        refused = await append(st[other], s.name, b"x", do_not_proxy=True)
        assert refused.status == pb.NOT_JOURNAL_PRIMARY_BROKER
        assert primary_suffix(refused.header.route) == primary
        async for resp_ in st[other].Read(
            pb.ReadRequest(journal=s.name, offset=0, do_not_proxy=True)
        ):
            assert resp_.status == pb.NOT_JOURNAL_BROKER
            break


async def test_direct_appends_through_another_broker_stay_in_step(cluster: Cluster) -> None:
    """A proxied direct append that the primary refuses before its content ends leaves the
    connection ready for the next append, whose answer is its own."""
    async with stubs(cluster) as st:
        s, primary, other = await unreplicated(cluster, st[0], "direct-proxy")
        raw = await Raw.open(cluster.brokers[other])
        expected = b""
        try:
            for i in range(10):
                content = [pb.AppendRequest(content=b"r" * 200_000)] * 3
                kind, got = await raw.append(
                    pb.AppendRequest(journal=s.name, offset=1 << 40), *content, pb.AppendRequest()
                )
                assert kind == RESPONSE and isinstance(got, pb.AppendResponse), got
                assert got.status == pb.WRONG_APPEND_OFFSET
                body = f"ok {i}\n".encode()
                kind, got = await raw.append(*committed(s.name, body))
                assert kind == RESPONSE and isinstance(got, pb.AppendResponse), got
                assert (got.status, got.header.process_id.suffix) == (pb.OK, primary)
                assert (got.commit.begin, got.commit.end) == (len(expected), len(expected + body))
                expected += body
        finally:
            raw.close()
        assert (await read_all(st[other], s.name))[0] == expected


async def test_insufficient_brokers(cluster: Cluster) -> None:
    async with stubs(cluster) as st:
        s = spec(f"cluster/r4-{next(_names)}", cluster.store, replication=4)
        await create(st[0], s)
        await wait_route(st[0], s.name, 3)
        resp = await append(st[0], s.name, b"needs four brokers")
        assert resp.status == pb.INSUFFICIENT_JOURNAL_BROKERS
        assert len(resp.header.route.members) == 3


async def read_replica(stub: pb_grpc.JournalStub, journal: str) -> bytes:
    """Everything one replica serves without proxying: its local content, plus persisted
    fragments it names by URL (file:// here), read directly as a client would."""
    out = bytearray()
    offset = 0
    while True:
        remote: pb.ReadResponse | None = None
        async for resp in stub.Read(
            pb.ReadRequest(journal=journal, offset=offset, do_not_proxy=True)
        ):
            if resp.content:
                out += resp.content
                offset += len(resp.content)
                remote = None
            elif resp.status == pb.OK and resp.fragment_url:
                remote = resp
        if remote is None:
            return bytes(out)
        path = Path(remote.fragment_url.removeprefix("file://"))
        data = path.read_bytes()
        out += data[remote.offset - remote.fragment.begin :]
        offset = remote.fragment.end


def check_acked(content: bytes, acked: list[int]) -> None:
    """Every acknowledged append is in `content`, in order (retries may duplicate some)."""
    seen = [int(line) for line in content.decode().split()]
    pos = {n: i for i, n in reversed(list(enumerate(seen)))}
    missing = [n for n in acked if n not in pos]
    assert not missing, f"{len(missing)} acknowledged appends lost, e.g. {missing[:5]}"
    firsts = [pos[n] for n in acked]
    assert firsts == sorted(firsts), "acknowledged appends out of order"


def assemble_store(store: Path, journal: str) -> bytes:
    """The journal's bytes as the fragment store holds them (codec NONE), checking that the
    persisted fragments cover [0, end) without a hole; overlapping fragments must agree."""
    frags: list[tuple[int, int, bytes]] = []
    for path in (store / journal).glob("*.raw"):
        begin_hex, end_hex, _ = path.name.split("-", 2)
        frags.append((int(begin_hex, 16), int(end_hex, 16), path.read_bytes()))
    out = bytearray()
    for begin, end, data in sorted(frags):
        assert len(data) == end - begin
        assert begin <= len(out), f"hole in the store at {len(out)} (next fragment at {begin})"
        overlap = len(out) - begin
        assert data[: min(overlap, len(data))] == bytes(out[begin : begin + len(data)])[:overlap]
        if end > len(out):
            out += data[max(overlap, 0) :]
    return bytes(out)


async def test_graceful_stop_hands_over_without_failed_appends(cluster: Cluster) -> None:
    s = spec(f"cluster/drain-{next(_names)}", cluster.store, replication=2)
    acked: list[int] = []
    gaps: list[float] = []
    async with stubs(cluster) as st, JournalClient(cluster.endpoints) as client:
        await create(st[0], s)
        r = await wait_route(st[0], s.name, 2)
        svc = AppendService(client, backoff_fn=lambda n: min(0.02 * (n + 1), 0.2))
        stop = asyncio.Event()
        task = asyncio.create_task(produce(svc, s.name, stop, acked, gaps))
        await asyncio.sleep(1.0)  # Appends flow until the stop.
        victim = cluster.by_suffix(primary_suffix(r))
        t0 = time.monotonic()
        await asyncio.to_thread(victim.stop)  # SIGTERM: drain, then exit
        drained_in = time.monotonic() - t0
        n_before = len(acked)
        await asyncio.sleep(1.0)  # Appends flow after the hand-over.
        stop.set()
        await asyncio.wait_for(task, 60)  # raises if any append failed
        await svc.close()
        assert len(acked) > n_before, "appends stopped after the handover"
        r2 = await wait_route(st[1 if victim is cluster.brokers[0] else 0], s.name, 2)
        assert victim.suffix not in {m.suffix for m in r2.members}
        content, _ = await read_all(
            st[cluster.brokers.index(cluster.by_suffix(primary_suffix(r2)))], s.name
        )
        check_acked(content, acked)
        # Zero downtime: no append waited anywhere near a timeout during the handover.
        assert max(gaps) < 3.0, f"an append waited {max(gaps):.1f}s during the handover"
        print(
            f"graceful handover: stop took {drained_in:.2f}s, longest wait for an ack "
            f"{max(gaps):.3f}s, {svc.rpc_count} RPCs for {len(acked)} appends"
        )
    await asyncio.to_thread(victim.start)


async def test_graceful_stop_hands_over_replication_one_journals_without_waiting_out_its_drain(
    cluster: Cluster,
) -> None:
    """A replication-1 journal is handed over by adding the new broker, promoting it, and
    dropping the old one; the new primary's pipeline takes the content from the old while
    the old one's own pipeline may still be reaching it under the previous route. Neither
    may wait on the other: the drain ends in seconds, not at its 20 s bound, and every
    journal keeps its content."""
    names = [f"cluster/r1-drain-{next(_names)}" for _ in range(8)]
    async with stubs(cluster) as st:
        for name in names:
            await create(st[0], spec(name, cluster.store, replication=1))
        routes = {name: await wait_route(st[0], name, 1) for name in names}
        for name in names:
            resp = await append(st[0], name, f"{name}\n".encode())
            assert resp.status == pb.OK, resp
    # The broker that is primary of the most of them.
    counts = collections.Counter(primary_suffix(r) for r in routes.values())
    victim = cluster.by_suffix(counts.most_common(1)[0][0])
    t0 = time.monotonic()
    await asyncio.to_thread(victim.stop)  # SIGTERM: drain, then exit
    took = time.monotonic() - t0
    log = victim.tail_log()
    await asyncio.to_thread(victim.start)
    assert "drain timed out" not in log, log
    assert took < 10.0, f"the drain took {took:.1f}s"
    async with stubs(cluster) as st:
        for name in names:
            expected = f"{name}\n".encode()

            async def content_of(name: str = name, expected: bytes = expected) -> bytes | None:
                content, metas = await read_all(st[0], name)
                if content:
                    return content
                # A journal moving back to the restarted broker: its new primary answers reads
                # only once it took the old one's content. Its index may still catch up with
                # the fragment persisted meanwhile: "not yet available" at offset 0, below a
                # write head past the content, is honest, and retried. An answer that the
                # journal is empty (a head of 0) or that skips its content fails.
                last = metas[-1] if metas else None
                if not (
                    last is not None
                    and last.status == pb.OFFSET_NOT_YET_AVAILABLE
                    and last.offset == 0
                    and last.write_head >= len(expected)
                ):
                    pytest.fail(f"a read of {name} was told it has no content: {metas}")
                return None

            # Right after the restart a proxied read may also fail UNAVAILABLE (a journal
            # moving back), which clients retry.
            content = await eventually(
                content_of,
                what=f"a read of {name}",
                ignoring=(grpc.aio.AioRpcError,),
                interval=0.2,
            )
            assert content == expected


async def test_every_broker_stopped_at_once_exits_without_waiting_out_its_drain(
    cluster: Cluster,
) -> None:
    """SIGTERM to every broker at once (a whole-cluster restart): none has a broker left to
    hand its journals to, so each exits at once, not after its 20 s drain bound, with its
    spools persisted; restarted, they serve every acknowledged append."""
    s = spec(f"cluster/all-stop-{next(_names)}", cluster.store)
    sent = b""
    async with stubs(cluster) as st:
        await create(st[0], s)
        await wait_route(st[0], s.name, 3)
        for i in range(10):
            resp = await append(st[i % 3], s.name, f"record {i}\n".encode())
            assert resp.status == pb.OK, resp
            sent += f"record {i}\n".encode()
    t0 = time.monotonic()
    await asyncio.gather(*(asyncio.to_thread(b.stop) for b in cluster.brokers))
    took = time.monotonic() - t0
    await asyncio.gather(*(asyncio.to_thread(b.start) for b in cluster.brokers))
    async with stubs(cluster) as st:
        await wait_route(st[0], s.name, 3)
        content, _ = await read_all(st[0], s.name)
    assert content == sent
    assert took < 10.0, f"stopping every broker took {took:.1f}s"


async def test_primary_sigkill_loses_no_acknowledged_append(cluster: Cluster) -> None:
    rng = random.Random(7)
    s = spec(f"cluster/kill-{next(_names)}", cluster.store)
    acked: list[int] = []
    async with stubs(cluster) as st, JournalClient(cluster.endpoints) as client:
        await create(st[0], s)
        await wait_route(st[0], s.name, 3)
        svc = AppendService(client, backoff_fn=lambda n: min(0.05 * (n + 1), 0.5))
        stop = asyncio.Event()
        task = asyncio.create_task(produce(svc, s.name, stop, acked))
        kills = 0
        for _ in range(10):
            await asyncio.sleep(rng.uniform(0.3, 1.2))  # Appends flow until the next kill.
            r = await wait_route(st[0], s.name, 3, timeout=60)
            victim = cluster.by_suffix(primary_suffix(r))
            before = len(acked)
            await asyncio.to_thread(victim.kill)
            await asyncio.to_thread(victim.start)
            kills += 1

            # Appends resume after each kill.
            def resumed(before: int = before) -> bool:
                if task.done():
                    pytest.fail(f"the producer ended: {task}")
                return len(acked) > before + 5

            await eventually(
                resumed, what="appends to resume after a kill", timeout=60, interval=0.05
            )
        stop.set()
        await asyncio.wait_for(task, 120)
        await svc.close()
        assert kills == 10 and len(acked) > 100

        r = await wait_route(st[0], s.name, 3, timeout=60)
        # Every acknowledged append is present, in order (retries may duplicate some).
        content, _ = await read_all(st[0], s.name)
        check_acked(content, acked)
        # Every replica serves identical bytes (a replica lists what others persisted within
        # its refresh interval).
        for i, stub in enumerate(st):

            async def identical(i: int = i, stub: pb_grpc.JournalStub = stub) -> bool:
                replica_content = await read_replica(stub, s.name)
                assert replica_content == content, (i, len(replica_content), len(content))
                return True

            await eventually(identical, what=f"replica {i}'s bytes", timeout=15, interval=0.5)
    # After a graceful stop of every broker, the store holds exactly the same bytes.
    for b in cluster.brokers:
        await asyncio.to_thread(b.stop)
    try:
        assert assemble_store(cluster.store, s.name) == content
    finally:
        for b in cluster.brokers:
            await asyncio.to_thread(b.start)


async def test_restarted_broker_persists_spools_of_journals_it_no_longer_serves(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """Committed content left in a killed broker's spools is persisted when it restarts,
    even though the journal is no longer assigned to it (here: it takes no journals)."""
    store = tmp_path / "store"
    store.mkdir()
    b = BrokerProcess(
        etcd_server.endpoint,
        root=f"/test-leftover/{os.getpid()}/{next(_names)}",
        spool_dir=tmp_path / "spool",
    )
    with b:
        async with grpc.aio.insecure_channel(b.endpoint) as ch:
            stub = pb_grpc.JournalStub(ch)
            s = spec(f"cluster/leftover-{next(_names)}", store, replication=1)
            await create(stub, s)
            resp = await append(stub, s.name, b"acknowledged, not yet persisted\n")
            assert resp.status == pb.OK
        # Only the (empty) offset reservation of a replication-1 primary is there yet.
        assert not [p.read_bytes() for p in store.rglob("*.raw") if p.stat().st_size]
        b.kill()
        b.extra_args = ["--journal-limit", "0"]
        b.start()
        persisted = [p.read_bytes() for p in store.rglob("*.raw") if p.stat().st_size]
        assert persisted == [b"acknowledged, not yet persisted\n"]


async def test_a_tailing_read_follows_its_journal_off_a_broker_that_stays_up(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """The journal moves off the broker serving a blocking read at its write head, while that
    broker lives on: the read ends there, and the client's reader goes on at the journal's new
    primary (it used to wait at the old replica's head for ever)."""
    store = tmp_path / "store"
    store.mkdir()
    root = f"/test-moved/{os.getpid()}/{next(_names)}"
    a, b = (
        BrokerProcess(
            etcd_server.endpoint,
            root=root,
            suffix=f"broker-{x}",
            spool_dir=tmp_path / x,
            extra_args=["--drain-timeout", "0"],
        )
        for x in "ab"
    )
    s = spec(f"cluster/moved-{next(_names)}", store, replication=1)
    with a, b:
        async with (
            grpc.aio.insecure_channel(a.endpoint) as ch,
            JournalClient([a.endpoint, b.endpoint]) as client,
            Etcd(etcd_server.endpoint) as etcd,
        ):
            stub = pb_grpc.JournalStub(ch)
            await create(stub, s)
            served_by = {"broker-a": a, "broker-b": b}[
                primary_suffix(await wait_route(stub, s.name, 1))
            ]
            assert (await append(stub, s.name, b"first\n")).status == pb.OK
            rr = RetryReader(
                client, pb.ReadRequest(journal=s.name, block=True), backoff_fn=lambda n: 0.1
            )
            assert await asyncio.wait_for(rr.readline(), 10) == b"first\n"
            tail = asyncio.create_task(rr.readline())  # waits at the write head, on `served_by`
            await asyncio.sleep(0.5)

            # Its member spec now takes no journals: the allocator moves the journal away.
            key = member_key(root, MemberID(served_by.zone, served_by.suffix)).encode()
            [kv] = (await etcd.get(key)).kvs
            member = pb.BrokerSpec.FromString(kv.value)
            member.journal_limit = 0
            await etcd.put(key, member.SerializeToString(), lease=kv.lease)

            async def moved() -> bool:
                r = await route(stub, s.name)
                return len(r.members) == 1 and primary_suffix(r) != served_by.suffix

            await eventually(moved, what="the journal to move", timeout=30, interval=0.2)
            assert served_by.running
            assert (await append(stub, s.name, b"second\n")).status == pb.OK
            assert await asyncio.wait_for(tail, 15) == b"second\n"
            rr.close()
