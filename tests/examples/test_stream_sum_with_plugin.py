"""stream-sum tested as its author would test it, with the package's pytest plugin alone: the
example's own spec files, two summers, streams published in two halves with the primary of
a shard SIGKILLed between them (its running sums live on in the SQLite store it recorded),
a stream left in a transaction never acknowledged, and every Sum checked exact, once each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import stream_sum
from stream_sum.messages import SUMS, Chunk, Sum, chunks_partition, shard_id

from gazette.message.mapping import fnv1a_32
from gazette.testing.pytest_plugin import Consumer, GazetteCluster, SpecsArg

EXAMPLE = Path(stream_sum.__file__).resolve().parents[1]
APP = "stream_sum.app:Summer"
PARTITIONS = 4  # As examples/stream-sum/journals.yaml has them.
STREAMS = 24
CHUNKS = 6


def partition(chunk: Chunk) -> str:
    """Each stream to one partition, as the example's chunker maps them."""
    return chunks_partition(fnv1a_32(chunk.stream) % PARTITIONS)


def total(i: int) -> int:
    """The sum of stream `i`'s values."""
    return sum(i * seq + 1 for seq in range(1, CHUNKS + 1))


def by_stream(s: Sum) -> str:
    return s.stream


def chunks(ids: range, first: int, last: int) -> list[Chunk]:
    """Chunks `first` to `last` of streams `ids`, interleaved; chunk CHUNKS + 1 ends a
    stream with its total."""
    out = []
    for seq in range(first, last + 1):
        for i in ids:
            if seq <= CHUNKS:
                out.append(Chunk(f"s-{i}", seq, value=i * seq + 1))
            else:
                out.append(Chunk(f"s-{i}", seq, end=True, total=total(i)))
    return out


async def test_every_stream_summed_once_through_a_primary_kill(
    gazette: GazetteCluster,
    gazette_journals: Callable[[SpecsArg], list[str]],
    gazette_consumer: Callable[..., Consumer],
) -> None:
    gazette_journals(EXAMPLE / "journals.yaml")
    gazette_consumer(APP, shards=EXAMPLE / "shards.yaml")
    gazette_consumer(APP)
    for i in range(PARTITIONS):
        await gazette.wait_primary(shard_id(i), standbys=1)

    # A producer that died before committing: its stream is never summed.
    ghost = [Chunk("ghost", 1, value=5), Chunk("ghost", 2, end=True, total=5)]
    await gazette.publish(partition, ghost, committed=False)

    # Half the streams whole, the other half begun: once the whole ones are summed, every
    # shard has folded the begun ones into its store, and one shard's primary is killed.
    whole, begun = range(STREAMS // 2), range(STREAMS // 2, STREAMS)
    parts = {partition(c) for c in chunks(whole, 1, 1)}
    assert parts == {partition(c) for c in chunks(begun, 1, 1)} and len(parts) == PARTITIONS
    await gazette.publish(partition, chunks(begun, 1, 3) + chunks(whole, 1, CHUNKS + 1))
    await gazette.read_committed(SUMS, Sum, until=len(whole))
    victim = await gazette.wait_primary(shard_id(0))
    victim.kill()
    await gazette.publish(partition, chunks(begun, 4, CHUNKS + 1))
    assert await gazette.wait_primary(shard_id(0)) is not victim

    expected = [Sum(f"s-{i}", CHUNKS, total(i)) for i in range(STREAMS)]
    sums = await gazette.read_committed(SUMS, Sum, until=STREAMS)
    assert sorted(sums, key=by_stream) == sorted(expected, key=by_stream)
    # Nothing more is committed: no stream twice, no ghost.
    sums = await gazette.read_committed(SUMS, Sum)
    assert sorted(sums, key=by_stream) == sorted(expected, key=by_stream)
