"""Plain-text tables for gazctl output."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["apply_plan", "render_table"]


def apply_plan(req: Any, name_of: Callable[[Any], str]) -> list[str]:
    """What a dry-run apply prints: a comment line per change (`name_of` names an upserted
    spec), then the ApplyRequest (journals' or shards') in protobuf text format."""
    lines = []
    for ch in req.changes:
        if ch.HasField("upsert"):
            verb = "update" if ch.expect_mod_revision else "create"
            lines.append(
                f"# {verb} {name_of(ch.upsert)} (expect revision {ch.expect_mod_revision})"
            )
        else:
            lines.append(f"# delete {ch.delete} (expect revision {ch.expect_mod_revision})")
    lines.append(str(req).rstrip("\n"))
    return lines


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces; trailing whitespace stripped."""
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [header, *rows]:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
