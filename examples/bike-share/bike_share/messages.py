"""The messages of bike-share and the journals holding them.

A `Ride` is one CSV record (the framing's UUID column, then the fields below). Rides are
partitioned by their start station: FNV-1a of the station id modulo the rides partitions the
brokers list (ordered by name), so one shard holds every departure of a station.
"""

from __future__ import annotations

from dataclasses import dataclass

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.message import CONTENT_TYPE_CSV
from gazette.message.csv_message import CSVMessage
from gazette.message.mapping import fnv1a_32

__all__ = [
    "CONTENT_TYPE",
    "MESSAGE_TYPE_LABEL",
    "RIDES_PREFIX",
    "Ride",
    "partition_key",
    "rides_partition",
    "rides_selector",
    "shard_id",
    "station_partition",
]

RIDES_PREFIX = "examples/bike-share/rides/"
"""Partitions of Ride: ``{RIDES_PREFIX}part-NNN``."""
MESSAGE_TYPE_LABEL = "app.gazette.dev/message-type"
CONTENT_TYPE = CONTENT_TYPE_CSV


@dataclass
class Ride(CSVMessage):
    """A ride of `bike_id` from `start_station` at `started_at` (ISO 8601) to `end_station`,
    `duration_s` seconds long."""

    ride_id: str = ""
    bike_id: int = 0
    started_at: str = ""
    duration_s: int = 0
    start_station: int = 0
    start_name: str = ""
    end_station: int = 0
    end_name: str = ""


def partition_key(ride: Ride) -> str:
    """The key rides are partitioned by: their start station."""
    return str(ride.start_station)


def station_partition(station: int, partitions: int) -> int:
    """Index of the rides partition holding the departures of `station`."""
    return fnv1a_32(str(station)) % partitions


def rides_partition(i: int) -> str:
    return f"{RIDES_PREFIX}part-{i:03d}"


def shard_id(i: int) -> str:
    """The shard reading rides partition `i`."""
    return f"bike-share-part-{i:03d}"


def rides_selector() -> bpb.LabelSelector:
    """The rides partitions (listed ordered by name, as the mapping needs)."""
    sel = bpb.LabelSelector()
    sel.include.labels.add(name=MESSAGE_TYPE_LABEL, value="bike_share.Ride")
    sel.include.labels.add(name="prefix", value=RIDES_PREFIX)
    return sel
