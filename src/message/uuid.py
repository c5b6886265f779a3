"""Message UUIDs: RFC 4122 version-1 UUIDs laid out exactly as Gazette's.

A UUID carries a producer's identity (`ProducerID`, the 6-byte "node" field), a `Clock` (the
60-bit timestamp of 100 ns intervals since 1582-10-15 shifted left by 4, plus a 4-bit counter
in the low bits, so a producer may sequence 16 messages within one 100 ns interval), and
`Flags` (10 bits of the clock-sequence field) that say how the message takes part in a
transaction: OUTSIDE_TXN, CONTINUE_TXN or ACK_TXN.

Byte layout (big-endian, as upstream's message package):

    0-3   uint32(clock >> 4)                      time_low
    4-5   uint16(clock >> 36)                     time_mid
    6-7   uint16(clock >> 52) | 0x1000            time_hi and version 1
    8-9   ((clock << 10) & 0x3C00) | flags | 0x8000   counter, flags, RFC 4122 variant
    10-15 ProducerID
"""

from __future__ import annotations

import os
import time
import uuid as _uuid
from collections.abc import Callable
from enum import IntFlag
from typing import NewType

__all__ = [
    "Clock",
    "ProducerID",
    "Flags",
    "GREGORIAN_OFFSET_100NS",
    "clock_from_unix",
    "clock_from_unix_ns",
    "clock_to_unix_ns",
    "tick",
    "update",
    "new_producer_id",
    "build_uuid",
    "build_uuid_unchecked",
    "uuid_int",
    "uuid_of_int",
    "UUID_SLOTS_VERIFIED",
    "canonical_str",
    "remember_str",
    "get_clock",
    "get_producer_id",
    "get_flags",
    "UUIDError",
]

Clock = NewType("Clock", int)
"""60-bit timestamp (100 ns since 1582-10-15) << 4 | 4-bit sequence counter."""

ProducerID = NewType("ProducerID", bytes)
"""6 bytes identifying a producer; random, with the multicast bit (id[0] & 0x01) set."""

# 100 ns intervals between the Gregorian reform (1582-10-15) and the Unix epoch.
GREGORIAN_OFFSET_100NS = 0x01B21DD213814000

_MAX_CLOCK = (1 << 64) - 1
_FLAGS_MASK = 0x3FF


class UUIDError(ValueError):
    """A UUID is not a version-1, RFC 4122 variant UUID, or an argument is out of range."""


class Flags(IntFlag):
    """How a message takes part in its producer's transaction (10 bits)."""

    OUTSIDE_TXN = 0x0
    """Not part of a transaction: committed as soon as it is read."""
    CONTINUE_TXN = 0x1
    """Part of a transaction that a later ACK_TXN message of the producer commits."""
    ACK_TXN = 0x2
    """Commits every CONTINUE_TXN message of the producer with a clock <= this one's."""


def clock_from_unix_ns(ns: int) -> Clock:
    """The Clock of a Unix time in nanoseconds, with a zero counter."""
    return Clock(((ns // 100) + GREGORIAN_OFFSET_100NS) << 4)


def clock_from_unix(seconds: int, nanos: int = 0) -> Clock:
    """The Clock of Unix `seconds` + `nanos`, with a zero counter."""
    return clock_from_unix_ns(seconds * 1_000_000_000 + nanos)


def clock_to_unix_ns(clock: Clock) -> int:
    """The Unix time, in nanoseconds, of a Clock's timestamp (its counter is dropped)."""
    return ((clock >> 4) - GREGORIAN_OFFSET_100NS) * 100


def tick(clock: Clock) -> Clock:
    """The next Clock: the counter advances (carrying into the timestamp when it wraps)."""
    return Clock(clock + 1)


def update(clock: Clock, now_ns: int | None = None) -> Clock:
    """`clock` moved forward to the wall time `now_ns` (default: now), never backwards."""
    wall = clock_from_unix_ns(time.time_ns() if now_ns is None else now_ns)
    return wall if wall > clock else clock


def new_producer_id() -> ProducerID:
    """A random ProducerID with the multicast bit set, as RFC 4122 asks of random node IDs."""
    raw = bytearray(os.urandom(6))
    raw[0] |= 0x01
    return ProducerID(bytes(raw))


def _uuid_of_int_public(value: int) -> _uuid.UUID:
    return _uuid.UUID(int=value)


def _uuid_of_int_fast(value: int) -> _uuid.UUID:
    # What UUID.__init__ ends with, minus its argument parsing: ~4x cheaper, and this is
    # on the publisher's per-message path. Verified at import against the public constructor.
    u = object.__new__(_uuid.UUID)
    object.__setattr__(u, "int", value)
    object.__setattr__(u, "is_safe", _uuid.SafeUUID.unknown)
    return u


def _pick_uuid_of_int() -> Callable[[int], _uuid.UUID]:
    probe = 0x0123456789ABCDEF0123456789ABCDEF
    try:
        fast = _uuid_of_int_fast(probe)
        if fast == _uuid.UUID(int=probe) and str(fast) == str(_uuid.UUID(int=probe)):
            return _uuid_of_int_fast
    except (AttributeError, TypeError):
        pass
    return _uuid_of_int_public


uuid_of_int: Callable[[int], _uuid.UUID] = _pick_uuid_of_int()
"""The UUID of a 128-bit integer, by the fastest construction verified on this Python."""

UUID_SLOTS_VERIFIED: bool = uuid_of_int is _uuid_of_int_fast
"""Whether setting a bare UUID's `int` and `is_safe` slots was verified to build a valid UUID
here: hot paths may then inline it (the publisher does, saving a call per message)."""


_KNOWN: list[tuple[_uuid.UUID | None, str]] = [(None, "")]
"""The last UUID whose canonical form a publisher made along with it, as one tuple (assigned
whole, so readers on other threads never see one UUID with another's string)."""


def remember_str(u: _uuid.UUID, text: str) -> None:
    """Note that `text` is str(u) (a publisher formats it cheaply while it builds `u`)."""
    _KNOWN[0] = (u, text)


def canonical_str(u: _uuid.UUID) -> str:
    """str(u), as framings write it, in a fraction of its time: the UUID last remembered is
    answered at once; others are formatted from their integer."""
    known = _KNOWN[0]
    if known[0] is u:
        return known[1]
    if u.__class__ is not _uuid.UUID:
        return str(u)
    h = f"{u.int:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uuid_int(producer_int: int, clock: int, flags: int) -> int:
    """The 128-bit integer of the UUID of (producer as a 48-bit int, clock, flags), unchecked."""
    ts = clock >> 4
    return (
        (ts & 0xFFFFFFFF) << 96
        | ((ts >> 32) & 0xFFFF) << 80
        | (((ts >> 48) & 0x0FFF) | 0x1000) << 64
        | (((clock << 10) & 0x3C00) | flags | 0x8000) << 48
        | producer_int
    )


def build_uuid(producer: ProducerID, clock: Clock, flags: Flags | int) -> _uuid.UUID:
    """The version-1 UUID of (producer, clock, flags)."""
    if len(producer) != 6:
        raise UUIDError(f"producer ID must be 6 bytes, not {len(producer)}")
    if not 0 <= clock <= _MAX_CLOCK:
        raise UUIDError(f"clock {clock} out of range")
    if not 0 <= int(flags) <= _FLAGS_MASK:
        raise UUIDError(f"flags {int(flags):#x} exceed 10 bits")
    return uuid_of_int(uuid_int(int.from_bytes(producer, "big"), clock, int(flags)))


def build_uuid_unchecked(producer_int: int, clock: int, flags: int) -> _uuid.UUID:
    """`build_uuid` for hot paths whose arguments are already known to be valid."""
    return uuid_of_int(uuid_int(producer_int, clock, flags))


def _check(u: _uuid.UUID) -> bytes:
    b = u.bytes
    if b[6] >> 4 != 1 or b[8] & 0xC0 != 0x80:
        raise UUIDError(f"{u} is not a version 1, RFC 4122 variant UUID")
    return b


def get_clock(u: _uuid.UUID) -> Clock:
    """The Clock (timestamp and counter) of a UUID built by `build_uuid`."""
    b = _check(u)
    ts = (
        int.from_bytes(b[0:4], "big")
        | int.from_bytes(b[4:6], "big") << 32
        | (int.from_bytes(b[6:8], "big") & 0x0FFF) << 48
    )
    counter = (int.from_bytes(b[8:10], "big") >> 10) & 0xF
    return Clock(ts << 4 | counter)


def get_producer_id(u: _uuid.UUID) -> ProducerID:
    return ProducerID(_check(u)[10:16])


def get_flags(u: _uuid.UUID) -> Flags:
    return Flags(int.from_bytes(_check(u)[8:10], "big") & _FLAGS_MASK)
