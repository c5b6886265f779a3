"""Journal resolution: where a journal's requests are served, and this broker's view of routes.

The keyspace mirror holds the journals' specs, the brokers and the assignments (`Keys`: the
etcd layout under one root). From it the `Resolver` derives, per journal, its Route (members
sorted by zone and suffix, with their endpoints), this broker's own assignment and slot, and
the response Header; these are cached until the keyspace changes, since every request
consults them several times and each is a scan of the assignments.

`Resolver.resolve` decides where a request is served: by this broker's replica, by proxy to
the primary, or not at all (a status). A replica just assigned here is served only once it
has recovered: the reconcile loop marks it ready (`mark_ready`), and requests wait for that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gazette.allocator.member import Member
from gazette.allocator.model import (
    Assignment,
    MemberID,
    assignments_prefix,
    item_key,
    items_prefix,
    member_key,
    members_prefix,
    parse_assignment_key,
)
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.selector import journal_labels_with_meta
from gazette.broker.protocol.validation import split_journal_meta
from gazette.broker.replica import JournalReplica
from gazette.broker.replication import RouteKey, route_key
from gazette.keyspace.etcd import EtcdError
from gazette.keyspace.keyspace import KeyValue


@dataclass(frozen=True)
class Keys:
    """The etcd key layout (upstream's) under one root (allocator.model's helpers)."""

    root: str

    @property
    def items(self) -> str:
        return items_prefix(self.root)

    @property
    def members(self) -> str:
        return members_prefix(self.root)

    @property
    def assign(self) -> str:
        return assignments_prefix(self.root)

    def item(self, journal: str) -> str:
        return item_key(self.root, journal)

    def member(self, zone: str, suffix: str) -> str:
        return member_key(self.root, MemberID(zone, suffix))

    def decode(self, key: str, raw: bytes) -> Any:
        """The value of `key` in the broker keyspace: a JournalSpec, a BrokerSpec, or an
        assignment's advertised Route."""
        if key.startswith(self.items):
            return pb.JournalSpec.FromString(raw)
        if key.startswith(self.members):
            return pb.BrokerSpec.FromString(raw)
        if key.startswith(self.assign):
            parse_assignment_key(self.root, key)
            return pb.Route.FromString(raw)
        return raw


@dataclass
class Resolution:
    """Where a journal request is served: here (`replica`), by proxy (`proxy_to`), or not
    at all (`status` != OK). `header` is this broker's view of the journal's route."""

    status: pb.Status.ValueType
    header: pb.Header
    replica: JournalReplica | None = None
    proxy_to: str = ""


def route_from_assignments(assignments: list[Assignment]) -> RouteKey:
    """The route key of an item's assignments (members sorted by (zone, suffix))."""
    ordered = sorted((a.member.zone, a.member.suffix, a.slot) for a in assignments)
    primary = next((i for i, (_, _, slot) in enumerate(ordered) if slot == 0), -1)
    return (tuple((z, s) for z, s, _ in ordered), primary)


class Resolver:
    """Routes, headers and resolution of journals, from the member's keyspace mirror.

    `replicas` is the broker's own mapping of the journals it serves (read, never changed
    here); `member` gives the keyspace, etcd and the reconcile loop's wake-up.
    """

    def __init__(
        self,
        member: Member,
        keys: Keys,
        member_id: MemberID,
        process_id: pb.ProcessSpec.ID,
        replicas: Mapping[str, JournalReplica],
    ) -> None:
        self.member = member
        self.keys = keys
        self.member_id = member_id
        self.process_id = process_id
        self.replicas = replicas
        self._ready: dict[str, asyncio.Event] = {}
        self._routing_generation = -1
        self._routes: dict[str, tuple[pb.Route, RouteKey]] = {}
        self._mine: dict[str, tuple[KeyValue[Any], int] | None] = {}
        self._headers: dict[str, pb.Header] = {}

    # --- headers and routes -------------------------------------------------------------
    def etcd_header(self) -> pb.Header.Etcd:
        h = self.member.keyspace.header
        return pb.Header.Etcd(
            cluster_id=h.cluster_id,
            member_id=h.member_id,
            revision=h.revision,
            raft_term=h.raft_term,
        )

    def _routing_current(self) -> None:
        """Drop the cached routing if the keyspace changed since it was derived."""
        generation = self.member.keyspace.generation
        if generation != self._routing_generation:
            self._routes.clear()
            self._mine.clear()
            self._headers.clear()
            self._routing_generation = generation

    def route_of(self, journal: str) -> pb.Route:
        """The journal's Route from the assignments in the keyspace, with endpoints.

        Cached until the keyspace changes: callers must not modify it.
        """
        return self.route_and_key(journal)[0]

    def route_and_key(self, journal: str) -> tuple[pb.Route, RouteKey]:
        """The journal's Route (as `route_of`) and its `route_key`."""
        self._routing_current()
        cached = self._routes.get(journal)
        if cached is not None:
            return cached
        keyspace = self.member.keyspace
        members: list[tuple[MemberID, int]] = []
        for kv in keyspace.prefixed(f"{self.keys.assign}{journal}#"):
            item, member_id, slot = parse_assignment_key(self.keys.root, kv.key)
            if item == journal:
                members.append((member_id, slot))
        members.sort()
        route = pb.Route(primary=-1)
        for i, (member_id, slot) in enumerate(members):
            route.members.add(zone=member_id.zone, suffix=member_id.suffix)
            member = keyspace.get(member_key(self.keys.root, member_id))
            route.endpoints.append(member.value.process_spec.endpoint if member else "")
            if slot == 0:
                route.primary = i
        cached = self._routes[journal] = (route, route_key(route))
        return cached

    def my_assignment(self, journal: str) -> tuple[KeyValue[Any], int] | None:
        """This broker's assignment of `journal` and its slot, if it has one."""
        self._routing_current()
        try:
            return self._mine[journal]
        except KeyError:
            pass
        found: tuple[KeyValue[Any], int] | None = None
        for kv in self.member.keyspace.prefixed(f"{self.keys.assign}{journal}#"):
            item, member_id, slot = parse_assignment_key(self.keys.root, kv.key)
            if item == journal and member_id == self.member_id:
                if found is None or slot < found[1]:
                    found = (kv, slot)
        self._mine[journal] = found
        return found

    def is_primary(self, journal: str) -> bool:
        """Whether this broker holds the journal's primary assignment (slot 0)."""
        mine = self.my_assignment(journal)
        return mine is not None and mine[1] == 0

    def header(self, journal: str | None = None, route: pb.Route | None = None) -> pb.Header:
        """This broker's response Header: its id, the etcd header and `route` (or the
        journal's route, or none). Without `route` it is cached until the keyspace changes:
        callers must not modify it (response constructors and CopyFrom copy it)."""
        if route is not None:
            return pb.Header(process_id=self.process_id, route=route, etcd=self.etcd_header())
        self._routing_current()
        key = journal or ""
        header = self._headers.get(key)
        if header is None:
            route = self.route_of(journal) if journal else pb.Route(primary=-1)
            header = pb.Header(process_id=self.process_id, route=route, etcd=self.etcd_header())
            self._headers[key] = header
        return header

    # --- readiness of local replicas ----------------------------------------------------
    def mark_ready(self, journal: str) -> None:
        """The journal's replica here has recovered: requests waiting for it go on."""
        self._ready.setdefault(journal, asyncio.Event()).set()

    def forget(self, journal: str) -> None:
        """The journal's replica here is gone: waiters wake, find none and look again."""
        ready = self._ready.pop(journal, None)
        if ready is not None:
            ready.set()

    async def ready_replica(self, name: str, timeout: float) -> JournalReplica | None:
        """The journal's replica here once it has recovered (None if it went meanwhile).
        Raises TimeoutError if the reconcile loop has not made it ready within `timeout`."""
        ready = self._ready.get(name)
        if ready is not None and ready.is_set():
            return self.replicas.get(name)  # recovered already: nothing to wait for
        if ready is None:
            ready = self._ready[name] = asyncio.Event()
        self.member.reconcile_soon()
        async with asyncio.timeout(max(timeout, 0.001)):
            await ready.wait()
        return self.replicas.get(name)

    # --- request resolution -------------------------------------------------------------
    async def resolve(
        self,
        journal: str,
        *,
        min_etcd_revision: int = 0,
        require_primary: bool = False,
        may_proxy: bool = True,
        timeout: float = 10.0,
        covered: Callable[[pb.LabelSet], bool] | None = None,
        proxy_header: pb.Header | None = None,
    ) -> Resolution:
        """Decide where a request of `journal` is served. A journal whose labels (with its
        meta-labels) `covered` refuses (the caller's authorization does not reach it) is
        JOURNAL_NOT_FOUND, whether or not it exists.

        Appends (`require_primary`) are served by the primary; reads are served by the
        primary too, or by any assigned replica when the request may not be proxied. A
        broker that cannot serve a request proxies it to the primary when `may_proxy`.
        Waits (up to `timeout`) for the keyspace to reach `min_etcd_revision`, for a journal
        without a primary to get one, and for a just-assigned replica to finish recovery;
        raises TimeoutError if the keyspace or the replica is not ready in time.

        `proxy_header` is the header of a request another broker forwarded here. When its
        route of the journal is not ours and its etcd revision is ahead of our keyspace,
        our view is behind the one the request was routed by (we may be a peer that the
        primary has not synchronised yet): we wait to reach that revision first, as
        upstream's resolver does. Only then: a revision ahead with the same route may be
        one no event of our keyspace's prefix ever reaches (a load or progress notification
        at etcd's global revision), and waiting for it would stall the request.
        """
        keyspace = self.member.keyspace
        name, _meta = split_journal_meta(journal)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if min_etcd_revision > keyspace.revision:
            await keyspace.wait_for_revision(min_etcd_revision, timeout=timeout)
        confirmed_absent = False
        while True:
            revision = keyspace.revision
            item = keyspace.get(self.keys.item(name))
            if item is not None and covered is not None:
                if not covered(journal_labels_with_meta(item.value)):
                    return Resolution(pb.JOURNAL_NOT_FOUND, self.header())
            if item is None:
                if confirmed_absent:
                    return Resolution(pb.JOURNAL_NOT_FOUND, self.header())
                # Our mirror may lag a journal created through another broker a moment ago:
                # JOURNAL_NOT_FOUND is final for clients, so confirm it against etcd first.
                confirmed_absent = await self._await_item(name, deadline - loop.time())
                continue
            route = self.route_of(name)
            if (
                proxy_header is not None
                and proxy_header.etcd.revision > revision
                and route_key(proxy_header.route) != route_key(route)
            ):
                async with asyncio.timeout(max(deadline - loop.time(), 0.001)):
                    await keyspace.wait_for_revision(int(proxy_header.etcd.revision))
                proxy_header = None  # reached: our view is at least the forwarder's
                continue
            header = self.header(name)
            mine = self.my_assignment(name)
            is_primary = mine is not None and mine[1] == 0
            has_primary = route.primary >= 0
            primary_ep = route.endpoints[route.primary] if has_primary else ""
            if is_primary or (mine is not None and not require_primary and not may_proxy):
                replica = await self.ready_replica(name, deadline - loop.time())
                if replica is not None:
                    return Resolution(pb.OK, header, replica)
            elif has_primary:
                if may_proxy and primary_ep:
                    return Resolution(pb.OK, header, proxy_to=primary_ep)
                if require_primary:
                    return Resolution(pb.NOT_JOURNAL_PRIMARY_BROKER, header)
                return Resolution(pb.NOT_JOURNAL_BROKER, header)
            elif not may_proxy and mine is None:
                return Resolution(pb.NOT_JOURNAL_BROKER, header)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return Resolution(pb.NO_JOURNAL_PRIMARY_BROKER, header)
            try:
                async with asyncio.timeout(remaining):
                    await keyspace.wait_for_change(revision)
            except TimeoutError:
                return Resolution(pb.NO_JOURNAL_PRIMARY_BROKER, self.header(name))

    async def _await_item(self, name: str, timeout: float) -> bool:
        """Catch the mirror up to etcd for journal `name`'s spec. Returns True if etcd has no
        such journal (the mirror is then authoritative for it)."""
        etcd = self.member.etcd
        if etcd is None:
            return True
        try:
            resp = await etcd.get(self.keys.item(name).encode())
        except EtcdError as err:  # not final: the client retries on UNAVAILABLE
            raise TimeoutError(f"cannot confirm journal {name} with etcd: {err}") from err
        if not resp.kvs:
            return True
        await self.member.keyspace.wait_for_revision(
            int(resp.kvs[0].mod_revision), timeout=max(timeout, 0.001)
        )
        return False
