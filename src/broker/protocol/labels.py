"""Operations on LabelSets.

A `pb.LabelSet` keeps its labels sorted on (name, value) and unique, and these
functions preserve that invariant. Mutators (`add_label`, `set_value`,
`remove`) change the set in place; combinators (`union`, `intersect`,
`subtract`) return a new set and leave their arguments alone.

As in Gazette, a label name given with the suffix ``:prefix`` (e.g.
``name:prefix``) produces a label with `prefix` set, which is meaningful only
within a LabelSelector: it matches any value starting with the label's value.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.validation import validate_label_set

__all__ = [
    "PREFIX_SUFFIX",
    "add_label",
    "intersect",
    "label_set",
    "label_set_equal",
    "remove",
    "set_value",
    "subtract",
    "union",
    "value_of",
    "values_of",
]

PREFIX_SUFFIX = ":prefix"

_Item = tuple[str, str, bool]


def _split_prefix(name: str) -> tuple[str, bool]:
    if name.endswith(PREFIX_SUFFIX):
        return name[: -len(PREFIX_SUFFIX)], True
    return name, False


def _items(ls: pb.LabelSet) -> list[_Item]:
    return [(label.name, label.value, label.prefix) for label in ls.labels]


def _assign(ls: pb.LabelSet, items: Iterable[_Item]) -> None:
    del ls.labels[:]
    ls.labels.extend(pb.Label(name=n, value=v, prefix=p) for n, v, p in items)


def _from_items(items: Iterable[_Item]) -> pb.LabelSet:
    out = pb.LabelSet()
    _assign(out, items)
    return out


def _groups(ls: pb.LabelSet) -> dict[str, list[_Item]]:
    out: dict[str, list[_Item]] = {}
    for item in _items(ls):
        out.setdefault(item[0], []).append(item)
    return out


def label_set(*pairs: tuple[str, str] | Mapping[str, str | Iterable[str]]) -> pb.LabelSet:
    """Build a LabelSet from (name, value) pairs and mappings of name to a value
    or to several values, in any order; duplicates collapse.

    For example ``label_set(("bb", "2"), {"aa": ["1", "0"]})`` holds
    aa=0, aa=1, bb=2.

    Raises ValidationError if a label is malformed or the result breaks a
    LabelSet rule (e.g. a name with both empty and non-empty values). A
    ``:prefix`` name suffix is accepted, for building selector sets.
    """
    out = pb.LabelSet()
    for arg in pairs:
        if isinstance(arg, tuple):
            add_label(out, arg[0], arg[1])
            continue
        for name, values in arg.items():
            if isinstance(values, str):
                add_label(out, name, values)
            else:
                for value in values:
                    add_label(out, name, value)
    validate_label_set(out, allow_prefix=True)
    return out


def add_label(ls: pb.LabelSet, name: str, value: str) -> None:
    """Add label `name` = `value`, keeping other values of `name`. Adding a
    label already present is a no-op (except that its prefix flag is updated)."""
    name, prefix = _split_prefix(name)
    items = _items(ls)
    keys = [(n, v) for n, v, _ in items]
    ind = bisect.bisect_left(keys, (name, value))
    if ind != len(keys) and keys[ind] == (name, value):
        if items[ind][2] != prefix:
            ls.labels[ind].prefix = prefix
        return
    items.insert(ind, (name, value, prefix))
    _assign(ls, items)


def set_value(ls: pb.LabelSet, name: str, value: str) -> None:
    """Set label `name` to the single value `value`, replacing any others."""
    name, prefix = _split_prefix(name)
    items = [item for item in _items(ls) if item[0] != name]
    keys = [(n, v) for n, v, _ in items]
    items.insert(bisect.bisect_left(keys, (name, value)), (name, value, prefix))
    _assign(ls, items)


def remove(ls: pb.LabelSet, name: str) -> None:
    """Remove every label of `name`."""
    items = _items(ls)
    kept = [item for item in items if item[0] != name]
    if len(kept) != len(items):
        _assign(ls, kept)


def values_of(ls: pb.LabelSet, name: str) -> list[str]:
    """The values of label `name`, in sorted order; empty if there are none."""
    return [label.value for label in ls.labels if label.name == name]


def value_of(ls: pb.LabelSet, name: str) -> str | None:
    """The first value of label `name`, or None if the set has no such label."""
    for label in ls.labels:
        if label.name == name:
            return label.value
    return None


def union(a: pb.LabelSet, b: pb.LabelSet) -> pb.LabelSet:
    """The labels of every name in `a` or `b`. Where both have labels of a name,
    those of `a` are kept and those of `b` dropped.

    This is Gazette's UnionLabelSets. Brokers apply an append's registers update
    as ``union(union_registers, subtract(registers, subtract_registers))``, so
    that the request's values replace current values of the same names.
    """
    ga, gb = _groups(a), _groups(b)
    return _from_items(
        item for name in sorted(ga.keys() | gb.keys()) for item in ga.get(name) or gb[name]
    )


def _same_values(x: list[_Item], y: list[_Item]) -> bool:
    return [v for _, v, _ in x] == [v for _, v, _ in y]


def intersect(a: pb.LabelSet, b: pb.LabelSet) -> pb.LabelSet:
    """The labels of `a` whose name has exactly the same values in `b`."""
    gb = _groups(b)
    return _from_items(
        item
        for name, group in _groups(a).items()
        if _same_values(group, gb.get(name, []))
        for item in group
    )


def subtract(a: pb.LabelSet, b: pb.LabelSet) -> pb.LabelSet:
    """The labels of `a`, less those of each name having exactly the same values
    in `b`. A name keeps all its labels if its values differ in any way, e.g.
    subtracting ``{x=1}`` from ``{x=1, x=2}`` leaves both (Gazette's
    SubtractLabelSet)."""
    gb = _groups(b)
    return _from_items(
        item
        for name, group in _groups(a).items()
        if not _same_values(group, gb.get(name, []))
        for item in group
    )


def label_set_equal(a: pb.LabelSet, b: pb.LabelSet) -> bool:
    """Whether `a` and `b` hold the same labels, prefix flags included."""
    return _items(a) == _items(b)
