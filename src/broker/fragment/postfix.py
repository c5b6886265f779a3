"""Evaluation of `JournalSpec.Fragment.path_postfix_template`.

Upstream evaluates the template with Go's text/template over a value exposing the spool
(``.Spool``, including ``.Spool.FirstAppendTime``, a Go ``time.Time``) and the journal spec
(``.JournalSpec``), with their fields also promoted to the top level. Templates in the wild
partition fragments by date, e.g.::

    date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}/{{ .JournalSpec.Name }}

We support the forms people write rather than Go templates in general:

- ``{{ .Spool.FirstAppendTime.Format "<Go layout>" }}`` (also ``.FirstAppendTime.Format``),
  with Go reference-time layouts (``2006 01 02 15 04 05 Jan January Mon Monday MST -0700 PM``
  ``.000`` ...), formatted in the zone of the given time (naive times are taken as UTC);
- ``{{ .JournalSpec.Name }}`` (also ``.Name``) and ``{{ .Spool.Journal }}`` (also ``.Journal``);
- trim markers ``{{-`` and ``-}}``, and ``{{/* comments */}}``.

Anything else raises `PostfixTemplateError` naming the unsupported expression.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

from gazette.broker.protocol import protocol_pb2 as pb


class PostfixTemplateError(ValueError):
    """The template uses an expression we do not support, or is malformed."""


_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.DOTALL)
_FORMAT = re.compile(r'^\.(?:Spool\.)?FirstAppendTime\.Format\s+"((?:[^"\\]|\\.)*)"$')
_FORMAT_RAW = re.compile(r"^\.(?:Spool\.)?FirstAppendTime\.Format\s+`([^`]*)`$")

_MONTHS = [
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
]  # fmt: skip
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _zone_offset(t: datetime, sep: str, seconds: bool, z: bool, hours_only: bool = False) -> str:
    off = t.utcoffset()
    total = int(off.total_seconds()) if off is not None else 0
    if z and total == 0:
        return "Z"
    sign = "-" if total < 0 else "+"
    total = abs(total)
    hh, mm, ss = total // 3600, (total // 60) % 60, total % 60
    if hours_only:
        return f"{sign}{hh:02d}"
    out = f"{sign}{hh:02d}{sep}{mm:02d}"
    if seconds:
        out += f"{sep}{ss:02d}"
    return out


def _zone_name(t: datetime) -> str:
    name = t.tzname()
    if not name or name == "UTC+00:00":
        return "UTC"
    if name.startswith("UTC") and len(name) > 3:
        return _zone_offset(t, "", False, False)  # Unnamed fixed zone: Go prints -0700 form.
    return name


# Tokens of Go's reference layout, longest first within a shared prefix (as Go matches them).
_TOKENS: list[tuple[str, Callable[[datetime], str]]] = [
    ("January", lambda t: _MONTHS[t.month - 1]),
    ("Jan", lambda t: _MONTHS[t.month - 1][:3]),
    ("Monday", lambda t: _DAYS[t.weekday()]),
    ("Mon", lambda t: _DAYS[t.weekday()][:3]),
    ("MST", _zone_name),
    ("2006", lambda t: f"{t.year:04d}"),
    ("002", lambda t: f"{t.timetuple().tm_yday:03d}"),
    ("01", lambda t: f"{t.month:02d}"),
    ("02", lambda t: f"{t.day:02d}"),
    ("03", lambda t: f"{(t.hour % 12) or 12:02d}"),
    ("04", lambda t: f"{t.minute:02d}"),
    ("05", lambda t: f"{t.second:02d}"),
    ("06", lambda t: f"{t.year % 100:02d}"),
    ("__2", lambda t: f"{t.timetuple().tm_yday:>3d}"),
    ("_2", lambda t: f"{t.day:>2d}"),
    ("15", lambda t: f"{t.hour:02d}"),
    ("1", lambda t: str(t.month)),
    ("2", lambda t: str(t.day)),
    ("3", lambda t: str((t.hour % 12) or 12)),
    ("4", lambda t: str(t.minute)),
    ("5", lambda t: str(t.second)),
    ("PM", lambda t: "PM" if t.hour >= 12 else "AM"),
    ("pm", lambda t: "pm" if t.hour >= 12 else "am"),
    ("-07:00:00", lambda t: _zone_offset(t, ":", True, False)),
    ("-070000", lambda t: _zone_offset(t, "", True, False)),
    ("-07:00", lambda t: _zone_offset(t, ":", False, False)),
    ("-0700", lambda t: _zone_offset(t, "", False, False)),
    ("-07", lambda t: _zone_offset(t, "", False, False, hours_only=True)),
    ("Z07:00:00", lambda t: _zone_offset(t, ":", True, True)),
    ("Z070000", lambda t: _zone_offset(t, "", True, True)),
    ("Z07:00", lambda t: _zone_offset(t, ":", False, True)),
    ("Z0700", lambda t: _zone_offset(t, "", False, True)),
    ("Z07", lambda t: _zone_offset(t, "", False, True, hours_only=True)),
]
_FRACTION = re.compile(r"[.,](0+|9+)(?![0-9])")


def format_go_layout(t: datetime, layout: str) -> str:
    """Format `t` as Go's ``time.Time.Format(layout)`` would."""
    out: list[str] = []
    i = 0
    while i < len(layout):
        m = _FRACTION.match(layout, i)
        if m is not None:
            digits = m.group(1)
            frac = f"{t.microsecond:06d}{0:03d}"[: len(digits)]
            if digits[0] == "9":
                frac = frac.rstrip("0")
                out.append(layout[i] + frac if frac else "")
            else:
                out.append(layout[i] + frac)
            i = m.end()
            continue
        for token, fn in _TOKENS:
            if layout.startswith(token, i):
                # "_2006" is an underscore then a year, not a space-padded day.
                if token == "_2" and layout.startswith("_2006", i):
                    continue
                out.append(fn(t))
                i += len(token)
                break
        else:
            out.append(layout[i])
            i += 1
    return "".join(out)


def _unquote(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), s)


def evaluate_postfix_template(
    template: str, first_append_time: datetime, spec: pb.JournalSpec
) -> str:
    """Evaluate `template` for a spool whose first append was at `first_append_time`.

    Returns "" for an empty template. Raises `PostfixTemplateError` for unsupported or
    malformed actions.
    """
    if first_append_time.tzinfo is None:
        first_append_time = first_append_time.replace(tzinfo=UTC)

    out: list[str] = []
    pos = 0
    for m in _ACTION.finditer(template):
        text = template[pos : m.start()]
        if m.group(1):
            text = text.rstrip()
        out.append(text)
        pos = m.end()
        if m.group(3):
            rest = template[pos:]
            pos += len(rest) - len(rest.lstrip())

        expr = m.group(2).strip()
        if expr.startswith("/*") and expr.endswith("*/"):
            continue
        if f := _FORMAT.match(expr):
            out.append(format_go_layout(first_append_time, _unquote(f.group(1))))
        elif f := _FORMAT_RAW.match(expr):
            out.append(format_go_layout(first_append_time, f.group(1)))
        elif expr in (".JournalSpec.Name", ".Name"):
            out.append(spec.name)
        elif expr in (".Spool.Journal", ".Journal"):
            out.append(spec.name)
        else:
            raise PostfixTemplateError(
                f"unsupported path_postfix_template expression {{{{{m.group(2)}}}}} in "
                f'{template!r}: supported are .Spool.FirstAppendTime.Format "<layout>", '
                ".JournalSpec.Name and .Spool.Journal"
            )
    tail = template[pos:]
    if "{{" in tail or "}}" in tail:
        raise PostfixTemplateError(f"unbalanced action delimiters in {template!r}")
    out.append(tail)
    return "".join(out)


__all__ = ["PostfixTemplateError", "evaluate_postfix_template", "format_go_layout"]
