"""JournalReplica: a broker's state of one journal it serves.

It owns the journal's spool (current fragment), its fragment index (local spools plus every
fragment listed in the journal's stores), its write head and its registers. Appends are
serialised by `lock` (asyncio.Lock is FIFO-fair, so appenders are served in arrival order);
readers never take the lock: they consult the index and wait on `head_changed()`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

from gazette.broker.fragment.coverset import CoverSet, FragmentEntry
from gazette.broker.fragment.postfix import PostfixTemplateError, evaluate_postfix_template
from gazette.broker.fragment.store import FragmentStoreError, store_for_url
from gazette.broker.metrics import COUNTERS
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.reservation import Reservations, is_marker
from gazette.broker.spool import Spool, recover_spools, spool_dir_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Listing:
    """A listing of a journal's stores, taken at index epoch `epoch`."""

    fragments: list[pb.Fragment]
    errors: list[str]
    epoch: int
    reserved: int | None = None
    """The furthest reservation marker in the first store, None if that store failed."""
    markers: tuple[int, ...] = ()
    """Every marker listed in the first store."""


DEFAULT_FRAGMENT_LENGTH = 1 << 29  # upstream's default of 512 MiB
DEFAULT_REFRESH_INTERVAL = 300.0
ROLLED_OVER_KEPT = 64  # the latest ranges a primary rolled forward over, kept for readers


def duration_seconds(d: Duration | None) -> float:
    if d is None:
        return 0.0
    return float(d.seconds) + d.nanos / 1e9


class JournalReplica:
    """One journal served by this broker (as primary, in this single-broker version)."""

    def __init__(
        self, spec: pb.JournalSpec, mod_revision: int, spool_root: Path, *, sync: bool = False
    ) -> None:
        self.name = spec.name
        self.spec = spec
        self.mod_revision = mod_revision
        self.spool_root = spool_root
        self.sync = sync
        self.index = CoverSet()
        self.spool: Spool | None = None
        self.write_head = 0
        self.registers = pb.LabelSet()
        self.lock = asyncio.Lock()
        self._head_changed = asyncio.Event()
        self.last_refresh = 0.0
        self.store_health_error = ""
        # Bumped whenever a local entry leaves the index for a persisted one (or is dropped):
        # a store listing that started before such a change must not rebuild the index.
        self.index_epoch = 0
        # Recovered spools of a journal without stores: readable until the next roll.
        self.retained: list[FragmentEntry] = []
        self.deleted = False
        self.dropped = False  # no longer served here (unassigned or deleted)
        self._rate_tokens = 0.0
        self._rate_at = time.monotonic()
        # Replication: the route this broker last saw (members and primary, see route_key),
        # an event replaced (after being set) whenever it changes, and the primary's
        # pipeline to its peers (owned by broker.replication, used under `lock`).
        self.route_key: tuple[object, ...] = ()
        # The primary of the route seen before the current one (a member's (zone, suffix)).
        self.previous_primary: object | None = None
        self._route_changed = asyncio.Event()
        self.pipeline: object | None = None
        # The end of the furthest commit proposal sent to peers, and the peers it was sent
        # to since a synchronisation last heard from all of them: beyond the write head, a
        # failed append that those peers may have committed (see broker.replication).
        self.unresolved_end = 0
        self.unresolved_peers: frozenset[str] = frozenset()
        # Offset reservations of a replication-1 journal (broker.reservation), and whether
        # this replica's spool continues the journal's current content: it followed a live
        # primary's pipeline, or it decided where its own primary spool starts.
        self.reservations = Reservations(self.directory / "reserved")
        self.continuity = False
        self._leading = asyncio.Event()  # `leading`
        # The offsets a fresh primary skipped, and until when (monotonic) blocking readers
        # wait there for the old primary's content to be published.
        self.hole: tuple[int, int, float] | None = None
        self.hole_closed: int | None = None  # where the old primary's content ends, once said
        self._markers_before_hole: frozenset[int] = frozenset()
        # Gaps in the index where blocking readers wait for an earlier primary's content,
        # by the offset where content follows them: until when (monotonic).
        self._gap_waits: dict[int, float] = {}
        # The end of the furthest spool this replica wrote or recovered itself.
        self.local_end = 0
        self._relisting: asyncio.Future[None] | None = None
        # Ranges this replica rolled forward over as primary (`roll_over`).
        self.rolled_over: list[tuple[int, int]] = []

    @property
    def leading(self) -> bool:
        """Whether this replica, as primary, has synchronised its route's peers since it
        became primary: until then a peer may hold acknowledged content beyond it (the
        previous primary of a hand-over), and its own head and index are no answer."""
        return self._leading.is_set()

    @leading.setter
    def leading(self, value: bool) -> None:
        if value:
            self._leading.set()
        else:
            self._leading.clear()

    async def wait_until_leading(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until `leading`; returns whether it is."""
        try:
            async with asyncio.timeout(timeout):
                await self._leading.wait()
        except TimeoutError:
            pass
        return self.leading

    # --- configuration -----------------------------------------------------------------
    @property
    def directory(self) -> Path:
        return spool_dir_for(self.spool_root, self.name)

    @property
    def fragment_length(self) -> int:
        return self.spec.fragment.length or DEFAULT_FRAGMENT_LENGTH

    @property
    def codec(self) -> pb.CompressionCodec.ValueType:
        return self.spec.fragment.compression_codec or pb.NONE

    @property
    def refresh_interval(self) -> float:
        return duration_seconds(self.spec.fragment.refresh_interval) or DEFAULT_REFRESH_INTERVAL

    @property
    def flush_interval(self) -> float:
        return duration_seconds(self.spec.fragment.flush_interval)

    @property
    def has_stores(self) -> bool:
        return len(self.spec.fragment.stores) > 0

    async def throttle(self, nbytes: int) -> bool:
        """Delay an append chunk to honour `max_append_rate` (bytes/s; 0: unlimited).

        A token bucket holding up to one second of rate: bursts up to the rate pass at once.
        Returns True if the chunk was delayed (reported as AppendResponse.delayed_chunks).
        """
        rate = self.spec.max_append_rate
        if rate <= 0:
            return False
        now = time.monotonic()
        self._rate_tokens = min(float(rate), self._rate_tokens + (now - self._rate_at) * rate)
        self._rate_at = now
        self._rate_tokens -= nbytes
        if self._rate_tokens >= 0:
            return False
        await asyncio.sleep(-self._rate_tokens / rate)
        return True

    def readable(self) -> bool:
        return self.spec.flags in (0, pb.JournalSpec.O_RDONLY, pb.JournalSpec.O_RDWR) or bool(
            self.spec.flags & (pb.JournalSpec.O_RDONLY | pb.JournalSpec.O_RDWR)
        )

    def writable(self) -> bool:
        return self.spec.flags == 0 or bool(
            self.spec.flags & (pb.JournalSpec.O_WRONLY | pb.JournalSpec.O_RDWR)
        )

    # --- lifecycle ---------------------------------------------------------------------
    async def recover(self) -> list[FragmentEntry]:
        """Load registers, recovered spools and the stores' fragments; returns the spools to
        persist. The write head is the end of everything known, and never below the head
        recorded at the last roll (so offsets are never handed out twice)."""
        self.registers = self._load_registers()
        self.write_head = self._load_head()
        self.reservations.load()
        recovered = await asyncio.to_thread(recover_spools, self.directory, self.name)
        pending: list[FragmentEntry] = []
        for r in recovered:
            spec = r.fragment(self.codec)
            self.local_end = max(self.local_end, spec.end)
            # The first append time of a recovered spool is not kept: its mtime stands in.
            spec.path_postfix = self.postfix(r.files.content.stat().st_mtime)
            entry = FragmentEntry(spec=spec, local_path=r.files.content)
            self.index.add(entry)
            pending.append(entry)
        await self.refresh_index()
        self.write_head = max(self.index.end_offset(), self.write_head)
        if pending:
            log.info(
                "recovered spools journal=%s count=%d through=%d",
                self.name,
                len(pending),
                self.write_head,
            )
        if not self.has_stores:
            # Nowhere to persist them: keep them readable until this journal next rolls.
            self.retained, pending = pending, []
        return pending

    async def refresh_index(self) -> None:
        """Rebuild the index from a fresh listing of every store (no appends may run)."""
        self.apply_listing(await self.list_stores())

    async def relist(self, *, wait: bool = True) -> None:
        """List the stores and apply the listing under `lock` while appends may run. With
        `wait=False` a listing that finds the journal locked is dropped (retried later)."""
        listing = await self.list_stores()
        if not wait and self.lock.locked():
            return
        async with self.lock:
            self.apply_listing(listing)

    def in_hole(self, offset: int) -> bool:
        """Whether `offset` lies in the hole this primary skipped, while readers wait there."""
        hole = self.hole
        if hole is None or not hole[0] <= offset < hole[1] or time.monotonic() >= hole[2]:
            return False
        return self.hole_closed is None or offset < self.hole_closed

    def open_hole(self, begin: int, end: int, wait: float) -> None:
        """This fresh primary skipped [begin, end): blocking readers wait there up to `wait`
        seconds, until a marker that the old primary writes after it (in the listing)
        says where its content ends."""
        self.hole = (begin, end, time.monotonic() + wait)
        self.hole_closed = None
        self._markers_before_hole = frozenset(self.reservations.markers)
        self._gap_waits[end] = self.hole[2]  # one wait there, not a second one after it

    def awaits_content(self, offset: int, end: int, wait: float) -> bool:
        """Whether a blocking read at `offset`, in a gap of the index that content (or the
        write head) follows at `end`, waits there for an earlier primary's content.

        A replication-1 primary that crashed or paused acknowledged content that only its
        spools hold, in offsets reserved up to the marker where the next primary started.
        While such a marker lies ahead in the gap and no marker at `offset` says that the
        old primary's content ends there (its closing marker, at the end of what it
        published), the gap may still be filled, also after the journal moved on again:
        readers wait up to `wait` seconds from the first wait at it on this broker. A gap
        with no marker ahead (history removed from the stores) is not waited at."""
        if self.spec.replication != 1 or not self.has_stores:
            return False
        markers = self.reservations.markers
        if offset in markers:
            return False
        ahead = [m for m in markers if offset < m <= end]
        if not ahead:
            return False
        until = self._gap_waits.setdefault(min(ahead), time.monotonic() + wait)
        return time.monotonic() < until

    def gap_is_gone(self, offset: int) -> bool:
        """Whether a read at `offset`, in a gap of the index that reaches the write head,
        takes it for content that is gone, and jumps to the head. Otherwise the gap's
        content may still arrive: a peer that rolled to its primary's head without the
        content (the primary, or its store, has it), or an index a listing has not caught
        up yet. A read then waits, or answers "not yet available" at `offset`.

        A gap is gone when no store could fill it; when an earlier replication-1 primary's
        reservation ends in it (`awaits_content` said the wait for it is over); or when
        this primary rolled forward over it, past an append that failed."""
        if not self.has_stores:
            return True
        if any(offset <= m <= self.write_head for m in self.reservations.markers):
            return True
        return any(begin <= offset < end for begin, end in self.rolled_over)

    def roll_over(self, end: int) -> list[FragmentEntry]:
        """As primary, roll forward to `end` over offsets of an append that failed (peers
        of an earlier route may hold its content; nobody was told it committed): they are
        skipped, and readers do not wait there (caller holds `lock`)."""
        if end > self.write_head:
            self.rolled_over.append((self.write_head, end))
            del self.rolled_over[:-ROLLED_OVER_KEPT]
        return self.roll_to(end)

    def at_content_edge(self, offset: int) -> bool:
        """Whether content begins or ends at `offset` (a fragment of the index, or the write
        head where a fresh primary's first append goes): a marker there bounds a gap that
        readers may wait at (`awaits_content`)."""
        if offset == self.write_head:
            return True
        return any(e.begin == offset or e.end == offset for e in self.index)

    async def relist_shared(self) -> None:
        """`relist()`, one listing shared by every concurrent caller."""
        if self._relisting is None or self._relisting.done():
            self._relisting = asyncio.ensure_future(self.relist())
        await asyncio.shield(self._relisting)

    async def list_stores(self) -> Listing:
        """Fragments of every store of the journal, and the errors of stores that failed."""
        epoch = self.index_epoch
        listed: list[pb.Fragment] = []
        errors: list[str] = []
        reserved: int | None = None
        markers: list[int] = []
        for i, url in enumerate(self.spec.fragment.stores):
            try:
                fragments = await store_for_url(url).list(self.name)
            except FragmentStoreError as err:
                errors.append(str(err))
                log.warning(
                    "fragment listing failed journal=%s store=%s err=%s", self.name, url, err
                )
                continue
            for f in fragments:
                if is_marker(f):
                    if i == 0:
                        reserved = max(reserved or 0, f.end)
                        markers.append(f.end)
                        self.reservations.markers.add(f.end)
                else:
                    listed.append(f)
            if i == 0 and reserved is None:
                reserved = 0
        return Listing(listed, errors, epoch, reserved, tuple(markers))

    def apply_listing(self, listing: Listing) -> None:
        """Make the index local entries plus the listed fragments (caller holds `lock`).

        The listing only adds when a store failed (history is never dropped because a store
        was briefly unreachable) or when a fragment was persisted while the listing ran (the
        listing may predate it); fragments removed from stores then leave at the next refresh.
        """
        listed, errors = listing.fragments, listing.errors
        self.store_health_error = "; ".join(errors)
        if listing.reserved is not None:
            self.reservations.saw(listing.reserved)
        if self.hole is not None:
            begin, end, _until = self.hole
            closing = [
                m
                for m in listing.markers
                if begin <= m < end and m not in self._markers_before_hole
            ]
            if closing:
                self.hole_closed = max(self.hole_closed or 0, *closing)
        if errors or listing.epoch != self.index_epoch:
            for f in listed:
                self.index.add(FragmentEntry(spec=f))
        else:
            fresh = CoverSet()
            for f in listed:
                fresh.add(FragmentEntry(spec=f))
            for e in self.index:
                if e.local_path is not None:
                    fresh.add(e)
            self.index = fresh
        self.last_refresh = time.monotonic()
        end = self.index.end_offset()
        if end > self.write_head and self.spool is not None and len(self.spool) == 0:
            # The stores hold content beyond our head (e.g. restored from elsewhere): follow.
            self.write_head = end
            self._start_spool(end)
        if end > self.write_head:
            self.write_head = end
            self.notify()

    def mark_persisted(self, entry: FragmentEntry, persisted: pb.Fragment | None) -> None:
        """Swap a rolled local entry for its persisted fragment (or drop it when None)."""
        try:
            if persisted is None:
                self.index.remove(entry)
            else:
                self.index.replace(FragmentEntry(spec=persisted))
        except KeyError:
            # A listed fragment already covers it (e.g. persisted by an earlier incarnation).
            if persisted is not None:
                self.index.add(FragmentEntry(spec=persisted))
        self.index_epoch += 1

    # --- spools --------------------------------------------------------------------------
    def _start_spool(self, begin: int, codec: pb.CompressionCodec.ValueType | None = None) -> None:
        if self.spool is not None:
            if len(self.spool) == 0:
                self.spool.remove()
            else:
                raise AssertionError("starting a spool over a non-empty one")
        self.spool = Spool.create(
            self.directory, self.name, begin, self.codec if codec is None else codec, sync=self.sync
        )

    def ensure_spool(self) -> Spool:
        if self.spool is None:
            self._start_spool(self.write_head)
        assert self.spool is not None
        return self.spool

    def should_roll(self, now: float) -> bool:
        s = self.spool
        if s is None or len(s) == 0:
            return False
        if len(s) >= self.fragment_length or s.codec != self.codec:
            return True
        if s.end != self.write_head:
            return True  # a listing found content beyond our spool: appends go after it
        interval = self.flush_interval
        if interval > 0 and s.first_append_time is not None:
            boundary = (s.first_append_time // interval + 1) * interval
            return now >= boundary
        return False

    def postfix(self, first_append_time: float) -> str:
        """The path postfix of a fragment whose first append was at `first_append_time`."""
        template = self.spec.fragment.path_postfix_template
        if not template:
            return ""
        try:
            return evaluate_postfix_template(
                template, datetime.fromtimestamp(first_append_time, UTC), self.spec
            )
        except PostfixTemplateError as err:  # validated at Apply; keep persisting regardless
            log.error("path postfix template failed journal=%s err=%s", self.name, err)
            return ""

    def roll(self) -> list[FragmentEntry]:
        """Close the current spool (caller holds `lock`); returns the entries to persist:
        the spool's, and any retained recovered spools of a journal without stores."""
        s = self.spool
        if s is None or len(s) == 0:
            return []
        spec = s.fragment()
        spec.path_postfix = self.postfix(s.first_append_time or time.time())
        entry = FragmentEntry(spec=spec, local_path=s.content_path)
        self.local_end = max(self.local_end, spec.end)
        s.close()
        COUNTERS.spool_completed += 1
        self.spool = None
        self._store_head(self.write_head)
        self._start_spool(self.write_head)
        rolled, self.retained = [*self.retained, entry], []
        return rolled

    def roll_to(
        self, offset: int, codec: pb.CompressionCodec.ValueType | None = None
    ) -> list[FragmentEntry]:
        """Close the current spool and start an empty one at `offset` (>= the write head)
        with `codec` (default: the spec's), as a replication proposal asks (caller holds
        `lock`); returns entries to persist."""
        if offset < self.write_head:
            raise ValueError(f"cannot roll {self.name} back to {offset} < head {self.write_head}")
        rolled = self.roll()
        if offset > self.write_head:
            self.write_head = offset
            self._store_head(offset)
            self._start_spool(offset, codec)
            self.notify()
        elif self.spool is None or (codec is not None and self.spool.codec != codec):
            self._start_spool(offset, codec)
        return rolled

    def set_route(self, key: tuple[object, ...]) -> None:
        """Record the journal's current route; wakes whoever waits on `route_changed()`."""
        if key != self.route_key:
            if self.route_key:
                members, primary = self.route_key
                assert isinstance(members, tuple) and isinstance(primary, int)
                self.previous_primary = members[primary] if primary >= 0 else None
            self.route_key = key
            self._route_changed.set()
            self._route_changed = asyncio.Event()

    async def route_changed(self) -> None:
        """Return at the next route change."""
        await self._route_changed.wait()

    def committed(self, spool: Spool) -> None:
        """Publish a commit of `spool` to the index and wake blocked readers."""
        self.index.add(FragmentEntry(spec=spool.fragment(), local_path=spool.content_path))
        self.write_head = spool.end
        self._head_changed.set()
        self._head_changed = asyncio.Event()

    async def wait_for_head_beyond(self, offset: int, timeout: float | None = None) -> bool:
        """Wait until the write head is greater than `offset` (True), or the replica is
        dropped or its journal deleted (False); or at most `timeout` seconds (then whether
        the head moved beyond `offset`)."""
        try:
            async with asyncio.timeout(timeout):
                while self.write_head <= offset and not self.dropped:
                    await self._head_changed.wait()
        except TimeoutError:
            return self.write_head > offset
        return not self.dropped

    def stop_serving(self, *, deleted: bool = False) -> None:
        """The journal is no longer served here (or was `deleted`): wake blocked readers, so
        that they end their RPCs (and their clients go to the journal's current brokers)."""
        self.deleted = self.deleted or deleted
        self.dropped = True
        self.notify()

    def notify(self) -> None:
        self._head_changed.set()
        self._head_changed = asyncio.Event()

    # --- registers ----------------------------------------------------------------------
    @property
    def _registers_path(self) -> Path:
        return self.directory / "registers.pb"

    def _load_registers(self) -> pb.LabelSet:
        try:
            return pb.LabelSet.FromString(self._registers_path.read_bytes())
        except FileNotFoundError:
            return pb.LabelSet()
        except Exception as err:  # noqa: BLE001 - a damaged file must not stop the broker
            log.error("cannot read registers journal=%s err=%s; starting empty", self.name, err)
            return pb.LabelSet()

    def store_registers(self, registers: pb.LabelSet) -> None:
        """Adopt `registers`, then durably replace the registers file (write + rename).

        Called after the append that changed them committed, so a failure to write the file
        is logged rather than raised: the fence holds in memory, and only its survival of a
        restart is at risk.
        """
        self.registers = registers
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self._registers_path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(registers.SerializeToString())
                if self.sync:
                    os.fdatasync(f.fileno())
            os.replace(tmp, self._registers_path)
        except OSError as err:
            log.error("cannot persist registers journal=%s err=%s", self.name, err)

    @property
    def _head_path(self) -> Path:
        return self.directory / "head"

    def _load_head(self) -> int:
        try:
            return int(self._head_path.read_text())
        except (FileNotFoundError, ValueError):
            return 0

    def _store_head(self, head: int) -> None:
        """Record the write head at a roll, so a restart never hands out offsets twice even
        when the stores (or a store-less journal's spools) no longer hold the content."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self._head_path.with_suffix(".tmp")
            tmp.write_text(str(head))
            os.replace(tmp, self._head_path)
        except OSError as err:
            log.error("cannot record write head journal=%s err=%s", self.name, err)

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()

    def delete(self) -> None:
        """The journal was deleted: wake blocked readers and forget its local state files."""
        self.stop_serving(deleted=True)
        self.close()
        for p in (self._registers_path, self._head_path, self.reservations.path):
            p.unlink(missing_ok=True)
