"""SHA1Sum: a 20-byte SHA1 digest as three protobuf fields.

The digest is split big-endian into part1 (bytes 0..8, fixed64), part2 (bytes
8..16, fixed64) and part3 (bytes 16..20, fixed32). (The wire encoding of fixed
fields is little-endian; that is protobuf's business, not ours.)

An empty fragment has the all-zero sum, not the SHA1 of no bytes.
"""

from __future__ import annotations

import hashlib

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError

__all__ = [
    "is_zero",
    "sha1sum_from_digest",
    "sha1sum_from_hex",
    "sha1sum_hex",
    "sha1sum_of",
    "sha1sum_to_digest",
]

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def sha1sum_from_digest(digest: bytes) -> pb.SHA1Sum:
    """The SHA1Sum of a 20-byte digest. Raises ValueError for another length."""
    if len(digest) != 20:
        raise ValueError(f"SHA1 digest must be 20 bytes (have {len(digest)})")
    return pb.SHA1Sum(
        part1=int.from_bytes(digest[0:8], "big"),
        part2=int.from_bytes(digest[8:16], "big"),
        part3=int.from_bytes(digest[16:20], "big"),
    )


def sha1sum_to_digest(sha: pb.SHA1Sum) -> bytes:
    """The 20-byte digest of a SHA1Sum."""
    return (
        sha.part1.to_bytes(8, "big") + sha.part2.to_bytes(8, "big") + sha.part3.to_bytes(4, "big")
    )


def sha1sum_hex(sha: pb.SHA1Sum) -> str:
    """The digest as 40 lower-case hex digits."""
    return sha1sum_to_digest(sha).hex()


def sha1sum_from_hex(text: str) -> pb.SHA1Sum:
    """Parse a SHA1Sum from exactly 40 hex digits (either case).

    Raises ValidationError naming the bad text otherwise.
    """
    if len(text) != 40 or not _HEX_DIGITS.issuperset(text):
        raise ValidationError(f"not a SHA1 sum of 40 hex digits ({text!r})")
    return sha1sum_from_digest(bytes.fromhex(text))


def sha1sum_of(data: bytes) -> pb.SHA1Sum:
    """The SHA1Sum of `data`."""
    return sha1sum_from_digest(hashlib.sha1(data).digest())


def is_zero(sha: pb.SHA1Sum) -> bool:
    """Whether the sum is all zero, as it is for a fragment with no content."""
    return sha.part1 == 0 and sha.part2 == 0 and sha.part3 == 0
