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
from datetime import UTC, datetime
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

from broker.fragment.coverset import CoverSet, FragmentEntry
from broker.fragment.postfix import PostfixTemplateError, evaluate_postfix_template
from broker.fragment.store import FragmentStoreError, store_for_url
from broker.protocol import protocol_pb2 as pb
from broker.spool import RecoveredSpool, Spool, recover_spools, spool_dir_for

log = logging.getLogger(__name__)

DEFAULT_FRAGMENT_LENGTH = 1 << 29  # upstream's default of 512 MiB
DEFAULT_REFRESH_INTERVAL = 300.0


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
        self.recovered: list[RecoveredSpool] = []
        self.last_refresh = 0.0
        self.store_health_error = ""

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
        persist. The write head is the end of everything known."""
        self.registers = self._load_registers()
        self.recovered = await asyncio.to_thread(recover_spools, self.directory, self.name)
        pending: list[FragmentEntry] = []
        for r in self.recovered:
            spec = r.fragment(self.codec)
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
        return pending

    async def refresh_index(self) -> None:
        """Rebuild the index from a fresh listing of every store (no appends may run)."""
        self.apply_listing(*await self.list_stores())

    async def list_stores(self) -> tuple[list[pb.Fragment], list[str]]:
        """Fragments of every store of the journal, and the errors of stores that failed."""
        listed: list[pb.Fragment] = []
        errors: list[str] = []
        for url in self.spec.fragment.stores:
            try:
                listed.extend(await store_for_url(url).list(self.name))
            except FragmentStoreError as err:
                errors.append(str(err))
                log.warning(
                    "fragment listing failed journal=%s store=%s err=%s", self.name, url, err
                )
        return listed, errors

    def apply_listing(self, listed: list[pb.Fragment], errors: list[str]) -> None:
        """Make the index local entries plus `listed` (caller holds `lock`).

        When a store failed, the listing only adds: history is never dropped because a
        store was briefly unreachable.
        """
        if errors:
            self.store_health_error = "; ".join(errors)
            for f in listed:
                self.index.add(FragmentEntry(spec=f))
        else:
            self.store_health_error = ""
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
        self.write_head = max(self.write_head, end)

    # --- spools --------------------------------------------------------------------------
    def _start_spool(self, begin: int) -> None:
        if self.spool is not None:
            if len(self.spool) == 0:
                self.spool.remove()
            else:
                raise AssertionError("starting a spool over a non-empty one")
        self.spool = Spool.create(self.directory, self.name, begin, self.codec, sync=self.sync)

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

    def roll(self) -> FragmentEntry | None:
        """Close the current spool (caller holds `lock`); returns its entry to persist."""
        s = self.spool
        if s is None or len(s) == 0:
            return None
        spec = s.fragment()
        spec.path_postfix = self.postfix(s.first_append_time or time.time())
        entry = FragmentEntry(spec=spec, local_path=s.content_path)
        s.close()
        self.spool = None
        self._start_spool(self.write_head)
        return entry

    def committed(self, spool: Spool) -> None:
        """Publish a commit of `spool` to the index and wake blocked readers."""
        self.index.add(FragmentEntry(spec=spool.fragment(), local_path=spool.content_path))
        self.write_head = spool.end
        self._head_changed.set()
        self._head_changed = asyncio.Event()

    async def wait_for_head_beyond(self, offset: int) -> None:
        """Return once the write head is greater than `offset`."""
        while self.write_head <= offset:
            await self._head_changed.wait()

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
        """Durably replace the registers file (write + rename), then adopt `registers`."""
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self._registers_path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(registers.SerializeToString())
            if self.sync:
                os.fdatasync(f.fileno())
        os.replace(tmp, self._registers_path)
        self.registers = registers

    def close(self) -> None:
        if self.spool is not None:
            self.spool.close()
