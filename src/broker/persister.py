"""The persist queue: rolled spools uploaded to their journal's first fragment store.

Every rolled spool goes through `Persister.enqueue`: from a replica's recovery, a roll of
the primary (length, flush interval, a full disk) and its peers' rolls, a catch-up, a
dropped replica, and shutdown. The `Persister` uploads one at a time (`run`), retrying a
failing store with backoff while the spool stays readable, and then removes the spool's
files. A spool of a journal this broker does not serve (any more) is published only as the
`LeftoverJudge` allows (broker.leftovers); one that must wait goes back to the queue later,
without holding up other journals'. A journal without stores keeps no history beyond its
current spool (as upstream): its rolled spools are dropped.

At start, the spools a previous run left are persisted before serving
(`persist_leftover_spools`); at shutdown, what is still queued, within a bound
(`persist_remaining`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from gazette.broker.fragment.coverset import FragmentEntry
from gazette.broker.fragment.store import FragmentStoreError, store_for_url
from gazette.broker.leftovers import LeftoverJudge, SpoolPending
from gazette.broker.metrics import COUNTERS
from gazette.broker.replica import JournalReplica
from gazette.broker.spool import COMMITS_SUFFIX, SPOOL_SUFFIX, SpoolError
from gazette.keyspace.keyspace import KeyValue

log = logging.getLogger(__name__)

PENDING_RETRY = 2.0
"""Seconds before a spool of an unserved journal that must wait is judged again."""


class Persister:
    """The broker's queue of rolled spools and their upload.

    `replicas` are the journals served here: a spool whose replica is not the one served
    is judged first (`judge`); `close_hole` marks the end of our content of a
    replication-1 journal once its last spool here is published (`Reserver.close_hole`).
    """

    def __init__(
        self,
        spool_dir: Path,
        replicas: Mapping[str, JournalReplica],
        judge: LeftoverJudge,
        close_hole: Callable[[JournalReplica, int], Awaitable[None]],
    ) -> None:
        self.spool_dir = spool_dir
        self.queue: asyncio.Queue[tuple[JournalReplica, FragmentEntry]] = asyncio.Queue()
        self._replicas = replicas
        self._judge = judge
        self._close_hole = close_hole
        # The upload `run` is doing: not cancelled with `run` (a lost lease ends the loops
        # while a spool is half published), `persist_remaining` finishes it.
        self._inflight: asyncio.Future[None] | None = None

    def enqueue(self, replica: JournalReplica, entries: list[FragmentEntry]) -> None:
        """Queue rolled spools of `replica` for upload."""
        for entry in entries:
            self.queue.put_nowait((replica, entry))

    async def run(self) -> None:
        """Upload queued spools until cancelled; a failing store is retried with backoff."""
        while True:
            replica, entry = await self.queue.get()
            backoff = 0.5
            while True:
                try:
                    self._inflight = asyncio.ensure_future(self.persist(replica, entry))
                    await asyncio.shield(self._inflight)
                    break
                except SpoolPending as err:
                    # Judged again later, without holding up other journals' spools.
                    log.info(
                        "spool of unserved journal=%s fragment=[%d,%d) waits: %s",
                        replica.name,
                        entry.begin,
                        entry.end,
                        err,
                    )
                    asyncio.get_running_loop().call_later(
                        PENDING_RETRY, self.queue.put_nowait, (replica, entry)
                    )
                    break
                except Exception as err:  # noqa: BLE001 - retried; the spool stays readable
                    replica.store_health_error = str(err)
                    if not isinstance(err, FragmentStoreError | OSError):
                        log.exception("unexpected persist failure journal=%s", replica.name)
                    log.error(
                        "persist failed journal=%s fragment=[%d,%d) err=%s; retrying",
                        replica.name,
                        entry.begin,
                        entry.end,
                        err,
                    )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)

    async def persist(self, replica: JournalReplica, entry: FragmentEntry) -> None:
        """Persist a rolled spool to the journal's first store, then remove its files.

        Raises SpoolPending if the spool is of a journal not served here and must wait for
        the journal (broker.leftovers); FragmentStoreError or OSError if the upload fails.
        """
        assert entry.local_path is not None
        if not entry.local_path.exists():
            # Persisted already, by an earlier replica object of this journal on this broker.
            log.info("spool already gone journal=%s path=%s", replica.name, entry.local_path)
            replica.mark_persisted(entry, None)
            COUNTERS.spool_persisted += 1
            return
        stores = list(replica.spec.fragment.stores)
        current = self._replicas.get(replica.name)
        if stores and current is not replica:
            if current is not None:
                # Served here again: the current replica recovered these spool files as
                # its own and persists them.
                return
            # Not ours to serve (any more): publish only what cannot fork the journal.
            if not await self._judge.publishable(replica, entry):
                return
        persisted = None
        if stores:
            persisted = await store_for_url(stores[0]).persist(entry.spec, entry.local_path)
            replica.store_health_error = ""
            log.info(
                "persisted journal=%s fragment=[%d,%d) store=%s",
                replica.name,
                entry.begin,
                entry.end,
                stores[0],
            )
        replica.mark_persisted(entry, persisted)
        if persisted is not None:  # Else a journal without stores dropped it.
            COUNTERS.spool_persisted += 1
        stem = entry.local_path.name[: -len(SPOOL_SUFFIX)]
        for p in (entry.local_path, entry.local_path.with_name(stem + COMMITS_SUFFIX)):
            p.unlink(missing_ok=True)
        if stores and replica.spec.replication == 1 and entry.end >= replica.local_end:
            # Our last content of a journal we no longer serve (judged as we see it now: it
            # may have gone during the upload), or that another primary took on (it reserved
            # beyond our reservation: e.g. we were paused and still serve it until we learn).
            gone = self._replicas.get(replica.name) is not replica
            superseded = replica.reservations.listed > replica.reservations.own
            if gone or superseded:
                await self._close_hole(replica, entry.end)

    async def persist_leftover_spools(
        self, spec_of: Callable[[str], KeyValue[Any] | None], judging_timeout: float
    ) -> None:
        """Persist the committed spools a previous run left in the spool directory.

        They hold acknowledged content, but the journal they belong to may not be assigned
        to this broker any more (with replication 1 it moved elsewhere when our previous
        lease went): persisting them to the journal's store now, before serving, makes
        that content readable wherever the journal lives. Each is judged against the
        journal's content first (broker.leftovers): one that conflicts is set aside, one
        that must wait for the journal is queued. Spools of journals without stores (or
        whose spec, from `spec_of`, is gone) stay, for the journal's replica here to
        recover. Reading a journal's primary is bounded by `judging_timeout` meanwhile.
        """
        root = self.spool_dir / "journals"
        if not root.is_dir():
            return
        usual, self._judge.timeout = self._judge.timeout, judging_timeout
        try:
            await self._persist_leftovers(root, spec_of)
        finally:
            self._judge.timeout = usual

    async def _persist_leftovers(
        self, root: Path, spec_of: Callable[[str], KeyValue[Any] | None]
    ) -> None:
        journals = sorted({str(p.parent.relative_to(root)) for p in root.rglob("*" + SPOOL_SUFFIX)})
        for name in journals:
            kv = spec_of(name)
            if kv is None or not kv.value.fragment.stores:
                log.info("leaving spools of journal=%s (no spec or no stores)", name)
                continue
            replica = JournalReplica(kv.value, kv.mod_revision, self.spool_dir)
            try:
                for entry in await replica.recover():
                    try:
                        await self.persist(replica, entry)
                    except SpoolPending as err:
                        log.info("leftover spool of journal=%s waits: %s", name, err)
                        self.queue.put_nowait((replica, entry))
            except (FragmentStoreError, OSError, SpoolError) as err:
                log.error(
                    "cannot persist leftover spools journal=%s err=%s; they stay for its "
                    "replica to retry",
                    name,
                    err,
                )
            finally:
                replica.close()

    async def persist_remaining(self, timeout: float) -> None:
        """At shutdown: persist what is queued, for up to `timeout` seconds. A spool that
        fails or must wait stays on disk for the next start."""
        deadline = time.monotonic() + timeout
        inflight, self._inflight = self._inflight, None
        if inflight is not None and not inflight.done():
            # E.g. published, but its closing marker not written yet (broker.reserver).
            try:
                await asyncio.wait_for(asyncio.shield(inflight), timeout)
            except Exception as err:  # noqa: BLE001 - its spool stays for the next start
                log.error("upload in progress at shutdown did not finish err=%r", err)
        while not self.queue.empty() and time.monotonic() < deadline:
            replica, entry = self.queue.get_nowait()
            try:
                await asyncio.wait_for(self.persist(replica, entry), deadline - time.monotonic())
            except SpoolPending as err:
                log.info(
                    "spool stays for the next start journal=%s fragment=[%d,%d): %s",
                    replica.name,
                    entry.begin,
                    entry.end,
                    err,
                )
            except (FragmentStoreError, OSError, TimeoutError) as err:
                log.error(
                    "persist at shutdown failed journal=%s fragment=[%d,%d) err=%s; "
                    "its spool stays for the next start",
                    replica.name,
                    entry.begin,
                    entry.end,
                    err,
                )
