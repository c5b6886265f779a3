"""Mapping functions: FNV-1a golden values, Gazette's mapping fixtures, and HRW stability."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.message.mapping import (
    JournalNotInPartitions,
    NoPartitions,
    direct_mapping,
    fnv1a_32,
    modulo_mapping,
    random_mapping,
    rendezvous_mapping,
)

JSON = "application/x-ndjson"


def partitions(names: list[str], content_type: str = JSON) -> list[pb.ListResponse.Journal]:
    out = []
    for name in names:
        j = pb.ListResponse.Journal()
        j.spec.name = name
        if content_type:
            j.spec.labels.labels.add(name="content-type", value=content_type)
        j.spec.labels.labels.add(name="topic", value="t")
        out.append(j)
    return out


def topic(count: int) -> list[pb.ListResponse.Journal]:
    return partitions([f"a/topic/part-{i:03d}" for i in range(count)])


def key(msg: object) -> str:
    assert isinstance(msg, str)
    return msg


@pytest.mark.parametrize(
    "data,want",
    [
        (b"", 0x811C9DC5),
        (b"a", 0xE40C292C),
        (b"foobar", 0xBF9CF968),
        ("foobar", 0xBF9CF968),
        (b"\x00", 0x050C5D1F),
        (b"chongo was here!\n", 0xD49930D5),
    ],
)
def test_fnv1a_32_golden(data: bytes | str, want: int) -> None:
    assert fnv1a_32(data) == want


def test_fnv1a_32_is_incremental() -> None:
    assert fnv1a_32(b"bar", fnv1a_32(b"foo")) == fnv1a_32(b"foobar")


# Gazette's regression fixtures (message/routines_test.go): the same keys over the same
# partitions must map to the same journals as a Go publisher's.
MODULO_443 = {
    "It always": 119,
    "seems": 54,
    "impossible": 308,
    "until": 97,
    "it is done.": 179,
    "- Nelson Mandela": 437,
    "Shall I compare": 84,
    "thee to": 300,
    "a summer's day?": 214,
    "Thou art more": 135,
    "lovely and more": 118,
    "temperate - Shakespeare": 228,
}
RENDEZVOUS_400_500 = {
    "It always": 21,
    "seems": 179,
    "impossible": 50,
    "until": 13,
    "it is done.": 337,
    "- Nelson Mandela": 29,
    "Shall I compare": 110,
    "thee to": 395,
    "a summer's day?": 192,
    "Thou art more": 394,
    "lovely and more": 344,
    "temperate - Shakespeare": 75,
}


def test_modulo_mapping_matches_gazette_fixtures() -> None:
    parts = topic(443)
    mapping = modulo_mapping(key, lambda: parts)
    for k, want in MODULO_443.items():
        assert mapping(k) == (f"a/topic/part-{want:03d}", JSON)


@pytest.mark.parametrize("count", [400, 500])
def test_rendezvous_mapping_matches_gazette_fixtures(count: int) -> None:
    parts = topic(count)
    mapping = rendezvous_mapping(key, lambda: parts)
    for k, want in RENDEZVOUS_400_500.items():
        assert mapping(k) == (f"a/topic/part-{want:03d}", JSON)


def test_rendezvous_reshuffles_minimally() -> None:
    keys = [f"session-{i}" for i in range(5000)]
    names = [f"t/part-{i:03d}" for i in range(20)]
    current = partitions(names)
    mapping = rendezvous_mapping(key, lambda: current)
    before = {k: mapping(k)[0] for k in keys}

    # Adding a partition moves keys only *to* it.
    current = partitions([*names, "t/part-new"])
    added = {k: mapping(k)[0] for k in keys}
    moved = [k for k in keys if added[k] != before[k]]
    assert moved and all(added[k] == "t/part-new" for k in moved)
    # Gazette's weight is FNV(key) XOR FNV(name): cheap but correlated, so a new partition's
    # share depends on its name's hash (here it takes ~45%). Only *which* keys move is promised.

    # Removing a partition moves only the keys it had.
    gone = names[7]
    current = partitions([n for n in names if n != gone])
    removed = {k: mapping(k)[0] for k in keys}
    assert {k for k in keys if removed[k] != before[k]} == {k for k in keys if before[k] == gone}

    # For contrast: modulo mapping reshuffles most keys when a partition is added.
    parts20, parts21 = partitions(names), partitions([*names, "t/part-new"])
    m20, m21 = modulo_mapping(key, lambda: parts20), modulo_mapping(key, lambda: parts21)
    assert sum(m20(k)[0] != m21(k)[0] for k in keys) > len(keys) // 2


def test_mappings_spread_keys() -> None:
    parts = topic(8)
    for build, least in ((modulo_mapping, 800), (rendezvous_mapping, 300)):
        mapping = build(key, lambda: parts)
        counts = Counter(mapping(f"k{i}")[0] for i in range(8000))
        assert len(counts) == 8 and min(counts.values()) > least, (build, counts)


def test_random_mapping() -> None:
    parts = topic(10)
    mapping = random_mapping(lambda: parts, random.Random(7))
    counts = Counter(mapping(object())[0] for _ in range(1000))
    assert len(counts) == 10
    assert all(ct == JSON for _, ct in (mapping(None) for _ in range(10)))


def test_direct_mapping() -> None:
    parts = partitions(["x/one", "x/two"], content_type="text/csv")
    mapping = direct_mapping(lambda m: m, lambda: parts)
    assert mapping(b"x/two") == ("x/two", "text/csv")
    assert mapping("x/one") == ("x/one", "text/csv")
    with pytest.raises(JournalNotInPartitions) as info:
        mapping("x/three")
    assert info.value.journal == "x/three"


def test_no_partitions() -> None:
    for mapping in (
        modulo_mapping(key, lambda: []),
        rendezvous_mapping(key, lambda: []),
        random_mapping(lambda: []),
        direct_mapping(key, lambda: []),
    ):
        with pytest.raises(NoPartitions):
            mapping("k")


def test_partitions_follow_the_listing() -> None:
    listing = {"parts": partitions(["a/1"])}
    mapping = modulo_mapping(key, lambda: listing["parts"])
    assert mapping("k") == ("a/1", JSON)
    listing["parts"] = partitions(["b/1"], content_type="")  # A new listing object.
    assert mapping("k") == ("b/1", "")
    listing["parts"] = []
    with pytest.raises(NoPartitions):
        mapping("k")


def test_memoized_key_hashes_stay_exact() -> None:
    parts = topic(7)
    mapping = modulo_mapping(key, lambda: parts)
    keys = [f"user-{i}" for i in range(20_000)]  # More than the memo holds.
    for k in keys + keys[:100]:
        assert mapping(k)[0] == f"a/topic/part-{fnv1a_32(k) % 7:03d}"
