"""Label selectors: parsing, canonical formatting, and matching.

A LabelSelector picks LabelSets (of journals, shards, or registers). Its text
form, shared with Gazette's ``gazctl -l``, is a comma-separated list of
expressions:

=====================  ==================================================
``foo=bar``            label foo present with value bar (also ``==``)
``foo!=bar``           label foo not present with value bar
``foo``                label foo present, with any value
``!foo``               label foo not present
``foo in (a, b)``      label foo present with value a or b
``foo notin (a, b)``   label foo not present with value a or b (also ``not in``)
=====================  ==================================================

A name suffixed ``:prefix`` (``name:prefix=examples/``) matches label values
which start with the given value, rather than equal it. Whitespace between
tokens is ignored, and a trailing comma is allowed.

Matching: for each distinct name of Include, some label of that name must match
one of the name's values (an empty value matches any value); and for no name of
Exclude may a label match.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.labels import PREFIX_SUFFIX, add_label, union
from gazette.broker.protocol.validation import PATH_SYMBOLS, TOKEN_SYMBOLS, validate_label_selector

__all__ = [
    "format_label_selector",
    "journal_labels_with_meta",
    "matches",
    "parse_label_selector",
]


def _is_name_char(ch: str) -> bool:
    return ch in TOKEN_SYMBOLS or unicodedata.category(ch)[0] in "LN"


def _is_value_char(ch: str) -> bool:
    return ch in PATH_SYMBOLS or unicodedata.category(ch)[0] in "LN"


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def at_end(self) -> bool:
        return self.pos == len(self.text)

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def take(self, literal: str) -> bool:
        if self.text.startswith(literal, self.pos):
            self.pos += len(literal)
            return True
        return False

    def run(self, pred: Callable[[str], bool]) -> str:
        start = self.pos
        while self.pos < len(self.text) and pred(self.text[self.pos]):
            self.pos += 1
        return self.text[start : self.pos]

    def error(self, expected: str, at: int | None = None) -> ValidationError:
        pos = self.pos if at is None else at
        if pos >= len(self.text):
            found = "end of selector"
        else:
            end = pos + 1
            if _is_value_char(self.text[pos]):
                while end < len(self.text) and _is_value_char(self.text[end]):
                    end += 1
            found = repr(self.text[pos:end])
        return ValidationError(
            f"expected {expected} at position {pos}, found {found} (in {self.text!r})"
        )

    def name(self) -> str:
        self.skip_ws()
        name = self.run(_is_name_char)
        if not name:
            raise self.error("a label name")
        if self.take(PREFIX_SUFFIX):
            name += PREFIX_SUFFIX
        return name

    def value(self) -> str:
        self.skip_ws()
        return self.run(_is_value_char)

    def value_list(self) -> list[str]:
        self.skip_ws()
        if not self.take("("):
            raise self.error("'('")
        values: list[str] = []
        while True:
            value = self.value()
            if not value:
                raise self.error("a value")
            values.append(value)
            self.skip_ws()
            if self.take(")"):
                return values
            if not self.take(","):
                raise self.error("',' or ')'")

    def expression(self, sel: pb.LabelSelector) -> None:
        self.skip_ws()
        if self.take("!"):
            add_label(sel.exclude, self.name(), "")
            return
        name = self.name()
        self.skip_ws()
        if self.take("!="):
            add_label(sel.exclude, name, self.value())
        elif self.take("==") or self.take("="):
            add_label(sel.include, name, self.value())
        elif self.at_end() or self.peek() == ",":
            add_label(sel.include, name, "")
        else:
            start = self.pos
            word = self.run(str.isalpha)
            if word == "not":
                self.skip_ws()
                if self.run(str.isalpha) != "in":
                    raise self.error("'in' after 'not'", start)
                word = "notin"
            if word == "in":
                target = sel.include
            elif word == "notin":
                target = sel.exclude
            else:
                raise self.error("one of '=', '!=', 'in', 'notin', ',' or end", start)
            for value in self.value_list():
                add_label(target, name, value)


def parse_label_selector(text: str) -> pb.LabelSelector:
    """Parse a selector from its text form (see the module docs).

    Raises ValidationError naming the position and offending token on a syntax
    error, or the field of a selector which parses but is invalid (e.g.
    ``foo, foo in (bar)`` has both empty and non-empty values of foo).
    """
    p = _Parser(text)
    # Include and Exclude are always present, as in Gazette's encoding.
    sel = pb.LabelSelector(include=pb.LabelSet(), exclude=pb.LabelSet())
    p.skip_ws()
    while not p.at_end():
        p.expression(sel)
        p.skip_ws()
        if p.at_end():
            break
        if not p.take(","):
            raise p.error("',' or end of selector")
        p.skip_ws()
    validate_label_selector(sel)
    return sel


def _format_set(labels: pb.LabelSet, exclude: bool) -> list[str]:
    groups: dict[str, list[str]] = {}
    for label in labels.labels:
        name = label.name + (PREFIX_SUFFIX if label.prefix else "")
        groups.setdefault(name, []).append(label.value)

    parts: list[str] = []
    for name in sorted(groups):
        values = sorted(groups[name])
        if values == [""]:
            parts.append(("!" if exclude else "") + name)
        elif len(values) == 1 and not values[0].startswith("="):
            parts.append(name + ("!=" if exclude else "=") + values[0])
        else:
            # Also used for a single value starting with '=', which would
            # otherwise read as part of an '==' operator.
            parts.append(f"{name} {'notin' if exclude else 'in'} ({','.join(values)})")
    return parts


def format_label_selector(sel: pb.LabelSelector) -> str:
    """The canonical text form of `sel`, which `parse_label_selector` reads back
    to an equal selector: includes then excludes, each sorted by name, comma
    separated, e.g. ``a=1,b in (2,3),c,!d,e!=4``."""
    return ",".join(_format_set(sel.include, False) + _format_set(sel.exclude, True))


def _group_matches(selector: list[pb.Label], values: list[str]) -> bool:
    for s in selector:
        for value in values:
            if s.value == "" or (value.startswith(s.value) if s.prefix else value == s.value):
                return True
    return False


def _groups(labels: pb.LabelSet) -> dict[str, list[pb.Label]]:
    out: dict[str, list[pb.Label]] = {}
    for label in labels.labels:
        out.setdefault(label.name, []).append(label)
    return out


def matches(sel: pb.LabelSelector, labels: pb.LabelSet) -> bool:
    """Whether `labels` is matched by `sel` (see the module docs)."""
    values: dict[str, list[str]] = {}
    for label in labels.labels:
        values.setdefault(label.name, []).append(label.value)
    for name, group in _groups(sel.exclude).items():
        if _group_matches(group, values.get(name, [])):
            return False
    for name, group in _groups(sel.include).items():
        if not _group_matches(group, values.get(name, [])):
            return False
    return True


def journal_labels_with_meta(spec: pb.JournalSpec) -> pb.LabelSet:
    """The labels of `spec` plus its meta-labels, against which List matches
    selectors: ``name`` (the journal name), and ``prefix`` once for each parent
    directory of the name, with its trailing '/' (``a/b/c`` has prefixes
    ``a/`` and ``a/b/``)."""
    meta = pb.LabelSet()
    add_label(meta, "name", spec.name)
    for i, ch in enumerate(spec.name):
        if ch == "/":
            add_label(meta, "prefix", spec.name[: i + 1])
    return union(meta, spec.labels)
