"""Tests of Offsets helpers."""

import pytest

from gazette.broker.protocol import ValidationError, copy_offsets, validate_offsets


def test_valid_and_copy() -> None:
    offsets = {"a/journal": 0, "b/journal;meta": 123}
    validate_offsets(offsets)
    dup = copy_offsets(offsets)
    assert dup == offsets and dup is not offsets
    dup["a/journal"] = 5
    assert offsets["a/journal"] == 0


@pytest.mark.parametrize(
    "offsets, expect",
    [
        ({"a/journal": -1}, r"Offsets\[a/journal\]: invalid offset \(-1"),
        ({"/bad": 1}, r"Offsets\[/bad\]: cannot begin with '/'"),
        ({"ab": 1}, r"Offsets\[ab\]: invalid length \(2; expected 4"),
        ({"bad//journal": 1}, r"Offsets\[bad//journal\]: must be a clean path"),
    ],
)
def test_invalid(offsets: dict[str, int], expect: str) -> None:
    with pytest.raises(ValidationError, match=expect):
        validate_offsets(offsets)
