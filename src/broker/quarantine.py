"""Judging, and setting aside, spools of journals this broker no longer serves.

A broker persists its spools when it rolls them as a journal's replica. But a broker also
finds spools it no longer serves: those a previous run left in its spool directory (after a
crash), and those of a journal that moved away while this broker was paused or partitioned
(a *zombie* primary). Such a spool may hold acknowledged content that nobody else has, or it
may overlap content the journal got since from another primary. Publishing it blindly could
put two versions of the same offsets in the fragment store, and a reader would then get one
or the other, or a record spliced from both.

So before such a spool is persisted it is compared with what the journal holds over its
range: the fragments listed in the store, and what the journal's current primary serves
(read by `broker.leftovers`, which acts on the verdict; this module does no network I/O).

- Every byte the journal holds there equals the spool's, and it holds all of them: the spool
  is *redundant* and dropped.
- Some bytes differ: the spool is *quarantined*: moved to ``<spool-dir>/quarantine/<journal>/``
  with a ``.reason`` file beside it, logged at ERROR and counted, never published. An operator
  can list it (``gazctl journals quarantined``) and decide.
- The journal lacks part of the range: publishing fills it only where no primary will write
  again, that is below the journal's write head, or below an offset reservation of this
  broker (broker.reservation) for a replication-1 journal. A spool reaching beyond both
  waits (the new primary may not have rolled forward yet) and is quarantined if that does not
  change within `WAIT_LIMIT` seconds.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gazette.broker.metrics import COUNTERS
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.sha1sum import sha1sum_hex

log = logging.getLogger(__name__)

WAIT_LIMIT = 60.0
"""Seconds a spool reaching beyond the journal's head waits before it is quarantined."""

QUARANTINE_DIR = "quarantine"
REASON_SUFFIX = ".reason"

Action = Literal["publish", "redundant", "quarantine", "wait"]


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str


@dataclass
class Comparison:
    """Compares content the journal holds with a spool file over [begin, end).

    Feed it what the journal holds (`observe`), then ask for a `verdict`.
    """

    path: Path
    begin: int
    end: int
    mismatch: str = ""
    covered: list[tuple[int, int]] = field(default_factory=list)

    def observe(self, offset: int, data: bytes, source: str) -> None:
        """The journal holds `data` at `offset` (according to `source`)."""
        lo, hi = max(offset, self.begin), min(offset + len(data), self.end)
        if lo >= hi or self.mismatch:
            return
        with open(self.path, "rb") as f:
            f.seek(lo - self.begin)
            ours = f.read(hi - lo)
        theirs = data[lo - offset : hi - offset]
        if ours != theirs:
            at = lo + next(
                (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                min(len(ours), len(theirs)),
            )
            self.mismatch = f"differs from {source} at offset {at}"
            return
        self.covered.append((lo, hi))

    def uncovered(self) -> list[tuple[int, int]]:
        """Ranges of the spool the journal was not seen to hold."""
        out: list[tuple[int, int]] = []
        at = self.begin
        for lo, hi in sorted(self.covered):
            if lo > at:
                out.append((at, lo))
            at = max(at, hi)
        if at < self.end:
            out.append((at, self.end))
        return out

    def verdict(self, safe_below: int | None) -> Verdict:
        """`safe_below`: the offset below which no primary will write again, or None if the
        journal has no primary that could (then missing content is published)."""
        if self.mismatch:
            return Verdict("quarantine", self.mismatch)
        missing = self.uncovered()
        if not missing:
            return Verdict("redundant", "the journal holds the same bytes")
        if safe_below is None or missing[-1][1] <= safe_below:
            return Verdict("publish", f"fills {describe(missing)} that the journal lacks")
        return Verdict(
            "wait",
            f"holds {describe(missing)}, reaching beyond offset {safe_below} where the "
            "journal's primary may still write",
        )


def describe(ranges: list[tuple[int, int]]) -> str:
    return ", ".join(f"[{lo}, {hi})" for lo, hi in ranges)


def quarantine_dir(spool_root: Path, journal: str) -> Path:
    return spool_root / QUARANTINE_DIR / journal


def quarantine(
    spool_root: Path, fragment: pb.Fragment, content: Path, commits: Path, reason: str
) -> Path:
    """Move a spool's files aside with a `.reason` file; returns the content's new path."""
    where = quarantine_dir(spool_root, fragment.journal)
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    stem = f"{fragment.begin:016x}-{fragment.end:016x}-{sha1sum_hex(fragment.sum)}"
    dest = where / (stem + ".spool")
    shutil.move(content, dest)
    if commits.exists():
        shutil.move(commits, where / (stem + ".commits"))
    record = {
        "journal": fragment.journal,
        "begin": fragment.begin,
        "end": fragment.end,
        "sha1": sha1sum_hex(fragment.sum),
        "reason": reason,
        "quarantined_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    fd = os.open(where / (stem + REASON_SUFFIX), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    COUNTERS.spools_quarantined += 1
    COUNTERS.spool_quarantined_bytes += fragment.end - fragment.begin
    log.error(
        "QUARANTINED spool journal=%s range=[%d,%d) path=%s reason=%s: it is not published; "
        "see `gazctl journals quarantined`",
        fragment.journal,
        fragment.begin,
        fragment.end,
        dest,
        reason,
    )
    return dest


@dataclass(frozen=True)
class Quarantined:
    """A quarantined spool, as `gazctl journals quarantined` lists it."""

    journal: str
    begin: int
    end: int
    sha1: str
    reason: str
    quarantined_at: str
    path: Path


def list_quarantined(spool_root: Path) -> list[Quarantined]:
    """Every quarantined spool under a broker's spool directory, by journal and offset."""
    top = spool_root / QUARANTINE_DIR
    out: list[Quarantined] = []
    if not top.is_dir():
        return out
    for reason_path in sorted(top.rglob("*" + REASON_SUFFIX)):
        try:
            r = json.loads(reason_path.read_text())
            out.append(
                Quarantined(
                    journal=str(r["journal"]),
                    begin=int(r["begin"]),
                    end=int(r["end"]),
                    sha1=str(r["sha1"]),
                    reason=str(r["reason"]),
                    quarantined_at=str(r["quarantined_at"]),
                    path=reason_path.with_suffix(".spool"),
                )
            )
        except (OSError, ValueError, KeyError) as err:
            log.warning("unreadable quarantine record path=%s err=%s", reason_path, err)
    out.sort(key=lambda q: (q.journal, q.begin))
    return out
