"""CRC-32C (Castagnoli), the checksum chaining the operations of a recovery log.

`update(crc, data)` continues a running checksum the way Go's
``crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), data)`` does, so that
``update(update(0, a), b) == update(0, a + b)``.

A native implementation is used when one is installed (the `crc32c` package,
else `google_crc32c`); otherwise a table-driven pure-Python fallback, which
costs a few microseconds per recorded op (ops are tens of bytes; write payloads
are never checksummed).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

__all__ = ["BACKEND", "Buffer", "update", "update_pure"]

Buffer = bytes | bytearray | memoryview

_POLY = 0x82F63B78  # Castagnoli, bit-reversed.
_MASK = 0xFFFFFFFF


def _make_tables() -> list[tuple[int, ...]]:
    base: list[int] = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        base.append(c)
    # Table k advances a byte through k further zero bytes ("slicing-by-8").
    tables = [base]
    for _ in range(7):
        prev = tables[-1]
        tables.append([(prev[i] >> 8) ^ base[prev[i] & 0xFF] for i in range(256)])
    return [tuple(t) for t in tables]


_T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7 = _make_tables()
_words = struct.Struct("<II").iter_unpack


def update_pure(crc: int, data: Buffer) -> int:
    """Pure-Python CRC-32C continuation of `crc` over `data`."""
    t0, t1, t2, t3, t4, t5, t6, t7 = _T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7
    crc ^= _MASK
    n = len(data)
    whole = n & ~7
    if whole:
        for lo, hi in _words(memoryview(data)[:whole]):
            lo ^= crc
            crc = (
                t7[lo & 0xFF]
                ^ t6[(lo >> 8) & 0xFF]
                ^ t5[(lo >> 16) & 0xFF]
                ^ t4[lo >> 24]
                ^ t3[hi & 0xFF]
                ^ t2[(hi >> 8) & 0xFF]
                ^ t1[(hi >> 16) & 0xFF]
                ^ t0[hi >> 24]
            )
    if whole != n:
        for b in memoryview(data)[whole:]:
            crc = t0[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ _MASK


def _select() -> tuple[str, Callable[[int, Buffer], int]]:
    try:
        import crc32c as _native  # type: ignore[import-not-found]

        def _via_crc32c(crc: int, data: Buffer) -> int:
            return int(_native.crc32c(data, crc))

        return "crc32c", _via_crc32c
    except ImportError:
        pass
    try:
        import google_crc32c as _google  # type: ignore[import-not-found]

        def _via_google(crc: int, data: Buffer) -> int:
            return int(_google.extend(crc, data))

        return "google_crc32c", _via_google
    except ImportError:
        pass
    return "pure-python", update_pure


BACKEND: str
update: Callable[[int, Buffer], int]
BACKEND, update = _select()
