"""What the tests of several real brokers share: Journal stubs of a cluster, creating a
journal and waiting for its route, and a producer of numbered lines that records what was
acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from gazette.broker.client import AppendService
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.testing.cluster import BrokerCluster
from tests.kit.eventually import eventually


@contextlib.asynccontextmanager
async def stubs(cluster: BrokerCluster) -> AsyncIterator[list[pb_grpc.JournalStub]]:
    """A Journal stub of each broker of `cluster`, in order."""
    channels = [grpc.aio.insecure_channel(ep) for ep in cluster.endpoints]
    try:
        yield [pb_grpc.JournalStub(ch) for ch in channels]
    finally:
        for ch in channels:
            await ch.close()


async def create(stub: pb_grpc.JournalStub, s: pb.JournalSpec) -> None:
    """Create or update the journal of `s`."""
    resp = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=s)]))
    assert resp.status == pb.OK


async def route(stub: pb_grpc.JournalStub, journal: str) -> pb.Route:
    """The journal's route, as the broker of `stub` lists it."""
    async for resp in stub.List(
        pb.ListRequest(
            selector=pb.LabelSelector(
                include=pb.LabelSet(labels=[pb.Label(name="name", value=journal)])
            )
        )
    ):
        for j in resp.journals:
            return j.route
    raise AssertionError(f"journal {journal} not listed")


async def wait_route(
    stub: pb_grpc.JournalStub, journal: str, members: int, timeout: float = 30.0
) -> pb.Route:
    """Wait for `members` assigned brokers with a primary."""

    async def converged() -> pb.Route | None:
        r = await route(stub, journal)
        return r if len(r.members) == members and r.primary >= 0 else None

    return await eventually(
        converged, what=f"the route of {journal} to converge", timeout=timeout, interval=0.1
    )


def primary_suffix(r: pb.Route) -> str:
    """The suffix of the route's primary broker."""
    return r.members[r.primary].suffix


async def produce(
    svc: AppendService,
    journal: str,
    stop: asyncio.Event,
    acked: list[int],
    gaps: list[float] | None = None,
    *,
    line: Callable[[int], bytes] = lambda n: f"{n:08d}\n".encode(),
    commits: dict[int, tuple[int, int]] | None = None,
) -> None:
    """Append numbered lines (`line(n)`, up to 20 in flight) until `stop`; record
    acknowledged numbers in order, the longest wait for an acknowledgement in `gaps`, and
    the commit that acknowledged each in `commits` ([begin, end): appends may be batched)."""
    seq = 0
    inflight: list[tuple[int, Any]] = []
    last = time.monotonic()

    async def ack_oldest() -> None:
        nonlocal last
        n, a = inflight.pop(0)
        resp = await a.done()  # raises if the append failed
        acked.append(n)
        if commits is not None:
            commits[n] = (resp.commit.begin, resp.commit.end)
        now = time.monotonic()
        if gaps is not None:
            gaps.append(now - last)
        last = now

    while not stop.is_set():
        a = svc.start_append(pb.AppendRequest(journal=journal))
        a.write(line(seq))
        a.release()
        inflight.append((seq, a))
        seq += 1
        if len(inflight) >= 20:
            await ack_oldest()
        await asyncio.sleep(0.002)  # Paces the load.
    while inflight:
        await ack_oldest()
