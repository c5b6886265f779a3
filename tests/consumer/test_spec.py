"""ShardSpec / ConsumerSpec validation and derived values (consumer.spec)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.selector import matches, parse_label_selector
from gazette.consumer.protocol import pb
from gazette.consumer.spec import (
    decode_consumer_value,
    desired_replication,
    read_channel_size,
    recovery_log_of,
    ring_buffer_size,
    shard_labels,
    validate_apply_request,
    validate_consumer_spec,
    validate_replica_status,
    validate_shard_spec,
)


def good() -> pb.ShardSpec:
    spec = pb.ShardSpec(
        id="shard-0001",
        recovery_log_prefix="recovery/word-count",
        hint_prefix="/gazette/hints",
        hint_backups=2,
        max_txn_duration=Duration(seconds=1),
        min_txn_duration=Duration(nanos=1_000_000),
        hot_standbys=1,
    )
    spec.sources.add(journal="examples/a", min_offset=0)
    spec.sources.add(journal="examples/b", min_offset=1024)
    spec.labels.labels.add(name="app", value="word-count")
    return spec


Mutation = Callable[[pb.ShardSpec], None]


def _set(**fields: object) -> Mutation:
    def mutate(spec: pb.ShardSpec) -> None:
        for name, value in fields.items():
            if isinstance(value, Duration):
                getattr(spec, name).CopyFrom(value)
            else:
                setattr(spec, name, value)

    return mutate


def _label(name: str, value: str) -> Mutation:
    def mutate(spec: pb.ShardSpec) -> None:
        spec.labels.labels.add(name=name, value=value)

    return mutate


def _labels(*pairs: tuple[str, str]) -> Mutation:
    def mutate(spec: pb.ShardSpec) -> None:
        for name, value in pairs:
            spec.labels.labels.add(name=name, value=value)

    return mutate


def _source(journal: str, min_offset: int = 0, index: int | None = None) -> Mutation:
    def mutate(spec: pb.ShardSpec) -> None:
        if index is None:
            spec.sources.add(journal=journal, min_offset=min_offset)
        else:
            spec.sources[index].journal = journal
            spec.sources[index].min_offset = min_offset

    return mutate


def _clear_sources(spec: pb.ShardSpec) -> None:
    del spec.sources[:]


def _no_recovery_log(spec: pb.ShardSpec) -> None:
    spec.recovery_log_prefix = ""
    spec.hint_prefix = ""


VALID: list[tuple[str, Mutation]] = [
    ("as is", lambda s: None),
    # A MessageProducer application's shards read no journals (upstream allows none too).
    ("no sources", _clear_sources),
    ("no recovery log nor hints", _no_recovery_log),
    ("root hint prefix", _set(hint_prefix="/")),
    ("zero min txn duration", _set(min_txn_duration=Duration())),
    ("min equal to max", _set(min_txn_duration=Duration(seconds=1))),
    ("longest Go duration", _set(max_txn_duration=Duration(seconds=9223372036, nanos=854775807))),
    # Not bounded, as upstream's validation: the allocator places a shard's replicas on
    # distinct consumer processes, so there are never more than processes.
    ("many hot standbys", _set(hot_standbys=100_000)),
    ("most hot standbys", _set(hot_standbys=(1 << 32) - 1)),
    ("disabled", _set(disable=True, hot_standbys=0)),
    ("buffers", _set(ring_buffer_size=16, read_channel_size=0)),
    ("multi-value label", _label("app", "other")),
]

INVALID: list[tuple[str, Mutation, str]] = [
    ("short id", _set(id="abc"), "id: invalid length (3; expected 4 <= length <= 512)"),
    ("id with #", _set(id="shard#1"), "id: not a valid token ('shard#1'; invalid rune '#')"),
    ("id with space", _set(id="shard 1"), "id: not a valid token"),
    ("long id", _set(id="x" * 513), "id: invalid length (513;"),
    (
        "bad recovery log",
        _set(recovery_log_prefix="/recovery"),
        "recovery_log_prefix: cannot begin with '/'",
    ),
    (
        "hints without log",
        _set(recovery_log_prefix=""),
        "hint_prefix: set without a recovery_log_prefix ('/gazette/hints'; expected none",
    ),
    (
        "relative hint prefix",
        _set(hint_prefix="gazette/hints"),
        "hint_prefix: not an absolute, clean, non-directory path ('gazette/hints'; expected e.g. "
        "'/gazette/hints'",
    ),
    ("log without hints", _set(hint_prefix=""), "hint_prefix: not an absolute"),
    ("hint prefix dir", _set(hint_prefix="/gazette/hints/"), "hint_prefix: not an absolute"),
    ("hint prefix dots", _set(hint_prefix="/gazette/../hints"), "hint_prefix: not an absolute"),
    ("negative backups", _set(hint_backups=-1), "hint_backups: invalid value (-1; expected >= 0)"),
    (
        "negative min txn",
        _set(min_txn_duration=Duration(seconds=-1)),
        "min_txn_duration: invalid value (-1s; expected >= 0s)",
    ),
    (
        "no max txn",
        _set(max_txn_duration=Duration()),
        "max_txn_duration: invalid value (0s; expected > 0s)",
    ),
    (
        "min above max",
        _set(min_txn_duration=Duration(seconds=90), max_txn_duration=Duration(seconds=1)),
        "min_txn_duration: invalid value (1m30s; expected <= max_txn_duration 1s",
    ),
    (
        "max past Go's durations",
        _set(max_txn_duration=Duration(seconds=9223372037)),
        "max_txn_duration: invalid value (2562047h47m17s; expected at most "
        "2562047h47m16.854775807s, the longest duration Go's consumers and gazctl can read)",
    ),
    (
        "min past Go's durations",
        _set(min_txn_duration=Duration(seconds=10**10)),
        "min_txn_duration: invalid value (2777777h46m40s; expected at most",
    ),
    (
        "max past protobuf's durations",
        _set(max_txn_duration=Duration(seconds=10**12)),
        "max_txn_duration: not a valid duration (seconds 1000000000000, nanos 0;",
    ),
    (
        "nanos of a second or more",
        _set(max_txn_duration=Duration(seconds=1, nanos=1_000_000_000)),
        "max_txn_duration: not a valid duration (seconds 1, nanos 1000000000;",
    ),
    (
        "mixed signs",
        _set(min_txn_duration=Duration(seconds=1, nanos=-1)),
        "min_txn_duration: not a valid duration (seconds 1, nanos -1;",
    ),
    ("reserved id label", _label("id", "x"), 'labels: cannot include label "id"'),
    ("bad label name", _label("a", "x"), "labels.Labels[1].Name: invalid length"),
    (
        "single-value label",
        _labels(("content-type", "a/b"), ("content-type", "c/d")),
        "labels.Labels[2]: single-value label content-type has multiple values",
    ),
    ("bad source", _source("/abs", index=0), "sources[0].journal: cannot begin with '/'"),
    (
        "negative min offset",
        _source("examples/a", -5, index=0),
        "sources[0].min_offset: invalid value (-5; expected >= 0)",
    ),
    (
        "unsorted sources",
        _source("examples/0"),
        "sources[2].journal: not in unique, sorted order ('examples/0' follows 'examples/b')",
    ),
    (
        "repeated source",
        _source("examples/b"),
        "sources[2].journal: not in unique, sorted order ('examples/b' follows 'examples/b')",
    ),
]


@pytest.mark.parametrize(("case", "mutate"), VALID, ids=[c for c, _ in VALID])
def test_valid(case: str, mutate: Mutation) -> None:
    spec = good()
    mutate(spec)
    spec.labels.labels.sort(key=lambda lb: (lb.name, lb.value))
    validate_shard_spec(spec)


@pytest.mark.parametrize(("case", "mutate", "message"), INVALID, ids=[c for c, _, _ in INVALID])
def test_invalid(case: str, mutate: Mutation, message: str) -> None:
    spec = good()
    mutate(spec)
    with pytest.raises(ValidationError) as info:
        validate_shard_spec(spec)
    assert message in str(info.value)


def test_derived_values() -> None:
    spec = good()
    assert recovery_log_of(spec) == "recovery/word-count/shard-0001"
    assert desired_replication(spec) == 2
    assert ring_buffer_size(spec) == read_channel_size(spec) == 8192
    spec.ring_buffer_size, spec.read_channel_size = 10, 20
    assert (ring_buffer_size(spec), read_channel_size(spec)) == (10, 20)
    spec.disable = True
    assert desired_replication(spec) == 0
    spec.recovery_log_prefix = ""
    assert recovery_log_of(spec) == ""

    labels = shard_labels(spec)
    assert [(lb.name, lb.value) for lb in labels.labels] == [
        ("app", "word-count"),
        ("id", "shard-0001"),
    ]
    assert matches(parse_label_selector("id=shard-0001,app"), labels)
    assert not matches(parse_label_selector("id=shard-0002"), labels)


def test_consumer_spec() -> None:
    spec = pb.ConsumerSpec(
        process_spec=bpb.ProcessSpec(
            id=bpb.ProcessSpec.ID(zone="zone-a", suffix="consumer-1"),
            endpoint="http://127.0.0.1:8081",
        ),
        shard_limit=10,
    )
    validate_consumer_spec(spec)
    spec.process_spec.id.suffix = "c1"
    with pytest.raises(ValidationError, match=r"^ProcessSpec\.Id\.Suffix"):
        validate_consumer_spec(spec)


@pytest.mark.parametrize(
    ("code", "errors", "message"),
    [
        (pb.ReplicaStatus.PRIMARY, [], ""),
        (pb.ReplicaStatus.FAILED, ["boom"], ""),
        (pb.ReplicaStatus.FAILED, [], "expected non-empty Errors with Code FAILED"),
        (pb.ReplicaStatus.STANDBY, ["boom"], "expected Code FAILED with non-empty Errors"),
        (7, [], "Code: invalid code (7)"),
    ],
)
def test_replica_status(code: int, errors: list[str], message: str) -> None:
    status = pb.ReplicaStatus(code=code, errors=errors)  # type: ignore[arg-type]
    if not message:
        validate_replica_status(status)
    else:
        with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
            validate_replica_status(status)


def test_apply_request() -> None:
    ok = pb.ApplyRequest(
        changes=[
            pb.ApplyRequest.Change(upsert=good(), expect_mod_revision=-1),
            pb.ApplyRequest.Change(delete="shard-0002", expect_mod_revision=7),
        ]
    )
    validate_apply_request(ok)
    bad = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=good(), expect_mod_revision=-2)])
    with pytest.raises(ValidationError, match=r"Changes\[0\]: invalid ExpectModRevision \(-2"):
        validate_apply_request(bad)
    both = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=good(), delete="shard-0001")])
    with pytest.raises(ValidationError, match="both Upsert and Delete"):
        validate_apply_request(both)
    hints_on_delete = pb.ApplyRequest.Change(delete="shard-0001", expect_mod_revision=-1)
    hints_on_delete.primary_hints.log = "recovery/word-count/shard-0001"
    with pytest.raises(ValidationError, match="only with an upsert"):
        validate_apply_request(pb.ApplyRequest(changes=[hints_on_delete]))


def test_decoder() -> None:
    root = "/gazette/consumers/wc"
    decode = decode_consumer_value(root)
    spec = good()
    assert decode(f"{root}/items/shard-0001", spec.SerializeToString()) == spec
    member = pb.ConsumerSpec(shard_limit=3)
    assert decode(f"{root}/members/zone#c1", member.SerializeToString()) == member
    status = pb.ReplicaStatus(code=pb.ReplicaStatus.STANDBY)
    assert decode(f"{root}/assign/shard-0001#zone#c1#1", status.SerializeToString()) == status
    with pytest.raises(ValueError, match="not of the form"):
        decode(f"{root}/assign/shard-0001", b"")
    assert decode(f"{root}/other", b"raw") == b"raw"
