"""The journal and shard specs of a stream-sum deployment of `partitions` chunk partitions:
one shard per partition, as protobuf messages (for the Apply APIs) and as the YAML that
``gazctl journals apply`` and ``gazctl shards apply`` read.

    python -m stream_sum.specs journals --partitions 8 --store file:///tmp/stream-sum-fragments/
    python -m stream_sum.specs shards --partitions 8 --hot-standbys 1
"""

from __future__ import annotations

import argparse
import sys

from google.protobuf.duration_pb2 import Duration

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import pb
from stream_sum.messages import (
    CHUNKS_PREFIX,
    CONTENT_TYPE,
    MESSAGE_TYPE_LABEL,
    SUMS,
    chunks_partition,
    shard_id,
)

__all__ = [
    "DEFAULT_STORE",
    "HINT_PREFIX",
    "RECOVERY_PREFIX",
    "journal_specs",
    "journals_yaml",
    "main",
    "shard_specs",
    "shards_yaml",
]

RECOVERY_PREFIX = "examples/stream-sum/recovery"
HINT_PREFIX = "/gazette/hints/stream-sum"
DEFAULT_STORE = "file:///tmp/stream-sum-fragments/"
RECOVERYLOG_CONTENT_TYPE = "application/x-gazette-recoverylog"
CHUNK_TYPE, SUM_TYPE = "stream_sum.Chunk", "stream_sum.Sum"


def _journal(name: str, store: str, replication: int, labels: dict[str, str]) -> bpb.JournalSpec:
    frag = bpb.JournalSpec.Fragment(
        length=1 << 26, compression_codec=bpb.SNAPPY, refresh_interval=Duration(seconds=60)
    )
    frag.stores.append(store)
    spec = bpb.JournalSpec(name=name, replication=replication, fragment=frag)
    for k, v in sorted(labels.items()):
        spec.labels.labels.add(name=k, value=v)
    return spec


def journal_specs(
    partitions: int, store: str = DEFAULT_STORE, replication: int = 1
) -> list[bpb.JournalSpec]:
    """Chunk partitions, the sums journal and one recovery log per shard, persisting
    fragments to `store` (a ``file://`` or ``s3://`` URL ending in '/')."""
    data = {"content-type": CONTENT_TYPE}
    chunks = {**data, MESSAGE_TYPE_LABEL: CHUNK_TYPE}
    specs = [_journal(chunks_partition(i), store, replication, chunks) for i in range(partitions)]
    specs.append(_journal(SUMS, store, replication, {**data, MESSAGE_TYPE_LABEL: SUM_TYPE}))
    recovery = {"content-type": RECOVERYLOG_CONTENT_TYPE}
    specs += [
        _journal(f"{RECOVERY_PREFIX}/{shard_id(i)}", store, replication, recovery)
        for i in range(partitions)
    ]
    return specs


def shard_specs(
    partitions: int,
    hot_standbys: int = 1,
    max_txn_ms: int = 200,
    hint_prefix: str = HINT_PREFIX,
    min_txn_ms: int = 0,
) -> list[pb.ShardSpec]:
    """One shard per chunk partition, recording into ``{RECOVERY_PREFIX}/{shard id}`` and
    storing its recovery-log hints under `hint_prefix` in etcd. A `min_txn_ms` keeps each
    transaction open that long (more chunks per commit, and more to consume again after a
    crash)."""
    out = []
    for i in range(partitions):
        spec = pb.ShardSpec(
            id=shard_id(i),
            sources=[pb.ShardSpec.Source(journal=chunks_partition(i))],
            recovery_log_prefix=RECOVERY_PREFIX,
            hint_prefix=hint_prefix,
            hint_backups=2,
            min_txn_duration=Duration(nanos=min_txn_ms * 1_000_000),
            max_txn_duration=Duration(nanos=max_txn_ms * 1_000_000),
            hot_standbys=hot_standbys,
        )
        spec.labels.labels.add(name="app", value="stream-sum")
        out.append(spec)
    return out


def journals_yaml(partitions: int, store: str = DEFAULT_STORE, replication: int = 1) -> str:
    """`journal_specs` as ``gazctl journals apply`` YAML (children in name order, labels in
    (name, value) order: gazctl refuses other orders)."""
    content = f"{{name: content-type, value: {CONTENT_TYPE}}}"
    lines = [
        "name: examples/stream-sum/",
        f"replication: {replication}",
        "fragment:",
        "  length: 67108864",
        "  compression_codec: SNAPPY",
        f'  stores: ["{store}"]',
        "  refresh_interval: 1m0s",
        "children:",
        f"  - name: {CHUNKS_PREFIX}",
        "    labels:",
        f"      - {{name: {MESSAGE_TYPE_LABEL}, value: {CHUNK_TYPE}}}",
        f"      - {content}",
        "    children:",
        *(f"      - name: {chunks_partition(i)}" for i in range(partitions)),
        f"  - name: {RECOVERY_PREFIX}/",
        "    labels:",
        f"      - {{name: content-type, value: {RECOVERYLOG_CONTENT_TYPE}}}",
        "    children:",
        *(f"      - name: {RECOVERY_PREFIX}/{shard_id(i)}" for i in range(partitions)),
        f"  - name: {SUMS}",
        "    labels:",
        f"      - {{name: {MESSAGE_TYPE_LABEL}, value: {SUM_TYPE}}}",
        f"      - {content}",
    ]
    return "\n".join(lines) + "\n"


def shards_yaml(
    partitions: int, hot_standbys: int = 1, max_txn_ms: int = 200, min_txn_ms: int = 0
) -> str:
    """`shard_specs` as ``gazctl shards apply`` YAML."""
    lines = [
        "common:",
        f"  recovery_log_prefix: {RECOVERY_PREFIX}",
        f"  hint_prefix: {HINT_PREFIX}",
        "  hint_backups: 2",
        *([f"  min_txn_duration: {min_txn_ms}ms"] if min_txn_ms else []),
        f"  max_txn_duration: {max_txn_ms}ms",
        f"  hot_standbys: {hot_standbys}",
        "  labels:",
        "    - {name: app, value: stream-sum}",
        "shards:",
    ]
    for i in range(partitions):
        lines += [
            f"  - id: {shard_id(i)}",
            "    sources:",
            f"      - journal: {chunks_partition(i)}",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stream_sum.specs",
        description="Print the gazctl YAML of a stream-sum deployment.",
    )
    parser.add_argument("kind", choices=["journals", "shards"])
    parser.add_argument("--partitions", type=int, default=4, help="chunk partitions (shards)")
    parser.add_argument("--store", default=DEFAULT_STORE, help="fragment store URL (journals)")
    parser.add_argument("--replication", type=int, default=1, help="journal replication")
    parser.add_argument("--hot-standbys", type=int, default=1, help="standbys per shard")
    parser.add_argument("--min-txn-ms", type=int, default=0, help="shortest transaction")
    parser.add_argument("--max-txn-ms", type=int, default=200, help="longest transaction")
    args = parser.parse_args(argv)
    if args.kind == "journals":
        sys.stdout.write(journals_yaml(args.partitions, args.store, args.replication))
    else:
        sys.stdout.write(
            shards_yaml(args.partitions, args.hot_standbys, args.max_txn_ms, args.min_txn_ms)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
