"""Mapping functions: which journal of a "topic" a message is published to.

A *topic* is a set of journals selected by labels (e.g. ``topic=clicks``); each journal is a
partition. A `MappingFunc` takes a message and returns ``(journal, content_type)``: the
journal to append it to and that journal's ``content-type`` label, which names the framing the
publisher must use. The builders here choose among the partitions returned by a
`PartitionsFunc` (typically ``lambda: polled_list.journals`` of a `broker.client.PolledList`):

- `modulo_mapping`: 32-bit FNV-1a of the message's mapping key, modulo the partition count.
- `rendezvous_mapping`: highest-random-weight hashing of the same key against each journal
  name's FNV-1a. When partitions are added or removed, only keys of the removed journals (or
  keys won by the added ones) move.
- `random_mapping`: a uniformly random partition.
- `direct_mapping`: the key *is* the journal name, which must be one of the partitions.

The hashes and tie-breaking are Gazette's (``message/routines.go``), so a Python and a Go
producer map the same key over the same (name-ordered, as brokers list them) partitions to the
same journal. Every mapping raises `NoPartitions` when the partitions function returns none.

Derived per-partition data (names, content types, name hashes) is cached for as long as the
partitions function keeps returning the *same* list object, as `PolledList.journals` does
between refreshes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.message.framing import CONTENT_TYPE_LABEL

__all__ = [
    "MappingFunc",
    "MappingKeyFunc",
    "PartitionsFunc",
    "MappingError",
    "NoPartitions",
    "JournalNotInPartitions",
    "fnv1a_32",
    "modulo_mapping",
    "rendezvous_mapping",
    "random_mapping",
    "direct_mapping",
]

MappingFunc = Callable[[Any], tuple[str, str]]
"""Maps a message to ``(journal name, content type of that journal)``."""

MappingKeyFunc = Callable[[Any], bytes | str]
"""The stable mapping key of a message (str keys are hashed as UTF-8)."""

PartitionsFunc = Callable[[], Sequence[pb.ListResponse.Journal]]
"""The current partitions (listing entries, with specs) to choose among."""

_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193


class MappingError(Exception):
    """A message could not be mapped to a journal."""


class NoPartitions(MappingError):
    """The partitions function returned no journals (Gazette's ErrEmptyListResponse).

    Transient when the selected journals are still being created: callers may retry later.
    """


class JournalNotInPartitions(MappingError):
    """`direct_mapping`: the named journal is not one of the current partitions."""

    def __init__(self, journal: str) -> None:
        super().__init__(f"journal {journal!r} is not among the current partitions")
        self.journal = journal


def fnv1a_32(data: bytes | str, h: int = _FNV32_OFFSET) -> int:
    """32-bit FNV-1a of `data` (str as UTF-8), continuing from hash state `h`."""
    if isinstance(data, str):
        data = data.encode()
    for b in data:
        h = ((h ^ b) * _FNV32_PRIME) & 0xFFFFFFFF
    return h


_KEY_CACHE_SIZE = 8192


class _KeyHashes:
    """FNV-1a of mapping keys, memoized: keys usually repeat (users, sessions, sensors), and
    hashing in Python costs ~50 ns a byte. Bounded: cleared whenever it fills up."""

    __slots__ = ("_key", "_cache")

    def __init__(self, key: MappingKeyFunc) -> None:
        self._key = key
        self._cache: dict[bytes | str, int] = {}

    def __call__(self, msg: Any) -> int:
        k = self._key(msg)
        h = self._cache.get(k)
        if h is None:
            if len(self._cache) >= _KEY_CACHE_SIZE:
                self._cache.clear()
            h = self._cache[k] = fnv1a_32(k)
        return h


class _Partitions:
    """Names, content types and name hashes of one partitions listing, cached by identity."""

    __slots__ = ("_fn", "_last", "names", "content_types", "hashes", "index")

    def __init__(self, fn: PartitionsFunc) -> None:
        self._fn = fn
        self._last: object = None
        self.names: list[str] = []
        self.content_types: list[str] = []
        self.hashes: list[int] = []
        self.index: dict[str, int] = {}

    def current(self) -> _Partitions:
        parts = self._fn()
        if parts is not self._last:
            self.names = [j.spec.name for j in parts]
            self.content_types = [_content_type(j.spec) for j in parts]
            self.hashes = [fnv1a_32(n) for n in self.names]
            self.index = {n: i for i, n in enumerate(self.names)}
            self._last = parts
        if not self.names:
            raise NoPartitions("no journals match the mapping's partitions")
        return self


def _content_type(spec: pb.JournalSpec) -> str:
    for label in spec.labels.labels:
        if label.name == CONTENT_TYPE_LABEL:
            return label.value
    return ""


def modulo_mapping(key: MappingKeyFunc, partitions: PartitionsFunc) -> MappingFunc:
    """Map on FNV-1a(key) modulo the number of partitions (in the listed order)."""
    parts = _Partitions(partitions)
    key_hash = _KeyHashes(key)

    def mapping(msg: Any) -> tuple[str, str]:
        p = parts.current()
        i = key_hash(msg) % len(p.names)
        return p.names[i], p.content_types[i]

    return mapping


def rendezvous_mapping(key: MappingKeyFunc, partitions: PartitionsFunc) -> MappingFunc:
    """Map to the partition of highest weight FNV-1a(key) XOR FNV-1a(journal name).

    Ties go to the earliest listed partition, as in Gazette.
    """
    parts = _Partitions(partitions)
    key_hash = _KeyHashes(key)

    def mapping(msg: Any) -> tuple[str, str]:
        p = parts.current()
        s = key_hash(msg)
        best, best_w = 0, 0
        for i, h in enumerate(p.hashes):
            w = s ^ h
            if w > best_w:
                best, best_w = i, w
        return p.names[best], p.content_types[best]

    return mapping


def random_mapping(partitions: PartitionsFunc, rng: random.Random | None = None) -> MappingFunc:
    """Map each message to a uniformly random partition (`rng` for reproducible tests)."""
    parts = _Partitions(partitions)
    randrange = (rng or random.Random()).randrange

    def mapping(msg: Any) -> tuple[str, str]:
        p = parts.current()
        i = randrange(len(p.names))
        return p.names[i], p.content_types[i]

    return mapping


def direct_mapping(key: MappingKeyFunc, partitions: PartitionsFunc) -> MappingFunc:
    """Map to the journal named by the message's key; it must be a current partition.

    Raises `JournalNotInPartitions` otherwise.
    """
    parts = _Partitions(partitions)

    def mapping(msg: Any) -> tuple[str, str]:
        p = parts.current()
        k = key(msg)
        name = k.decode() if isinstance(k, bytes) else k
        i = p.index.get(name)
        if i is None:
            raise JournalNotInPartitions(name)
        return p.names[i], p.content_types[i]

    return mapping
