"""The word-count feeder: text in, one `NGramDelta(ngram, 1)` per n-gram occurrence out.

Each delta is published committed (``publish_committed``: readable at once, no transaction)
to the deltas partition of FNV-1a(ngram) modulo the partitions listed by the brokers (ordered
by name), so that every occurrence of an n-gram lands in the same partition and each shard
owns a disjoint set of n-grams. The input is one stream of words: n-grams span line breaks
and the `Feeder.add` calls.

    python -m word_count.feed --broker 127.0.0.1:8080 corpus.txt     # or - for stdin

It reaches a secured cluster with the ``BROKER_*`` settings of the environment
(`word_count.clients`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections import Counter
from collections.abc import Sequence

from gazette.broker.client import AppendService, JournalClient, list_all_journals
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.message.mapping import NoPartitions, modulo_mapping
from gazette.message.publisher import Publisher
from word_count.clients import journal_client
from word_count.messages import NGramDelta, deltas_selector, ngrams, words

__all__ = ["Feeder", "feed_text", "main"]

log = logging.getLogger("word_count.feed")

DEFAULT_BARRIER_EVERY = 5000
"""Wait for the appends to commit after this many deltas (bounds what is buffered)."""


class Feeder:
    """Publishes the n-grams of text added with `add`, carrying the last ``n - 1`` words from
    one call to the next. `counts` holds the deltas of every n-gram whose appends committed:
    what a consumer must eventually count.

    Use ``async with Feeder(client, partitions) as f``, or call `close`. Append errors other
    than transient ones (retried by the AppendService) raise from `add` or `barrier`;
    cancellation leaves what was not yet acknowledged out of `counts`.
    """

    def __init__(
        self,
        client: JournalClient,
        partitions: Sequence[bpb.ListResponse.Journal],
        *,
        n: int = 2,
        barrier_every: int = DEFAULT_BARRIER_EVERY,
    ) -> None:
        if not partitions:
            raise NoPartitions("no deltas partitions: apply the word-count journals first")
        self.n = n
        self.partitions = list(partitions)
        self.barrier_every = barrier_every
        self.counts: Counter[str] = Counter()
        self._service = AppendService(client)
        self._pub = Publisher(self._service)
        self._mapping = modulo_mapping(lambda m: m.ngram, lambda: self.partitions)
        self._carry: list[str] = []
        self._unacked: Counter[str] = Counter()
        self._in_flight = 0

    async def add(self, text: str) -> int:
        """Publish the n-grams `text` completes; returns how many."""
        tokens = self._carry + words(text)
        published = 0
        for gram in ngrams(tokens, self.n):
            self._pub.publish_committed(self._mapping, NGramDelta(gram, 1))
            self._unacked[gram] += 1
            published += 1
            self._in_flight += 1
            if self._in_flight >= self.barrier_every:
                await self.barrier()
        self._carry = tokens[len(tokens) - (self.n - 1) :] if self.n > 1 else []
        return published

    async def barrier(self) -> None:
        """Return once everything published so far committed; it then counts in `counts`."""
        pending, self._unacked, self._in_flight = self._unacked, Counter(), 0
        await self._pub.barrier()
        self.counts.update(pending)

    async def close(self) -> None:
        """Wait for what is in flight, then stop the append service."""
        try:
            await self.barrier()
        finally:
            await self._service.close()

    async def __aenter__(self) -> Feeder:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def deltas_partitions(client: JournalClient) -> list[bpb.ListResponse.Journal]:
    """The deltas partitions, as the brokers list them (ordered by name)."""
    return await list_all_journals(client, deltas_selector())


async def feed_text(client: JournalClient, text: str, *, n: int = 2) -> Counter[str]:
    """Publish the n-grams of `text` to the current deltas partitions; returns the count of
    each n-gram published, once every append committed."""
    async with Feeder(client, await deltas_partitions(client), n=n) as feeder:
        await feeder.add(text)
    return feeder.counts


async def _run(args: argparse.Namespace) -> None:
    src = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")  # noqa: SIM115
    async with journal_client(args.broker) as client:
        parts = await deltas_partitions(client)
        async with Feeder(client, parts, n=args.n) as feeder:
            with src:
                for line in src:
                    await feeder.add(line)
        total = feeder.counts.total()
        print(
            f"published {total} {args.n}-grams ({len(feeder.counts)} distinct) "
            f"to {len(parts)} partitions",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="text file to count ('-': stdin)")
    parser.add_argument("--broker", default="127.0.0.1:8080", help="a broker's endpoint")
    parser.add_argument("-n", type=int, default=2, help="words per n-gram (default 2)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
