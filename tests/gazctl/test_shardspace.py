"""The YAML shard sets of gazctl (gazctl.shardspace): parse, push down, hoist, dump."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.broker.protocol.errors import ValidationError
from gazette.consumer.protocol import pb
from gazette.gazctl.shardspace import (
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


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            "shards:\n- id: s\n  hint_backups: 99999999999999999999999\n",
            "shards[s].hint_backups: expected an integer from -2147483648 to 2147483647 "
            "(99999999999999999999999)",
        ),
        (
            "shards:\n- id: s\n  hot_standbys: 4294967296\n",
            "shards[s].hot_standbys: expected an integer from 0 to 4294967295",
        ),
        ("shards:\n- id: s\n  ring_buffer_size: 4294967296\n", "shards[s].ring_buffer_size"),
        ("common:\n  read_channel_size: 4294967296\n", "common.read_channel_size: expected"),
        (
            "shards:\n- id: s\n  sources: [{journal: a/b, min_offset: 9223372036854775808}]\n",
            "shards[s].sources[0].min_offset: expected an integer from",
        ),
        ("shards:\n- id: s\n  revision: 9223372036854775808\n", "shards[s].revision: expected"),
        (
            "shards:\n- id: s\n  max_txn_duration: 3000000h\n",
            "shards[s].max_txn_duration: invalid duration ('3000000h'; beyond Go's",
        ),
    ],
)
def test_out_of_range_numbers_name_their_key(doc: str, message: str) -> None:
    """As journal specs: a number past its field's type is refused naming the YAML key."""
    with pytest.raises(ValidationError) as exc:
        load_set(doc)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            "common:\n  labels: [{name: b, value: '1'}, {name: a, value: '1'}]\n",
            "common.labels[1]: labels must be in (name, value) order without duplicates, as "
            "upstream requires: a='1' goes before b='1'",
        ),
        (
            "shards:\n- id: s\n  labels: [{name: a}, {name: a}]\n",
            "shards[s].labels[1]: duplicate label a=''",
        ),
    ],
)
def test_labels_in_upstream_order(doc: str, message: str) -> None:
    """Shard labels are in the order upstream's LabelSet requires, as journal labels are."""
    with pytest.raises(ValidationError) as exc:
        load_set(doc)
    assert message in str(exc.value)


def test_shards_in_any_order() -> None:
    """Upstream's shard set has no order rule (unlike a journal tree's children): kept."""
    shard_set = load_set("shards:\n- id: s-b\n- id: s-a\n")
    assert [e.spec.id for e in shard_set.shards] == ["s-b", "s-a"]
