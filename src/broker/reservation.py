"""Offset reservations: how a replication-1 journal never hands out an offset twice.

With `replication: 1` a journal's unpersisted content lives on one broker only. When that
broker crashes or is paused past its lease, another broker becomes primary knowing only what
the fragment store holds. Starting at the end of the persisted fragments would hand out again
offsets the old primary already acknowledged (and served to readers): the journal would fork,
and the old broker's spools, persisted later, would overlap different content.

So a replication-1 primary *reserves* offsets before it acknowledges content there. A
reservation is a zero-length fragment ``[R, R)`` written to the journal's first fragment store
(an empty object named like any fragment, `000...R-000...R-<sha1 of nothing>.raw`). Before
committing an append that ends beyond the furthest reservation it wrote in its current tenure
as primary (so its first commit always writes one), the primary writes a new one a span beyond
both that append and the furthest marker it knows: the furthest marker in the store is always
the latest primary's. It commits, and writes markers, only while its etcd lease is certainly
held (`MemberSession.lease_valid_for`, read before and after a marker's write). A broker
that becomes primary without having followed the previous primary's pipeline (a *fresh*
primary) lists the store again and starts its spool at the furthest reservation there, unless
that reservation is its own (it was the last primary and its local spools hold everything it
acknowledged). Content an old primary
acknowledged therefore always lies below the offsets a later primary writes: it can be
persisted whenever that broker comes back, and readers that saw it never see other bytes at
those offsets. The price is a hole of up to one span in the journal's offsets after a crash
or pause. Blocking readers wait in it (up to `--hole-wait`) for the old primary to publish
its content and write a closing marker where that content ends, then skip the rest as a
reported offset jump; the markers at the hole's edges (where the new primary started, the
closing one) stay in the store, so readers of every later primary wait there alike
(`JournalReplica.awaits_content`).

The marker is an ordinary (empty) fragment so that upstream brokers and tools list it
without error, and an upstream primary's index also starts at or beyond it.

Rejected: a reservation key in etcd (upstream brokers sharing the keyspace would fail to
decode it), writing the head to the store on every append (a store write per append), and
leaving replication 1 as upstream has it (a fork on every crash with unpersisted content).
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.sha1sum import sha1sum_from_digest

log = logging.getLogger(__name__)

MIN_SPAN = 4 << 20
"""The least a reservation reaches beyond the append that needs it (bytes of offset space)."""

_EMPTY_SUM = sha1sum_from_digest(hashlib.sha1(b"").digest())


class ReservationError(Exception):
    """Offsets could not be reserved (lease possibly lost, or the store failed): the append
    that needed them is rolled back."""


class ReservationStoreError(ReservationError):
    """The journal's first fragment store failed the reservation's write (the append is
    answered FRAGMENT_STORE_UNHEALTHY, as upstream answers appends to an unhealthy store)."""


def span_for(fragment_length: int) -> int:
    """How far past an append's end a new reservation reaches: two fragments, at least
    `MIN_SPAN`, so that a busy journal writes a marker about once per two fragments."""
    return max(2 * fragment_length, MIN_SPAN)


def marker(journal: str, offset: int) -> pb.Fragment:
    """The zero-length fragment that reserves offsets below `offset` of `journal`."""
    return pb.Fragment(
        journal=journal,
        begin=offset,
        end=offset,
        compression_codec=pb.NONE,
        sum=_EMPTY_SUM,
    )


def is_marker(fragment: pb.Fragment) -> bool:
    """Whether a listed fragment is a reservation (it holds no content)."""
    return fragment.begin == fragment.end


@dataclass
class Reservations:
    """A journal's reservation state on one broker.

    `listed` is the furthest reservation seen in the store (or written here); `own` the
    furthest this broker wrote for the journal, kept in a local file so that it survives a
    restart; `known` whether a listing of the first store succeeded since this replica was
    made (a fresh primary must not guess).
    """

    path: Path
    listed: int = 0
    own: int = 0
    known: bool = False
    tenure: int = 0
    """The furthest marker written in this broker's current tenure as primary (0: none)."""
    markers: set[int] = field(default_factory=set)
    """Markers known to be in the store (listed, or written here), to remove once replaced."""

    def load(self) -> None:
        try:
            self.own = int(self.path.read_text())
        except (FileNotFoundError, ValueError):
            self.own = 0
        self.listed = max(self.listed, self.own)

    def saw(self, offset: int) -> None:
        """A listing of the first store succeeded; `offset` is its furthest marker (or 0)."""
        self.listed = max(self.listed, offset)
        self.known = True

    def next_marker(self, end: int, span: int) -> int:
        """Where the marker that covers content up to `end` goes."""
        return max(end, self.listed) + span

    def wrote(self, offset: int, *, sync: bool) -> None:
        """This broker wrote the marker at `offset`: remember it durably."""
        self.listed = max(self.listed, offset)
        self.own = max(self.own, offset)
        self.tenure = max(self.tenure, offset)
        self.markers.add(offset)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "w") as f:
                f.write(str(self.own))
                if sync:
                    f.flush()
                    os.fdatasync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as err:
            # Only costs a hole at our own restart: we then treat the marker as someone else's.
            log.error("cannot record own reservation path=%s err=%s", self.path, err)

    def replaced(self) -> list[int]:
        """Known markers below the furthest one: they reserve nothing more, and are
        forgotten here as the caller removes them from the store."""
        old = sorted(m for m in self.markers if m < self.listed)
        self.markers.difference_update(old)
        return old

    def fresh_start(self, head: int) -> int:
        """Where a fresh primary whose head is `head` starts: beyond every reservation but
        its own (module docstring)."""
        if self.listed > head and self.listed != self.own:
            return self.listed
        return head

    def covers(self, end: int) -> bool:
        """Whether content up to `end` may be acknowledged without a new reservation: only
        below a marker of our current tenure (another primary's marker proves nothing of
        what we may write, and a tenure without a marker of its own could be mistaken later
        for the previous primary's)."""
        return end <= self.tenure
