"""allocator.member.Member against a real etcd: announcement, reconcile loop, advertised
values, a graceful exit's hand-over, and the replacement of a crashed predecessor."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gazette.allocator.member import RECONCILE_RETRY, Member
from gazette.allocator.model import MemberID, assignments_prefix, item_key, members_prefix
from gazette.allocator.session import MemberExistsError
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.keyspace.etcd import Etcd, EtcdError, op_put
from gazette.keyspace.keyspace import KeySpace
from gazette.testing.etcd import EtcdServer
from tests.kit.eventually import eventually


def decoder(root: str) -> Callable[[str, bytes], Any]:
    def decode(key: str, raw: bytes) -> Any:
        if key.startswith(members_prefix(root)):
            return pb.BrokerSpec.FromString(raw)
        if key.startswith(assignments_prefix(root)):
            return pb.Route.FromString(raw)
        return pb.JournalSpec.FromString(raw)

    return decode


class Node:
    """A member whose reconcile advertises a Route naming itself on each assignment."""

    def __init__(self, etcd: EtcdServer, root: str, suffix: str, endpoint: str = "") -> None:
        self.reconciles = 0
        self.fail_next: list[BaseException] = []
        self.spec = pb.BrokerSpec(
            process_spec=pb.ProcessSpec(
                id=pb.ProcessSpec.ID(zone="z", suffix=suffix),
                endpoint=endpoint or f"http://{suffix}:1",
            ),
            journal_limit=10,
        )
        self.member = Member(
            etcd_endpoint=etcd.endpoint,
            root=root,
            member_id=MemberID("z", suffix),
            spec=self.spec,
            decode_spec=pb.BrokerSpec.FromString,
            keyspace=KeySpace(root + "/", decoder(root)),
            lease_ttl=3,
            reconcile=self.reconcile,
            item_replication=lambda spec: int(spec.replication),
            member_limit=lambda spec: int(spec.journal_limit),
            is_consistent=lambda item, a, all_: bool(a.value.members),
        )
        self.task: asyncio.Task[None] | None = None

    async def reconcile(self) -> None:
        self.reconciles += 1
        if self.fail_next:
            raise self.fail_next.pop()
        for akv, _slot in self.member.assignments().values():
            if not akv.value.members:
                route = pb.Route(primary=0)
                route.members.add(zone="z", suffix=self.member.id.suffix)
                await self.member.advertise(akv, route)

    async def start(self) -> None:
        await self.member.start()
        self.task = asyncio.create_task(self.member.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.member.release()


@pytest.fixture
async def root(etcd_server: EtcdServer) -> AsyncIterator[str]:
    root = f"/member-test/{uuid.uuid4().hex[:12]}"
    async with Etcd(etcd_server.endpoint) as etcd:
        spec = pb.JournalSpec(name="a/journal", replication=1)
        await etcd.txn([], [op_put(item_key(root, "a/journal").encode(), spec.SerializeToString())])
        yield root


def assigned_to(node: Node, item: str = "a/journal") -> bool:
    mine = node.member.assignments().get(item)
    return mine is not None and bool(mine[0].value.members)


async def test_a_member_reconciles_its_assignments_and_hands_them_over_when_exiting(
    etcd_server: EtcdServer, root: str
) -> None:
    a = Node(etcd_server, root, "member-a")
    b = Node(etcd_server, root, "member-b")
    await a.start()
    try:
        # Alone: the item is assigned here as its primary (slot 0), and the reconcile
        # advertised its route.
        await eventually(
            lambda: assigned_to(a) and a.member.assignments()["a/journal"][1] == 0,
            what="the item assigned to a, at slot 0",
            timeout=10,
            interval=0.02,
        )
        await b.start()
        await a.member.mark_exiting()
        # The allocator moves the item to the other member, which reconciles it in turn.
        await eventually(
            lambda: assigned_to(b) and not a.member.assignments(),
            what="the item handed over to b",
            timeout=10,
            interval=0.02,
        )
        assert b.reconciles >= 1
    finally:
        await b.stop()
        await a.stop()
    async with Etcd(etcd_server.endpoint) as etcd:
        left = await etcd.get_prefix(members_prefix(root).encode())
        assert not left.kvs, "release revokes the lease: member keys are gone"


async def test_a_reconcile_failing_on_etcd_is_retried(etcd_server: EtcdServer, root: str) -> None:
    node = Node(etcd_server, root, "member-r")
    node.fail_next.append(EtcdError("unavailable"))
    await node.start()
    try:
        await eventually(
            lambda: assigned_to(node),
            what="the item assigned",
            timeout=5 + RECONCILE_RETRY,
            interval=0.02,
        )
        assert node.reconciles >= 2
    finally:
        await node.stop()


async def test_a_crashed_predecessor_is_replaced_but_another_process_is_not(
    etcd_server: EtcdServer, root: str
) -> None:
    first = Node(etcd_server, root, "member-c")
    await first.start()
    assert first.task is not None
    first.task.cancel()  # Crashed: its lease is left to expire.
    with contextlib.suppress(asyncio.CancelledError):
        await first.task
    other = Node(etcd_server, root, "member-c", endpoint="http://elsewhere:1")
    with pytest.raises(MemberExistsError):
        await other.member.start()
    await other.member.release()
    # The same endpoint: our own predecessor, replaced at once.
    again = Node(etcd_server, root, "member-c")
    await again.start()
    try:
        assert again.member.lease_id != first.member.lease_id
        await eventually(
            lambda: assigned_to(again), what="the item assigned again", timeout=10, interval=0.02
        )
    finally:
        await again.stop()
        if first.member.etcd is not None:
            await first.member.etcd.close()


async def test_the_lease_is_kept_alive_from_the_announcement_before_run(
    etcd_server: EtcdServer, root: str
) -> None:
    """What a process does between `start` and `run` (a broker judging its leftover spools)
    may outlast the lease's TTL: the member must still be announced, not fenced at `run`."""
    node = Node(etcd_server, root, "member-slow")
    await node.member.start()
    try:
        await asyncio.sleep(node.member.lease_ttl + 1.5)  # A start slower than the TTL.
        async with Etcd(etcd_server.endpoint) as etcd:
            held = await etcd.get(node.member.key.encode())
            assert held.kvs, "the member key expired before the member ran"
        node.task = asyncio.create_task(node.member.run())
        await eventually(
            lambda: assigned_to(node), what="the item assigned", timeout=10, interval=0.02
        )
        assert not node.task.done()
    finally:
        await node.stop()
