"""Prometheus' text exposition format (version 0.0.4), for the ``/debug/metrics`` endpoints of
brokers and consumers: families of samples rendered at each scrape from the processes' own
counters (no registry, no lock per update)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["CONTENT_TYPE", "Family", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class Family:
    """One metric: its name, type (``counter``, ``gauge``), help text and samples."""

    name: str
    kind: str
    help: str
    samples: list[str] = field(default_factory=list)

    def add(self, value: float, labels: Sequence[tuple[str, str]] = ()) -> None:
        """A sample of `value` with `labels` (name, value) pairs, values escaped."""
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
        self.samples.append(
            f"{self.name}{{{inner}}} {value!r}" if inner else f"{self.name} {value!r}"
        )


def render(families: Iterable[Family]) -> str:
    """`families` in the text format: HELP and TYPE lines, then their samples."""
    lines: list[str] = []
    for f in families:
        lines.append(f"# HELP {f.name} {f.help}")
        lines.append(f"# TYPE {f.name} {f.kind}")
        lines.extend(f.samples)
    return "\n".join(lines) + "\n"
