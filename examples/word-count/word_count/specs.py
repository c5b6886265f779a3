"""The journal and shard specs of a word-count deployment of `partitions` deltas partitions:
one shard per partition, as protobuf messages (for the Apply APIs) and as the YAML that
``gazctl journals apply`` and ``gazctl shards apply`` read."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import pb
from gazette.message import CONTENT_TYPE_JSON_LINES
from word_count.messages import (
    COUNTS,
    MESSAGE_TYPE_LABEL,
    deltas_partition,
    shard_id,
)

__all__ = [
    "RECOVERY_PREFIX",
    "HINT_PREFIX",
    "journal_specs",
    "journals_yaml",
    "shard_specs",
    "shards_yaml",
]

RECOVERY_PREFIX = "examples/word-count/recovery"
HINT_PREFIX = "/gazette/hints/word-count"
RECOVERYLOG_CONTENT_TYPE = "application/x-gazette-recoverylog"


def _journal(
    name: str, store: str, replication: int, labels: dict[str, str], flush: int = 0
) -> bpb.JournalSpec:
    frag = bpb.JournalSpec.Fragment(
        length=1 << 26,
        compression_codec=bpb.SNAPPY,
        refresh_interval=Duration(seconds=60),
    )
    if flush:
        frag.flush_interval.CopyFrom(Duration(seconds=flush))
    frag.stores.append(store)
    spec = bpb.JournalSpec(name=name, replication=replication, fragment=frag)
    for k, v in sorted(labels.items()):
        spec.labels.labels.add(name=k, value=v)
    return spec


def journal_specs(partitions: int, store: str, replication: int = 1) -> list[bpb.JournalSpec]:
    """Deltas partitions, the counts journal and one recovery log per shard, persisting
    fragments to `store` (a ``file://`` or ``s3://`` URL ending in '/')."""
    data = {"content-type": CONTENT_TYPE_JSON_LINES}
    specs = [
        _journal(
            deltas_partition(i),
            store,
            replication,
            {**data, MESSAGE_TYPE_LABEL: "NGramDelta"},
        )
        for i in range(partitions)
    ]
    specs.append(_journal(COUNTS, store, replication, {**data, MESSAGE_TYPE_LABEL: "NGramCount"}))
    specs += [
        _journal(
            f"{RECOVERY_PREFIX}/{shard_id(i)}",
            store,
            replication,
            {"content-type": RECOVERYLOG_CONTENT_TYPE},
        )
        for i in range(partitions)
    ]
    return specs


def shard_specs(
    partitions: int,
    hot_standbys: int = 1,
    max_txn_ms: int = 200,
    hint_prefix: str = HINT_PREFIX,
) -> list[pb.ShardSpec]:
    """One shard per deltas partition, recording into ``{RECOVERY_PREFIX}/{shard id}``
    and storing its recovery-log hints under `hint_prefix` in etcd."""
    out = []
    for i in range(partitions):
        spec = pb.ShardSpec(
            id=shard_id(i),
            sources=[pb.ShardSpec.Source(journal=deltas_partition(i))],
            recovery_log_prefix=RECOVERY_PREFIX,
            hint_prefix=hint_prefix,
            hint_backups=2,
            max_txn_duration=Duration(nanos=max_txn_ms * 1_000_000),
            hot_standbys=hot_standbys,
        )
        spec.labels.labels.add(name="app", value="word-count")
        out.append(spec)
    return out


def journals_yaml(partitions: int, store: str, replication: int = 1) -> str:
    """`journal_specs` as ``gazctl journals apply`` YAML.

    Children are in name order and labels in (name, value) order, as upstream's gazctl
    requires (it refuses the file otherwise)."""
    ndjson = f"{{name: content-type, value: {CONTENT_TYPE_JSON_LINES}}}"
    lines = [
        "name: examples/word-count/",
        f"replication: {replication}",
        "fragment:",
        "  length: 67108864",
        "  compression_codec: SNAPPY",
        f'  stores: ["{store}"]',
        "  refresh_interval: 1m0s",
        "children:",
        f"  - name: {COUNTS}",
        "    labels:",
        f"      - {{name: {MESSAGE_TYPE_LABEL}, value: NGramCount}}",
        f"      - {ndjson}",
        "  - name: examples/word-count/deltas/",
        "    labels:",
        f"      - {{name: {MESSAGE_TYPE_LABEL}, value: NGramDelta}}",
        f"      - {ndjson}",
        "    children:",
        *(f"      - name: {deltas_partition(i)}" for i in range(partitions)),
        f"  - name: {RECOVERY_PREFIX}/",
        "    labels:",
        f"      - {{name: content-type, value: {RECOVERYLOG_CONTENT_TYPE}}}",
        "    children:",
        *(f"      - name: {RECOVERY_PREFIX}/{shard_id(i)}" for i in range(partitions)),
    ]
    return "\n".join(lines) + "\n"


def shards_yaml(partitions: int, hot_standbys: int = 1, max_txn_ms: int = 200) -> str:
    """`shard_specs` as ``gazctl shards apply`` YAML."""
    shards = "\n".join(
        f"  - id: {shard_id(i)}\n    sources:\n      - journal: {deltas_partition(i)}"
        for i in range(partitions)
    )
    common = [
        "common:",
        f"  recovery_log_prefix: {RECOVERY_PREFIX}",
        f"  hint_prefix: {HINT_PREFIX}",
        "  hint_backups: 2",
        f"  max_txn_duration: {max_txn_ms}ms",
        f"  hot_standbys: {hot_standbys}",
        "  labels:",
        "    - {name: app, value: word-count}",
        "shards:",
    ]
    return "\n".join(common) + "\n" + shards + "\n"
