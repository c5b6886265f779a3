"""Tests of SHA1Sum conversions."""

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.broker.protocol import (
    ValidationError,
    is_zero,
    pb,
    sha1sum_from_digest,
    sha1sum_from_hex,
    sha1sum_hex,
    sha1sum_of,
    sha1sum_to_digest,
)

HELLO = hashlib.sha1(b"hello").digest()


def test_golden_parts_of_hello() -> None:
    s = sha1sum_from_digest(HELLO)
    assert s.part1 == 0xAAF4C61DDCC5E8A2
    assert s.part2 == 0xDABEDE0F3B482CD9
    assert s.part3 == 0xAEA9434D
    assert sha1sum_hex(s) == "aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d"
    assert sha1sum_of(b"hello") == s


def test_hex_round_trip_and_case() -> None:
    text = "aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d"
    assert sha1sum_to_digest(sha1sum_from_hex(text)) == HELLO
    assert sha1sum_from_hex(text.upper()) == sha1sum_from_hex(text)


@pytest.mark.parametrize(
    "text", ["", "aa", "g" * 40, "a" * 39, "a" * 41, " " + "a" * 39, "+" + "a" * 39]
)
def test_bad_hex(text: str) -> None:
    with pytest.raises(ValidationError, match="40 hex digits"):
        sha1sum_from_hex(text)


def test_bad_digest_length() -> None:
    with pytest.raises(ValueError):
        sha1sum_from_digest(b"short")


def test_is_zero() -> None:
    assert is_zero(pb.SHA1Sum())
    assert is_zero(sha1sum_from_digest(bytes(20)))
    assert not is_zero(sha1sum_from_digest(bytes(19) + b"\x01"))
    # The empty fragment's sum is zero, not SHA1 of no bytes.
    assert not is_zero(sha1sum_of(b""))


@given(st.binary(min_size=20, max_size=20))
def test_digest_round_trip(digest: bytes) -> None:
    s = sha1sum_from_digest(digest)
    assert sha1sum_to_digest(s) == digest
    assert sha1sum_from_hex(sha1sum_hex(s)) == s
    assert pb.SHA1Sum.FromString(s.SerializeToString()) == s
