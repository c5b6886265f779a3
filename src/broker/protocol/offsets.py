"""Offsets: a mapping of journal names to byte offsets.

Consumers checkpoint the offsets through which they have read each source
journal, and readers resume from them.
"""

from __future__ import annotations

from collections.abc import Mapping

from gazette.broker.protocol.errors import ValidationError, context
from gazette.broker.protocol.validation import validate_journal_name

__all__ = ["Offsets", "copy_offsets", "validate_offsets"]

Offsets = dict[str, int]


def validate_offsets(offsets: Mapping[str, int]) -> None:
    """Check that every journal name is valid and every offset is >= 0.

    Raises ValidationError with context ``Offsets[<journal>]``.
    """
    for journal, offset in offsets.items():
        with context(f"Offsets[{journal}]"):
            validate_journal_name(journal)
            if offset < 0:
                raise ValidationError(f"invalid offset ({offset}; expected >= 0)")


def copy_offsets(offsets: Mapping[str, int]) -> Offsets:
    """A new Offsets holding the same entries."""
    return dict(offsets)
