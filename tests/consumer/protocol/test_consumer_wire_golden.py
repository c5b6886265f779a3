"""Golden encodings of consumer messages, built by hand from the field numbers and wire
types of Gazette's consumer/protocol/protocol.proto, so that a wrong field number or type
in proto/consumer.proto fails here.

Wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32. A map<K, V> field is a
repeated entry message {key 1, value 2}; each test's maps have one entry, so that the
encoding is deterministic.
"""

import struct
from typing import Any, cast

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message

from gazette.broker.protocol import pb as bpb
from gazette.consumer.protocol import consumer_pb2_grpc, pb
from gazette.recoverylog import recoverylog_pb2 as rpb

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


def varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int32/int64 negatives are ten-byte two's complement varints.
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def f_varint(field: int, n: int) -> bytes:
    return key(field, VARINT) + varint(n)


def f_fixed64(field: int, n: int) -> bytes:
    return key(field, FIXED64) + struct.pack("<Q", n)


def f_fixed32(field: int, n: int) -> bytes:
    return key(field, FIXED32) + struct.pack("<I", n)


def f_bytes(field: int, data: bytes | str) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return key(field, LEN) + varint(len(raw)) + raw


def map_entry(field: int, k: str, value: bytes) -> bytes:
    """One entry of a map field: `value` is the already-encoded value field (number 2)."""
    return f_bytes(field, f_bytes(1, k) + value)


def assert_golden(msg: Message, golden: bytes) -> None:
    assert msg.SerializeToString() == golden
    parsed = type(msg).FromString(golden)
    assert parsed == msg
    assert parsed.SerializeToString() == golden


# Fixtures shared by several messages, with their hand-built encodings.
PROCESS_ID = bpb.ProcessSpec.ID(zone="z", suffix="c1")
PROCESS_ID_BYTES = f_bytes(1, "z") + f_bytes(2, "c1")
ENDPOINT = "http://h:8080"
ROUTE = bpb.Route(members=[PROCESS_ID], primary=0, endpoints=[ENDPOINT])
ROUTE_BYTES = f_bytes(1, PROCESS_ID_BYTES) + f_bytes(3, ENDPOINT)  # primary 0 is omitted.
HEADER = bpb.Header(
    process_id=PROCESS_ID,
    route=ROUTE,
    etcd=bpb.Header.Etcd(cluster_id=1, member_id=2, revision=3, raft_term=4),
)
HEADER_BYTES = (
    f_bytes(1, PROCESS_ID_BYTES)
    + f_bytes(2, ROUTE_BYTES)
    + f_bytes(3, f_varint(1, 1) + f_varint(2, 2) + f_varint(3, 3) + f_varint(4, 4))
)
HINTS = rpb.FSMHints(
    log="rl/s-1",
    live_nodes=[
        rpb.FnodeSegments(
            fnode=1,
            segments=[
                rpb.Segment(
                    author=0xDEADBEEF,
                    first_seq_no=1,
                    first_offset=0,
                    first_checksum=0x01020304,
                    last_seq_no=3,
                    last_offset=99,
                )
            ],
        )
    ],
    properties=[rpb.Property(path="p", content="c")],
)
HINTS_BYTES = (
    f_bytes(1, "rl/s-1")
    + f_bytes(
        2,
        f_varint(1, 1)
        + f_bytes(
            2,
            f_fixed32(1, 0xDEADBEEF)
            + f_varint(2, 1)
            + f_fixed32(4, 0x01020304)
            + f_varint(5, 3)
            + f_varint(6, 99),
        ),
    )
    + f_bytes(3, f_bytes(1, "p") + f_bytes(2, "c"))
)
EXTENSION = f_bytes(100, b"ext")


def test_helpers_match_literal_bytes() -> None:
    assert key(100, LEN) == b"\xa2\x06"
    assert f_varint(1, 400) == b"\x08\x90\x03"
    assert varint(-1) == b"\xff" * 9 + b"\x01"


def test_shard_spec_all_fields() -> None:
    spec = pb.ShardSpec(
        id="s-1",
        sources=[
            pb.ShardSpec.Source(journal="a/j", min_offset=5),
            pb.ShardSpec.Source(journal="b/j"),
        ],
        recovery_log_prefix="rl",
        hint_prefix="/hints",
        hint_backups=2,
        max_txn_duration=Duration(seconds=1),
        min_txn_duration=Duration(nanos=500_000_000),
        disable=True,
        hot_standbys=1,
        labels=bpb.LabelSet(labels=[bpb.Label(name="app", value="x")]),
        disable_wait_for_ack=True,
        ring_buffer_size=8192,
        read_channel_size=4096,
    )
    assert_golden(
        spec,
        f_bytes(1, "s-1")
        + f_bytes(2, f_bytes(1, "a/j") + f_varint(3, 5))
        + f_bytes(2, f_bytes(1, "b/j"))
        + f_bytes(3, "rl")
        + f_bytes(4, "/hints")
        + f_varint(5, 2)
        + f_bytes(6, f_varint(1, 1))  # Duration: seconds 1, nanos 2.
        + f_bytes(7, f_varint(2, 500_000_000))
        + f_varint(8, 1)
        + f_varint(9, 1)
        + f_bytes(10, f_bytes(1, f_bytes(1, "app") + f_bytes(2, "x")))
        + f_varint(11, 1)
        + f_varint(12, 8192)
        + f_varint(13, 4096),
    )


def test_consumer_spec() -> None:
    spec = pb.ConsumerSpec(
        process_spec=bpb.ProcessSpec(id=PROCESS_ID, endpoint=ENDPOINT),
        shard_limit=10,
        exiting=True,
    )
    assert_golden(
        spec,
        f_bytes(1, f_bytes(1, PROCESS_ID_BYTES) + f_bytes(2, ENDPOINT))
        + f_varint(2, 10)
        + f_varint(3, 1),
    )


def test_replica_status() -> None:
    status = pb.ReplicaStatus(code=pb.ReplicaStatus.FAILED, errors=["boom", "bang"])
    assert_golden(status, b"\x08\x90\x03" + f_bytes(2, "boom") + f_bytes(2, "bang"))
    assert_golden(pb.ReplicaStatus(code=pb.ReplicaStatus.BACKFILL), f_varint(1, 100))


def test_checkpoint() -> None:
    producer_id = bytes.fromhex("0102030405f6")
    cp = pb.Checkpoint(
        sources={
            "a/j": pb.Checkpoint.Source(
                read_through=1234,
                producers=[
                    pb.Checkpoint.Source.ProducerEntry(
                        id=producer_id,
                        state=pb.Checkpoint.ProducerState(last_ack=0x1122334455667788, begin=-1),
                    )
                ],
            )
        },
        ack_intents={"b/j": b"ack!"},
    )
    source = f_varint(1, 1234) + f_bytes(
        2,
        f_bytes(1, producer_id) + f_bytes(2, f_fixed64(1, 0x1122334455667788) + f_varint(2, -1)),
    )
    assert_golden(
        cp,
        map_entry(1, "a/j", f_bytes(2, source)) + map_entry(2, "b/j", f_bytes(2, b"ack!")),
    )


def test_list_request_and_response() -> None:
    req = pb.ListRequest(
        selector=bpb.LabelSelector(include=bpb.LabelSet(labels=[bpb.Label(name="app")])),
        extension=b"ext",
    )
    assert_golden(req, f_bytes(1, f_bytes(1, f_bytes(1, f_bytes(1, "app")))) + EXTENSION)

    resp = pb.ListResponse(
        status=pb.OK,
        header=HEADER,
        shards=[
            pb.ListResponse.Shard(
                spec=pb.ShardSpec(id="s-1", hot_standbys=1),
                mod_revision=7,
                route=ROUTE,
                status=[
                    pb.ReplicaStatus(code=pb.ReplicaStatus.PRIMARY),
                    pb.ReplicaStatus(code=pb.ReplicaStatus.STANDBY),
                ],
                create_revision=6,
            )
        ],
        extension=b"ext",
    )
    shard = (
        f_bytes(1, f_bytes(1, "s-1") + f_varint(9, 1))
        + f_varint(2, 7)
        + f_bytes(3, ROUTE_BYTES)
        + f_bytes(4, f_varint(1, 300))
        + f_bytes(4, f_varint(1, 200))
        + f_varint(5, 6)
    )
    # status OK (0) is omitted.
    assert_golden(resp, f_bytes(2, HEADER_BYTES) + f_bytes(3, shard) + EXTENSION)


def test_apply_request_and_response() -> None:
    req = pb.ApplyRequest(
        changes=[
            pb.ApplyRequest.Change(
                expect_mod_revision=0, upsert=pb.ShardSpec(id="s-1"), primary_hints=HINTS
            ),
            pb.ApplyRequest.Change(expect_mod_revision=9, delete="s-2"),
        ],
        extension=b"ext",
    )
    assert_golden(
        req,
        f_bytes(1, f_bytes(2, f_bytes(1, "s-1")) + f_bytes(4, HINTS_BYTES))
        + f_bytes(1, f_varint(1, 9) + f_bytes(3, "s-2"))
        + EXTENSION,
    )
    resp = pb.ApplyResponse(status=pb.ETCD_TRANSACTION_FAILED, header=HEADER, extension=b"ext")
    assert_golden(resp, f_varint(1, 4) + f_bytes(2, HEADER_BYTES) + EXTENSION)


def test_stat_request_and_response() -> None:
    req = pb.StatRequest(header=HEADER, shard="s-1", read_through={"a/j": 10}, extension=b"ext")
    assert_golden(
        req,
        f_bytes(1, HEADER_BYTES)
        + f_bytes(2, "s-1")
        + map_entry(3, "a/j", f_varint(2, 10))
        + EXTENSION,
    )
    resp = pb.StatResponse(
        status=pb.SHARD_STOPPED,
        header=HEADER,
        read_through={"a/j": 10},
        publish_at={"b/j": 20},
        extension=b"ext",
    )
    assert_golden(
        resp,
        f_varint(1, 5)
        + f_bytes(2, HEADER_BYTES)
        + map_entry(3, "a/j", f_varint(2, 10))
        + map_entry(4, "b/j", f_varint(2, 20))
        + EXTENSION,
    )


def test_get_hints_request_and_response() -> None:
    assert_golden(pb.GetHintsRequest(shard="s-1", extension=b"ext"), f_bytes(1, "s-1") + EXTENSION)
    resp = pb.GetHintsResponse(
        status=pb.OK,
        header=HEADER,
        primary_hints=pb.GetHintsResponse.ResponseHints(hints=HINTS),
        backup_hints=[
            pb.GetHintsResponse.ResponseHints(),  # No hints: an empty, but present, entry.
            pb.GetHintsResponse.ResponseHints(hints=rpb.FSMHints(log="rl/s-1")),
        ],
        extension=b"ext",
    )
    assert_golden(
        resp,
        f_bytes(2, HEADER_BYTES)
        + f_bytes(3, f_bytes(1, HINTS_BYTES))
        + f_bytes(4, b"")
        + f_bytes(4, f_bytes(1, f_bytes(1, "rl/s-1")))
        + EXTENSION,
    )
    assert not pb.GetHintsResponse.FromString(f_bytes(4, b"")).backup_hints[0].HasField("hints")


def test_unassign_request_and_response() -> None:
    req = pb.UnassignRequest(shards=["s-1", "s-2"], only_failed=True, dry_run=True)
    assert_golden(req, f_bytes(1, "s-1") + f_bytes(1, "s-2") + f_varint(2, 1) + f_varint(3, 1))
    resp = pb.UnassignResponse(status=pb.NOT_SHARD_PRIMARY, shards=["s-1"])
    assert_golden(resp, f_varint(1, 3) + f_bytes(2, "s-1"))


def test_decodes_go_encodings_with_explicit_defaults() -> None:
    # Go (gogoproto) always writes non-nullable messages (an empty header) and both
    # fields of a map entry, even when zero; these must decode to the same message.
    go = f_varint(1, 0) + f_bytes(2, b"") + map_entry(3, "a/j", f_varint(2, 0))
    resp = pb.StatResponse.FromString(go)
    assert resp.HasField("header")
    assert dict(resp.read_through) == {"a/j": 0}


@pytest.mark.parametrize(
    ("enum", "values"),
    [
        (
            pb.Status,
            {
                "OK": 0,
                "SHARD_NOT_FOUND": 1,
                "NO_SHARD_PRIMARY": 2,
                "NOT_SHARD_PRIMARY": 3,
                "ETCD_TRANSACTION_FAILED": 4,
                "SHARD_STOPPED": 5,
            },
        ),
        (
            pb.ReplicaStatus.Code,
            {"IDLE": 0, "BACKFILL": 100, "STANDBY": 200, "PRIMARY": 300, "FAILED": 400},
        ),
    ],
)
def test_enums(enum: Any, values: dict[str, int]) -> None:
    assert dict(enum.items()) == values


# (message full name, field name) -> (number, type): upstream's numbers and types.
T = FieldDescriptor
FIELDS: dict[str, dict[str, tuple[int, int]]] = {
    "consumer.ShardSpec": {
        "id": (1, T.TYPE_STRING),
        "sources": (2, T.TYPE_MESSAGE),
        "recovery_log_prefix": (3, T.TYPE_STRING),
        "hint_prefix": (4, T.TYPE_STRING),
        "hint_backups": (5, T.TYPE_INT32),
        "max_txn_duration": (6, T.TYPE_MESSAGE),
        "min_txn_duration": (7, T.TYPE_MESSAGE),
        "disable": (8, T.TYPE_BOOL),
        "hot_standbys": (9, T.TYPE_UINT32),
        "labels": (10, T.TYPE_MESSAGE),
        "disable_wait_for_ack": (11, T.TYPE_BOOL),
        "ring_buffer_size": (12, T.TYPE_UINT32),
        "read_channel_size": (13, T.TYPE_UINT32),
    },
    "consumer.ShardSpec.Source": {"journal": (1, T.TYPE_STRING), "min_offset": (3, T.TYPE_INT64)},
    "consumer.ConsumerSpec": {
        "process_spec": (1, T.TYPE_MESSAGE),
        "shard_limit": (2, T.TYPE_UINT32),
        "exiting": (3, T.TYPE_BOOL),
        "http_endpoint": (4, T.TYPE_STRING),
    },
    "consumer.ReplicaStatus": {"code": (1, T.TYPE_ENUM), "errors": (2, T.TYPE_STRING)},
    "consumer.Checkpoint": {"sources": (1, T.TYPE_MESSAGE), "ack_intents": (2, T.TYPE_MESSAGE)},
    "consumer.Checkpoint.Source": {
        "read_through": (1, T.TYPE_INT64),
        "producers": (2, T.TYPE_MESSAGE),
    },
    "consumer.Checkpoint.Source.ProducerEntry": {
        "id": (1, T.TYPE_BYTES),
        "state": (2, T.TYPE_MESSAGE),
    },
    "consumer.Checkpoint.ProducerState": {
        "last_ack": (1, T.TYPE_FIXED64),
        "begin": (2, T.TYPE_INT64),
    },
    "consumer.ListRequest": {"selector": (1, T.TYPE_MESSAGE), "extension": (100, T.TYPE_BYTES)},
    "consumer.ListResponse": {
        "status": (1, T.TYPE_ENUM),
        "header": (2, T.TYPE_MESSAGE),
        "shards": (3, T.TYPE_MESSAGE),
        "extension": (100, T.TYPE_BYTES),
    },
    "consumer.ListResponse.Shard": {
        "spec": (1, T.TYPE_MESSAGE),
        "mod_revision": (2, T.TYPE_INT64),
        "route": (3, T.TYPE_MESSAGE),
        "status": (4, T.TYPE_MESSAGE),
        "create_revision": (5, T.TYPE_INT64),
    },
    "consumer.ApplyRequest": {"changes": (1, T.TYPE_MESSAGE), "extension": (100, T.TYPE_BYTES)},
    "consumer.ApplyRequest.Change": {
        "expect_mod_revision": (1, T.TYPE_INT64),
        "upsert": (2, T.TYPE_MESSAGE),
        "delete": (3, T.TYPE_STRING),
        "primary_hints": (4, T.TYPE_MESSAGE),
    },
    "consumer.ApplyResponse": {
        "status": (1, T.TYPE_ENUM),
        "header": (2, T.TYPE_MESSAGE),
        "extension": (100, T.TYPE_BYTES),
    },
    "consumer.StatRequest": {
        "header": (1, T.TYPE_MESSAGE),
        "shard": (2, T.TYPE_STRING),
        "read_through": (3, T.TYPE_MESSAGE),
        "extension": (100, T.TYPE_BYTES),
    },
    "consumer.StatResponse": {
        "status": (1, T.TYPE_ENUM),
        "header": (2, T.TYPE_MESSAGE),
        "read_through": (3, T.TYPE_MESSAGE),
        "publish_at": (4, T.TYPE_MESSAGE),
        "extension": (100, T.TYPE_BYTES),
    },
    "consumer.GetHintsRequest": {"shard": (1, T.TYPE_STRING), "extension": (100, T.TYPE_BYTES)},
    "consumer.GetHintsResponse": {
        "status": (1, T.TYPE_ENUM),
        "header": (2, T.TYPE_MESSAGE),
        "primary_hints": (3, T.TYPE_MESSAGE),
        "backup_hints": (4, T.TYPE_MESSAGE),
        "extension": (100, T.TYPE_BYTES),
    },
    "consumer.GetHintsResponse.ResponseHints": {"hints": (1, T.TYPE_MESSAGE)},
    "consumer.UnassignRequest": {
        "shards": (1, T.TYPE_STRING),
        "only_failed": (2, T.TYPE_BOOL),
        "dry_run": (3, T.TYPE_BOOL),
    },
    "consumer.UnassignResponse": {"status": (1, T.TYPE_ENUM), "shards": (2, T.TYPE_STRING)},
}

# Message-typed fields referring to other packages, by full name.
REFERENCES = {
    ("consumer.ShardSpec", "max_txn_duration"): "google.protobuf.Duration",
    ("consumer.ShardSpec", "labels"): "protocol.LabelSet",
    ("consumer.ConsumerSpec", "process_spec"): "protocol.ProcessSpec",
    ("consumer.ListRequest", "selector"): "protocol.LabelSelector",
    ("consumer.ListResponse", "header"): "protocol.Header",
    ("consumer.ListResponse.Shard", "route"): "protocol.Route",
    ("consumer.StatRequest", "header"): "protocol.Header",
    ("consumer.ApplyRequest.Change", "primary_hints"): "recoverylog.FSMHints",
    ("consumer.GetHintsResponse.ResponseHints", "hints"): "recoverylog.FSMHints",
}


def _message(full_name: str) -> Any:
    return pb.DESCRIPTOR.pool.FindMessageTypeByName(full_name)


@pytest.mark.parametrize("full_name", sorted(FIELDS))
def test_field_numbers_and_types(full_name: str) -> None:
    desc = _message(full_name)
    got = {f.name: (f.number, f.type) for f in desc.fields}
    assert got == FIELDS[full_name]


def test_message_set_is_complete() -> None:
    names: set[str] = set()

    def walk(desc: Any) -> None:
        if desc.GetOptions().map_entry:
            return
        names.add(desc.full_name)
        for nested in desc.nested_types:
            walk(nested)

    for desc in pb.DESCRIPTOR.message_types_by_name.values():
        walk(desc)
    assert names == set(FIELDS)


@pytest.mark.parametrize(("field", "type_name"), sorted(REFERENCES.items()))
def test_references(field: tuple[str, str], type_name: str) -> None:
    assert _message(field[0]).fields_by_name[field[1]].message_type.full_name == type_name


def test_map_fields() -> None:
    for msg, field, value_type in [
        ("consumer.Checkpoint", "sources", T.TYPE_MESSAGE),
        ("consumer.Checkpoint", "ack_intents", T.TYPE_BYTES),
        ("consumer.StatRequest", "read_through", T.TYPE_INT64),
        ("consumer.StatResponse", "read_through", T.TYPE_INT64),
        ("consumer.StatResponse", "publish_at", T.TYPE_INT64),
    ]:
        entry = _message(msg).fields_by_name[field].message_type
        assert entry.GetOptions().map_entry
        assert entry.fields_by_name["key"].type == T.TYPE_STRING
        assert entry.fields_by_name["value"].type == value_type


SERVICE_METHODS = {
    "/consumer.Shard/Stat": ("consumer.StatRequest", "consumer.StatResponse"),
    "/consumer.Shard/List": ("consumer.ListRequest", "consumer.ListResponse"),
    "/consumer.Shard/Apply": ("consumer.ApplyRequest", "consumer.ApplyResponse"),
    "/consumer.Shard/GetHints": ("consumer.GetHintsRequest", "consumer.GetHintsResponse"),
    "/consumer.Shard/Unassign": ("consumer.UnassignRequest", "consumer.UnassignResponse"),
}


class _RecordingChannel:
    """Stands in for a grpc channel, recording the methods a stub binds."""

    def __init__(self) -> None:
        self.unary_unary_methods: list[str] = []

    def unary_unary(self, method: str, **_kwargs: Any) -> str:
        self.unary_unary_methods.append(method)
        return method

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"stub bound a non-unary method kind: {name}")


def test_service_method_names() -> None:
    channel = _RecordingChannel()
    stub: Any = consumer_pb2_grpc.ShardStub(cast(Any, channel))
    assert sorted(channel.unary_unary_methods) == sorted(SERVICE_METHODS)
    assert stub.GetHints == "/consumer.Shard/GetHints"

    service = pb.DESCRIPTOR.services_by_name["Shard"]
    assert service.full_name == "consumer.Shard"
    got = {
        f"/{service.full_name}/{m.name}": (m.input_type.full_name, m.output_type.full_name)
        for m in service.methods
        if not (m.client_streaming or m.server_streaming)
    }
    assert got == SERVICE_METHODS
