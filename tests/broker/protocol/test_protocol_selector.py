"""Tests of label selector parsing, formatting and matching."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.broker.protocol import (
    ValidationError,
    format_label_selector,
    journal_labels_with_meta,
    label_set,
    matches,
    parse_label_selector,
    pb,
    validate_label_selector,
    values_of,
)


def sel(include: pb.LabelSet | None = None, exclude: pb.LabelSet | None = None) -> pb.LabelSelector:
    return pb.LabelSelector(include=include or pb.LabelSet(), exclude=exclude or pb.LabelSet())


@pytest.mark.parametrize(
    "text, expect",
    [
        ("", sel()),
        ("foo = bar", sel(label_set(("foo", "bar")))),
        ("foo==bar", sel(label_set(("foo", "bar")))),
        ("foo:prefix =bar", sel(label_set(("foo:prefix", "bar")))),
        ("foo != bar", sel(exclude=label_set(("foo", "bar")))),
        ("foo ", sel(label_set(("foo", "")))),
        (" !foo", sel(exclude=label_set(("foo", "")))),
        ("! foo", sel(exclude=label_set(("foo", "")))),
        ("foo=", sel(label_set(("foo", "")))),
        (
            " foo in (bing, baz,bar)",
            sel(label_set(("foo", "bar"), ("foo", "baz"), ("foo", "bing"))),
        ),
        (" foo not in ( pear, apple )", sel(exclude=label_set(("foo", "apple"), ("foo", "pear")))),
        ("foo notin(pear)", sel(exclude=label_set(("foo", "pear")))),
        (
            "foo==bar, baz !=bing ,apple:prefix in (fruit, banana)",
            sel(
                label_set(("apple:prefix", "banana"), ("apple:prefix", "fruit"), ("foo", "bar")),
                label_set(("baz", "bing")),
            ),
        ),
        (
            "!foo,baz,bing:prefix not in (thing-one, thing-2),!bar,",
            sel(
                label_set(("baz", "")),
                label_set(
                    ("bar", ""),
                    ("bing:prefix", "thing-2"),
                    ("bing:prefix", "thing-one"),
                    ("foo", ""),
                ),
            ),
        ),
        (
            "foo = ba=ar, baz=bi=ngo,exc!=who=ops",
            sel(label_set(("foo", "ba=ar"), ("baz", "bi=ngo")), label_set(("exc", "who=ops"))),
        ),
        (
            "foo in (bi=ng,ba=ar), exc notin (who=ops,oth=er)",
            sel(
                label_set(("foo", "bi=ng"), ("foo", "ba=ar")),
                label_set(("exc", "who=ops"), ("exc", "oth=er")),
            ),
        ),
        ("foo===bar", sel(label_set(("foo", "=bar")))),
        ("name:prefix=examples/", sel(label_set(("name:prefix", "examples/")))),
        ("in in (in)", sel(label_set(("in", "in")))),
        ("\tfoo\n=\nbar ,\n", sel(label_set(("foo", "bar")))),
    ],
)
def test_parse(text: str, expect: pb.LabelSelector) -> None:
    parsed = parse_label_selector(text)
    assert parsed == expect
    assert parse_label_selector(format_label_selector(parsed)) == parsed


@pytest.mark.parametrize(
    "text, error",
    [
        (
            "apple,banana err in (bar)",
            "expected one of '=', '!=', 'in', 'notin', ',' or end at position 13, found 'err'",
        ),
        ("apple,banana in (bar,err baz)", "expected ',' or ')' at position 25, found 'baz'"),
        ("ban=ana in (bar)", "expected ',' or end of selector at position 8, found 'in'"),
        ("foo, foo in (bar)", "Include.Labels[1]: label foo has both empty and non-empty values"),
        ("a=b", "Include.Labels[0].Name: invalid length (1; expected 2"),
        (",foo", "expected a label name at position 0, found ','"),
        ("foo,,bar", "expected a label name at position 4, found ','"),
        ("!", "expected a label name at position 1, found end of selector"),
        ("foo in ()", "expected a value at position 8, found ')'"),
        ("foo in (a,)", "expected a value at position 10"),
        ("foo in bar", "expected '(' at position 7, found 'bar'"),
        ("foo in (bar", "expected ',' or ')' at position 11, found end of selector"),
        ("foo not at (bar)", "expected 'in' after 'not' at position 4, found 'not'"),
        (
            "foo ~ bar",
            "expected one of '=', '!=', 'in', 'notin', ',' or end at position 4, found '~'",
        ),
        ("foo=bar baz", "expected ',' or end of selector at position 8, found 'baz'"),
        ("foo:prefixx=a", "at position 10, found 'x=a'"),
        ("foo=b@r", "expected ',' or end of selector at position 5, found '@'"),
    ],
)
def test_parse_errors(text: str, error: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_label_selector(text)
    assert error in str(info.value), str(info.value)


def test_format_canonical() -> None:
    s = parse_label_selector(
        "zz notin (b,a), yy!=q, !xx, name:prefix=examples/, cc in (2,1), bb, aa=1, aa:prefix=p/"
    )
    assert format_label_selector(s) == (
        "aa=1,aa:prefix=p/,bb,cc in (1,2),name:prefix=examples/,!xx,yy!=q,zz notin (a,b)"
    )
    # A value starting with '=' uses the set form, as "aa==x" would read as aa=x.
    eq = sel(label_set(("aa", "=x")), label_set(("bb", "=y")))
    assert format_label_selector(eq) == "aa in (=x),bb notin (=y)"
    assert parse_label_selector(format_label_selector(eq)) == eq


_MATCH_SEL = sel(
    label_set(("inc-1:prefix", "a-val/"), ("inc-2", ""), ("inc-3", "val-1"), ("inc-3", "val-2")),
    label_set(("exc-1", ""), ("exc-2", "val-3"), ("exc-2", "val-4")),
)


@pytest.mark.parametrize(
    "labels, expect",
    [
        (label_set(), False),
        (
            label_set(("foo", "bar"), ("inc-1", "a-val/a/1"), ("inc-2", "any"), ("inc-3", "val-1")),
            True,
        ),
        (
            label_set(("foo", "bar"), ("inc-1", "a-val/b/2"), ("inc-2", "foo"), ("inc-3", "val-1")),
            True,
        ),
        (
            label_set(("foo", "bar"), ("inc-1", "a-val/c/3"), ("inc-2", "any"), ("inc-3", "val-2")),
            True,
        ),
        (label_set(("inc-1", "a-val/"), ("inc-2", "any"), ("inc-3", "val-2")), True),
        (label_set(("inc-1", "bad-val/4"), ("inc-2", "any"), ("inc-3", "val-1")), False),
        (label_set(("inc-1", "a-val"), ("inc-2", "any"), ("inc-3", "val-1")), False),
        (label_set(("inc-1", "a-val/5"), ("inc-3", "val-1")), False),  # inc-2 missing.
        (label_set(("inc-1", "a-val/6"), ("inc-2", "any"), ("inc-3", "val-other")), False),
        (
            label_set(
                ("exc-1", "any"), ("inc-1", "a-val/a/7"), ("inc-2", "any"), ("inc-3", "val-1")
            ),
            False,
        ),
        (
            label_set(
                ("exc-2", "val-4"), ("inc-1", "a-val/8"), ("inc-2", "any"), ("inc-3", "val-1")
            ),
            False,
        ),
        (
            label_set(
                ("exc-2", "val-ok"), ("inc-1", "a-val/9"), ("inc-2", "any"), ("inc-3", "val-1")
            ),
            True,
        ),
        (
            label_set(("inc-1", "x"), ("inc-1", "a-val/z"), ("inc-2", "any"), ("inc-3", "val-1")),
            True,
        ),
    ],
)
def test_matches(labels: pb.LabelSet, expect: bool) -> None:
    assert matches(_MATCH_SEL, labels) is expect


def test_matches_exclude_only_and_empty() -> None:
    exclude_only = sel(exclude=_MATCH_SEL.exclude)
    assert matches(exclude_only, label_set())
    assert matches(exclude_only, label_set(("foo", "bar")))
    assert matches(exclude_only, label_set(("exc-2", "val-ok")))
    assert not matches(exclude_only, label_set(("exc-2", "val-3")))
    assert not matches(exclude_only, label_set(("exc-1", "any")))
    assert matches(sel(), label_set())
    assert matches(sel(), label_set(("aa", "b")))


def test_journal_labels_with_meta() -> None:
    spec = pb.JournalSpec(name="examples/words/part-000", labels=label_set(("topic", "words")))
    labels = journal_labels_with_meta(spec)
    assert values_of(labels, "name") == ["examples/words/part-000"]
    assert values_of(labels, "prefix") == ["examples/", "examples/words/"]
    assert values_of(labels, "topic") == ["words"]
    assert matches(parse_label_selector("prefix=examples/words/"), labels)
    assert matches(parse_label_selector("name:prefix=examples/wo"), labels)
    assert matches(parse_label_selector("name=examples/words/part-000, topic"), labels)
    assert not matches(parse_label_selector("prefix=examples/word/"), labels)
    assert not matches(parse_label_selector("prefix!=examples/"), labels)
    assert values_of(journal_labels_with_meta(pb.JournalSpec(name="flat")), "prefix") == []


# --- properties -------------------------------------------------------------------

_NAMES = st.sampled_from(["aa", "bb", "name", "app.gazette.dev/x", "in", "not", "ünï"])
_VALUES = st.text(alphabet="ab=/%.-_+1é", min_size=1, max_size=6)


@st.composite
def selector_sets(draw: st.DrawFn) -> pb.LabelSet:
    out = pb.LabelSet()
    for name in draw(st.lists(_NAMES, unique=True, max_size=4)):
        if draw(st.booleans()):
            labels = [(name, "", draw(st.booleans()))]
        else:
            values = draw(st.lists(_VALUES, min_size=1, max_size=3, unique=True))
            labels = [(name, v, draw(st.booleans())) for v in values]
        out.labels.extend(pb.Label(name=n, value=v, prefix=p) for n, v, p in labels)
    labels_sorted = sorted(out.labels, key=lambda label: (label.name, label.value))
    return pb.LabelSet(labels=labels_sorted)


@given(selector_sets(), selector_sets())
def test_format_parse_round_trip(include: pb.LabelSet, exclude: pb.LabelSet) -> None:
    s = sel(include, exclude)
    validate_label_selector(s)
    text = format_label_selector(s)
    assert parse_label_selector(text) == s
    assert format_label_selector(parse_label_selector(text)) == text


def _parse_or_validation_error(text: str) -> None:
    try:
        s = parse_label_selector(text)
    except ValidationError:
        return
    assert parse_label_selector(format_label_selector(s)) == s


@given(st.text())
def test_parse_random_text_raises_only_validation_error(text: str) -> None:
    _parse_or_validation_error(text)


@given(st.text(alphabet="ab =!,()innot:prefix", max_size=30))
def test_parse_selector_like_text(text: str) -> None:
    _parse_or_validation_error(text)
