"""Prometheus' text format read back by the tests of the /debug/metrics endpoints."""

from __future__ import annotations

import re

SAMPLE = re.compile(r'^([a-z_]+)(?:\{((?:[a-z]+="(?:[^"\\]|\\.)*",?)*)\})? (\S+)$')


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples by (name, labels); checks every line is a HELP, a TYPE or a sample."""
    out = {}
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = tuple(
            (k, v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\"))
            for k, v in re.findall(r'([a-z]+)="((?:[^"\\]|\\.)*)"', m.group(2) or "")
        )
        out[(m.group(1), labels)] = float(m.group(3))
    return out
