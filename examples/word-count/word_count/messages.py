"""The messages of word-count, the journals holding them, and how text splits into n-grams."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.message import CONTENT_TYPE_JSON_LINES, JSONMessage

__all__ = [
    "COUNTS",
    "DELTAS_PREFIX",
    "MESSAGE_TYPE_LABEL",
    "NGramCount",
    "NGramDelta",
    "deltas_partition",
    "deltas_selector",
    "ngrams",
    "shard_id",
    "words",
]

DELTAS_PREFIX = "examples/word-count/deltas/"
"""Partitions of NGramDelta: ``{DELTAS_PREFIX}part-NNN``."""
COUNTS = "examples/word-count/counts"
"""The journal of NGramCount updates."""
MESSAGE_TYPE_LABEL = "app.gazette.dev/message-type"
CONTENT_TYPE = CONTENT_TYPE_JSON_LINES


@dataclass
class NGramDelta(JSONMessage):
    """`delta` more occurrences of `ngram` (words joined by single spaces)."""

    ngram: str = ""
    delta: int = 0


@dataclass
class NGramCount(JSONMessage):
    """The count of `ngram` after a shard's transaction changed it."""

    ngram: str = ""
    count: int = 0


def deltas_partition(i: int) -> str:
    return f"{DELTAS_PREFIX}part-{i:03d}"


def shard_id(i: int) -> str:
    """The shard reading deltas partition `i`."""
    return f"word-count-part-{i:03d}"


def deltas_selector() -> bpb.LabelSelector:
    """The deltas partitions: journals labelled ``message-type=NGramDelta`` under
    `DELTAS_PREFIX` (brokers list them ordered by name, as the mapping needs)."""
    sel = bpb.LabelSelector()
    sel.include.labels.add(name=MESSAGE_TYPE_LABEL, value="NGramDelta")
    sel.include.labels.add(name="prefix", value=DELTAS_PREFIX)
    return sel


_WORD = re.compile(r"\w+(?:'\w+)*")


def words(text: str) -> list[str]:
    """The lowercase words of `text` (runs of letters, digits and inner apostrophes)."""
    return _WORD.findall(text.lower())


def ngrams(tokens: Iterable[str], n: int = 2) -> Iterator[str]:
    """Every run of `n` consecutive tokens, joined by a space."""
    if n < 1:
        raise ValueError(f"n must be >= 1, not {n}")
    window: list[str] = []
    for t in tokens:
        window.append(t)
        if len(window) > n:
            del window[0]
        if len(window) == n:
            yield " ".join(window)
