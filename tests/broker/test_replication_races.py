"""Races between appends, route changes, drops and replication, on brokers running in this
process (real etcd, real gRPC, real spools), so a test can hold a journal's lock or step
in at the exact point of an interleaving."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from gazette.broker.broker import Broker
from gazette.broker.config import BrokerConfig
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.broker.replica import JournalReplica
from gazette.broker.replica_set import ReplicaSet
from gazette.broker.replication import Pipeline
from gazette.broker.service import JournalService
from gazette.testing.etcd import EtcdServer, free_port
from tests.kit import specs
from tests.kit.eventually import eventually

_names = itertools.count()
_ports: set[int] = set()


def fresh_port() -> int:
    """A free port not used before by this process: gRPC shares subchannels per target
    process-wide, and one to a stopped node of an earlier test may still be backing off."""
    while (port := free_port()) in _ports:
        pass
    _ports.add(port)
    return port


class Node:
    """One broker: its state, gRPC server and background loops."""

    def __init__(self, cfg: BrokerConfig) -> None:
        self.cfg = cfg
        self.broker = Broker(cfg)
        self.server: grpc.aio.Server | None = None
        self.background: asyncio.Task[None] | None = None
        self.channel = grpc.aio.insecure_channel(cfg.listen)
        self.stub = pb_grpc.JournalStub(self.channel)

    async def start(self) -> Node:
        await self.broker.start()
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_JournalServicer_to_server(JournalService(self.broker), self.server)
        self.server.add_insecure_port(self.cfg.listen)
        await self.server.start()
        self.background = asyncio.create_task(self.broker.run_background())
        return self

    async def stop(self) -> None:
        """A graceful stop without drain: spools persisted, lease revoked."""
        if self.server is None:
            return
        self.broker.end_streams()
        await self.server.stop(0.5)
        assert self.background is not None
        self.background.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.background
        await self.broker.shutdown()
        await self.channel.close(None)
        self.server = None

    async def crash(self) -> None:
        """Like SIGKILL: nothing persisted or released; the spools stay, the lease expires."""
        assert self.server is not None and self.background is not None
        b = self.broker
        b.replica_set.cancel_pulses()
        for task in [self.background, *b._tasks]:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.background
        await self.server.stop(0)
        for replica in b.replicas.values():
            replica.close()
        await b.peers.close()
        await self.channel.close(None)
        if b._lock_fd is not None:
            os.close(b._lock_fd)  # the spool directory is free for the next incarnation
        self.server = None

    def replica(self, journal: str) -> JournalReplica:
        return self.broker.replicas[journal]


@contextlib.asynccontextmanager
async def cluster(
    etcd: EtcdServer, tmp_path: Path, n: int, zones: tuple[str, ...] = ("a", "b", "c")
) -> AsyncIterator[list[Node]]:
    root = f"/test-races/{os.getpid()}/{next(_names)}"
    nodes = []
    try:
        for i in range(n):
            port = fresh_port()
            cfg = BrokerConfig(
                etcd=etcd.endpoint,
                root=root,
                zone=zones[i % len(zones)],
                suffix=f"node{i}",
                listen=f"127.0.0.1:{port}",
                spool_dir=tmp_path / f"b{i}",
                lease_ttl=4,
                chunk_timeout=5.0,
            )
            nodes.append(await Node(cfg).start())
        yield nodes
    finally:
        for node in nodes:
            await node.stop()


def spec(name: str, store: Path, replication: int) -> pb.JournalSpec:
    return specs.journal_spec(name, store, replication=replication)


async def create(node: Node, s: pb.JournalSpec, expect: int = 0) -> None:
    change = pb.ApplyRequest.Change(upsert=s, expect_mod_revision=expect)
    resp = await node.stub.Apply(pb.ApplyRequest(changes=[change]))
    assert resp.status == pb.OK


def primary_of(nodes: list[Node], journal: str) -> Node:
    for node in nodes:
        r = node.broker.route_of(journal)
        if r.primary >= 0:
            m = r.members[r.primary]
            return next(n for n in nodes if n.cfg.suffix == m.suffix)
    raise AssertionError(f"{journal} has no primary")


async def synced(nodes: list[Node], journal: str, members: int) -> Node:
    """Wait until every node sees `members` replicas with a primary whose pipeline is up."""

    def ready() -> bool:
        routes = [n.broker.route_of(journal) for n in nodes]
        if any(len(r.members) != members or r.primary < 0 for r in routes):
            return False
        p = primary_of(nodes, journal).broker.replicas.get(journal)
        return p is not None and isinstance(p.pipeline, Pipeline) and not p.pipeline.broken

    await eventually(
        ready,
        what=f"{journal} with {members} replicas and a synchronised primary",
        timeout=10,
        interval=0.02,
    )
    return primary_of(nodes, journal)


async def append(stub: pb_grpc.JournalStub, journal: str, data: bytes, **kw: Any) -> Any:
    async def reqs() -> AsyncIterator[pb.AppendRequest]:
        yield pb.AppendRequest(journal=journal, **kw)
        yield pb.AppendRequest(content=data)
        yield pb.AppendRequest()

    return await stub.Append(reqs())


async def test_queued_append_is_refused_when_the_route_shrinks(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """An append admitted with a full route but waiting for the journal's lock must not
    commit with fewer replicas than the journal's replication once the route has shrunk."""
    async with cluster(etcd_server, tmp_path, 2) as nodes:
        s = spec(f"races/shrink-{next(_names)}", tmp_path / "store", replication=2)
        await create(nodes[0], s)
        primary = await synced(nodes, s.name, 2)
        peer = next(n for n in nodes if n is not primary)
        resp = await append(primary.stub, s.name, b"two copies\n")
        assert resp.status == pb.OK
        replica = primary.replica(s.name)
        await replica.lock.acquire()
        try:
            queued = asyncio.create_task(append(primary.stub, s.name, b"one copy?\n"))
            await eventually(
                lambda: len(replica.lock._waiters or ()) > 0,
                what="a queued append",
                timeout=10,
                interval=0.02,
            )
            await peer.stop()
            await eventually(
                lambda: len(primary.broker.route_of(s.name).members) == 1,
                what="the route to shrink",
                timeout=10,
                interval=0.02,
            )
        finally:
            replica.lock.release()
        resp = await queued
        assert resp.status == pb.INSUFFICIENT_JOURNAL_BROKERS
        assert replica.write_head == len(b"two copies\n")


async def test_client_cancelled_during_commit_leaves_no_bytes_past_the_spool_end(
    etcd_server: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append whose RPC is cancelled while its commit proposal is out rolls back: bytes
    left past the committed end of the spool make its persisted fragment fail verification
    (`has more than N content bytes`) at every later persist attempt."""
    async with cluster(etcd_server, tmp_path, 2) as nodes:
        s = spec(f"races/cancel-{next(_names)}", tmp_path / "store", replication=2)
        await create(nodes[0], s)
        primary = await synced(nodes, s.name, 2)
        assert (await append(primary.stub, s.name, b"kept\n")).status == pb.OK

        stalled = asyncio.Event()
        original = Pipeline.propose

        async def slow_commit(self: Pipeline, proposal: pb.Fragment, regs: pb.LabelSet) -> None:
            if proposal.end > self.replica.write_head:
                stalled.set()
                # Stalls the commit: the test cancels the append meanwhile.
                await asyncio.sleep(30)
            await original(self, proposal, regs)

        monkeypatch.setattr(Pipeline, "propose", slow_commit)

        async def reqs() -> AsyncIterator[pb.AppendRequest]:
            yield pb.AppendRequest(journal=s.name)
            yield pb.AppendRequest(content=b"cancelled while committing\n")
            yield pb.AppendRequest()

        call = primary.stub.Append(reqs())
        await asyncio.wait_for(stalled.wait(), 10)
        call.cancel()
        replica = primary.replica(s.name)
        await eventually(
            lambda: not replica.lock.locked(), what="the append to end", timeout=10, interval=0.02
        )
        monkeypatch.setattr(Pipeline, "propose", original)
        spool = replica.spool
        assert spool is not None
        assert os.path.getsize(spool.content_path) == len(spool) == len(b"kept\n")
        # A later, shorter append commits, and the rolled spool persists.
        assert (await append(primary.stub, s.name, b"x\n")).status == pb.OK
        async with replica.lock:
            entries = replica.roll()
        for entry in entries:
            await primary.broker._persist(replica, entry)


async def test_stream_opened_for_the_new_route_survives_a_lagging_reconcile(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """A peer accepts a Replicate stream for the route its keyspace holds; its reconcile
    loop may record that route on the replica only later. That must not end the stream
    (which would fail the primary's next append) as if the route had changed."""
    async with cluster(etcd_server, tmp_path, 3) as nodes:
        s = spec(f"races/lag-{next(_names)}", tmp_path / "store", replication=2)
        await create(nodes[0], s)
        primary = await synced(nodes, s.name, 2)
        assert (await append(primary.stub, s.name, b"before\n")).status == pb.OK
        peer = next(n for n in nodes if n is not primary and s.name in n.broker.replicas)
        original = peer.broker._reconcile_once

        async def lagging() -> None:
            # Later than the primary's stream for the new route arrives.
            await asyncio.sleep(0.5)
            await original()

        peer.broker._reconcile_once = lagging  # type: ignore[method-assign]
        s.replication = 3
        await create(nodes[0], s, expect=-1)
        assert await synced(nodes, s.name, 3) is primary
        lagging_replica = peer.broker.replicas[s.name]
        await eventually(  # The lagging peer's reconcile loop catches up.
            lambda: lagging_replica.route_key == peer.broker.route_and_key(s.name)[1],
            what="the peer to record the new route",
            timeout=10,
            interval=0.02,
        )
        resp = await append(primary.stub, s.name, b"after\n", do_not_proxy=True)
        assert resp.status == pb.OK


async def read_all(stub: pb_grpc.JournalStub, journal: str) -> bytes:
    out = b""
    async for resp in stub.Read(pb.ReadRequest(journal=journal, offset=0, block=False)):
        if resp.status not in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
            raise AssertionError(resp)
        out += resp.content
    return out


async def test_reassigned_while_its_drop_waits(etcd_server: EtcdServer, tmp_path: Path) -> None:
    """A journal unassigned and assigned again while its old replica's drop still waits for
    the journal's lock (an append or a peer transaction holds it): the new replica must not
    share spool files with the old one, whose drop rolls and starts a spool of its own."""
    async with cluster(etcd_server, tmp_path, 1) as nodes:
        (node,) = nodes
        b = node.broker
        s = spec(f"races/reassign-{next(_names)}", tmp_path / "store", replication=1)
        await create(node, s)
        await synced(nodes, s.name, 1)
        assert (await append(node.stub, s.name, b"one\n")).status == pb.OK
        old = node.replica(s.name)
        mine = b.my_assignment(s.name)
        assert mine is not None
        await old.lock.acquire()
        try:
            assert b.etcd is not None
            await b.etcd.delete(mine[0].key.encode())  # the allocator assigns it again
            await eventually(
                lambda: len(b._tasks) > 0, what="the old replica's drop", timeout=10, interval=0.02
            )
            await asyncio.sleep(0.5)  # A new replica, were there one, would recover meanwhile.
        finally:
            old.lock.release()
        await eventually(lambda: not b._tasks, what="the drop to finish", timeout=10, interval=0.02)
        await synced(nodes, s.name, 1)
        assert node.replica(s.name) is not old
        assert (await append(node.stub, s.name, b"two\n")).status == pb.OK
        assert await read_all(node.stub, s.name) == b"one\ntwo\n"


async def test_peer_gives_its_lock_back_when_the_primary_goes_silent_mid_append(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """A primary partitioned mid-append (no connection reset) must not hold a peer's journal
    lock forever: after 1.5x chunk_timeout the peer rolls the partial append back."""
    async with cluster(etcd_server, tmp_path, 2) as nodes:
        for n in nodes:
            n.broker.cfg = dataclasses.replace(n.broker.cfg, chunk_timeout=0.4)
        s = spec(f"races/silent-{next(_names)}", tmp_path / "store", replication=2)
        await create(nodes[0], s)
        primary = await synced(nodes, s.name, 2)
        peer = next(n for n in nodes if n is not primary)
        replica = peer.replica(s.name)
        header = primary.broker.header(s.name)
        current = replica.ensure_spool().fragment()
        requests: asyncio.Queue[pb.ReplicateRequest] = asyncio.Queue()
        await requests.put(pb.ReplicateRequest(header=header, proposal=current, acknowledge=True))

        async def stream() -> AsyncIterator[pb.ReplicateRequest]:
            while True:
                yield await requests.get()

        call = peer.stub.Replicate(stream())
        assert (await call.read()).status == pb.OK
        await requests.put(pb.ReplicateRequest(content=b"never committed", content_delta=0))
        await eventually(
            lambda: replica.lock.locked(),
            what="the peer to take the lock",
            timeout=10,
            interval=0.02,
        )
        t0 = time.monotonic()
        await eventually(
            lambda: not replica.lock.locked(), what="the lock back", timeout=5, interval=0.02
        )
        assert time.monotonic() - t0 < 3
        assert replica.write_head == current.end  # the partial append was rolled back
        assert os.path.getsize(replica.ensure_spool().content_path) == len(replica.ensure_spool())
        call.cancel()


async def test_journal_created_elsewhere_is_found_by_a_lagging_broker(
    etcd_server: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JOURNAL_NOT_FOUND is final for clients, so a broker whose etcd watch lags must not
    answer it for a journal another broker just created: it confirms with etcd and waits
    for its mirror to catch up."""
    from gazette.keyspace.etcd import Etcd

    real_watch = Etcd.watch_prefix

    async def lagging_watch(self: Etcd, prefix: bytes, start: int) -> AsyncIterator[Any]:
        async for resp in real_watch(self, prefix, start):
            await asyncio.sleep(getattr(self, "lag", 0.0))
            yield resp

    monkeypatch.setattr(Etcd, "watch_prefix", lagging_watch)
    async with cluster(etcd_server, tmp_path, 2) as nodes:
        lagging = nodes[1].broker
        assert lagging.etcd is not None
        lagging.etcd.lag = 0.5  # type: ignore[attr-defined]
        s = spec(f"races/lagging-{next(_names)}", tmp_path / "store", replication=1)
        await create(nodes[0], s)
        assert lagging.keyspace.get(lagging.keys.item(s.name)) is None  # still lagging
        resp = await append(nodes[1].stub, s.name, b"hello\n")
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        # An unknown journal is still answered JOURNAL_NOT_FOUND.
        resp = await append(nodes[1].stub, f"races/missing-{next(_names)}", b"x\n")
        assert resp.status == pb.JOURNAL_NOT_FOUND


@pytest.mark.parametrize("peer_serves", [True, False], ids=["persisted", "unserved"])
async def test_reader_waits_for_content_a_new_primary_rolled_forward_over(
    etcd_server: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, peer_serves: bool
) -> None:
    """Issue 38's chain. The whole route crashed with acknowledged content in its spools;
    a fresh primary took the journal at the stores' head. A restarted old member joins its
    route having persisted its recovered spool already, so its spools no longer hold what
    the new primary catches up from it. The primary rolled forward over that content, and a
    blocking reader at the old head jumped over it (a recovery-log player took the jump for
    removed history and recovered without it). The persisted fragment must be read instead;
    and where a peer cannot serve the content at all (`unserved`), the reader waits in the
    hole rolled over until the content is published."""
    if not peer_serves:

        async def cannot_serve(
            _self: ReplicaSet, _r: JournalReplica, _ep: str, begin: int, _end: int
        ) -> tuple[int, None]:
            return begin, None

        monkeypatch.setattr(ReplicaSet, "_copy_from_peer", cannot_serve)
    async with cluster(etcd_server, tmp_path, 3) as nodes:
        s = spec(f"races/rolled-{next(_names)}", tmp_path / "store", replication=2)
        await create(nodes[0], s)
        primary = await synced(nodes, s.name, 2)
        acked = b"acknowledged, only in the old route's spools\n"
        assert (await append(primary.stub, s.name, acked)).status == pb.OK
        old = [n for n in nodes if s.name in n.broker.replicas]
        (fresh,) = [n for n in nodes if n not in old]
        for n in old:
            await n.crash()
        await eventually(  # the old members' leases expire: the fresh broker is primary alone
            lambda: (
                [m.suffix for m in fresh.broker.route_of(s.name).members] == [fresh.cfg.suffix]
                and fresh.broker.route_of(s.name).primary == 0
                and s.name in fresh.broker.replicas
            ),
            what="the fresh broker to take the journal",
            timeout=20,
            interval=0.05,
        )
        taken = fresh.replica(s.name)
        assert taken.write_head == 0  # nothing was persisted

        reads = fresh.stub.Read(pb.ReadRequest(journal=s.name, offset=0, block=True))
        await taken.lock.acquire()  # no synchronisation until the returning member persisted
        try:
            back = await Node(old[0].cfg).start()
            nodes[nodes.index(old[0])] = back

            def persisted() -> bool:
                r = back.broker.replicas.get(s.name)
                if r is None:
                    return False
                entry, found = r.index.find(0)
                return found and entry is not None and entry.local_path is None

            await eventually(
                persisted, what="the returning member to persist", timeout=20, interval=0.05
            )
        finally:
            taken.lock.release()
        assert (await synced(nodes, s.name, 2)) is fresh

        def joined() -> bool:
            p = taken.pipeline
            return isinstance(p, Pipeline) and len(p.peers) == 1 and not p.broken

        await eventually(joined, what="the primary to synchronise", timeout=20, interval=0.05)
        assert taken.write_head == len(acked)
        assert (await append(fresh.stub, s.name, b"next\n")).status == pb.OK
        content = b""
        async with asyncio.timeout(20):
            async for resp in reads:
                if resp.content:
                    assert resp.offset == len(content), "the read jumped over content"
                    content += resp.content
                if content == acked + b"next\n":
                    break
        reads.cancel()


async def test_reads_at_a_new_primary_wait_until_it_took_the_handed_over_content(
    etcd_server: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A draining broker hands a replication-1 journal over: the new broker is promoted
    first, and its pipeline then takes the old primary's content. A read at the new primary
    meanwhile answered from its empty replica: "nothing at offset 0, write head 0" to a
    non-blocking reader, while the journal held acknowledged content. Reads there wait for
    the synchronisation instead."""
    gate = asyncio.Event()
    catch_up = ReplicaSet._catch_up

    async def gated(self: ReplicaSet, replica: JournalReplica, *args: Any) -> None:
        await gate.wait()
        await catch_up(self, replica, *args)

    async with cluster(etcd_server, tmp_path, 2) as nodes:
        s = spec(f"races/handed-{next(_names)}", tmp_path / "store", replication=1)
        await create(nodes[0], s)
        old = await synced(nodes, s.name, 1)
        (new,) = [n for n in nodes if n is not old]
        acked = b"acknowledged, in the old primary's spool\n"
        assert (await append(old.stub, s.name, acked)).status == pb.OK
        monkeypatch.setattr(ReplicaSet, "_catch_up", gated)
        drain = asyncio.create_task(old.broker.drain(20))
        await eventually(
            lambda: new.broker.resolver.is_primary(s.name) and s.name in new.broker.replicas,
            what="the new broker to be promoted",
            timeout=10,
            interval=0.02,
        )
        # The read waits for the new primary to take the content. (If the old primary's
        # Replicate stream fails first, the route drops it, the new primary leads alone and
        # the read finds the content the old one persisted on its way out.)
        read = asyncio.create_task(read_all(new.stub, s.name))
        await asyncio.sleep(0.5)
        gate.set()
        assert await asyncio.wait_for(read, 10) == acked
        assert await asyncio.wait_for(drain, 20)
