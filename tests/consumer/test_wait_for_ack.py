"""Waiting for ACKs end to end: etcd, a broker, and a `gazette-consumer` process of the
counter application (tests/consumer/counter_app.py), downstream of a transactional producer.

The test plays the upstream stage itself, with a Publisher: a committed message, then a
transaction of two messages whose ACK follows after a gap. This pins the timing more tightly
than an upstream consumer could (its ACK follows its commit by an unknown delay). The
counter publishes one Total per key and transaction, so its output shows where each of its
transactions closed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.protocol import pb
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.publisher import Publisher
from tests.consumer.counter_app import Add
from tests.consumer.support import (
    PROCESS_TIMEOUT,
    Setup,
    apply_shards,
    committed_totals,
    ready_on,
    stat_through,
    write_head,
)
from tests.kit.eventually import eventually

MIN_TXN = 0.5
"""Seconds each of the counter's transactions stays open at least: the upstream messages,
published back to back, are all read within it."""
ACK_GAP = 2.0
"""Seconds between the upstream transaction's messages and its ACK (well within the
counter's max_txn_duration of 10 s)."""


async def test_downstream_commits_once_per_upstream_transaction_unless_disabled(
    new_setup: Callable[..., Setup], client: JournalClient
) -> None:
    """shard-000 waits for ACKs (the default): the transaction that consumed the committed
    message stays open past the stall for the ACK, and consumes the upstream transaction
    with it (one Total). shard-001 sets disable_wait_for_ack: its transaction closes at the
    stall, before the ACK (a Total of the committed message alone, then one after the ACK)."""
    s = new_setup(2)
    await s.create_journals(client)
    s.start(1)
    specs = s.shard_specs(hot_standbys=0)
    for spec in specs:
        spec.min_txn_duration.CopyFrom(Duration(nanos=int(MIN_TXN * 1e9)))
        spec.max_txn_duration.CopyFrom(Duration(seconds=10))
    specs[1].disable_wait_for_ack = True
    async with s.stubs() as stubs, AppendService(client) as svc:
        stub = stubs["consumer-0"]
        await apply_shards(stub, specs)
        for sid in s.shard_ids:
            ready = ready_on(stub, [pb.ReplicaStatus.PRIMARY], sid)
            await eventually(ready, what=f"{sid} primary", timeout=PROCESS_TIMEOUT, interval=0.1)

        pub = Publisher(svc)

        def to(journal: str) -> Callable[[object], tuple[str, str]]:
            return lambda _m: (journal, CONTENT_TYPE_JSON_LINES)

        # Both shards are reading: a first message went through each.
        for journal in s.inputs:
            pub.publish_committed(to(journal), Add("warm-up", 1))
        await pub.barrier()
        for sid, journal in zip(s.shard_ids, s.inputs, strict=True):
            await stat_through(stub, sid, journal, await write_head(client, journal))

        # The upstream stage: a committed message, its transaction right behind it...
        for journal in s.inputs:
            pub.publish_committed(to(journal), Add("k", 1))
            pub.publish_uncommitted(to(journal), Add("k", 10))
            pub.publish_uncommitted(to(journal), Add("k", 100))
        await pub.barrier()
        await asyncio.sleep(ACK_GAP)
        await pub.commit()  # ...and its ACK, after the gap.

        for sid, journal in zip(s.shard_ids, s.inputs, strict=True):
            await stat_through(stub, sid, journal, await write_head(client, journal))
        totals = await committed_totals(client, s.output, await write_head(client, s.output))
    by_shard = {
        sid: [t.total for t in totals if (t.key, t.shard) == ("k", sid)] for sid in s.shard_ids
    }
    assert by_shard == {"shard-000": [111], "shard-001": [1, 111]}, by_shard
