"""The BikeShare consumer application: ``gazette-consumer bike_share.app:BikeShare``.

Each shard reads one rides partition, and so owns the departures of the stations that map to
it. Its SQLite store (`SQLiteStore` on the loop, recorded to the shard's recovery log) holds:

- ``stations``: one row per station with departures: its name, departures, their total
  seconds, and the start of the latest;
- ``routes``: rides per (start station, end station).

Every ride updates both tables within the consumer transaction (`SQLiteStore.transact`), which
the runtime commits with its checkpoint, so a shard killed mid-transaction leaves none of the
transaction's rides counted and its successor consumes them again: each ride counts once.

Queries: ``GET /api/stations/{id}`` on the consumer's HTTP port (``register_http``) answers
from the primary of the station's shard, with ``{"status": "OK", "station", "name",
"departures", "mean_ride_seconds", "last_departure", "top_destinations": [{"station",
"rides"}...], "shard", "served_by"}``; 404 for a station without departures, 400 for an id
that is not an integer, 503 while the shard has no primary. A process that is not the shard's
primary forwards the query to the one that is (``Resolution.forward_http``, docs/consumer.md),
so any consumer answers. A query reads the primary's
database as its connection sees it, which includes the open transaction's rides: they are
counted, but a crash before its commit would take them back until they are consumed again
(docs/sqlite-app.md).
"""

from __future__ import annotations

import logging
from typing import Any

import apsw
from aiohttp import web

from bike_share.messages import Ride, rides_selector, station_partition
from gazette.broker.client import list_all_journals
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.application import Shard
from gazette.consumer.runtime import ConsumerRuntime
from gazette.consumer.store import RecoveredLog
from gazette.message.envelope import Envelope
from gazette.message.publisher import Publisher
from gazette.stores.sqlite import SQLiteStore

__all__ = ["SCHEMA", "TOP_DESTINATIONS", "BikeShare", "station_report"]

log = logging.getLogger("bike_share")

SCHEMA = """
CREATE TABLE IF NOT EXISTS stations (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    departures INTEGER NOT NULL,
    ride_seconds INTEGER NOT NULL,
    last_departure TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS routes (
    start_id INTEGER NOT NULL,
    end_id INTEGER NOT NULL,
    end_name TEXT NOT NULL,
    rides INTEGER NOT NULL,
    PRIMARY KEY (start_id, end_id)
) WITHOUT ROWID;
"""
TOP_DESTINATIONS = 5
"""Destinations a station's report lists, most rides first."""


def record_ride(conn: apsw.Connection, ride: Ride) -> None:
    """Count `ride` (within the consumer transaction)."""
    conn.execute(
        "INSERT INTO stations (id, name, departures, ride_seconds, last_departure) "
        "VALUES (?, ?, 1, ?, ?) ON CONFLICT (id) DO UPDATE SET name = excluded.name, "
        "departures = departures + 1, ride_seconds = ride_seconds + excluded.ride_seconds, "
        "last_departure = max(last_departure, excluded.last_departure)",
        (ride.start_station, ride.start_name, ride.duration_s, ride.started_at),
    )
    conn.execute(
        "INSERT INTO routes (start_id, end_id, end_name, rides) VALUES (?, ?, ?, 1) "
        "ON CONFLICT (start_id, end_id) DO UPDATE SET rides = rides + 1",
        (ride.start_station, ride.end_station, ride.end_name),
    )


def station_report(conn: apsw.Connection, station: int) -> dict[str, Any] | None:
    """What the API answers of `station` from this database, or None if it has no row."""
    rows = conn.execute(
        "SELECT name, departures, ride_seconds, last_departure FROM stations WHERE id = ?",
        (station,),
    ).fetchall()
    if not rows:
        return None
    name, departures, seconds, last = rows[0]
    departures, seconds = int(departures), int(seconds)  # type: ignore[arg-type]
    top = conn.execute(
        "SELECT end_id, end_name, rides FROM routes WHERE start_id = ? "
        "ORDER BY rides DESC, end_id LIMIT ?",
        (station, TOP_DESTINATIONS),
    ).fetchall()
    return {
        "station": station,
        "name": name,
        "departures": departures,
        "mean_ride_seconds": round(seconds / departures, 1),
        "last_departure": last,
        "top_destinations": [{"station": e, "name": n, "rides": r} for e, n, r in top],
    }


class BikeShare:
    """The application (module docs). One instance serves every shard of its process."""

    def __init__(self) -> None:
        self._runtime: ConsumerRuntime | None = None

    # -- Application --------------------------------------------------------------------------

    async def new_store(self, shard: Shard, recovered: RecoveredLog | None) -> SQLiteStore:
        if recovered is None:
            raise ValueError(f"shard {shard.id}: bike-share needs a recovery log")
        # On the loop: each message's SQL is short (docs/sqlite-app.md).
        return await SQLiteStore.from_recovered(recovered, bootstrap_sql=SCHEMA, on_loop=True)

    def new_message(self, spec: bpb.JournalSpec) -> Ride:
        return Ride()

    async def consume_message(
        self, shard: Shard, store: SQLiteStore, env: Envelope, pub: Publisher
    ) -> None:
        await store.transact(record_ride, env.message)

    def finalize_txn(self, shard: Shard, store: SQLiteStore, pub: Publisher) -> None:
        """Nothing to flush: each ride was written to the store as it was consumed."""

    # -- The query API ------------------------------------------------------------------------

    def register_http(self, app: web.Application, runtime: ConsumerRuntime) -> None:
        """Add ``GET /api/stations/{id}`` to the consumer's HTTP server."""
        self._runtime = runtime
        app.router.add_get("/api/stations/{id}", self._station_http)

    async def _station_http(self, request: web.Request) -> web.StreamResponse:
        try:
            station = int(request.match_info["id"])
        except ValueError:
            body = {"status": "INVALID_ARGUMENT", "error": "the station id is an integer"}
            return web.json_response(body, status=400)
        runtime = self._runtime
        assert runtime is not None, "register_http was not called"
        shard_id = await self.shard_of(station)
        if not shard_id:
            body = {"status": "SHARD_NOT_FOUND", "error": "no shard reads the rides"}
            return web.json_response(body, status=503)
        async with runtime.resolver.resolve(shard_id, may_proxy=True, incoming=request) as res:
            if not res.local:  # Another process is the primary (or none is): ask it.
                return await res.forward_http(request)
            store = res.store
            assert isinstance(store, SQLiteStore)
            report = await store.run(station_report, station)
        if report is None:
            body = {"status": "NOT_FOUND", "shard": shard_id, "error": f"no rides from {station}"}
            return web.json_response(body, status=404)
        body = {"status": "OK", **report, "shard": shard_id, "served_by": runtime.cfg.suffix}
        return web.json_response(body)

    async def shard_of(self, station: int) -> str:
        """The shard reading the rides partition of `station`, or '' if none does."""
        runtime = self._runtime
        assert runtime is not None and runtime.client is not None
        parts = await list_all_journals(runtime.client, rides_selector())
        if not parts:
            return ""
        journal = parts[station_partition(station, len(parts))].spec.name
        shards = runtime.resolver.shards_with_source(journal)
        return str(shards[0].id) if shards else ""
