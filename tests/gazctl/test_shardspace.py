"""The YAML shard sets of gazctl (gazctl.shardspace): parse, push down, hoist, dump."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.protocol.errors import ValidationError
from consumer.protocol import pb
from gazctl.shardspace import (
    ShardEntry,
    ShardSet,
    apply_changes,
    dump_set,
    intersect_specs,
    load_set,
    subtract_specs,
    union_specs,
)

HOISTED = """\
common:
  recovery_log_prefix: recovery/clicks
  hint_prefix: /hints
  hint_backups: 3
  max_txn_duration: 2s
  min_txn_duration: 10ms
  labels:
  - name: app
    value: clicks
  disable_wait_for_ack: true
shards:
- comment: first of two
  id: clicks-0
  sources:
  - journal: clicks/part-0
    min_offset: 512
  hot_standbys: 2
  labels:
  - name: region
    value: eu
  revision: 11
- delete: true
  id: clicks-1
  sources:
  - journal: clicks/part-1
  disable: true
  ring_buffer_size: 64
  revision: 12
"""


def flat() -> list[pb.ShardSpec]:
    def base(shard: str) -> pb.ShardSpec:
        spec = pb.ShardSpec(
            id=shard,
            recovery_log_prefix="recovery/clicks",
            hint_prefix="/hints",
            hint_backups=3,
            max_txn_duration=Duration(seconds=2),
            min_txn_duration=Duration(nanos=10_000_000),
            disable_wait_for_ack=True,
        )
        spec.labels.labels.add(name="app", value="clicks")
        return spec

    a = base("clicks-0")
    a.sources.add(journal="clicks/part-0", min_offset=512)
    a.hot_standbys = 2
    a.labels.labels.add(name="region", value="eu")
    b = base("clicks-1")
    b.sources.add(journal="clicks/part-1")
    b.disable = True
    b.ring_buffer_size = 64
    return [a, b]


def test_round_trip() -> None:
    shard_set = load_set(HOISTED)
    assert [e.comment for e in shard_set.shards] == ["first of two", ""]
    assert [e.delete for e in shard_set.shards] == [False, True]
    assert [e.revision for e in shard_set.shards] == [11, 12]
    shard_set.push_down()
    assert [e.spec for e in shard_set.shards] == flat()
    assert shard_set.common == pb.ShardSpec()
    shard_set.hoist()
    assert dump_set(shard_set) == HOISTED


def test_spec_algebra() -> None:
    a, b = flat()
    common = intersect_specs(a, b)
    assert common.hint_backups == 3 and not common.sources and not common.hot_standbys
    assert [lb.name for lb in common.labels.labels] == ["app"]
    rest = subtract_specs(a, common)
    assert rest.id == "clicks-0" and not rest.hint_prefix and rest.hot_standbys == 2
    assert [lb.name for lb in rest.labels.labels] == ["region"]
    assert union_specs(rest, common) == a


def test_apply_changes_revisions() -> None:
    spec = pb.ShardSpec(id="s-new", max_txn_duration=Duration(seconds=1))
    shard_set = ShardSet(
        shards=[
            ShardEntry(spec),
            ShardEntry(pb.ShardSpec(id="s-old")),
            ShardEntry(pb.ShardSpec(id="s-pinned"), revision=5),
            ShardEntry(pb.ShardSpec(id="s-gone"), delete=True),
        ]
    )
    changes = apply_changes(shard_set, {"s-old": 7, "s-pinned": 9, "s-gone": 3})
    assert [c.expect_mod_revision for c in changes] == [0, 7, 5, 3]
    assert changes[3].delete == "s-gone"
    with pytest.raises(ValidationError, match="no such shard"):
        apply_changes(ShardSet(shards=[ShardEntry(pb.ShardSpec(id="s-x"), delete=True)]), {})


def test_sources_as_names_and_label_mappings() -> None:
    shard_set = load_set(
        "shards:\n- id: shard-a\n  sources: [b/journal, a/journal]\n  labels: {x: '1', y: null}\n"
    )
    spec = shard_set.shards[0].spec
    assert [s.journal for s in spec.sources] == ["b/journal", "a/journal"]  # order kept
    assert [(lb.name, lb.value) for lb in spec.labels.labels] == [("x", "1"), ("y", "")]
