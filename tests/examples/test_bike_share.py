"""The bike-share example end to end: etcd, a broker, and two `gazette-consumer` processes of
`bike_share.app:BikeShare` (hot standbys 1). Rides are fed, the stations are queried over the
HTTP API; then the primaries are SIGKILLed while more rides are fed, and the API of the
surviving process must answer every station exactly as the rides add up."""

from __future__ import annotations

import asyncio
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import grpc.aio
from bike_share.feed import feed, generate, read_csv
from bike_share.messages import Ride, shard_id, station_partition
from bike_share.specs import journal_specs, shard_specs

from gazette.broker.client import JournalClient
from gazette.broker.client.list import apply_journals
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.testing.broker import BrokerProcess
from gazette.testing.consumer import ConsumerProcess
from gazette.testing.etcd import EtcdServer
from tests.examples.conftest import BIKE_SHARE
from tests.examples.shards_support import all_shards, statuses, until
from tests.kit.eventually import eventually

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 2
PRIMARY, STANDBY = pb.ReplicaStatus.PRIMARY, pb.ReplicaStatus.STANDBY


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
    http: aiohttp.ClientSession, procs: list[ConsumerProcess], station: int
) -> dict[str, Any]:
    """The station's report, asked of every running process: each answers it, the others
    by forwarding the query to the primary of the station's shard, so every answer is that
    primary's."""
    answers = [await get(http, p.http_endpoint, station) for p in procs if p.running]
    assert answers and all(status == 200 for status, _ in answers), answers
    served_by = {body["served_by"] for _, body in answers}
    assert len(served_by) == 1, answers
    return answers[-1][1]


def matches(report: dict[str, Any], want: dict[str, Any]) -> bool:
    top = report["top_destinations"]
    return (
        report["departures"] == want["departures"]
        and report["mean_ride_seconds"] == want["mean_ride_seconds"]
        and all(want["routes"][d["station"]] == d["rides"] for d in top)
        and [d["rides"] for d in top] == sorted(want["routes"].values(), reverse=True)[: len(top)]
    )


async def all_stations_match(
    http: aiohttp.ClientSession, procs: list[ConsumerProcess], rides: list[Ride]
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
    etcd_server: EtcdServer, broker: BrokerProcess, client: JournalClient, tmp_path: Path
) -> None:
    fragments = tmp_path / "fragments"
    fragments.mkdir()
    specs = journal_specs(PARTITIONS, f"file://{fragments}/")
    await apply_journals(
        client, bpb.ApplyRequest(changes=[bpb.ApplyRequest.Change(upsert=s) for s in specs])
    )
    procs = [
        ConsumerProcess(
            "bike_share.app:BikeShare",
            etcd_server.endpoint,
            [broker.endpoint],
            root=f"/test-bike-share-consumers/{os.getpid()}",
            zone=f"z{i}",
            suffix=f"consumer-{i}",
            workdir=tmp_path / f"consumer-{i}",
            extra_env={"PYTHONPATH": f"{BIKE_SHARE}{os.pathsep}{REPO}"},
            extra_args=["--hint-interval", "1"],
        )
        for i in range(2)
    ]
    by_suffix = {p.suffix: p for p in procs}
    try:
        for p in procs:
            p.start()
        async with (
            grpc.aio.insecure_channel(procs[0].endpoint) as ch0,
            grpc.aio.insecure_channel(procs[1].endpoint) as ch1,
            aiohttp.ClientSession() as http,
        ):
            stubs = {
                procs[0].suffix: pb_grpc.ShardStub(ch0),
                procs[1].suffix: pb_grpc.ShardStub(ch1),
            }
            stub = stubs["consumer-0"]
            hints = f"/test-hints/bike-share/{os.getpid()}"
            req = pb.ApplyRequest(
                changes=[
                    pb.ApplyRequest.Change(upsert=s)
                    for s in shard_specs(PARTITIONS, hot_standbys=1, hint_prefix=hints)
                ]
            )
            assert (await stub.Apply(req)).status == pb.OK
            both = lambda s: sorted(s.values()) == sorted([PRIMARY, STANDBY])  # noqa: E731
            await until(all_shards(stub, PARTITIONS, both), "a primary and a standby of each")

            rides = list(generate(1500))
            assert await feed(client, rides) == len(rides)
            await all_stations_match(http, procs, rides)
            status, body = await get(http, procs[0].http_endpoint, 9999)
            assert (status, body["status"]) == (404, "NOT_FOUND")  # Forwarded or not.
            async with http.get(f"{procs[0].http_endpoint}/api/stations/x") as resp:
                assert resp.status == 400

            # SIGKILL the primary of each shard in turn while more rides are fed.
            for k in range(PARTITIONS):
                more = list(generate(1000, first=len(rides)))
                feeding = asyncio.create_task(feed(client, more, barrier_every=100))
                await asyncio.sleep(0.3)
                st = await statuses(stub if procs[0].running else stubs["consumer-1"])
                victim = next(m for m, c in st[shard_id(k)].items() if c == PRIMARY)
                survivor = next(s for s in by_suffix if s != victim)
                by_suffix[victim].kill()
                assert await feeding == len(more)
                rides += more
                await until(
                    all_shards(
                        stubs[survivor], PARTITIONS, lambda s, v=survivor: s.get(v) == PRIMARY
                    ),
                    f"{survivor} primary of every shard (kill {k})",
                )
                # Queried while the killed process is down: the survivor answers all.
                await all_stations_match(http, procs, rides)
                by_suffix[victim].start()
                await until(all_shards(stubs[survivor], PARTITIONS, both), f"a standby (kill {k})")
            await all_stations_match(http, procs, rides)
    finally:
        for p in procs:
            p.kill()
