"""The rides feeder: a CSV file of rides (or generated ones) in, `Ride` messages out.

Each ride is published committed (readable at once) to the rides partition of its start
station. The file has a header row naming the columns of `Ride` (any order; extra columns
are ignored).

    python -m bike_share.feed --broker 127.0.0.1:8080 rides.csv
    python -m bike_share.feed --broker 127.0.0.1:8080 --generate 10000
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import dataclasses
import random
import sys
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from bike_share.messages import Ride, partition_key, rides_selector
from gazette.broker.client import AppendService, JournalClient, list_all_journals
from gazette.message.mapping import NoPartitions, modulo_mapping
from gazette.message.publisher import Publisher

__all__ = ["STATIONS", "feed", "generate", "read_csv"]

STATIONS = {i: f"Station {i}" for i in range(1, 41)}
"""The stations of generated rides."""


def generate(count: int, seed: int = 1, first: int = 0) -> Iterator[Ride]:
    """`count` pseudo-random rides (ids from `first`), a few stations busier than the rest."""
    rnd = random.Random(seed * 1_000_003 + first)
    ids = sorted(STATIONS)
    weights = [1 / (i + 1) for i in range(len(ids))]
    t0 = datetime(2026, 6, 1, 6, 0, 0)
    for n in range(first, first + count):
        start, end = rnd.choices(ids, weights, k=2)
        yield Ride(
            ride_id=f"r{n:08d}",
            bike_id=rnd.randrange(1, 500),
            started_at=(t0 + timedelta(seconds=7 * n)).isoformat(),
            duration_s=rnd.randrange(120, 3600),
            start_station=start,
            start_name=STATIONS[start],
            end_station=end,
            end_name=STATIONS[end],
        )


def read_csv(lines: Iterable[str]) -> Iterator[Ride]:
    """Rides of CSV `lines` with a header row."""
    types = {f.name: f.type for f in dataclasses.fields(Ride)}
    for row in csv.DictReader(lines):
        ride = Ride()
        for k, v in row.items():
            if k in types:
                setattr(ride, k, int(v) if types[k] in (int, "int") else v)
        yield ride


async def feed(client: JournalClient, rides: Iterable[Ride], barrier_every: int = 1000) -> int:
    """Publish `rides` to the rides partitions; returns how many, once all committed."""
    parts = await list_all_journals(client, rides_selector())
    if not parts:
        raise NoPartitions("no rides partitions: apply examples/bike-share/journals.yaml")
    mapping = modulo_mapping(partition_key, lambda: parts)
    n = 0
    async with AppendService(client) as service:
        pub = Publisher(service)
        for ride in rides:
            pub.publish_committed(mapping, ride)
            n += 1
            if n % barrier_every == 0:
                await pub.barrier()
        await pub.barrier()
    return n


async def _run(args: argparse.Namespace) -> None:
    async with JournalClient(args.broker) as client:
        if args.generate:
            n = await feed(client, generate(args.generate, args.seed))
        else:
            with open(args.file, encoding="utf-8", newline="") as f:
                n = await feed(client, read_csv(f))
    print(f"published {n} rides", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", nargs="?", help="CSV file of rides")
    parser.add_argument("--broker", default="127.0.0.1:8080", help="a broker's endpoint")
    parser.add_argument("--generate", type=int, default=0, help="publish N generated rides")
    parser.add_argument("--seed", type=int, default=1, help="seed of generated rides")
    args = parser.parse_args(argv)
    if not args.file and not args.generate:
        parser.error("give a CSV file or --generate N")
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
