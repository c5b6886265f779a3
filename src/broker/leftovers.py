"""Judging the spools of journals this broker does not serve, before they are published.

Such a spool is a leftover: of a previous run (found at start), of a journal that moved away
or was lost with the lease, or of a shutdown. `broker.quarantine` says why it cannot be
published blindly and holds the comparison (`Comparison`, `Verdict`) and the quarantine
itself; the `LeftoverJudge` brings it what the journal holds over the spool's range (the
fragments in its stores, then what its current primary serves) and acts on the verdict:
publish, drop as redundant, wait (`SpoolPending`, judged again later), or quarantine once it
has waited for `quarantine.WAIT_LIMIT` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from gazette.broker.fragment.coverset import FragmentEntry
from gazette.broker.fragment.store import FragmentStoreError, store_for_url
from gazette.broker.metrics import COUNTERS
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.quarantine import WAIT_LIMIT, Comparison, Verdict, quarantine
from gazette.broker.replica import JournalReplica
from gazette.broker.reservation import is_marker
from gazette.broker.spool import COMMITS_SUFFIX, SPOOL_SUFFIX

log = logging.getLogger(__name__)


class SpoolPending(Exception):
    """A spool of a journal this broker no longer serves cannot be judged yet (retried)."""


class LeftoverJudge:
    """Judges spools of unserved journals against the journal (broker.quarantine).

    `route_of` gives the journal's current route, `peer_stub` a stub on another broker, and
    `close_hole` marks the end of our content of a replication-1 journal
    (`Reserver.close_hole`). `timeout` bounds reading the journal's primary.
    """

    def __init__(
        self,
        spool_dir: Path,
        process_id: pb.ProcessSpec.ID,
        route_of: Callable[[str], pb.Route],
        peer_stub: Callable[[str], Any],
        close_hole: Callable[[JournalReplica, int], Awaitable[None]],
        timeout: float,
    ) -> None:
        self.spool_dir = spool_dir
        self.process_id = process_id
        self._route_of = route_of
        self._peer_stub = peer_stub
        self._close_hole = close_hole
        self.timeout = timeout
        # Spools waiting for the journal to pass them, since when (monotonic).
        self._pending_since: dict[tuple[str, int], float] = {}

    async def publishable(self, replica: JournalReplica, entry: FragmentEntry) -> bool:
        """Judge a spool of a journal this broker does not serve (broker.quarantine): True
        to persist it; else it was dropped as redundant or quarantined. Raises SpoolPending
        while it must wait for the journal."""
        assert entry.local_path is not None
        verdict = await self.judge(replica, entry)
        key = (replica.name, entry.begin)
        if verdict.action == "wait":
            since = self._pending_since.setdefault(key, time.monotonic())
            if time.monotonic() - since < WAIT_LIMIT:
                raise SpoolPending(f"spool [{entry.begin}, {entry.end}): {verdict.reason}")
            verdict = Verdict("quarantine", f"{verdict.reason} (for over {WAIT_LIMIT:.0f}s)")
        self._pending_since.pop(key, None)
        stem = entry.local_path.name[: -len(SPOOL_SUFFIX)]
        commits = entry.local_path.with_name(stem + COMMITS_SUFFIX)
        if verdict.action == "publish":
            log.info(
                "publishing spool of unserved journal=%s range=[%d,%d): %s",
                replica.name,
                entry.begin,
                entry.end,
                verdict.reason,
            )
            return True
        if verdict.action == "redundant":
            log.info(
                "dropping spool of unserved journal=%s range=[%d,%d): %s",
                replica.name,
                entry.begin,
                entry.end,
                verdict.reason,
            )
            COUNTERS.spools_redundant += 1
            entry.local_path.unlink(missing_ok=True)
            commits.unlink(missing_ok=True)
            if replica.spec.replication == 1 and entry.end >= replica.local_end:
                await self._close_hole(replica, entry.end)  # e.g. published before a crash
        else:
            quarantine(self.spool_dir, entry.spec, entry.local_path, commits, verdict.reason)
        replica.mark_persisted(entry, None)
        return False

    async def judge(self, replica: JournalReplica, entry: FragmentEntry) -> Verdict:
        """Compare a spool with the journal's content over its range (broker.quarantine)."""
        assert entry.local_path is not None
        cmp = Comparison(entry.local_path, entry.begin, entry.end)
        for url in replica.spec.fragment.stores:
            store = store_for_url(url)
            try:
                listed = await store.list(replica.name)
            except FragmentStoreError as err:
                raise SpoolPending(f"cannot list {url} to compare: {err}") from err
            for f in listed:
                if is_marker(f) or f.end <= entry.begin or f.begin >= entry.end:
                    continue
                try:
                    with tempfile.TemporaryDirectory(dir=self.spool_dir) as tmp:
                        dest = Path(tmp) / "fragment"
                        await store.fetch(f, dest)
                        data = await asyncio.to_thread(dest.read_bytes)
                except (FragmentStoreError, OSError) as err:
                    raise SpoolPending(f"cannot read [{f.begin}, {f.end}) of {url}: {err}") from err
                cmp.observe(f.begin, data, f"fragment [{f.begin}, {f.end}) in {url}")
        own = replica.reservations.own if replica.spec.replication == 1 else 0
        if cmp.mismatch or own >= entry.end:
            # Below our own reservation no other primary writes (broker.reservation): what
            # the stores hold is all that can differ.
            return cmp.verdict(own)
        route = self._route_of(replica.name)
        if route.primary < 0 or route.members[route.primary] == self.process_id:
            return cmp.verdict(None)  # no primary elsewhere: nobody writes there now
        head = await self._read_primary(
            cmp, route.endpoints[route.primary], replica.name, entry.begin, entry.end
        )
        return cmp.verdict(None if head is None else max(head, own))

    async def _read_primary(
        self, cmp: Comparison, endpoint: str, journal: str, begin: int, end: int
    ) -> int | None:
        """Feed `cmp` what the journal's primary serves over [begin, end); returns its write
        head (None if the journal is gone). Raises SpoolPending if it cannot be read."""
        req = pb.ReadRequest(journal=journal, offset=begin, end_offset=end, block=False)
        head = begin
        try:
            async with asyncio.timeout(self.timeout):
                async for resp in self._peer_stub(endpoint).Read(req):
                    if resp.status == pb.JOURNAL_NOT_FOUND:
                        return None
                    if resp.status not in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
                        raise SpoolPending(f"primary {endpoint}: {pb.Status.Name(resp.status)}")
                    head = max(head, resp.write_head)
                    if resp.content:
                        cmp.observe(resp.offset, resp.content, f"primary {endpoint}")
                        head = max(head, resp.offset + len(resp.content))
        except (grpc.aio.AioRpcError, TimeoutError) as err:
            raise SpoolPending(f"reading {journal} from primary {endpoint}: {err}") from err
        return head
