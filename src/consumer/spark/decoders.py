"""Ready-made RocksDB decoders for ``gazette-shards`` (option ``decoder``).

A decoder is ``f(key: bytes, value: bytes) -> dict`` of the columns named by the ``schema``
option; it gets the key without ``key_prefix``. These live in the installed package, so
Spark's Python workers can always import them.
"""

from __future__ import annotations

__all__ = ["UTF8_DECIMAL_SCHEMA", "utf8_decimal"]

UTF8_DECIMAL_SCHEMA = "key STRING, value BIGINT"
"""The ``schema`` option to give with `utf8_decimal`."""


def utf8_decimal(key: bytes, value: bytes) -> dict[str, object]:
    """A UTF-8 key and a decimal integer value (as the word-count example stores its
    counts under ``key_prefix`` ``n``): ``{"key": str, "value": int}``."""
    return {"key": key.decode(), "value": int(value)}
