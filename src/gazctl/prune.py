"""Deleting the fragments of a recovery log which no hints need (``gazctl shards prune``).

`gazette.recoverylog.prune` decides which fragments are dead for every set of hints; this
module lists a log's fragments from the brokers and removes the dead ones from their stores.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from gazette.broker.client import JournalClient, list_all_fragments
from gazette.broker.fragment.store import store_for_url
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog.prune import HintsSets, plan_prune

__all__ = ["PruneResult", "prune_log"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PruneResult:
    """What `prune_log` deleted (or, with `dry_run`, would delete) and kept."""

    journal: str
    deleted: list[pb.Fragment]
    kept: list[pb.Fragment]
    dry_run: bool

    @property
    def bytes_deleted(self) -> int:
        return sum(f.end - f.begin for f in self.deleted)

    @property
    def bytes_kept(self) -> int:
        return sum(f.end - f.begin for f in self.kept)


async def prune_log(
    client: JournalClient,
    journal: str,
    hints_sets: HintsSets,
    *,
    dry_run: bool = False,
    progress: Callable[[int, int, pb.Fragment], None] | None = None,
) -> PruneResult:
    """Delete the fragments of recovery log `journal` which no hints need.

    Lists the journal's fragments from the brokers, plans with `plan_prune` (raising its
    errors before deleting anything), then removes each doomed fragment from its backing
    store, calling `progress(i, n, fragment)` after each (also with `dry_run`, which deletes
    nothing). A store error (`FragmentStoreError`) stops pruning; fragments deleted until
    then stay deleted, which is safe. Cancellation likewise stops between deletions.
    """
    listed = await list_all_fragments(client, pb.FragmentsRequest(journal=journal))
    delete, keep = plan_prune([f.spec for f in listed], hints_sets)
    for i, frag in enumerate(delete, 1):
        if not dry_run:
            await store_for_url(frag.backing_store).remove(frag)
            log.info(
                "pruned recovery log fragment journal=%s begin=%d end=%d store=%s",
                journal,
                frag.begin,
                frag.end,
                frag.backing_store,
            )
        if progress is not None:
            progress(i, len(delete), frag)
    return PruneResult(journal, delete, keep, dry_run)
