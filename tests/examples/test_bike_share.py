"""The bike-share example end to end, on the package's pytest plugin: the example's specs
(`bike_share.specs`), two `gazette-consumer` processes of `bike_share.app:BikeShare` (hot
standbys 1), rides fed by the example's feeder, the stations queried over the HTTP API;
then the primary of each shard is SIGKILLed in turn while more rides are fed, and the API
of the surviving process must answer every station exactly as the rides add up."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import aiohttp
from bike_share.feed import feed, generate, read_csv
from bike_share.messages import Ride, shard_id, station_partition
from bike_share.specs import journal_specs, shard_specs

from gazette.broker.client import JournalClient
from gazette.testing.pytest_plugin import Consumer, GazetteCluster, SpecsArg
from tests.kit.eventually import eventually

APP = "bike_share.app:BikeShare"
PARTITIONS = 2


def expected(rides: list[Ride]) -> dict[int, dict[str, Any]]:
    """Each start station's departures, mean seconds and rides per destination, computed
    here independently of the application."""
    deps: Counter[int] = Counter()
    secs: Counter[int] = Counter()
    routes: dict[int, Counter[int]] = defaultdict(Counter)
    for r in rides:
        deps[r.start_station] += 1
        secs[r.start_station] += r.duration_s
        routes[r.start_station][r.end_station] += 1
    return {
        s: {
            "departures": deps[s],
            "mean_ride_seconds": round(secs[s] / deps[s], 1),
            "routes": routes[s],
        }
        for s in deps
    }


def test_read_csv_takes_the_named_columns() -> None:
    text = (
        "start_name,ride_id,bike_id,started_at,duration_s,start_station,end_station,end_name,x\n"
        "Hall,r1,7,2026-06-01T06:00:00,300,3,4,Pier,ignored\n"
    )
    assert list(read_csv(text.splitlines(keepends=True))) == [
        Ride("r1", 7, "2026-06-01T06:00:00", 300, 3, "Hall", 4, "Pier")
    ]


async def get(http: aiohttp.ClientSession, endpoint: str, station: int) -> tuple[int, Any]:
    async with http.get(f"{endpoint}/api/stations/{station}") as resp:
        return resp.status, await resp.json()


async def query_primary(
    http: aiohttp.ClientSession, procs: list[Consumer], station: int
) -> dict[str, Any]:
    """The station's report, asked of every running process: each answers it, the others
    by forwarding the query to the primary of the station's shard, so every answer is that
    primary's."""
    answers = [await get(http, p.http_endpoint, station) for p in procs if p.running]
    assert answers and all(status == 200 for status, _ in answers), answers
    served_by = {body["served_by"] for _, body in answers}
    assert len(served_by) == 1, answers
    report: dict[str, Any] = answers[-1][1]
    return report


def matches(report: dict[str, Any], want: dict[str, Any]) -> bool:
    top = report["top_destinations"]
    return (
        report["departures"] == want["departures"]
        and report["mean_ride_seconds"] == want["mean_ride_seconds"]
        and all(want["routes"][d["station"]] == d["rides"] for d in top)
        and [d["rides"] for d in top] == sorted(want["routes"].values(), reverse=True)[: len(top)]
    )


async def all_stations_match(
    http: aiohttp.ClientSession, procs: list[Consumer], rides: list[Ride]
) -> None:
    want = expected(rides)

    async def check() -> bool:
        for station, w in want.items():
            try:
                report = await query_primary(http, procs, station)
            except (AssertionError, aiohttp.ClientError):
                return False
            if not matches(report, w):
                return False
        return True

    await eventually(check, what="every station's report adds up", timeout=60, interval=0.2)
    # Every station answered once, by the primary of its own shard.
    for station in want:
        report = await query_primary(http, procs, station)
        assert report["shard"] == shard_id(station_partition(station, PARTITIONS))
        assert matches(report, want[station]), (report, want[station])


async def test_station_api_exact_through_primary_kills(
    gazette: GazetteCluster,
    gazette_journals: Callable[[SpecsArg], list[str]],
    gazette_consumer: Callable[..., Consumer],
) -> None:
    gazette_journals(journal_specs(PARTITIONS, "file:///bike-share-fragments/"))
    consumers = [
        gazette_consumer(APP, shards=shard_specs(PARTITIONS), hint_interval=1),
        gazette_consumer(APP, hint_interval=1),
    ]
    for i in range(PARTITIONS):
        await gazette.wait_primary(shard_id(i), standbys=1)

    async with (
        JournalClient(gazette.brokers().endpoints) as client,
        aiohttp.ClientSession() as http,
    ):
        rides = list(generate(1500))
        assert await feed(client, rides) == len(rides)
        await all_stations_match(http, consumers, rides)
        status, body = await get(http, consumers[0].http_endpoint, 9999)
        assert (status, body["status"]) == (404, "NOT_FOUND")  # Forwarded or not.
        async with http.get(f"{consumers[0].http_endpoint}/api/stations/x") as resp:
            assert resp.status == 400

        # SIGKILL the primary of each shard in turn while more rides are fed.
        for k in range(PARTITIONS):
            more = list(generate(1000, first=len(rides)))
            feeding = asyncio.create_task(feed(client, more, barrier_every=100))
            victim = await gazette.wait_primary(shard_id(k))  # (The feed runs meanwhile.)
            victim.kill()
            assert await feeding == len(more)
            rides += more
            for i in range(PARTITIONS):
                assert await gazette.wait_primary(shard_id(i)) is not victim
            # Queried while the killed process is down: the survivor answers all.
            await all_stations_match(http, consumers, rides)
            victim.restart()
            for i in range(PARTITIONS):
                await gazette.wait_primary(shard_id(i), standbys=1)
        await all_stations_match(http, consumers, rides)
