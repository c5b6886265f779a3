"""Replication of a journal's appends from its primary broker to its peers (`Replicate`).

A journal with replication R is assigned to R brokers; slot 0 is the primary. The primary
holds a *pipeline*: one long-lived `Replicate` stream to each peer, opened for one route
(members and primary) and discarded when the route changes. Over it:

- **Synchronisation.** The first request carries the header (our route and etcd revision),
  the primary's current spool fragment as a *proposal*, and its registers. A peer whose spool
  is that same fragment answers OK; otherwise PROPOSAL_MISMATCH with its own fragment. On a
  mismatch the primary first catches up any committed content a peer holds beyond its own
  write head (read from that peer), then rolls to a fresh spool at its head and proposes
  that empty fragment, which every peer adopts by rolling its own spool. Rolled spools are
  persisted by every replica that holds them, so nothing committed is lost.
- **Appends.** Content chunks go to every peer (`content`, `content_delta` = offset within
  the append); the commit is a proposal of the spool extended by the append, with the
  registers it results in. Only when every peer acknowledges it does the primary commit
  locally and answer its client. A rollback is a proposal of the unchanged spool. A commit
  proposal that fails once sent may still have been committed by some peers: the primary
  then never writes other content at those offsets (`JournalReplica.unresolved_end`): the
  next synchronisation catches the content up from a peer that holds it, or, if a peer it
  was sent to is no longer in the route, rolls forward over it.

Peers verify each proposal against their own spool and pending content (begin, end,
compression and the rolling SHA1 of the whole fragment): a peer never commits bytes whose
digest differs from the primary's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from gazette.auth.grpc_auth import journal_scope
from gazette.broker.fragment.coverset import FragmentEntry
from gazette.broker.protocol import labels
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.replica import JournalReplica
from gazette.broker.spool import PendingAppend

if TYPE_CHECKING:
    from gazette.broker.protocol.protocol_pb2_grpc import JournalAsyncStub as JournalStub
else:
    JournalStub = Any

log = logging.getLogger(__name__)

RouteKey = tuple[tuple[tuple[str, str], ...], int]


class ReplicationError(Exception):
    """A peer could not be synchronised or did not acknowledge; the pipeline is discarded."""


class ReplicationProtocolError(Exception):
    """A Replicate stream broke the protocol (e.g. a content delta out of sequence)."""


def route_key(route: pb.Route) -> RouteKey:
    """The identity of a route: its members and primary (endpoints are not part of it)."""
    return (tuple((m.zone, m.suffix) for m in route.members), int(route.primary))


def same_fragment(a: pb.Fragment, b: pb.Fragment) -> bool:
    """Whether two fragments have the same journal, extent, codec and content digest."""
    return (
        a.journal == b.journal
        and a.begin == b.begin
        and a.end == b.end
        and a.compression_codec == b.compression_codec
        and (a.sum.part1, a.sum.part2, a.sum.part3) == (b.sum.part1, b.sum.part2, b.sum.part3)
    )


def describe(f: pb.Fragment) -> str:
    return f"[{f.begin}, {f.end}) sum={f.sum.part1:016x}.. codec={f.compression_codec}"


def _adopt_registers(replica: JournalReplica, registers: pb.LabelSet) -> None:
    if not labels.label_set_equal(registers, replica.registers):
        replica.store_registers(registers)


class Follower:
    """The peer side of one Replicate stream, applied to `replica` (whose lock the caller
    holds for the stream's life). Synchronous: every step is local file work."""

    def __init__(
        self, replica: JournalReplica, enqueue: Callable[[list[FragmentEntry]], None]
    ) -> None:
        self.replica = replica
        self.enqueue = enqueue
        self.pending: PendingAppend | None = None

    def content(self, data: bytes, delta: int) -> None:
        spool = self.replica.ensure_spool()
        if self.pending is None:
            self.pending = spool.begin_append()
        if delta != len(self.pending):
            raise ReplicationProtocolError(
                f"content delta {delta} of {self.replica.name} does not follow the "
                f"{len(self.pending)} bytes received"
            )
        self.pending.write(data)

    def rollback(self) -> None:
        if self.pending is not None:
            self.pending.rollback()
            self.pending = None

    def proposal(self, proposal: pb.Fragment, registers: pb.LabelSet) -> pb.ReplicateResponse:
        """Apply a proposal: commit pending content it describes, roll to an empty fragment
        at or beyond our end, or confirm our current fragment; else PROPOSAL_MISMATCH."""
        replica = self.replica
        spool = replica.ensure_spool()
        pending, self.pending = self.pending, None
        if pending is not None and len(pending) and same_fragment(proposal, pending.proposal()):
            pending.commit()
            _adopt_registers(replica, registers)
            replica.committed(spool)
            replica.continuity = True  # following a live primary (broker.reservation)
            return pb.ReplicateResponse(status=pb.OK)
        if pending is not None:
            pending.rollback()
        current = spool.fragment()
        if same_fragment(proposal, current):
            _adopt_registers(replica, registers)
            replica.continuity = True  # following a live primary (broker.reservation)
            return pb.ReplicateResponse(status=pb.OK)
        if proposal.begin == proposal.end and proposal.end >= replica.write_head:
            # With the proposal's codec: our spec may lag the primary's.
            self.enqueue(replica.roll_to(proposal.end, proposal.compression_codec))
            _adopt_registers(replica, registers)
            log.info("peer rolled journal=%s to=%d", replica.name, proposal.end)
            replica.continuity = True  # following a live primary (broker.reservation)
            return pb.ReplicateResponse(status=pb.OK)
        return pb.ReplicateResponse(
            status=pb.PROPOSAL_MISMATCH, fragment=current, registers=replica.registers
        )


class Pipeline:
    """The primary's Replicate streams to the peers of one route of one journal."""

    def __init__(
        self,
        replica: JournalReplica,
        route: pb.Route,
        header: pb.Header,
        stub_for: Callable[[str], JournalStub],
        *,
        timeout: float,
    ) -> None:
        self.replica = replica
        self.key = route_key(route)
        self.header = header
        self.timeout = timeout
        self.peers: list[tuple[str, str]] = []  # (member "zone#suffix", endpoint)
        for i, m in enumerate(route.members):
            if i != route.primary:
                ep = route.endpoints[i] if i < len(route.endpoints) else ""
                self.peers.append((f"{m.zone}#{m.suffix}", ep))
        self._stub_for = stub_for
        self._calls: list[Any] = []
        self.broken = False
        self._first = True

    def close(self) -> None:
        self.broken = True
        for call in self._calls:
            call.cancel()
        self._calls = []

    def check(self) -> None:
        """Raise ReplicationError if the pipeline is broken (closed)."""
        self._check()

    def _check(self) -> None:
        if self.broken:
            raise ReplicationError(f"replication pipeline of {self.replica.name} is broken")

    def _failed(self, err: BaseException) -> BaseException:
        """Close the pipeline after a write or read failed or was interrupted (the streams
        may hold unread answers, or a request some peers received and others did not), and
        return what to raise: a ReplicationError for a transport failure or a stream that
        `close()` cancelled under us; anything else (our own cancellation) unchanged."""
        self.close()
        if isinstance(err, grpc.aio.AioRpcError | TimeoutError | asyncio.InvalidStateError):
            return ReplicationError(f"replicating {self.replica.name}: {err}")
        task = asyncio.current_task()
        if isinstance(err, asyncio.CancelledError) and not (task and task.cancelling()):
            return ReplicationError(f"replication pipeline of {self.replica.name} was closed")
        return err

    async def _exchange(self, req: pb.ReplicateRequest) -> list[pb.ReplicateResponse]:
        """Send `req` (an acknowledged proposal) to every peer and read each one's answer."""
        self._check()
        if self._first:
            req.header.CopyFrom(self.header)
            self._first = False
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.gather(*(c.write(req) for c in self._calls))
                resps = await asyncio.gather(*(c.read() for c in self._calls))
        except BaseException as err:
            raise self._failed(err) from err
        out: list[pb.ReplicateResponse] = []
        for (member, _), resp in zip(self.peers, resps, strict=True):
            if resp is grpc.aio.EOF:  # type: ignore[attr-defined]
                self.close()
                raise ReplicationError(f"peer {member} ended the Replicate stream")
            out.append(resp)
        return out

    async def send_content(self, data: bytes, delta: int) -> None:
        self._check()
        if not self._calls or not data:
            return
        req = pb.ReplicateRequest(content=data, content_delta=delta)
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.gather(*(c.write(req) for c in self._calls))
        except BaseException as err:
            raise self._failed(err) from err

    async def propose(self, proposal: pb.Fragment, registers: pb.LabelSet) -> None:
        """Propose a fragment; every peer must acknowledge it with OK."""
        self._check()
        if not self._calls:
            return
        # Once sent, a proposal extending our spool may be committed by some peers whatever
        # becomes of it here: until we commit it too, those offsets are not ours to reuse.
        replica = self.replica
        replica.unresolved_end = max(replica.unresolved_end, proposal.end)
        replica.unresolved_peers |= {member for member, _ in self.peers}
        resps = await self._exchange(
            pb.ReplicateRequest(proposal=proposal, registers=registers, acknowledge=True)
        )
        for (member, _), resp in zip(self.peers, resps, strict=True):
            if resp.status != pb.OK:
                self.close()
                raise ReplicationError(
                    f"peer {member} answered {pb.Status.Name(resp.status)} to proposal "
                    f"{describe(proposal)} of {self.replica.name}"
                    + (f" (its fragment {describe(resp.fragment)})" if resp.fragment.end else "")
                )

    def _roll_target(self, replica: JournalReplica) -> int:
        """Where synchronised spools begin: our head, or beyond a failed append sent to
        peers that are not in this route. Those may have committed it (and persist it from
        their spools), so we leave its offsets to them rather than write other content
        there. Peers of this route answered the synchronisation: one that committed it is
        ahead of us, and we caught it up."""
        if replica.unresolved_peers <= {member for member, _ in self.peers}:
            return replica.write_head
        return max(replica.write_head, replica.unresolved_end)

    async def open(
        self,
        enqueue: Callable[[list[FragmentEntry]], None],
        catch_up: Callable[[str, int, int], Any],
    ) -> None:
        """Open a stream to every peer and bring them to a common spool (module docstring).

        `catch_up(endpoint, begin, end)` is awaited to copy committed content [begin, end)
        a peer holds beyond our head into our spool. The caller holds the replica's lock.
        """
        try:
            await self._synchronise(enqueue, catch_up)
        except BaseException:
            self.close()  # never leave streams open to peers we gave up on
            raise

    async def _synchronise(
        self,
        enqueue: Callable[[list[FragmentEntry]], None],
        catch_up: Callable[[str, int, int], Any],
    ) -> None:
        replica = self.replica
        for member, endpoint in self.peers:
            if not endpoint:
                raise ReplicationError(f"peer {member} of {replica.name} has no endpoint")
            with journal_scope(replica.name):  # what a signed call asks for
                self._calls.append(self._stub_for(endpoint).Replicate())  # type: ignore[call-arg]
        for _attempt in range(4):
            spool = replica.ensure_spool()
            proposal = spool.fragment()
            resps = await self._exchange(
                pb.ReplicateRequest(
                    proposal=proposal, registers=replica.registers, acknowledge=True
                )
            )
            mismatched: list[tuple[str, pb.ReplicateResponse]] = []
            for (member, endpoint), resp in zip(self.peers, resps, strict=True):
                if resp.status == pb.PROPOSAL_MISMATCH:
                    mismatched.append((endpoint, resp))
                elif resp.status != pb.OK:
                    raise ReplicationError(
                        f"peer {member} refused {replica.name}: {pb.Status.Name(resp.status)}"
                    )
            if not mismatched and replica.write_head >= self._roll_target(replica):
                replica.unresolved_end, replica.unresolved_peers = 0, frozenset()
                return
            if mismatched:
                endpoint, ahead = max(mismatched, key=lambda er: er[1].fragment.end)
                if ahead.fragment.end > replica.write_head:
                    log.info(
                        "catching up journal=%s from=%s range=[%d,%d)",
                        replica.name,
                        endpoint,
                        replica.write_head,
                        ahead.fragment.end,
                    )
                    await catch_up(endpoint, replica.write_head, ahead.fragment.end)
                    _adopt_registers(replica, ahead.registers)
                log.info(
                    "synchronising peers journal=%s head=%d mismatched=%s",
                    replica.name,
                    replica.write_head,
                    [describe(r.fragment) for _, r in mismatched],
                )
            target = self._roll_target(replica)
            if replica.write_head < target:
                log.warning(
                    "rolling forward journal=%s over [%d,%d): a failed append that peers "
                    "of an earlier route may hold",
                    replica.name,
                    replica.write_head,
                    replica.unresolved_end,
                )
                enqueue(replica.roll_over(target))
            else:
                enqueue(replica.roll_to(target))
        raise ReplicationError(f"peers of {replica.name} did not converge on a fragment")
