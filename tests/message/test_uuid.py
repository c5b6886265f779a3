"""Golden tests of Gazette's UUID layout."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.message.uuid import (
    GREGORIAN_OFFSET_100NS,
    Clock,
    Flags,
    ProducerID,
    UUIDError,
    build_uuid,
    clock_from_unix,
    clock_to_unix_ns,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
    tick,
    update,
)

PRODUCER = ProducerID(bytes.fromhex("0102030405ff"))


def test_clock_of_a_timestamp() -> None:
    # 2019-11-19T22:00:00Z, as 100 ns intervals since 1582-10-15, shifted by 4.
    clock = clock_from_unix(1574200800, 123_456_700)
    assert clock == ((1574200800 * 10_000_000 + 1_234_567 + GREGORIAN_OFFSET_100NS) << 4)
    assert GREGORIAN_OFFSET_100NS == 122_192_928_000_000_000
    assert clock_to_unix_ns(clock) == 1574200800_123_456_700


def test_uuid_bytes_golden() -> None:
    clock = Clock(0x0123_4567_89AB_CDEF)  # timestamp 0x0123456789ABCDE, counter 0xF
    u = build_uuid(PRODUCER, clock, Flags.ACK_TXN)
    # time_low = ts & 0xffffffff, time_mid = ts >> 32 & 0xffff, time_hi = ts >> 48 | 0x1000.
    # clock seq = (0xF << 10) | 0x2 | 0x8000 = 0xbc02.
    assert u.bytes.hex() == "789abcde" + "3456" + "1012" + "bc02" + "0102030405ff"
    assert u.version == 1 and u.variant == uuid.RFC_4122
    assert get_clock(u) == clock
    assert get_flags(u) == Flags.ACK_TXN
    assert get_producer_id(u) == PRODUCER


def test_counter_and_flags_do_not_collide() -> None:
    u = build_uuid(PRODUCER, Clock(0x10 | 0x7), Flags.CONTINUE_TXN)
    assert u.bytes[8:10] == bytes.fromhex("9c01")  # (7 << 10) | 1 | 0x8000
    assert get_clock(u) & 0xF == 7 and get_flags(u) == Flags.CONTINUE_TXN


def test_tick_and_update() -> None:
    c = clock_from_unix(1_700_000_000)
    assert tick(c) == c + 1
    assert update(c, now_ns=1_600_000_000 * 10**9) == c, "update never moves backwards"
    later = update(c, now_ns=1_800_000_000 * 10**9)
    assert later == clock_from_unix(1_800_000_000)


def test_producer_ids_are_random_with_multicast_bit() -> None:
    ids = {new_producer_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(p) == 6 and p[0] & 0x01 for p in ids)


def test_bad_inputs() -> None:
    with pytest.raises(UUIDError):
        build_uuid(ProducerID(b"12345"), Clock(1), Flags.OUTSIDE_TXN)
    with pytest.raises(UUIDError):
        build_uuid(PRODUCER, Clock(1), 0x400)
    with pytest.raises(UUIDError):
        get_clock(uuid.uuid4())


@given(st.integers(0, (1 << 64) - 1), st.binary(min_size=6, max_size=6), st.integers(0, 0x3FF))
def test_round_trip(clock: int, producer: bytes, flags: int) -> None:
    u = build_uuid(ProducerID(producer), Clock(clock), flags)
    assert get_clock(u) == clock
    assert get_producer_id(u) == producer
    assert int(get_flags(u)) == flags


@given(st.integers(0, (1 << 128) - 1))
def test_canonical_str_is_str(value: int) -> None:
    from gazette.message.uuid import canonical_str

    u = uuid.UUID(int=value)
    assert canonical_str(u) == str(u)


def test_publishers_remember_each_uuids_canonical_string() -> None:
    from gazette.message.publisher import Publisher
    from gazette.message.uuid import _KNOWN, canonical_str

    pub = Publisher(None)  # type: ignore[arg-type]  # Only its clock is used.
    made = []
    for i in range(100):
        u = pub._next_uuid((0, 1, 2)[i % 3])
        assert _KNOWN[0][0] is u and _KNOWN[0][1] == str(u)
        made.append(u)
    assert [canonical_str(u) for u in made] == [str(u) for u in made]  # Earlier ones too.
