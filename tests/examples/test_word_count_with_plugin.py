"""word-count tested as its author would test it, with the package's pytest plugin alone: the
example's own spec files, two consumers, bigram deltas published, the primary of a shard
SIGKILLed between two batches, and the read-committed NGramCount stream checked exact."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import word_count
from word_count.messages import COUNTS, NGramCount, NGramDelta, deltas_partition, shard_id

from gazette.message.mapping import fnv1a_32
from gazette.testing.pytest_plugin import Consumer, GazetteCluster, SpecsArg

EXAMPLE = Path(word_count.__file__).resolve().parents[1]
APP = "word_count.app:WordCount"
PARTITIONS = 4  # As examples/word-count/journals.yaml has them.

BATCHES = [
    "the cat sat on the mat and the cat ran",
    "a dog sat on the cat; the dog ran on and on",
    "the mat the cat the dog the end",
]


def deltas(text: str) -> list[NGramDelta]:
    words = re.findall(r"[a-z]+", text)
    return [NGramDelta(f"{a} {b}", 1) for a, b in zip(words, words[1:], strict=False)]


def partition(delta: NGramDelta) -> str:
    """Each bigram always to one partition, as the example's feeder maps them."""
    return deltas_partition(fnv1a_32(delta.ngram) % PARTITIONS)


def latest(updates: list[NGramCount]) -> dict[str, int]:
    return {u.ngram: u.count for u in updates}


def reached(expected: Counter[str]) -> Callable[[list[NGramCount]], bool]:
    """Whether the updates read so far bring every bigram to its expected count."""
    return lambda updates: all(latest(updates).get(g, 0) >= n for g, n in expected.items())


async def test_counts_exact_through_a_primary_kill(
    gazette: GazetteCluster,
    gazette_journals: Callable[[SpecsArg], list[str]],
    gazette_consumer: Callable[..., Consumer],
) -> None:
    gazette_journals(EXAMPLE / "journals.yaml")
    gazette_consumer(APP, shards=EXAMPLE / "shards.yaml")
    gazette_consumer(APP)
    for i in range(PARTITIONS):
        await gazette.wait_primary(shard_id(i), standbys=1)

    expected: Counter[str] = Counter()
    victim = await gazette.wait_primary(shard_id(0))
    for n, text in enumerate(BATCHES):
        batch = deltas(text)
        expected.update(d.ngram for d in batch)
        await gazette.publish(partition, batch)
        counts = await gazette.read_committed(COUNTS, NGramCount, until=reached(expected))
        assert latest(counts) == expected
        if n == 0:
            victim.kill()  # The next batch is counted by the shard's new primary.
            assert await gazette.wait_primary(shard_id(0)) is not victim
        if n == 1:
            victim.restart()

    # Exactly once: every update raises its bigram's count, none is committed twice.
    seen: dict[str, int] = {}
    for u in await gazette.read_committed(COUNTS, NGramCount):
        assert u.count > seen.get(u.ngram, 0), f"{u.ngram}: {u.count} after {seen[u.ngram]}"
        seen[u.ngram] = u.count
    assert seen == expected
