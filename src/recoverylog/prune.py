"""Pruning: deleting the fragments of a recovery log which no hints still need.

A recovery log holds every write ever made to a store, most of it dead: files since deleted
(RocksDB compactions). Hints say which portions of the log playback reads: the live segments
of each hinted file and, after the last hinted segment, the rest of the log through its head.
A persisted fragment overlapping none of those portions, for *every* set of hints which may
be played (the primary and backup hints of every shard whose history runs through the log, as
logs are forked between shards), can be deleted from its store.

Rules (as upstream's ``gazctl shards prune``, but folding every hints set, not only the
oldest backup of each shard):

- a segment with an unknown last_offset (all of a Recorder's) extends to the head, as
  does the final segment of each hints set (playback reads on from it);
- only persisted fragments (with a backing store) are candidates, never the fragment ending
  at the log's head (the open spool, or the latest persisted content);
- pruning is refused (`ShardNotHinted`) if any shard lacks hints, (`HintsWithoutLiveFiles`)
  if a hints set has no live files (its playback reads the log from the beginning), and
  (`LogNotHinted`) if no hints refer to the log at all.

`plan_prune` decides, without I/O; ``gazctl shards prune`` (`gazette.gazctl.prune`) lists a
journal's fragments, plans, and deletes from the fragment stores.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.segments import live_log_segments

__all__ = [
    "HintsWithoutLiveFiles",
    "LogNotHinted",
    "PruneError",
    "ShardNotHinted",
    "live_ranges",
    "plan_prune",
]

_UNBOUNDED = 1 << 63

HintsSets = Mapping[str, Sequence[rpb.FSMHints | None]]
"""Hints by shard id: each shard's primary and backup hints (None where it has none)."""


class PruneError(Exception):
    """Pruning is refused: deleting anything could break the playback of some hints."""


class ShardNotHinted(PruneError):
    """A shard has no hints at all: which parts of the log it needs is unknown.

    Not the Spark export's `MissingHints`, which says a shard lacks the hints of the kind
    an export asked for (or has no recovery log) and is an `ExportError`: this one is a
    refusal to prune, a `PruneError` as ``gazctl shards prune`` reports them. One class could
    be both only if the recovery log depended on the export."""

    def __init__(self, shard: str) -> None:
        super().__init__(f"shard {shard} has no hints; cannot prune its recovery log")
        self.shard = shard


class HintsWithoutLiveFiles(PruneError):
    """Hints of a shard have no live files, so their playback reads the whole log."""

    def __init__(self, shard: str, index: int) -> None:
        super().__init__(f"hints #{index} of shard {shard} have no live files; cannot prune")
        self.shard = shard
        self.index = index


class LogNotHinted(PruneError):
    """No hints refer to the journal: they are likely hints of other logs."""

    def __init__(self, journal: str) -> None:
        super().__init__(f"no hints refer to log {journal}; refusing to prune it")
        self.journal = journal


def live_ranges(hints_sets: HintsSets) -> dict[str, list[tuple[int, int]]]:
    """Per log, the sorted disjoint [begin, end) ranges some hints' playback reads.

    An end of 2^63 is the head. Raises a `PruneError`, or `InvalidHints` /
    `InconsistentSegments` for hints which are not consistent.
    """
    ranges: dict[str, list[tuple[int, int]]] = {}
    for shard, sets in hints_sets.items():
        if not any(h is not None for h in sets):
            raise ShardNotHinted(shard)
        for index, hints in enumerate(sets):
            if hints is None:
                continue
            if not hints.live_nodes:
                raise HintsWithoutLiveFiles(shard, index)
            segments = live_log_segments(hints)[1]
            for i, seg in enumerate(segments):
                tail = i == len(segments) - 1  # Playback reads on from the final segment.
                end = seg.last_offset if seg.last_offset and not tail else _UNBOUNDED
                ranges.setdefault(seg.log, []).append((seg.first_offset, end))
    return {name: _merge(spans) for name, spans in ranges.items()}


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if out and begin <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((begin, end))
    return out


def _overlaps(ranges: list[tuple[int, int]], begin: int, end: int) -> bool:
    # The last range starting before `end` is the only one which may reach `begin`, as the
    # ranges are disjoint and sorted.
    i = bisect.bisect_left(ranges, end, key=lambda r: r[0])
    return i > 0 and ranges[i - 1][1] > begin


def plan_prune(
    fragments: Iterable[pb.Fragment], hints_sets: HintsSets
) -> tuple[list[pb.Fragment], list[pb.Fragment]]:
    """Split `fragments` into (delete, keep), in their given order (see the module docs).

    `fragments` are specs as listed by a broker (of one or several journals); `hints_sets`
    the hints of every shard whose history may run through them. Raises a `PruneError` if
    pruning is not safe, and `InvalidHints` / `InconsistentSegments` for bad hints.
    """
    frags = list(fragments)
    ranges = live_ranges(hints_sets)
    heads: dict[str, int] = {}
    for f in frags:
        heads[f.journal] = max(heads.get(f.journal, 0), f.end)
    for journal in heads:
        if journal not in ranges:
            raise LogNotHinted(journal)
    delete: list[pb.Fragment] = []
    keep: list[pb.Fragment] = []
    for f in frags:
        doomed = (
            bool(f.backing_store)
            and f.end < heads[f.journal]
            and not _overlaps(ranges[f.journal], f.begin, f.end)
        )
        (delete if doomed else keep).append(f)
    return delete, keep
