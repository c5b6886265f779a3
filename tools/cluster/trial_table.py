"""The outcome of each fault's trials, as a table and a JSON summary (no I/O).

A trial is one injection of a fault with its checks: the stream-sum verifier over the
streams chunked during it, the acknowledged appends still readable where acknowledged, the
zombies the fault made (processes cut off or paused past their lease TTL) fenced, and the
time from healing until every journal and shard had its full replica set again. A run fails
if any trial found a violation, a lost append, a zombie not fenced, or a failure (a process
that did not come back, a chunker that gave up, a cluster that did not converge).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field


@dataclass
class TrialResult:
    fault: str
    streams_verified: int = 0
    streams_expected: int = 0
    violations: int = 0
    """Exactly-once violations the verifier found (missing, duplicate, wrong, unexpected)."""
    violation_kinds: dict[str, int] = field(default_factory=dict)
    """The violations by kind: a missing sum (a shard that stopped) is not a duplicate."""
    acks_checked: int = 0
    acks_lost: int = 0
    zombies: int = 0
    """Lease-holding processes the fault cut off or paused past their TTL (0: it made none)."""
    zombies_fenced: int = 0
    """Of those, the ones found fenced after convergence (exited with the lease-lost status,
    or their member key carrying a new lease)."""
    recovery_s: float | None = None
    """Seconds from healing to convergence (None: it did not converge)."""
    append_stall_s: float = 0.0
    """The longest time between two acknowledged appends during the trial."""
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.violations == 0
            and self.acks_lost == 0
            and self.zombies_fenced == self.zombies
            and self.recovery_s is not None
            and not self.failures
        )


@dataclass(frozen=True)
class FaultSummary:
    """The trials of one fault, combined: counts summed, times their worst."""

    fault: str
    trials: int
    streams_verified: int
    streams_expected: int
    violations: int
    violation_kinds: dict[str, int]
    acks_checked: int
    acks_lost: int
    zombies: int
    zombies_fenced: int
    recovery_s: float | None
    append_stall_s: float
    failures: int

    @property
    def ok(self) -> bool:
        return (
            self.violations == 0
            and self.acks_lost == 0
            and self.zombies_fenced == self.zombies
            and self.recovery_s is not None
            and self.failures == 0
        )


def summarize(results: Sequence[TrialResult]) -> list[FaultSummary]:
    """One summary per fault, in the order of their first trial."""
    order: list[str] = []
    by_fault: dict[str, list[TrialResult]] = {}
    for r in results:
        if r.fault not in by_fault:
            order.append(r.fault)
            by_fault[r.fault] = []
        by_fault[r.fault].append(r)
    out = []
    for name in order:
        rs = by_fault[name]
        times = [r.recovery_s for r in rs]
        out.append(
            FaultSummary(
                fault=name,
                trials=len(rs),
                streams_verified=sum(r.streams_verified for r in rs),
                streams_expected=sum(r.streams_expected for r in rs),
                violations=sum(r.violations for r in rs),
                violation_kinds=_sum_kinds(r.violation_kinds for r in rs),
                acks_checked=max(r.acks_checked for r in rs),
                acks_lost=max(r.acks_lost for r in rs),
                zombies=sum(r.zombies for r in rs),
                zombies_fenced=sum(r.zombies_fenced for r in rs),
                recovery_s=None if None in times else max(t for t in times if t is not None),
                append_stall_s=max(r.append_stall_s for r in rs),
                failures=sum(len(r.failures) for r in rs),
            )
        )
    return out


def _sum_kinds(kinds: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for k in kinds:
        for kind, n in k.items():
            total[kind] = total.get(kind, 0) + n
    return dict(sorted(total.items()))


HEADER = (
    "fault",
    "trials",
    "streams verified",
    "exactly-once violations",
    "acked appends lost",
    "zombies fenced",
    "recovery (s)",
    "append stall (s)",
    "failures",
)


def _row(s: FaultSummary) -> tuple[str, ...]:
    recovery = "-" if s.recovery_s is None else f"{s.recovery_s:.1f}"
    return (
        s.fault,
        str(s.trials),
        f"{s.streams_verified}/{s.streams_expected}",
        _violations(s),
        f"{s.acks_lost}/{s.acks_checked}",
        f"{s.zombies_fenced}/{s.zombies}" if s.zombies else "-",
        recovery,
        f"{s.append_stall_s:.1f}",
        str(s.failures),
    )


def _violations(s: FaultSummary) -> str:
    if not s.violation_kinds:
        return str(s.violations)
    kinds = ", ".join(f"{n} {kind}" for kind, n in s.violation_kinds.items())
    return f"{s.violations} ({kinds})"


def render(summaries: Sequence[FaultSummary]) -> str:
    """A fixed-width text table, one row per fault. Acked appends lost are cumulative (every
    append acknowledged so far is checked after each trial), so a fault's row shows the worst
    check after its trials."""
    rows = [HEADER, *(_row(s) for s in summaries)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def final_json(results: Sequence[TrialResult]) -> str:
    """One line: whether the run passed, the per-fault summaries, and every trial."""
    summaries = summarize(results)
    return json.dumps(
        {
            "ok": bool(results) and all(r.ok for r in results),
            "faults": [{**asdict(s), "ok": s.ok} for s in summaries],
            "trials": [{**asdict(r), "ok": r.ok} for r in results],
        },
        separators=(",", ":"),
    )


def exit_status(results: Sequence[TrialResult]) -> int:
    """0 if every trial passed (and there was one), else 1."""
    return 0 if results and all(r.ok for r in results) else 1
