"""Tests of LabelSet operations."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.broker.protocol import (
    ValidationError,
    add_label,
    intersect,
    label_set,
    label_set_equal,
    pb,
    remove,
    set_value,
    subtract,
    union,
    validate_label_set,
    value_of,
    values_of,
)


def pairs(ls: pb.LabelSet) -> list[tuple[str, str]]:
    return [(label.name, label.value) for label in ls.labels]


def test_label_set_sorts_and_dedups() -> None:
    ls = label_set(("bb", "2"), {"aa": ["1", "0"], "cc": "3"}, ("bb", "2"))
    assert pairs(ls) == [("aa", "0"), ("aa", "1"), ("bb", "2"), ("cc", "3")]


def test_label_set_validates() -> None:
    with pytest.raises(ValidationError, match=r"Labels\[1\]: label aa has both empty"):
        label_set(("aa", ""), ("aa", "1"))
    with pytest.raises(ValidationError, match=r"Labels\[0\].Name: invalid length"):
        label_set(("a", "1"))


def test_prefix_suffix() -> None:
    ls = label_set(("name:prefix", "a/b/"))
    assert ls.labels[0] == pb.Label(name="name", value="a/b/", prefix=True)
    with pytest.raises(ValidationError, match="Prefix: may not be set"):
        validate_label_set(ls)


def test_add_set_remove() -> None:
    ls = pb.LabelSet()
    add_label(ls, "bb", "3")  # Insert into empty.
    add_label(ls, "aa", "0")  # At beginning.
    add_label(ls, "bb", "1")  # In middle.
    add_label(ls, "aa", "2")  # In middle.
    add_label(ls, "bb", "3")  # Repeat.
    add_label(ls, "bb", "4")  # At end.
    assert pairs(ls) == [("aa", "0"), ("aa", "2"), ("bb", "1"), ("bb", "3"), ("bb", "4")]

    set_value(ls, "bb:prefix", "5")  # Replace at end.
    set_value(ls, "cc", "6")  # Insert at end.
    set_value(ls, "00", "6")  # Insert at beginning.
    assert pairs(ls) == [("00", "6"), ("aa", "0"), ("aa", "2"), ("bb", "5"), ("cc", "6")]
    assert ls.labels[3].prefix

    set_value(ls, "00", "7")
    set_value(ls, "aa", "8")
    assert pairs(ls) == [("00", "7"), ("aa", "8"), ("bb", "5"), ("cc", "6")]

    remove(ls, "bb")
    remove(ls, "bb")  # Not found.
    remove(ls, "0")  # Not found, before beginning.
    remove(ls, "dd")  # Not found, past end.
    assert pairs(ls) == [("00", "7"), ("aa", "8"), ("cc", "6")]
    for name in ("00", "aa", "cc"):
        remove(ls, name)
    assert pairs(ls) == []


def test_values_of_and_value_of() -> None:
    ls = label_set(("DDDD", "111"), ("aaa", "222"), ("aaa", "333"), ("ccc", ""), ("ff", "555"))
    assert values_of(ls, "aaa") == ["222", "333"]
    assert values_of(ls, "ccc") == [""]
    assert values_of(ls, "bbb") == []
    assert value_of(ls, "aaa") == "222"
    assert value_of(ls, "ccc") == ""
    assert value_of(ls, "DDDD") == "111"
    assert value_of(ls, "zzz") is None


def test_union_prefers_lhs() -> None:
    a = label_set(("bbb", "val-1"), ("bbb", "val-2"), ("ccc", "val-3"))
    b = label_set(("aaa", "val-4"), ("aaa", "val-5"), ("bbb", "val-6"), ("ddd", "val-7"))
    assert pairs(union(a, b)) == [
        ("aaa", "val-4"),
        ("aaa", "val-5"),
        ("bbb", "val-1"),  # Values of a's bbb are kept.
        ("bbb", "val-2"),
        ("ccc", "val-3"),
        ("ddd", "val-7"),
    ]


_LHS = label_set(
    ("aaa", "val"),  # Matched.
    ("bbb", "val-1"),  # Differs on value.
    ("ccc", "val-1"),
    ("ccc", "val-2"),  # Value only on LHS.
    ("ddd", "val-1"),  # Matched.
    ("ddd", "val-2"),  # Matched.
    ("eee", "val"),  # Only on LHS.
    ("ggg", "val"),  # Matched.
)
_RHS = label_set(
    ("aaa", "val"),
    ("bbb", "val-2"),
    ("ccc", "val-1"),
    ("ddd", "val-1"),
    ("ddd", "val-2"),
    ("fff", "val"),  # Only on RHS.
    ("ggg", "val"),
)


def test_intersect() -> None:
    assert pairs(intersect(_LHS, _RHS)) == [
        ("aaa", "val"),
        ("ddd", "val-1"),
        ("ddd", "val-2"),
        ("ggg", "val"),
    ]


def test_subtract() -> None:
    assert pairs(subtract(_LHS, _RHS)) == [
        ("bbb", "val-1"),
        ("ccc", "val-1"),
        ("ccc", "val-2"),
        ("eee", "val"),
    ]


def test_registers_update_as_brokers_apply_it() -> None:
    registers = label_set(("cursor", "10"), ("owner", "alice"), ("owner", "bob"))
    request_union = label_set(("cursor", "20"))
    request_subtract = label_set(("owner", "alice"), ("owner", "bob"))
    updated = union(request_union, subtract(registers, request_subtract))
    assert pairs(updated) == [("cursor", "20")]


def test_combinators_leave_arguments_alone() -> None:
    a, b = label_set(("aa", "1")), label_set(("bb", "2"))
    a_copy, b_copy = pb.LabelSet(), pb.LabelSet()
    a_copy.CopyFrom(a)
    b_copy.CopyFrom(b)
    union(a, b), subtract(a, b), intersect(a, b)
    assert a == a_copy and b == b_copy


def test_label_set_equal() -> None:
    lhs = label_set(("one", "1"), ("three", "3"))
    rhs = label_set(("one", "1"), ("two:prefix", "pre/"))
    assert not label_set_equal(lhs, rhs)
    add_label(rhs, "three", "3")
    assert not label_set_equal(lhs, rhs)
    add_label(lhs, "two", "pre/")
    assert not label_set_equal(lhs, rhs)  # Differs in the prefix flag.
    add_label(lhs, "two:prefix", "pre/")
    assert label_set_equal(lhs, rhs)


# --- properties -------------------------------------------------------------------

_NAMES = st.sampled_from(["aa", "bb", "cc", "dd", "app.gazette.dev/x"])
_VALUES = st.sampled_from(["v1", "v2", "v3", "a/b", "x=y"])


@st.composite
def label_sets(draw: st.DrawFn) -> pb.LabelSet:
    groups = draw(
        st.dictionaries(_NAMES, st.one_of(st.just([""]), st.lists(_VALUES, min_size=1, max_size=3)))
    )
    return label_set(*({name: values} for name, values in groups.items()))


def _groups(ls: pb.LabelSet) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in pairs(ls):
        out.setdefault(name, []).append(value)
    return out


@given(label_sets(), label_sets())
def test_union_properties(a: pb.LabelSet, b: pb.LabelSet) -> None:
    out = union(a, b)
    validate_label_set(out)
    ga, gb, go = _groups(a), _groups(b), _groups(out)
    assert go.keys() == ga.keys() | gb.keys()
    for name, values in go.items():
        assert values == ga.get(name, gb.get(name))
    assert label_set_equal(union(a, a), a)
    assert label_set_equal(union(out, b), out)


@given(label_sets(), label_sets())
def test_subtract_and_intersect_properties(a: pb.LabelSet, b: pb.LabelSet) -> None:
    sub, inter = subtract(a, b), intersect(a, b)
    validate_label_set(sub)
    validate_label_set(inter)
    assert pairs(subtract(a, a)) == []
    assert label_set_equal(subtract(a, pb.LabelSet()), a)
    # a splits by name into what b matches exactly and what it doesn't.
    assert sorted(pairs(sub) + pairs(inter)) == pairs(a)
    gb = _groups(b)
    for name, values in _groups(sub).items():
        assert gb.get(name) != values


@given(label_sets(), _NAMES, _VALUES)
def test_mutators_keep_invariants(ls: pb.LabelSet, name: str, value: str) -> None:
    if values_of(ls, name) != [""]:
        add_label(ls, name, value)
        validate_label_set(ls)
        assert value in values_of(ls, name)
    set_value(ls, name, value)
    validate_label_set(ls)
    assert values_of(ls, name) == [value]
    remove(ls, name)
    validate_label_set(ls)
    assert value_of(ls, name) is None
