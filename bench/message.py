"""Message benchmark: publishing and read-committed throughput, as ratios of plain json.

- publish_committed: 100-byte JSON messages (a `JSONMessage` dataclass; framed size exactly
  100 bytes) published with `Publisher.publish_committed` over a modulo mapping of 2 journals
  of a real broker, the producer yielding to the event loop every 1,000 messages; timed until
  every append committed (`barrier()`). Target >= 300k messages/s. Messages
  are built before timing; the garbage collector is kept off them (`gc.freeze`) in every
  timed section, baselines included.
- publish_uncommitted: the same, as transactions of 1,000 messages each acknowledged
  (`commit()` every 10 transactions, so ACKs are appended without waiting on each).
- read_committed: `ReadCommittedIter` over both journals (a Sequencer, JSON decoding,
  dataclass construction), messages/s.

Native baselines, in the same run: `json.dumps` of the same records (dicts holding the UUID
string) into one bytes buffer, and `json.loads` of each line of that buffer, messages/s.

Prints progress on stderr, then one JSON line. `--quick` runs in well under a minute.
"""

from __future__ import annotations

import os.path
import sys

# This script is named after the package it measures; keep its directory off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import (
    AppendService,
    JournalClient,
    OffsetNotYetAvailable,
    apply_journals,
    list_all_journals,
)
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.selector import parse_label_selector
from gazette.message import JSONMessage
from gazette.message.iterators import ReadCommittedIter
from gazette.message.mapping import modulo_mapping
from gazette.message.publisher import Publisher
from gazette.message.sequencer import Sequencer
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer

TARGET = 300_000
MESSAGE_SIZE = 100
PARTITIONS = 2
YIELD_EVERY = 1000
WARMUP = PARTITIONS * 10


@dataclass
class Reading(JSONMessage):
    sensor: str = ""
    seq: int = 0
    note: str = ""
    uuid: uuid.UUID | None = None


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_messages(n: int) -> list[Reading]:
    """`n` messages whose JSON frames (with a UUID) are exactly MESSAGE_SIZE bytes."""
    probe = Reading(sensor="s-000", seq=100_000, note="", uuid=uuid.uuid1())
    pad = MESSAGE_SIZE - len(probe.to_json_line() or b"")
    assert pad > 0
    return [Reading(sensor=f"s-{i % 997:03d}", seq=100_000 + i, note="x" * pad) for i in range(n)]


def native_dumps_rate(messages: list[Reading]) -> tuple[float, bytes]:
    """json.dumps of the messages' records (UUID strings precomputed) into one buffer."""
    records = [
        {"uuid": str(uuid.uuid1()), "sensor": m.sensor, "seq": m.seq, "note": m.note}
        for m in messages
    ]
    dumps = json.dumps
    buf = bytearray()
    frozen()
    t0 = time.perf_counter()
    for r in records:
        buf += dumps(r, separators=(",", ":")).encode()
        buf += b"\n"
    elapsed = time.perf_counter() - t0
    gc.unfreeze()
    assert len(buf) == MESSAGE_SIZE * len(messages), len(buf) / len(messages)
    return len(records) / elapsed, bytes(buf)


def native_loads_rate(data: bytes) -> float:
    loads = json.loads
    frozen()
    t0 = time.perf_counter()
    n = 0
    for line in data.splitlines():
        loads(line)
        n += 1
    rate = n / (time.perf_counter() - t0)
    gc.unfreeze()
    return rate


def frozen() -> None:
    """Keep the collector off the objects made so far (the run's pre-built messages): a real
    producer doesn't hold a million messages, and the baselines get the same treatment."""
    gc.collect()
    gc.freeze()


async def setup_topic(client: JournalClient, store: Path, name: str) -> list[Any]:
    changes = []
    for i in range(PARTITIONS):
        frag = pb.JournalSpec.Fragment(
            length=1 << 28, compression_codec=pb.NONE, refresh_interval=Duration(seconds=60)
        )
        frag.stores.append(f"file://{store}/")
        spec = pb.JournalSpec(name=f"bench/{name}/part-{i}", replication=1, fragment=frag)
        spec.labels.labels.add(name="content-type", value="application/x-ndjson")
        spec.labels.labels.add(name="topic", value=name)
        changes.append(pb.ApplyRequest.Change(upsert=spec))
    await apply_journals(client, pb.ApplyRequest(changes=changes))
    return list(await list_all_journals(client, parse_label_selector(f"topic={name}")))


async def publish_run(
    client: JournalClient, parts: list[Any], messages: list[Reading], committed: bool
) -> float:
    mapping = modulo_mapping(lambda m: m.sensor, lambda: parts)
    async with AppendService(client) as svc:
        # Warm up: the broker takes new journals' assignments, the client learns routes.
        warm = Publisher(svc)
        for m in make_messages(WARMUP):
            warm.publish_committed(mapping, m)
        await warm.barrier()

        pub = Publisher(svc)
        publish: Callable[..., Any] = (
            pub.publish_committed if committed else pub.publish_uncommitted
        )
        frozen()
        t0 = time.perf_counter()
        for i, m in enumerate(messages):
            publish(mapping, m)
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                if not committed:
                    pub.publish_ack_intents(pub.build_ack_intents())
                await asyncio.sleep(0)
        if not committed:
            pub.publish_ack_intents(pub.build_ack_intents())
        await pub.barrier()
        elapsed = time.perf_counter() - t0
        gc.unfreeze()
        say(f"    {len(messages)} messages in {elapsed:.2f}s, {svc.rpc_count} append RPCs")
    return len(messages) / elapsed


async def read_committed(client: JournalClient, parts: list[Any]) -> tuple[int, float]:
    frozen()
    t0 = time.perf_counter()
    n = 0
    for j in parts:
        it = ReadCommittedIter(
            client,
            pb.ReadRequest(journal=j.spec.name, block=False),
            j.spec,
            lambda spec: Reading(),
            Sequencer(),
        )
        try:
            async for env in it:
                n += env.message.sensor != ""  # Not an acknowledgement.
        except OffsetNotYetAvailable:
            pass
        finally:
            it.close()
    rate = n / (time.perf_counter() - t0)
    gc.unfreeze()
    return n, rate


async def run(endpoint: str, store: Path, count: int, runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with JournalClient(endpoint) as client:
        pub_rates, txn_rates = [], []
        parts: list[Any] = []
        for r in range(runs):
            parts = await setup_topic(client, store, f"committed-{r}")
            say(f"publish_committed run {r + 1}/{runs} ...")
            pub_rates.append(await publish_run(client, parts, make_messages(count), True))
            say(f"  {pub_rates[-1]:,.0f} messages/s")
        out["publish"] = pub_rates

        say("read_committed of the last run's journals ...")
        n, read_rate = await read_committed(client, parts)
        assert n == count + WARMUP, (n, count)
        say(f"  {n} messages, {read_rate:,.0f} messages/s")
        out["read"] = read_rate

        for r in range(runs):
            txn_parts = await setup_topic(client, store, f"txn-{r}")
            say(f"publish_uncommitted (+ ACK per {YIELD_EVERY}) run {r + 1}/{runs} ...")
            txn_rates.append(await publish_run(client, txn_parts, make_messages(count), False))
            say(f"  {txn_rates[-1]:,.0f} messages/s")
        out["txn"] = txn_rates
        n, _ = await read_committed(client, txn_parts)
        assert n == count + WARMUP, (n, count)  # Every transaction committed, nothing else.
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small run (< 1 minute)")
    args = parser.parse_args()
    count = 200_000 if args.quick else 1_000_000
    runs = 3

    say(f"native json.dumps / json.loads of {count} {MESSAGE_SIZE}-byte records ...")
    dumps_rates, loads_rates = [], []
    for _ in range(runs):
        rate, data = native_dumps_rate(make_messages(count))
        dumps_rates.append(rate)
        loads_rates.append(native_loads_rate(data))
    native_dumps = statistics.median(dumps_rates)
    native_loads = statistics.median(loads_rates)
    say(f"  dumps {native_dumps:,.0f}/s, loads {native_loads:,.0f}/s (medians of {runs})")

    with tempfile.TemporaryDirectory(prefix="bench-message-", dir="/var/tmp") as tmp:
        tmpdir = Path(tmp)
        store = tmpdir / "store"
        store.mkdir()
        with EtcdServer() as etcd:
            with BrokerProcess(etcd.endpoint, spool_dir=tmpdir / "spool") as b:
                figures = asyncio.run(run(b.endpoint, store, count, runs))

    publish = statistics.median(figures["publish"])
    txn = statistics.median(figures["txn"])
    read = figures["read"]
    result = {
        "bench": "message",
        "message_bytes": MESSAGE_SIZE,
        "publish_committed_per_s": round(publish),
        "publish_committed_spread": [
            round(min(figures["publish"])),
            round(max(figures["publish"])),
        ],
        "target": TARGET,
        "meets_target": publish >= TARGET,
        "publish_uncommitted_per_s": round(txn),
        "read_committed_per_s": round(read),
        "native_json_dumps_per_s": round(native_dumps),
        "native_json_loads_per_s": round(native_loads),
        "ratio_publish_committed": round(publish / native_dumps, 3),
        "ratio_publish_uncommitted": round(txn / native_dumps, 3),
        "ratio_read_committed": round(read / native_loads, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
