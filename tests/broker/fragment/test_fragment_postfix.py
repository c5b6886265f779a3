"""Path postfix templates, evaluated as Go's text/template would for the supported forms."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from gazette.broker.fragment.postfix import (
    PostfixTemplateError,
    evaluate_postfix_template,
    format_go_layout,
)
from gazette.broker.protocol import protocol_pb2 as pb

T = datetime(2024, 3, 5, 14, 7, 9, 123456, tzinfo=UTC)
SPEC = pb.JournalSpec(name="a/journal/part-000")


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("", ""),
        ("static/dir", "static/dir"),
        ('date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}', "date=2024-03-05"),
        (
            'date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}/'
            'hour={{ .Spool.FirstAppendTime.Format "15" }}',
            "date=2024-03-05/hour=14",
        ),
        ('{{.Spool.FirstAppendTime.Format "20060102T150405Z0700"}}', "20240305T140709Z"),
        ('{{ .FirstAppendTime.Format "2006/01/02" }}', "2024/03/05"),
        ("{{ .Spool.FirstAppendTime.Format `Jan-2006` }}", "Mar-2024"),
        ("j={{ .JournalSpec.Name }}", "j=a/journal/part-000"),
        ("j={{.Name}}", "j=a/journal/part-000"),
        ("x/ {{- .JournalSpec.Name -}} /y", "x/a/journal/part-000/y"),
        ("a{{/* a comment */}}b", "ab"),
    ],
)
def test_evaluate(template: str, want: str) -> None:
    assert evaluate_postfix_template(template, T, SPEC) == want


@pytest.mark.parametrize(
    ("layout", "want"),
    [
        ("2006-01-02 15:04:05", "2024-03-05 14:07:09"),
        ("Jan 2, 2006 at 3:04pm (MST)", "Mar 5, 2024 at 2:07pm (UTC)"),
        ("Monday January _2 03PM", "Tuesday March  5 02PM"),
        ("06 1 2 3 4 5", "24 3 5 2 7 9"),
        ("002", "065"),
        ("15:04:05.000", "14:07:09.123"),
        ("15:04:05.999999", "14:07:09.123456"),
        ("05.999999999", "09.123456"),
        ("-0700 -07:00 Z07:00", "+0000 +00:00 Z"),
        ("_2006", "_2024"),
        ("no tokens here", "no tokens here"),
    ],
)
def test_go_layouts(layout: str, want: str) -> None:
    assert format_go_layout(T, layout) == want


def test_zones() -> None:
    t = datetime(2024, 1, 1, 23, 30, tzinfo=timezone(timedelta(hours=-5, minutes=-30)))
    assert format_go_layout(t, "2006-01-02T15:04:05-07:00") == "2024-01-01T23:30:00-05:30"
    assert format_go_layout(t, "Z0700 MST") == "-0530 -0530"
    # Naive times are taken as UTC.
    naive = datetime(2024, 1, 1, 0, 0)
    assert evaluate_postfix_template('{{ .Spool.FirstAppendTime.Format "MST" }}', naive, SPEC) == (
        "UTC"
    )


@pytest.mark.parametrize(
    "template",
    [
        "{{ .Spool.Begin }}",
        '{{ printf "%d" 1 }}',
        '{{ .Spool.FirstAppendTime.Format "2006" | lower }}',
        "{{ if .Name }}x{{ end }}",
        "unbalanced {{ .Name",
    ],
)
def test_unsupported(template: str) -> None:
    with pytest.raises(PostfixTemplateError) as info:
        evaluate_postfix_template(template, T, SPEC)
    assert "unsupported" in str(info.value) or "unbalanced" in str(info.value)


def test_error_names_expression() -> None:
    with pytest.raises(PostfixTemplateError, match=r"\.Spool\.Begin"):
        evaluate_postfix_template("d={{ .Spool.Begin }}", T, SPEC)
