"""The etcd client against a real three-member cluster: when the member it uses is killed (or
is the leader, or hangs), reads, transactions, lease keep-alives and an open watch continue on
another member; a write whose outcome is unknown is reported, not sent twice. And a broker
given the three endpoints keeps serving, and its lease, while members die and come back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gazette.broker.client import JournalClient, append
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.keyspace.etcd import (
    Compare,
    Etcd,
    EtcdCompacted,
    EtcdOutcomeUnknown,
    op_put,
)
from gazette.keyspace.keyspace import KeySpace
from gazette.mainboilerplate.etcd_endpoints import InvalidEndpoint, parse_endpoints
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdCluster
from tests.kit.eventually import eventually
from tests.kit.specs import apply_specs, journal_spec


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    with EtcdCluster(3) as c:
        yield c


@pytest.fixture(autouse=True)
def _whole_cluster(cluster: EtcdCluster) -> Iterator[None]:
    """Every test starts and ends with all three members up."""
    yield
    for i, member in enumerate(cluster.members):
        if not member.running:
            cluster.start(i)
    cluster.leader()


def _prefix(name: str) -> str:
    return f"/failover/{os.getpid()}/{name}/"


def _member_in_use(cluster: EtcdCluster, etcd: Etcd) -> int:
    return cluster.endpoints.index(etcd.endpoint)


@contextlib.asynccontextmanager
async def _client(cluster: EtcdCluster, first: int, timeout: float = 10.0) -> AsyncIterator[Etcd]:
    """A client of every member that starts on member `first`."""
    eps = cluster.endpoints
    async with Etcd(eps[first:] + eps[:first], timeout=timeout) as etcd:
        assert _member_in_use(cluster, etcd) == first
        yield etcd


@pytest.mark.parametrize(
    ("flag", "endpoints"),
    [
        ("http://127.0.0.1:2379", ("http://127.0.0.1:2379",)),
        ("https://a:2379,http://b", ("https://a:2379", "http://b")),
        ("127.0.0.1:2379", ("127.0.0.1:2379",)),
        ("http://a:1, http://b:2,c:3", ("http://a:1", "http://b:2", "c:3")),
        ("http://[::1]:2379", ("http://[::1]:2379",)),
        ("etcd-0", ("etcd-0",)),
    ],
)
def test_endpoint_lists(flag: str, endpoints: tuple[str, ...]) -> None:
    assert parse_endpoints(flag) == endpoints


@pytest.mark.parametrize(
    ("flag", "error"),
    [
        ("", "no etcd endpoint"),
        ("http://a:1,,http://b:2", "empty etcd endpoint"),
        ("http://a:1,", "empty etcd endpoint"),
        ("unix:///run/etcd.sock", "not http or https"),
        ("http://a:notaport", "invalid port"),
        ("a:70000", "invalid port"),
        ("http://:2379", "no host"),
        ("http://a:2379/v3", "only a host and a port"),
    ],
)
def test_invalid_endpoints_are_refused(flag: str, error: str) -> None:
    with pytest.raises(InvalidEndpoint, match=error):
        parse_endpoints(flag)
    with pytest.raises(InvalidEndpoint, match=error):
        Etcd(flag)


async def _guarded_put(etcd: Etcd, key: bytes, value: bytes) -> None:
    """Put `value` over the value read, as callers write: guarded on its mod revision, and on
    `EtcdOutcomeUnknown` read again and decide again (the guard keeps it from applying twice)."""
    read = (await etcd.get(key)).kvs[0]
    for _ in range(5):
        try:
            txn = await etcd.txn([Compare(key, "mod", read.mod_revision)], [op_put(key, value)])
        except EtcdOutcomeUnknown:
            read = (await etcd.get(key)).kvs[0]
            if read.value == value:
                return
            continue
        assert txn.succeeded
        return
    raise AssertionError(f"{key!r} not written")


async def test_reads_and_txns_continue_when_the_member_in_use_dies(cluster: EtcdCluster) -> None:
    key = f"{_prefix('rw')}k".encode()
    victim = (cluster.leader() + 1) % 3  # a follower: the leader has its own test
    async with _client(cluster, victim) as etcd:
        await etcd.put(key, b"1")
        cluster.kill(victim)

        got = await etcd.get(key)
        assert got.kvs[0].value == b"1"
        assert _member_in_use(cluster, etcd) != victim

        await _guarded_put(etcd, key, b"2")
        got = await etcd.get(key)
        assert (got.kvs[0].value, got.kvs[0].version) == (b"2", 2), "applied once"


async def test_a_write_no_member_ran_goes_to_the_next(cluster: EtcdCluster) -> None:
    key = f"{_prefix('unsent')}k".encode()
    victim = (cluster.leader() + 1) % 3
    cluster.kill(victim)
    async with _client(cluster, victim) as etcd:
        # The dead member takes no connection, so nothing was sent to it: the transaction is
        # sent to the next member, without risk of running twice.
        txn = await etcd.txn([Compare(key, "create", 0)], [op_put(key, b"1")])
        assert txn.succeeded
        assert _member_in_use(cluster, etcd) != victim
        got = await etcd.get(key)
        assert (got.kvs[0].value, got.kvs[0].version) == (b"1", 1)


async def test_reads_and_txns_continue_when_the_leader_dies(cluster: EtcdCluster) -> None:
    key = f"{_prefix('leader')}k".encode()
    leader = cluster.leader()
    async with _client(cluster, leader) as etcd:
        await etcd.put(key, b"1")
        cluster.kill(leader)

        # Reads meet the election (members without a leader refuse them) and are retried
        # until a new leader serves them.
        assert (await etcd.get(key)).kvs[0].value == b"1"

        await _guarded_put(etcd, key, b"2")
        got = (await etcd.get(key)).kvs[0]
        assert (got.value, got.version) == (b"2", 2), "applied once"
        assert cluster.leader() != leader


async def test_a_lease_outlives_the_death_of_the_member_in_use(cluster: EtcdCluster) -> None:
    key = f"{_prefix('lease')}member".encode()
    ttl = 3
    victim = cluster.leader()  # leases live on the leader: the hardest member to lose
    async with _client(cluster, victim) as etcd:
        lease = await etcd.grant_lease(ttl)
        await etcd.put(key, b"alive", lease=lease)
        renewals: list[float] = []
        keep_alive = asyncio.create_task(
            etcd.keep_alive(lease, ttl, lambda sent_at, _ttl: renewals.append(sent_at))
        )
        try:
            await eventually(lambda: renewals, what="a first renewal")
            killed_at = time.monotonic()
            cluster.kill(victim)
            # Two TTLs: the lease expires unless renewed through another member.
            await asyncio.sleep(2 * ttl)
            assert not keep_alive.done()
            after = [t for t in renewals if t > killed_at]
            assert len(after) >= 2, f"renewals after the kill: {after}"
            assert (await etcd.get(key)).kvs[0].lease == lease, "the lease expired"
        finally:
            keep_alive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keep_alive
            await etcd.revoke_lease(lease)


async def test_an_open_watch_resumes_on_another_member_without_gaps_or_repeats(
    cluster: EtcdCluster,
) -> None:
    prefix = _prefix("watch")
    victim = (cluster.leader() + 1) % 3
    writer_first = (victim + 1) % 3
    async with _client(cluster, victim) as watcher, _client(cluster, writer_first) as writer:
        start = await writer.put(f"{prefix}start".encode(), b"0")
        written: list[int] = []
        seen: list[int] = []

        async def watch() -> None:
            async for resp in watcher.watch_prefix(prefix.encode(), start.header.revision + 1):
                seen.extend(int(ev.kv.mod_revision) for ev in resp.events)

        async def write(n: int) -> None:
            for i in range(n):
                resp = await writer.put(f"{prefix}k{i % 7}".encode(), str(i).encode())
                written.append(int(resp.header.revision))
                await asyncio.sleep(0.01)

        watching = asyncio.create_task(watch())
        try:
            await write(20)
            await eventually(lambda: len(seen) == 20, what="the first events")
            cluster.kill(victim)
            await write(40)
            await eventually(lambda: len(seen) >= len(written), what="every event", timeout=15)
            assert not watching.done()
            assert seen == written, "events missed or repeated across the fail-over"
            assert _member_in_use(cluster, watcher) != victim
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching


async def test_a_keyspace_mirror_follows_through_a_member_death(cluster: EtcdCluster) -> None:
    prefix = _prefix("keyspace")
    victim = (cluster.leader() + 2) % 3
    async with _client(cluster, victim) as etcd, _client(cluster, (victim + 1) % 3) as writer:
        await writer.put(f"{prefix}a".encode(), b"1")
        ks = KeySpace(prefix, lambda _key, raw: int(raw))
        await ks.load(etcd)
        loads = 0
        load = ks.load

        async def counting_load(client: Etcd) -> None:
            nonlocal loads
            loads += 1
            await load(client)

        ks.load = counting_load  # type: ignore[method-assign]
        watching = asyncio.create_task(ks.watch(etcd))
        try:
            cluster.kill(victim)
            resp = await writer.put(f"{prefix}b".encode(), b"2")
            await ks.wait_for_revision(resp.header.revision, timeout=10)
            assert [kv.value for kv in ks.prefixed(prefix)] == [1, 2]
            assert loads == 0, "the watch resumed; the mirror was not reloaded"
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching


async def test_a_watch_of_a_compacted_revision_fails_with_its_compact_revision(
    cluster: EtcdCluster,
) -> None:
    from aetcd import rpc

    prefix = _prefix("compacted")
    async with _client(cluster, 0) as etcd:
        first = await etcd.put(f"{prefix}a".encode(), b"1")
        last = await etcd.put(f"{prefix}a".encode(), b"2")
        await etcd._unary(
            "kv", "Compact", rpc.CompactionRequest(revision=last.header.revision, physical=True)
        )
        with pytest.raises(EtcdCompacted) as err:
            async for _ in etcd.watch_prefix(prefix.encode(), first.header.revision):
                pass
        assert err.value.compact_revision == last.header.revision


async def test_a_write_to_a_hung_member_is_reported_unknown_not_sent_twice(
    cluster: EtcdCluster,
) -> None:
    key = f"{_prefix('hung')}k".encode()
    victim = (cluster.leader() + 1) % 3
    async with _client(cluster, victim, timeout=3.0) as a, _client(cluster, victim, 3.0) as b:
        await a.put(key, b"0")
        await b.get(key)  # Both are connected to the victim.
        cluster.pause(victim)
        try:
            # Sent on an open connection, then no answer: etcd may yet apply it, and a
            # second run would read as a conflict. The caller learns so; the client moves on.
            with pytest.raises(EtcdOutcomeUnknown):
                await a.txn([Compare(key, "version", 1)], [op_put(key, b"1")])
            assert _member_in_use(cluster, a) != victim

            # A read that meets the hung member is sent again to the next.
            assert (await b.get(key)).kvs[0].value == b"0"
            assert _member_in_use(cluster, b) != victim

            # The caller decides again on what it reads; here it writes another value.
            await b.put(key, b"2")
        finally:
            cluster.resume(victim)
        # The frozen member may run the unanswered transaction once it thaws: its guard
        # (version 1) fails now, so it cannot overwrite what was decided since.
        await asyncio.sleep(0.5)
        got = (await a.get(key)).kvs[0]
        assert (got.value, got.version) == (b"2", 2)


async def test_a_broker_keeps_serving_and_its_lease_while_members_die(
    cluster: EtcdCluster, tmp_path: Path
) -> None:
    root = f"/failover-broker/{os.getpid()}"
    broker = BrokerProcess(cluster.endpoints_flag, root=root, spool_dir=tmp_path / "spool")
    journal = "failover/journal"
    with broker:
        async with JournalClient(broker.endpoint) as client, Etcd(cluster.endpoints) as etcd:
            await apply_specs(client, [journal_spec(journal)])
            await append(client, pb.AppendRequest(journal=journal), b"first\n", retry_for=10)
            member_key = f"{root}/members/{broker.zone}#{broker.suffix}".encode()
            before = (await etcd.get(member_key)).kvs[0]

            async def appends_for(seconds: float) -> None:
                """Append every 0.1 s; each must commit within two seconds."""
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    resp = await append(
                        client, pb.AppendRequest(journal=journal), b"more\n", retry_for=2
                    )
                    assert resp.status == pb.OK
                    await asyncio.sleep(0.1)

            # The member the broker's client starts on, then the leader: each down for longer
            # than the broker's lease TTL (4 s), then back.
            try:
                for victim in (0, cluster.leader()):
                    cluster.kill(victim)
                    await appends_for(6)
                    cluster.start(victim)
                    await appends_for(1)
            except Exception as err:
                err.add_note(f"broker exit status {broker.proc and broker.proc.poll()}; its log:")
                err.add_note(broker.tail_log())
                raise

            after = (await etcd.get(member_key)).kvs[0]
            assert (after.lease, after.create_revision) == (before.lease, before.create_revision)
            assert broker.proc is not None and broker.proc.poll() is None
