"""Golden encodings of broker messages, built by hand from field numbers and wire
types, so that a wrong field number or type in proto/protocol.proto fails here.

Wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
"""

import hashlib
import struct

from google.protobuf.duration_pb2 import Duration

from gazette.broker.protocol import pb, sha1sum_from_digest

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


def f_bytes(field: int, data: bytes | str) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return key(field, LEN) + varint(len(raw)) + raw


def test_helpers_match_literal_bytes() -> None:
    assert key(1, LEN) == b"\x0a"
    assert key(3, FIXED32) == b"\x1d"
    assert varint(1024) == b"\x80\x08"
    assert varint(-1) == b"\xff" * 9 + b"\x01"


def test_label() -> None:
    assert pb.Label(name="a", value="b").SerializeToString() == b"\x0a\x01a\x12\x01b"
    assert pb.Label(name="a", prefix=True).SerializeToString() == b"\x0a\x01a\x18\x01"


def test_label_set_and_selector() -> None:
    label = b"\x0a\x02aa\x12\x01b"
    ls = pb.LabelSet(labels=[pb.Label(name="aa", value="b")])
    assert ls.SerializeToString() == f_bytes(1, label)
    sel = pb.LabelSelector(include=ls, exclude=ls)
    assert sel.SerializeToString() == f_bytes(1, f_bytes(1, label)) + f_bytes(2, f_bytes(1, label))


def test_sha1sum_fixed_fields_little_endian() -> None:
    s = sha1sum_from_digest(hashlib.sha1(b"hello").digest())
    expect = (
        b"\x09" + struct.pack("<Q", 0xAAF4C61DDCC5E8A2)
        + b"\x11" + struct.pack("<Q", 0xDABEDE0F3B482CD9)
        + b"\x1d" + struct.pack("<I", 0xAEA9434D)
    )  # fmt: skip
    assert s.SerializeToString() == expect
    assert expect[1:9] == bytes.fromhex("a2e8c5dc1dc6f4aa")


def test_read_request() -> None:
    req = pb.ReadRequest(journal="a/j", offset=5, block=True)
    assert req.SerializeToString() == b"\x12\x03a/j\x18\x05\x20\x01"

    req = pb.ReadRequest(
        journal="a/j",
        offset=-1,
        do_not_proxy=True,
        metadata_only=True,
        end_offset=7,
        begin_mod_time=8,
        min_etcd_revision=9,
    )
    assert req.SerializeToString() == (
        f_bytes(2, "a/j")
        + b"\x18" + b"\xff" * 9 + b"\x01"
        + b"\x28\x01\x30\x01\x38\x07\x40\x08\x48\x09"
    )  # fmt: skip


def test_append_request() -> None:
    label = b"\x0a\x02aa\x12\x01b"
    req = pb.AppendRequest(
        journal="a/j",
        offset=5,
        check_registers=pb.LabelSelector(
            include=pb.LabelSet(labels=[pb.Label(name="aa", value="b")])
        ),
    )
    assert req.SerializeToString() == (
        b"\x12\x03a/j" + b"\x28\x05" + b"\x32\x0b" + b"\x0a\x09" + b"\x0a\x07" + label
    )
    req = pb.AppendRequest(
        do_not_proxy=True,
        content=b"xyz",
        union_registers=pb.LabelSet(),
        subtract_registers=pb.LabelSet(),
        suspend=pb.AppendRequest.SUSPEND_KEEP,
        min_etcd_revision=3,
    )
    assert req.SerializeToString() == (
        b"\x18\x01" + f_bytes(4, b"xyz") + b"\x3a\x00" + b"\x42\x00" + b"\x48\x04" + b"\x50\x03"
    )


def test_journal_spec() -> None:
    spec = pb.JournalSpec(
        name="a/j",
        replication=3,
        fragment=pb.JournalSpec.Fragment(length=1024),
    )
    assert spec.SerializeToString() == b"\x0a\x03a/j\x10\x03\x22\x03\x08\x80\x08"

    spec = pb.JournalSpec(
        labels=pb.LabelSet(labels=[pb.Label(name="aa", value="b")]),
        fragment=pb.JournalSpec.Fragment(
            compression_codec=pb.SNAPPY,
            stores=["s3://b/"],
            refresh_interval=Duration(seconds=60),
            retention=Duration(seconds=1),
            flush_interval=Duration(nanos=5),
            path_postfix_template="p",
        ),
        flags=pb.JournalSpec.O_RDWR,
        max_append_rate=100,
        suspend=pb.JournalSpec.Suspend(level=pb.JournalSpec.Suspend.FULL, offset=9),
    )
    fragment = (
        b"\x10\x04"
        + f_bytes(3, "s3://b/")
        + f_bytes(4, b"\x08\x3c")
        + f_bytes(5, b"\x08\x01")
        + f_bytes(6, b"\x10\x05")
        + f_bytes(7, "p")
    )
    assert spec.SerializeToString() == (
        f_bytes(3, f_bytes(1, b"\x0a\x02aa\x12\x01b"))
        + f_bytes(4, fragment)
        + b"\x30\x04"  # Field 5 is unused; flags are field 6.
        + b"\x38\x64"
        + f_bytes(8, b"\x08\x02\x10\x09")
    )


def test_fragment() -> None:
    frag = pb.Fragment(
        journal="a/j",
        begin=1,
        end=2,
        sum=pb.SHA1Sum(part3=1),
        compression_codec=pb.GZIP,
        backing_store="s3://b/",
        mod_time=7,
        path_postfix="x=1",
    )
    assert frag.SerializeToString() == (
        f_bytes(1, "a/j")
        + b"\x10\x01\x18\x02"
        + f_bytes(4, b"\x1d\x01\x00\x00\x00")
        + b"\x28\x02"
        + f_bytes(6, "s3://b/")
        + b"\x38\x07"
        + f_bytes(8, "x=1")
    )


def test_process_broker_route_header() -> None:
    pid = pb.ProcessSpec.ID(zone="z", suffix="s")
    assert pid.SerializeToString() == b"\x0a\x01z\x12\x01s"
    bs = pb.BrokerSpec(
        process_spec=pb.ProcessSpec(id=pid, endpoint="http://h"), journal_limit=2, exiting=True
    )
    assert bs.SerializeToString() == (
        f_bytes(1, f_bytes(1, b"\x0a\x01z\x12\x01s") + f_bytes(2, "http://h")) + b"\x10\x02\x18\x01"
    )
    route = pb.Route(members=[pid], primary=-1, endpoints=["http://h"])
    assert route.SerializeToString() == (
        f_bytes(1, b"\x0a\x01z\x12\x01s") + b"\x10" + varint(-1) + f_bytes(3, "http://h")
    )
    header = pb.Header(
        process_id=pid,
        route=pb.Route(primary=1),
        etcd=pb.Header.Etcd(cluster_id=1, member_id=2, revision=3, raft_term=4),
    )
    assert header.SerializeToString() == (
        f_bytes(1, b"\x0a\x01z\x12\x01s")
        + f_bytes(2, b"\x10\x01")
        + f_bytes(3, b"\x08\x01\x10\x02\x18\x03\x20\x04")
    )


def test_responses() -> None:
    resp = pb.ReadResponse(
        status=pb.OFFSET_NOT_YET_AVAILABLE, offset=3, write_head=4, fragment_url="u", content=b"c"
    )
    assert resp.SerializeToString() == b"\x08\x06\x18\x03\x20\x04" + f_bytes(6, "u") + f_bytes(
        7, b"c"
    )
    resp2 = pb.AppendResponse(
        status=pb.REGISTER_MISMATCH,
        commit=pb.Fragment(begin=1),
        registers=pb.LabelSet(),
        total_chunks=5,
        delayed_chunks=6,
        store_health_error="e",
    )
    assert resp2.SerializeToString() == (
        b"\x08\x0d" + f_bytes(3, b"\x10\x01") + b"\x22\x00\x28\x05\x30\x06" + f_bytes(7, "e")
    )
    resp3 = pb.FragmentsResponse(
        fragments=[pb.FragmentsResponse._Fragment(spec=pb.Fragment(end=1), signed_url="u")],
        next_page_token=9,
    )
    assert resp3.SerializeToString() == (
        f_bytes(3, f_bytes(1, b"\x18\x01") + f_bytes(2, "u")) + b"\x20\x09"
    )
    resp4 = pb.ListResponse(
        journals=[
            pb.ListResponse.Journal(
                spec=pb.JournalSpec(replication=1),
                mod_revision=2,
                route=pb.Route(primary=1),
                create_revision=4,
            )
        ]
    )
    assert resp4.SerializeToString() == f_bytes(
        3, f_bytes(1, b"\x10\x01") + b"\x10\x02" + f_bytes(3, b"\x10\x01") + b"\x20\x04"
    )


def test_replicate_list_apply_fragments_requests() -> None:
    rep = pb.ReplicateRequest(
        deprecated_journal="j",
        proposal=pb.Fragment(end=1),
        content=b"c",
        content_delta=2,
        acknowledge=True,
        registers=pb.LabelSet(),
    )
    assert rep.SerializeToString() == (
        f_bytes(2, "j") + f_bytes(3, b"\x18\x01") + f_bytes(4, b"c") + b"\x28\x02\x30\x01\x3a\x00"
    )
    lst = pb.ListRequest(selector=pb.LabelSelector(), watch=True, watch_resume=pb.Header())
    assert lst.SerializeToString() == b"\x0a\x00\x20\x01\x2a\x00"
    apply = pb.ApplyRequest(
        changes=[
            pb.ApplyRequest.Change(expect_mod_revision=-1, upsert=pb.JournalSpec(replication=1)),
            pb.ApplyRequest.Change(expect_mod_revision=5, delete="a/j"),
        ]
    )
    assert apply.SerializeToString() == (
        f_bytes(1, b"\x08" + varint(-1) + f_bytes(2, b"\x10\x01"))
        + f_bytes(1, b"\x08\x05" + f_bytes(3, "a/j"))
    )
    frag = pb.FragmentsRequest(
        journal="a/j",
        begin_mod_time=3,
        end_mod_time=4,
        next_page_token=5,
        page_limit=6,
        signatureTTL=Duration(seconds=7),
        do_not_proxy=True,
    )
    assert frag.SerializeToString() == (
        f_bytes(2, "a/j")
        + b"\x18\x03\x20\x04\x28\x05\x30\x06"
        + f_bytes(7, b"\x08\x07")
        + b"\x40\x01"
    )
    health = pb.FragmentStoreHealthRequest(fragment_store="s3://b/")
    assert health.SerializeToString() == f_bytes(1, "s3://b/")


def test_enum_numbers() -> None:
    assert [pb.Status.Value(n) for n in (
        "OK", "JOURNAL_NOT_FOUND", "NO_JOURNAL_PRIMARY_BROKER", "NOT_JOURNAL_PRIMARY_BROKER",
        "INSUFFICIENT_JOURNAL_BROKERS", "NOT_JOURNAL_BROKER", "OFFSET_NOT_YET_AVAILABLE",
        "WRONG_ROUTE", "PROPOSAL_MISMATCH", "ETCD_TRANSACTION_FAILED", "NOT_ALLOWED",
        "WRONG_APPEND_OFFSET", "INDEX_HAS_GREATER_OFFSET", "REGISTER_MISMATCH", "SUSPENDED",
        "FRAGMENT_STORE_UNHEALTHY",
    )] == list(range(16))  # fmt: skip
    assert [pb.CompressionCodec.Value(n) for n in (
        "INVALID", "NONE", "GZIP", "ZSTANDARD", "SNAPPY", "GZIP_OFFLOAD_DECOMPRESSION"
    )] == list(range(6))  # fmt: skip
    assert (pb.JournalSpec.NOT_SPECIFIED, pb.JournalSpec.O_RDONLY) == (0, 1)
    assert (pb.JournalSpec.O_WRONLY, pb.JournalSpec.O_RDWR) == (2, 4)
    assert [pb.JournalSpec.Suspend.Level.Value(n) for n in ("NONE", "PARTIAL", "FULL")] == [0, 1, 2]
    assert [pb.AppendRequest.Suspend.Value(n) for n in (
        "SUSPEND_RESUME", "SUSPEND_NO_RESUME", "SUSPEND_IF_FLUSHED", "SUSPEND_NOW", "SUSPEND_KEEP"
    )] == list(range(5))  # fmt: skip


def test_service_method_paths() -> None:
    service = pb.DESCRIPTOR.services_by_name["Journal"]
    assert service.full_name == "protocol.Journal"
    assert [m.name for m in service.methods] == [
        "List", "Apply", "Read", "Append", "Replicate", "ListFragments", "FragmentStoreHealth",
    ]  # fmt: skip
    streams = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert streams["List"] == (False, True)
    assert streams["Read"] == (False, True)
    assert streams["Append"] == (True, False)
    assert streams["Replicate"] == (True, True)
    assert streams["Apply"] == (False, False)
