"""The journal and shard specs of a bike-share deployment of `partitions` rides partitions:
one shard per partition, as protobuf messages for the Apply APIs (journals.yaml and
shards.yaml beside this package are the same for two partitions)."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from bike_share.messages import CONTENT_TYPE, MESSAGE_TYPE_LABEL, rides_partition, shard_id
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import pb

__all__ = ["HINT_PREFIX", "RECOVERY_PREFIX", "journal_specs", "shard_specs"]

RECOVERY_PREFIX = "examples/bike-share/recovery"
HINT_PREFIX = "/gazette/hints/bike-share"


def _journal(name: str, store: str, labels: dict[str, str]) -> bpb.JournalSpec:
    frag = bpb.JournalSpec.Fragment(
        length=1 << 26, compression_codec=bpb.SNAPPY, refresh_interval=Duration(seconds=60)
    )
    frag.stores.append(store)
    spec = bpb.JournalSpec(name=name, replication=1, fragment=frag)
    for k, v in sorted(labels.items()):
        spec.labels.labels.add(name=k, value=v)
    return spec


def journal_specs(partitions: int, store: str) -> list[bpb.JournalSpec]:
    """Rides partitions and one recovery log per shard, persisting fragments to `store` (a
    ``file://`` or ``s3://`` URL ending in '/')."""
    rides = {"content-type": CONTENT_TYPE, MESSAGE_TYPE_LABEL: "bike_share.Ride"}
    logs = {"content-type": "application/x-gazette-recoverylog"}
    return [_journal(rides_partition(i), store, rides) for i in range(partitions)] + [
        _journal(f"{RECOVERY_PREFIX}/{shard_id(i)}", store, logs) for i in range(partitions)
    ]


def shard_specs(
    partitions: int, hot_standbys: int = 1, hint_prefix: str = HINT_PREFIX
) -> list[pb.ShardSpec]:
    """One shard per rides partition, recording into ``{RECOVERY_PREFIX}/{shard id}``."""
    out = []
    for i in range(partitions):
        spec = pb.ShardSpec(
            id=shard_id(i),
            sources=[pb.ShardSpec.Source(journal=rides_partition(i))],
            recovery_log_prefix=RECOVERY_PREFIX,
            hint_prefix=hint_prefix,
            hint_backups=2,
            max_txn_duration=Duration(nanos=200_000_000),
            hot_standbys=hot_standbys,
        )
        spec.labels.labels.add(name="app", value="bike-share")
        out.append(spec)
    return out
