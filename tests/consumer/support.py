"""What the consumer's end-to-end tests share: an application's journals, shard specs and
`gazette-consumer` processes (`Setup`), the Shard API calls they make, a feed of counted
input, and the checks of exactly-once totals."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc.aio
from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import AppendService, JournalClient
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.iterators import ReadCommittedIter
from gazette.message.publisher import Publisher
from gazette.testing.broker import BrokerProcess
from gazette.testing.consumer import ConsumerProcess
from gazette.testing.etcd import EtcdServer
from tests.consumer.counter_app import Add, Total
from tests.kit.eventually import eventually
from tests.kit.specs import RECOVERY_LOG, apply_specs, journal_spec

REPO = Path(__file__).resolve().parents[2]
COUNTER = "tests.consumer.counter_app:Counter"
BATCH_COUNTER = "tests.consumer.counter_app:BatchCounter"
PROCESS_TIMEOUT = 60.0
"""Seconds a consumer process is given to reach a state (start, recover, hand over)."""

_names = itertools.count()


def json_journal(name: str, store: Path) -> bpb.JournalSpec:
    """An input or output journal of JSON lines, in 16 MiB fragments persisted to `store`."""
    return journal_spec(name, store, length=1 << 24, content_type=CONTENT_TYPE_JSON_LINES)


def recovery_log(name: str, store: Path) -> bpb.JournalSpec:
    """A shard's recovery log, in 16 MiB fragments persisted to `store`."""
    return journal_spec(name, store, length=1 << 24, content_type=RECOVERY_LOG)


class Setup:
    """Journals, shard specs and consumer processes of one test: `shards` shards of the
    counter application `app` (COUNTER or BATCH_COUNTER), shard-00i reading journal in-i, all
    writing their totals to one output journal."""

    def __init__(
        self, etcd: EtcdServer, broker: BrokerProcess, tmp: Path, shards: int, app: str = COUNTER
    ) -> None:
        self.app = app
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
        await apply_specs(
            client,
            [json_journal(j, store) for j in [*self.inputs, self.output]]
            + [recovery_log(f"{self.prefix}/recovery/{s}", store) for s in self.shard_ids],
        )

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

    def consumer(self, i: int, hint_interval: int = 1) -> ConsumerProcess:
        """Consumer process `i` (not started), in zone z0 or z1, writing primary hints every
        `hint_interval` seconds."""
        c = ConsumerProcess(
            self.app,
            self.etcd.endpoint,
            [self.broker.endpoint],
            root=self.root,
            zone=f"z{i % 2}",
            suffix=f"consumer-{i}",
            workdir=self.tmp / f"consumer-{i}",
            extra_env={"COUNTER_OUTPUT": self.output, "PYTHONPATH": str(REPO)},
            extra_args=["--hint-interval", str(hint_interval)],
        )
        self.consumers.append(c)
        return c

    def start(self, n: int, hint_interval: int = 1) -> dict[str, ConsumerProcess]:
        """Start consumers 0 .. n-1; they are returned by suffix."""
        return {c.suffix: c.start() for c in (self.consumer(i, hint_interval) for i in range(n))}

    def stubs(self) -> contextlib.AbstractAsyncContextManager[dict[str, pb_grpc.ShardStub]]:
        """A Shard stub of each consumer made so far, by suffix."""
        return shard_stubs(self.consumers)

    def close(self) -> None:
        for c in self.consumers:
            c.kill()


@contextlib.asynccontextmanager
async def shard_stubs(
    consumers: list[ConsumerProcess],
) -> AsyncIterator[dict[str, pb_grpc.ShardStub]]:
    """A Shard stub of each of `consumers`, by suffix, over channels open until the exit."""
    async with contextlib.AsyncExitStack() as stack:
        stubs = {}
        for c in consumers:
            ch = await stack.enter_async_context(grpc.aio.insecure_channel(c.endpoint))
            stubs[c.suffix] = pb_grpc.ShardStub(ch)
        yield stubs


async def apply_shards(stub: pb_grpc.ShardStub, specs: list[pb.ShardSpec]) -> None:
    req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=s) for s in specs])
    resp = await stub.Apply(req)
    assert resp.status == pb.OK, resp


async def shard_status(stub: pb_grpc.ShardStub) -> dict[str, list[int]]:
    resp = await stub.List(pb.ListRequest())
    return {s.spec.id: [st.code for st in s.status] for s in resp.shards}


def ready_on(
    stub: pb_grpc.ShardStub, codes: list[int], shard: str = "shard-000"
) -> Callable[[], Awaitable[bool]]:
    """A check: `shard`'s replicas have statuses `codes` (in any order), as `stub` lists
    them (False while its process does not answer)."""

    async def ready() -> bool:
        try:
            st = await shard_status(stub)
        except grpc.aio.AioRpcError:
            return False
        return sorted(st.get(shard, [])) == sorted(codes)

    return ready


async def until_ready(stub: pb_grpc.ShardStub, codes: list[int], what: str) -> None:
    """Until shard-000's replicas have statuses `codes`."""
    await eventually(ready_on(stub, codes), what=what, timeout=PROCESS_TIMEOUT, interval=0.1)


async def until_primary(stub: pb_grpc.ShardStub, member: str, what: str) -> None:
    """Until `stub`'s process lists consumer `member` as shard-000's primary."""

    async def primary() -> bool:
        return await primary_of(stub, "shard-000") == member

    await eventually(primary, what=what, timeout=PROCESS_TIMEOUT, interval=0.1)


async def stat_through(
    stub: pb_grpc.ShardStub, shard: str, journal: str, offset: int
) -> pb.StatResponse:
    resp: pb.StatResponse = await stub.Stat(
        pb.StatRequest(shard=shard, read_through={journal: offset}), timeout=60
    )
    assert resp.status == pb.OK, resp
    return resp


async def caught_up(client: JournalClient, stub: pb_grpc.ShardStub, journal: str) -> None:
    """Until shard-000 committed what it read of `journal` through its write head of now."""
    await stat_through(stub, "shard-000", journal, await write_head(client, journal))


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
            await asyncio.sleep(0.02)  # Paces the load.


async def check_totals(
    client: JournalClient, stub: pb_grpc.ShardStub, s: Setup, expected: dict[str, int]
) -> None:
    """Once the shard read its input through, the committed totals are exactly `expected`:
    each key's totals strictly increase (no duplicate, no rollback) and end at its sum."""
    await caught_up(client, stub, s.inputs[0])
    out_head = await write_head(client, s.output)
    final: dict[str, int] = {}
    for t in await committed_totals(client, s.output, out_head):
        assert t.total > final.get(t.key, -1), f"total of {t.key} repeated or went back"
        final[t.key] = t.total
    assert final == expected
