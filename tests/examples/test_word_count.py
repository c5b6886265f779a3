"""The word-count example end to end, on the package's pytest plugin: the example's specs
(`word_count.specs`), two `gazette-consumer` processes of `word_count.app:WordCount` (hot
standbys 1), whose primaries are SIGKILLed again and again while text is fed; the counts
must come out exact, through the query API and in the read-committed NGramCount stream."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator

import grpc.aio
import pytest
from word_count.feed import Feeder, deltas_partitions
from word_count.messages import COUNTS, NGramCount, deltas_partition, shard_id
from word_count.query import QueryError, query_channel
from word_count.specs import journal_specs, shard_specs

from gazette.broker.client import JournalClient, write_head
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.message.mapping import fnv1a_32
from gazette.testing.pytest_plugin import Consumer, GazetteCluster, SpecsArg

APP = "word_count.app:WordCount"
PARTITIONS = 2
KILLS = 10
TAIL_LINES = 300


def corpus(seed: int = 7) -> Iterator[str]:
    """Endless deterministic pseudo-random prose: lines of four sentences over a
    Zipf-weighted vocabulary of 80 words."""
    rng = random.Random(seed)
    vocab = [
        f"{a}{b}" for a in ("ba", "ko", "mi", "tu", "re", "sa", "lo", "ne") for b in "aeioulnrst"
    ]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    while True:
        line = []
        for _ in range(4):
            sentence = rng.choices(vocab, weights, k=rng.randint(3, 12))
            sentence[0] = sentence[0].capitalize()
            line.append(" ".join(sentence) + rng.choice([".", ",", "!", "?", ";"]))
        yield " ".join(line) + "\n"


def expected_counts(text: str) -> Counter[str]:
    """Bigram counts of `text`, computed independently of `word_count.messages`."""
    toks = re.findall(r"[a-z]+", text.lower())
    return Counter(f"{a} {b}" for a, b in zip(toks, toks[1:], strict=False))


async def test_counts_exact_through_primary_kills(
    gazette: GazetteCluster,
    gazette_journals: Callable[[SpecsArg], list[str]],
    gazette_consumer: Callable[..., Consumer],
) -> None:
    t_start = time.monotonic()
    gazette_journals(journal_specs(PARTITIONS, "file:///word-count-fragments/"))
    consumers = [
        gazette_consumer(APP, shards=shard_specs(PARTITIONS, hot_standbys=1), hint_interval=1),
        gazette_consumer(APP, hint_interval=1),
    ]
    for i in range(PARTITIONS):
        await gazette.wait_primary(shard_id(i), standbys=1)

    async with (
        JournalClient(gazette.brokers().endpoints) as client,
        grpc.aio.insecure_channel(consumers[0].endpoint) as ch0,
        grpc.aio.insecure_channel(consumers[1].endpoint) as ch1,
    ):
        channels = {consumers[0].suffix: ch0, consumers[1].suffix: ch1}
        lines: list[str] = []
        kills_done = asyncio.Event()
        parts = await deltas_partitions(client)
        assert [j.spec.name for j in parts] == [deltas_partition(i) for i in range(2)]

        async def feed() -> Counter[str]:
            """Feed lines paced until the kills are over, then TAIL_LINES more at once."""
            text = corpus()
            async with Feeder(client, parts) as feeder:
                while not kills_done.is_set():
                    lines.append(next(text))
                    await feeder.add(lines[-1])
                    await feeder.barrier()
                    await asyncio.sleep(0.02)  # Paces the load.
                for _ in range(TAIL_LINES):
                    lines.append(next(text))
                    await feeder.add(lines[-1])
            return feeder.counts

        feeder = asyncio.create_task(feed())
        takeovers = []
        for k in range(KILLS):
            await asyncio.sleep(0.3)  # The primaries process input until one is killed.
            victim = await gazette.wait_primary(shard_id(k % 2))
            t0 = time.monotonic()
            victim.kill()
            for i in range(PARTITIONS):
                assert await gazette.wait_primary(shard_id(i)) is not victim
            takeovers.append(time.monotonic() - t0)
            victim.restart()
            for i in range(PARTITIONS):
                await gazette.wait_primary(shard_id(i), standbys=1)
        assert not feeder.done()
        kills_done.set()
        fed = await feeder
        t_kills = time.monotonic() - t_start

        text = "".join(lines)
        expected = expected_counts(text)
        assert fed == expected

        # Every shard reads its partition through (Stat proxies to the primary).
        stub = pb_grpc.ShardStub(ch0)
        for i in range(PARTITIONS):
            head = await write_head(client, deltas_partition(i))
            resp = await stub.Stat(
                pb.StatRequest(shard=shard_id(i), read_through={deltas_partition(i): head}),
                timeout=60,
            )
            assert resp.status == pb.OK, resp

        # The query API, through either process (one of them proxies).
        owner = {g: shard_id(fnv1a_32(g) % PARTITIONS) for g in expected}
        served_by = set()
        for name, ch in channels.items():
            got: Counter[str] = Counter()
            for i in range(PARTITIONS):
                resp_q = await query_channel(ch, {"shard": shard_id(i), "prefix": ""})
                served_by.add((name, resp_q["served_by"]))
                assert all(owner[g] == shard_id(i) for g in resp_q["counts"])
                got.update(resp_q["counts"])
            assert got == expected, f"counts queried through {name}"
            for g, n in list(expected.most_common(5)):
                one = await query_channel(ch, {"ngram": g})
                assert one["counts"] == {g: n} and one["shard"] == owner[g]
        assert any(a != b for a, b in served_by), "no query was proxied"
        with pytest.raises(QueryError, match="SHARD_NOT_FOUND"):
            await query_channel(ch0, {"shard": "no-such-shard"})

    # The read-committed NGramCount stream: strictly increasing per n-gram, ending at the
    # expected counts.
    final: dict[str, int] = {}
    updates = await gazette.read_committed(COUNTS, NGramCount)
    for u in updates:
        assert u.count > final.get(u.ngram, 0), f"{u.ngram}: {u.count} after {final.get(u.ngram)}"
        final[u.ngram] = u.count
    assert final == dict(expected)
    print(
        f"{sum(expected.values())} bigrams ({len(expected)} distinct), {KILLS} SIGKILLs in"
        f" {t_kills:.1f}s, takeovers {[round(t, 1) for t in takeovers]},"
        f" {len(updates)} NGramCount updates"
    )
