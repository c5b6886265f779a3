"""Waiting for ACKs end to end: etcd, a broker, and `gazette-consumer` processes of the
counter application (tests/consumer/counter_app.py), downstream of a transactional producer.

The first test plays the upstream stage itself, with a Publisher: a committed message, then a
transaction of two messages whose ACK follows after a gap. This pins the timing more tightly
than an upstream consumer could (its ACK follows its commit by an unknown delay). The second
runs a chain of two consumers with the package's pytest plugin: the relay application
(tests/consumer/relay_app.py) publishes its output uncommitted and the counter consumes it.
The counter publishes one Total per key and transaction, so its output shows where each of
its transactions closed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.protocol import pb
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.publisher import Publisher
from gazette.testing.pytest_plugin import Consumer, GazetteCluster, SpecsArg
from tests.consumer.counter_app import Add, Total
from tests.consumer.support import (
    COUNTER,
    PROCESS_TIMEOUT,
    Setup,
    apply_shards,
    committed_totals,
    ready_on,
    stat_through,
    write_head,
)
from tests.kit.eventually import eventually
from tests.kit.specs import RECOVERY_LOG, journal_spec

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


# A chain of two consumers. The relay (tests/consumer/relay_app.py) is the upstream stage:
# its shards publish each Add they consume at once, uncommitted, and its ACK follows at their
# commit. RELAY_SLOW holds its transaction open for RELAY_HOLD seconds, RELAY_FAST commits at
# its first stall, so their transactions overlap in the relayed journal. Two counter shards
# read that journal, one waiting for ACKs and one not.

RELAY = "tests.consumer.relay_app:Relay"
RELAYED = "chain/relayed"
TOTALS = "chain/totals"
RELAY_FAST, RELAY_SLOW = "relay-fast", "relay-slow"
SUM_WAITS, SUM_NO_WAIT = "sum-waits", "sum-no-wait"
RELAYS, COUNTERS = (RELAY_FAST, RELAY_SLOW), (SUM_WAITS, SUM_NO_WAIT)
RELAY_HOLD = 3.0
"""Seconds RELAY_SLOW's transactions stay open (min_txn_duration): its span is in the relayed
journal for that long before its ACK."""
SUM_MIN_TXN = 1.0
"""Seconds each counter transaction stays open at least: the two relays' spans both begin
within it, whichever the counter read first."""
MAX_TXN = 10.0
"""Seconds any transaction stays open at most (well past RELAY_HOLD)."""


def relay_input(shard: str) -> str:
    return f"chain/in/{shard}"


def duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


def shard_spec(sid: str, source: str, min_txn: float, **fields: Any) -> pb.ShardSpec:
    return pb.ShardSpec(
        id=sid,
        sources=[pb.ShardSpec.Source(journal=source)],
        recovery_log_prefix="chain/recovery",
        hint_prefix="/hints",
        hint_backups=1,
        min_txn_duration=duration(min_txn),
        max_txn_duration=duration(MAX_TXN),
        **fields,
    )


def totals_of(totals: list[Total], key: str) -> dict[str, list[int]]:
    """Each counter shard's totals of `key`, in commit order: one per transaction."""
    return {sid: [t.total for t in totals if (t.key, t.shard) == (key, sid)] for sid in COUNTERS}


def reached(key: str, total: int) -> Callable[[list[Total]], bool]:
    return lambda totals: all(ts[-1:] == [total] for ts in totals_of(totals, key).values())


async def test_chain_downstream_commits_once_per_overlapping_upstream_transactions(
    gazette: GazetteCluster,
    gazette_journals: Callable[[SpecsArg], list[str]],
    gazette_consumer: Callable[..., Consumer],
) -> None:
    """Each relay consumes one Add and relays it: RELAY_FAST's transaction commits at once,
    RELAY_SLOW's RELAY_HOLD seconds later. SUM_WAITS consumes RELAY_FAST's Add, stalls while
    RELAY_SLOW's span awaits its ACK, keeps its transaction open, and commits once for both
    upstream transactions. SUM_NO_WAIT (disable_wait_for_ack) commits RELAY_FAST's Add at
    the stall, in the middle of RELAY_SLOW's span, then RELAY_SLOW's after its ACK."""
    logs = [f"chain/recovery/{sid}" for sid in (*RELAYS, *COUNTERS)]
    gazette_journals(
        [
            *(journal_spec(j, content_type=CONTENT_TYPE_JSON_LINES) for j in (RELAYED, TOTALS)),
            *(journal_spec(relay_input(s), content_type=CONTENT_TYPE_JSON_LINES) for s in RELAYS),
            *(journal_spec(log, content_type=RECOVERY_LOG) for log in logs),
        ]
    )
    gazette_consumer(
        RELAY,
        shards=[
            shard_spec(RELAY_FAST, relay_input(RELAY_FAST), 0.0),
            shard_spec(RELAY_SLOW, relay_input(RELAY_SLOW), RELAY_HOLD),
        ],
        env={"RELAY_OUTPUT": RELAYED},
    )
    gazette_consumer(
        COUNTER,
        shards=[
            shard_spec(SUM_WAITS, RELAYED, SUM_MIN_TXN),
            shard_spec(SUM_NO_WAIT, RELAYED, SUM_MIN_TXN, disable_wait_for_ack=True),
        ],
        env={"COUNTER_OUTPUT": TOTALS},
    )
    for sid in (*RELAYS, *COUNTERS):
        await gazette.wait_primary(sid)

    def to_relay(add: Add) -> str:
        return relay_input(RELAY_FAST if add.n == 1 else RELAY_SLOW)

    # Every shard is reading: an Add through each relay reached both counters.
    await gazette.publish(to_relay, [Add("warm-up", 1), Add("warm-up", 10)])
    await gazette.read_committed(TOTALS, Total, until=reached("warm-up", 11))

    await gazette.publish(to_relay, [Add("k", 1), Add("k", 10)])
    totals = await gazette.read_committed(TOTALS, Total, until=reached("k", 11))
    assert totals_of(totals, "k") == {SUM_WAITS: [11], SUM_NO_WAIT: [1, 11]}
