"""Member: one process's membership of an allocator keyspace (a broker's, a consumer's).

A member announces itself under a lease (`MemberSession`), mirrors the keyspace, runs the
`Allocator` (which acts only while this member leads), and reconciles: whenever the keyspace
changes, or the process asks (`reconcile_soon`), the process's `reconcile` callback makes its
local replicas follow this member's assignments and advertises their status as the
assignments' values (`advertise`). What an item is, when a replica is consistent and how a
replica starts and stops are the process's (the callbacks it passes); this is the rest.

Life cycle: `start` (announce, keep the lease alive from then on, load the keyspace, build
the allocator), `run` for as long as the member serves (keyspace watch, the lease's
keep-alive, allocator, reconcile loop and the process's own loops, in one task group: one
failing fails all, a lost lease first, even one lost between `start` and `run`), at a
graceful exit `mark_exiting` (the allocator then moves the items away), and `release` (revoke
the lease: the member key and its assignments go at once).

The process keeps its own drain criterion (when it has handed over enough), its replicas and
its Resolver: brokers and consumers differ there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from gazette.allocator.allocator import Allocator, ConsistencyFn
from gazette.allocator.model import (
    Assignment,
    MemberID,
    assignments_prefix,
    member_key,
    parse_assignment_key,
)
from gazette.allocator.session import MemberSession
from gazette.auth.tls import ClientTLS
from gazette.keyspace.etcd import Compare, Etcd, EtcdError, op_put
from gazette.keyspace.keyspace import KeySpace, KeyValue

__all__ = ["RECONCILE_RETRY", "Member", "MemberSpec"]

log = logging.getLogger(__name__)

RECONCILE_RETRY = 0.5
"""Seconds before a reconcile that failed on etcd is tried again."""


class MemberSpec(Protocol):
    """The announced value: a BrokerSpec or ConsumerSpec (protobuf messages)."""

    exiting: bool

    @property
    def process_spec(self) -> Any: ...

    def SerializeToString(self) -> bytes: ...

    def CopyFrom(self, other: Any) -> None: ...


class Member:
    """This process as a member under `root` (module docs).

    `spec` is what it announces (its endpoint in ``process_spec``); `decode_spec` reads an
    announcement back, to recognise our own crashed predecessor (same endpoint) and replace
    it at once instead of after its lease TTL. `etcd_tls` is the TLS of the etcd connection
    (`Etcd`). `reconcile` is called by the reconcile loop (never twice at once); an
    `EtcdError` it raises is logged and retried. The allocator's callbacks
    (`item_replication` ... `is_failed`) are those of `Allocator`.
    """

    def __init__(
        self,
        *,
        etcd_endpoint: str,
        etcd_tls: ClientTLS | None = None,
        root: str,
        member_id: MemberID,
        spec: MemberSpec,
        decode_spec: Callable[[bytes], MemberSpec],
        keyspace: KeySpace,
        lease_ttl: int,
        reconcile: Callable[[], Awaitable[None]],
        item_replication: Callable[[Any], int],
        member_limit: Callable[[Any], int],
        is_consistent: ConsistencyFn,
        is_failed: Callable[[Assignment], bool] | None = None,
    ) -> None:
        self.etcd_endpoint = etcd_endpoint
        self.etcd_tls = etcd_tls
        self.root = root
        self.id = member_id
        self.spec = spec
        self.keyspace = keyspace
        self.lease_ttl = lease_ttl
        self.etcd: Etcd | None = None
        self.session: MemberSession | None = None
        self.allocator: Allocator | None = None
        self._decode_spec = decode_spec
        self._reconcile = reconcile
        self._allocator_args: dict[str, Any] = {
            "item_replication": item_replication,
            "member_limit": member_limit,
            "member_exiting": lambda spec: bool(spec.exiting),
            "is_consistent": is_consistent,
            "is_failed": is_failed,
        }
        self._wake = asyncio.Event()
        self._lease: asyncio.Task[None] | None = None

    @property
    def key(self) -> str:
        """This member's key: ``{root}/members/{zone}#{suffix}``."""
        return member_key(self.root, self.id)

    @property
    def lease_id(self) -> int:
        """The member's lease, or 0 before `start` and after `release`."""
        return self.session.lease_id if self.session is not None else 0

    def lease_valid_for(self) -> float:
        """Seconds for which the lease is certainly held (`MemberSession.lease_valid_for`);
        0 before `start`."""
        return self.session.lease_valid_for() if self.session is not None else 0.0

    async def start(self) -> None:
        """Connect to etcd, announce this member and load the keyspace; from then on a
        change of the keyspace asks for a reconcile (the first one is asked for now).

        Raises `MemberExistsError` if another live process is this member, `TLSConfigError`
        if the etcd TLS files cannot be used, `EtcdError` if etcd fails; the lease granted
        is revoked again then. The etcd client stays open (`release` closes it).
        """
        self.etcd = Etcd(self.etcd_endpoint, tls=self.etcd_tls)
        self.session = MemberSession(self.etcd, self.key, self.lease_ttl)
        await self.session.announce(self.spec.SerializeToString(), replace_if=self._is_previous)
        # Kept alive from its grant on, as etcd's own sessions are: what the process does
        # before `run` (load the keyspace, a broker's leftover spools to judge against their
        # journals' primaries) may take longer than the lease's TTL.
        self._lease = asyncio.create_task(self.session.keep_alive(), name="lease")
        try:
            await self.keyspace.load(self.etcd)
        except BaseException:
            await self.release()
            raise
        self.allocator = Allocator(
            self.etcd, self.keyspace, self.root, self.id, **self._allocator_args
        )
        self.keyspace.observe(self._wake.set)
        self._wake.set()

    def _is_previous(self, raw: bytes) -> bool:
        """An existing announcement of our endpoint is our own crashed predecessor: the
        process holds what makes it unique here (a broker its spool directory's lock), so
        no live process advertises that endpoint."""
        try:
            previous = self._decode_spec(raw)
        except Exception:  # noqa: BLE001 - not ours, whatever it is
            return False
        return bool(previous.process_spec.endpoint == self.spec.process_spec.endpoint)

    def reconcile_soon(self) -> None:
        """Have the reconcile loop run (again) soon."""
        self._wake.set()

    async def run(self, *loops: tuple[str, Callable[[], Coroutine[Any, Any, None]]]) -> None:
        """Keep the member alive until cancelled: the keyspace watch, the lease keep-alive,
        the allocator, the reconcile loop, and the process's own `loops` (name, coroutine
        function). One failing (`LeaseLostError` when etcd ended the lease) cancels the
        others and raises, in an exception group."""
        assert self.etcd is not None and self.session is not None and self.allocator is not None
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.keyspace.watch(self.etcd), name="keyspace-watch")
            tg.create_task(self._keep_lease(), name="lease")
            tg.create_task(self.allocator.serve(), name="allocator")
            tg.create_task(self._reconcile_loop(), name="reconcile")
            for name, loop in loops:
                tg.create_task(loop(), name=name)

    async def _keep_lease(self) -> None:
        """The lease's keep-alive, running since `start`: its failure (the lease lost, even
        before `run`) fails the member, and cancelling this cancels it."""
        assert self._lease is not None
        await self._lease

    async def _reconcile_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._reconcile()
            except EtcdError as err:
                log.warning("reconcile: etcd err=%s; retrying", err)
                await asyncio.sleep(RECONCILE_RETRY)
                self._wake.set()

    def assignments(self) -> dict[str, tuple[KeyValue[Any], int]]:
        """This member's assignments: item -> (its assignment, slot); the lowest slot if
        the item has several (slot 0: primary)."""
        out: dict[str, tuple[KeyValue[Any], int]] = {}
        for kv in self.keyspace.prefixed(assignments_prefix(self.root)):
            try:
                item, member, slot = parse_assignment_key(self.root, kv.key)
            except ValueError:
                continue
            if member == self.id and (item not in out or slot < out[item][1]):
                out[item] = (kv, slot)
        return out

    async def advertise(self, assignment: KeyValue[Any], value: Any) -> None:
        """Write `value` (a protobuf message) as the value of our `assignment`, guarded by
        its mod revision: a stale view fails the write silently (the next change of the
        keyspace reconciles again). Raises `EtcdError`."""
        assert self.etcd is not None
        key = assignment.key.encode()
        await self.etcd.txn(
            [Compare(key, "mod", assignment.mod_revision)],
            [op_put(key, value.SerializeToString(), assignment.lease)],
        )

    async def mark_exiting(self) -> None:
        """Announce this member as exiting: the allocator moves its items to other members.
        Raises `LeaseLostError` if the member key is gone, `EtcdError` if etcd fails."""
        assert self.session is not None
        spec = type(self.spec)()  # type: ignore[call-arg]
        spec.CopyFrom(self.spec)
        spec.exiting = True
        await self.session.update(spec.SerializeToString())

    async def release(self) -> None:
        """Revoke the lease (the member key and its assignments go at once; if etcd cannot
        be reached, they go when the lease expires) and close the etcd client."""
        if self._lease is not None:
            self._lease.cancel()
            await asyncio.wait({self._lease})  # Whatever it ended with: the lease goes now.
            if not self._lease.cancelled():
                self._lease.exception()  # Retrieved: a lease lost before `run` is no news.
            self._lease = None
        if self.session is not None:
            try:
                await self.session.release()
            except EtcdError as err:
                log.warning("cannot revoke lease err=%s", err)
        if self.etcd is not None:
            await self.etcd.close()
