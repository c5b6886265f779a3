"""Authors and their journal fences."""

from __future__ import annotations

import pytest

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog.author import author_fence, format_author, new_author


def test_new_author_is_a_nonzero_uint32() -> None:
    authors = {new_author() for _ in range(1000)}
    assert all(1 <= a <= 0xFFFFFFFF for a in authors)
    assert len(authors) > 990


@pytest.mark.parametrize(
    ("author", "text"),
    [
        (0, "0"),
        (1, "1"),
        (31, "v"),
        (32, "10"),
        (0xFEEDBEEF, "3verfnf"),
        (0xFFFFFFFF, "3vvvvvv"),
    ],
)
def test_format_author_in_base_32(author: int, text: str) -> None:
    assert format_author(author) == text
    assert int(text, 32) == author


def test_author_fence() -> None:
    assert author_fence(0x12345) == pb.LabelSet(labels=[pb.Label(name="author", value="28q5")])
    with pytest.raises(ValueError):
        format_author(1 << 32)
