"""Writing the offset reservations of replication-1 journals this broker is primary of.

`broker.reservation` says what a reservation is and keeps a replica's markers; the
`Reserver` does the writing: before a commit that reaches past the furthest reservation of
its tenure, a marker a span beyond it (`reserve`, only while the etcd lease is certainly
held); after a commit that comes within half a span of it, the next one in the background
(`reserve_ahead`); the removal of markers a newer one replaced; and, for a spool of a journal
this broker no longer serves, a marker at its end once it is published (`close_hole`), which
tells the new primary, and every later one, that nothing more of ours will come. Markers
at the edges of content (that closing one, and the one where a new primary started) are
never removed: they bound the gap for readers (`JournalReplica.awaits_content`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from gazette.allocator.session import MemberSession
from gazette.broker.fragment.store import FragmentStoreError, store_for_url
from gazette.broker.metrics import COUNTERS
from gazette.broker.replica import JournalReplica
from gazette.broker.reservation import (
    ReservationError,
    ReservationStoreError,
    marker,
    span_for,
)

log = logging.getLogger(__name__)

RESERVE_RETRIES = (0.2, 0.5, 1.0)
"""Delays between attempts to write a reservation marker before the append is refused."""

LEASE_MARGIN = 0.5
"""Seconds of certain lease left that reserving offsets requires (clock-rate slack)."""


class Reserver:
    """The reservation markers of the broker's replication-1 journals.

    `session` gives the member's session (None before it starts), `replicas` the journals
    served here, `is_primary` whether this broker is a journal's primary, and `spawn` runs
    background work the broker owns (cancelled at its shutdown).
    """

    def __init__(
        self,
        spool_dir: Path,
        session: Callable[[], MemberSession | None],
        replicas: Mapping[str, JournalReplica],
        is_primary: Callable[[str], bool],
        spawn: Callable[[Coroutine[Any, Any, None]], Any],
    ) -> None:
        self.spool_dir = spool_dir
        self._session = session
        self._replicas = replicas
        self._is_primary = is_primary
        self._spawn = spawn
        self._reserving: set[str] = set()  # journals with a reservation being extended

    async def reserve(self, replica: JournalReplica, end: int) -> None:
        """Reserve offsets beyond `end` of a replication-1 journal before content up to `end`
        is acknowledged (broker.reservation). The caller holds `replica.lock`.

        Raises ReservationError if our lease may have ended (a paused or partitioned broker
        must not reserve what a new primary may already be writing) or the store fails.
        """
        if replica.spec.replication != 1 or not replica.has_stores:
            return
        reservations = replica.reservations
        # Every commit, not only those needing a marker: a primary cut off from etcd past
        # its lease may have a successor already.
        session = self._session()
        if session is None or session.lease_valid_for() <= LEASE_MARGIN:
            raise ReservationError(
                f"{replica.name}: this broker's etcd lease may have expired; another broker "
                "may be primary"
            )
        if reservations.covers(end):
            return
        offset = reservations.next_marker(end, span_for(replica.fragment_length))
        store = store_for_url(replica.spec.fragment.stores[0])
        for delay in (*RESERVE_RETRIES, None):
            try:
                await store.persist(marker(replica.name, offset), self.empty_file())
                break
            except (FragmentStoreError, OSError) as err:
                if delay is None:
                    replica.store_health_error = str(err)
                    raise ReservationStoreError(
                        f"{replica.name}: cannot reserve offsets up to {offset} (replication 1 "
                        f"reserves offsets in its first store before acknowledging): {err}"
                    ) from err
                await asyncio.sleep(delay)
        if session.lease_valid_for() <= LEASE_MARGIN:
            raise ReservationError(
                f"{replica.name}: this broker's etcd lease may have expired while reserving "
                "offsets; another broker may be primary"
            )
        reservations.wrote(offset, sync=replica.sync)
        COUNTERS.reservations += 1
        # Markers where content begins or ends bound the gap a crashed or paused primary
        # left (where the next one started, where the old one's published content ends):
        # readers of every later primary wait at such a gap by them (kept).
        replaced = reservations.replaced()
        bounds = {m for m in replaced if replica.at_content_edge(m)}
        reservations.markers.update(bounds)
        replaced = [m for m in replaced if m not in bounds]
        if replaced:
            self._spawn(self._remove_markers(store.url, replica.name, replaced))

    def reserve_ahead(self, replica: JournalReplica) -> None:
        """After a commit: once the head is within half a span of the furthest reservation,
        extend it in the background, so appends rarely wait for a marker write."""
        if replica.spec.replication != 1 or not replica.has_stores:
            return
        half = span_for(replica.fragment_length) // 2
        if replica.reservations.tenure - replica.write_head > half:
            return
        if replica.name in self._reserving:
            return
        self._reserving.add(replica.name)

        async def extend() -> None:
            try:
                if self._replicas.get(replica.name) is replica and self._is_primary(replica.name):
                    await self.reserve(replica, replica.write_head + half + 1)
            except ReservationError as err:
                log.warning("reserving ahead failed journal=%s err=%s", replica.name, err)
            finally:
                self._reserving.discard(replica.name)

        self._spawn(extend())

    async def close_hole(self, replica: JournalReplica, end: int) -> None:
        """Our last spool of a replication-1 journal we no longer serve is published: a
        marker at its end tells the journal's new primary that nothing more of ours will
        come, so its readers stop waiting in the hole it left (broker.reservation)."""
        try:
            await store_for_url(replica.spec.fragment.stores[0]).persist(
                marker(replica.name, end), self.empty_file()
            )
        except (FragmentStoreError, OSError) as err:
            log.warning(
                "cannot mark our content's end journal=%s at=%d err=%s", replica.name, end, err
            )

    async def _remove_markers(self, url: str, journal: str, offsets: list[int]) -> None:
        """Remove reservations that a newer one replaced (best effort: a marker left behind
        only reserves offsets below the newer one)."""
        for offset in offsets:
            try:
                await store_for_url(url).remove(marker(journal, offset))
            except (FragmentStoreError, OSError) as err:
                log.warning(
                    "cannot remove old reservation journal=%s at=%d err=%s", journal, offset, err
                )

    def empty_file(self) -> Path:
        """An empty file in the spool directory: the content of every marker."""
        path = self.spool_dir / "empty"
        if not path.exists() or path.stat().st_size:
            path.write_bytes(b"")
        return path
