"""The assignment solver: which members should replicate each item.

`solve()` is a pure function of the items (with their replication), the members (with
their item limits and exit flags) and the current assignments. It models the problem as a
flow network

    source -> item -> item-in-zone -> member -> sink

where the source arc of an item carries its replication, an item-in-zone arc bounds how
many of the item's replicas one zone may hold (all but one of them, so that an item of
replication two or more spans two zones), an item-in-zone to member arc carries one
replica, and a member's sink arc carries its item limit. A maximum flow is a largest
feasible assignment; the solver steers *which* one it finds, in three passes:

1. Placement. Current assignments that fit are kept first (seeded); the remaining
   replicas go directly to a member with room, preferring zones holding fewer of the
   item's replicas and then the member least loaded relative to its limit; only what
   still does not fit searches augmenting paths, which move other replicas around.
2. If items still lack replicas, the zone bound is lifted and step 1 repeats for them:
   better all of an item's replicas in one zone than fewer replicas.
3. Balance. Single replicas move from loaded to less loaded members, within the zone
   bound, while that lowers sum(load**2 / limit), which spreads load in proportion to
   limits.

A solution is a fixed point: solving again with it as `current` keeps every assignment
(step 1) and finds no move that lowers the sum (step 3). A cluster that gains a member
therefore moves only the replicas the newcomer's share needs. docs/allocator.md has the
reasoning and the alternatives we rejected.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

from gazette.allocator.model import Item, Member, MemberID


def solve(
    items: Iterable[Item],
    members: Iterable[Member],
    current: Mapping[str, Sequence[MemberID]],
) -> dict[str, list[MemberID]]:
    """The desired members of every item, keyed by item id.

    Each list holds `min(replication, feasible)` distinct members: the kept current
    members in their current order (so a current primary stays first), then new ones in
    member order. Exiting members and members of limit 0 get nothing, no member exceeds
    its limit, and an item of replication two or more spans two zones whenever the
    capacity of two zones allows it. `current` may name unknown or exiting members; they
    are ignored. The result is deterministic: it depends only on the arguments' contents,
    not on their order.
    """
    return _Network(list(items), list(members), current).solve()


class _Network:
    """Mutable flow state of one `solve()` call.

    Indices: items by position in id order, members (eligible ones only) by position in
    MemberID order, zones by position in name order. In the augmenting-path search, node
    numbers are: item `i`, then item-in-zone `n + i * Z + z`, then member `n + n * Z + k`.
    """

    def __init__(
        self,
        items: list[Item],
        members: list[Member],
        current: Mapping[str, Sequence[MemberID]],
    ) -> None:
        self.items = sorted(items, key=lambda i: i.id)
        eligible = sorted((m for m in members if m.limit > 0 and not m.exiting), key=lambda m: m.id)
        self.member_ids = [m.id for m in eligible]
        self.limit = [m.limit for m in eligible]
        index = {m.id: k for k, m in enumerate(eligible)}
        zones = sorted({m.id.zone for m in eligible})
        zone_index = {z: n for n, z in enumerate(zones)}
        self.n_zones = len(zones)
        self.zone_of = [zone_index[m.id.zone] for m in eligible]
        self.zone_members: list[list[int]] = [[] for _ in zones]
        for k, z in enumerate(self.zone_of):
            self.zone_members[z].append(k)

        n_members = len(eligible)
        self.want = [min(max(item.replication, 0), n_members) for item in self.items]
        spread = self.n_zones >= 2
        self.zone_cap = [w - 1 if spread and w >= 2 else w for w in self.want]

        self.current: list[list[int]] = []
        for item in self.items:
            mine: list[int] = []
            for member_id in current.get(item.id, ()):
                found = index.get(member_id)
                if found is not None and found not in mine:
                    mine.append(found)
            self.current.append(mine)

        # The flow: an item's members (ordered sets), its replicas per zone, a member's
        # items and load.
        self.assigned: list[dict[int, None]] = [{} for _ in self.items]
        self.in_zone: list[dict[int, int]] = [{} for _ in self.items]
        self.held: list[dict[int, None]] = [{} for _ in eligible]
        self.load = [0] * n_members
        # Indices of free capacity. Per zone: a min-heap of (cost, member) and the members
        # with room; across zones: a min-heap of (least cost in the zone, zone). Heap
        # entries go stale as loads change and are discarded lazily.
        self.member_heaps: list[list[tuple[float, int]]] = [
            [(self._cost(k), k) for k in ms] for ms in self.zone_members
        ]
        for heap in self.member_heaps:
            heapq.heapify(heap)
        self.zone_least = [self._zone_cost(z) for z in range(self.n_zones)]
        self.zone_heap = [(c, z) for z, c in enumerate(self.zone_least)]
        heapq.heapify(self.zone_heap)
        self.room_in: list[dict[int, None]] = [dict.fromkeys(ms) for ms in self.zone_members]

    # --- the passes -----------------------------------------------------------------------
    def solve(self) -> dict[str, list[MemberID]]:
        if not self.member_ids:
            return self._result()
        spread_caps = list(self.zone_cap)
        everything = list(range(len(self.items)))
        self._place(everything)
        unmet = self._unmet()
        if unmet and self.zone_cap != self.want:
            # Better all of an item's replicas in one zone than fewer replicas. The bound is
            # lifted for every item, as an unmet item may need another item to give up its
            # second zone; but only paths on behalf of unmet items are searched.
            self.zone_cap = list(self.want)
            self._place(unmet)
        self.zone_cap = spread_caps
        self._rebalance()
        return self._result()

    def _unmet(self) -> list[int]:
        return [i for i, w in enumerate(self.want) if len(self.assigned[i]) < w]

    def _place(self, items: list[int]) -> None:
        """Place replicas of `items`: current assignments, then directly, then by moves."""
        self._seed(items)
        for i in items:
            self._fill_directly(i)
        dead: set[int] = set()  # nodes that cannot reach the sink
        for i in items:
            while len(self.assigned[i]) < self.want[i]:
                if not any(self.room_in) or not self._augment(i, dead):
                    break

    # --- member load ----------------------------------------------------------------------
    def _cost(self, k: int) -> float:
        """What one more replica on member `k` adds to sum(load**2 / limit).

        Placing where this is least, and moving replicas while that lowers the sum,
        balances load in proportion to limits. A full member costs more than 2 and one
        with room less, so a heap's least entry also tells whether any member has room.
        """
        return (2 * self.load[k] + 1) / self.limit[k]

    def _zone_cost(self, z: int) -> float:
        """The least `_cost` of a member of zone `z` (discarding stale heap entries)."""
        heap = self.member_heaps[z]
        while heap and heap[0][0] != self._cost(heap[0][1]):
            heapq.heappop(heap)
        return heap[0][0] if heap else _FULL

    def _load_changed(self, k: int) -> None:
        z = self.zone_of[k]
        heapq.heappush(self.member_heaps[z], (self._cost(k), k))
        if self.load[k] < self.limit[k]:
            self.room_in[z][k] = None
        else:
            self.room_in[z].pop(k, None)
        least = self._zone_cost(z)
        if least != self.zone_least[z]:
            self.zone_least[z] = least
            heapq.heappush(self.zone_heap, (least, z))

    # --- placement ------------------------------------------------------------------------
    def _add(self, i: int, k: int) -> None:
        z = self.zone_of[k]
        self.assigned[i][k] = None
        self.in_zone[i][z] = self.in_zone[i].get(z, 0) + 1
        self.held[k][i] = None
        self.load[k] += 1
        self._load_changed(k)

    def _seed(self, items: list[int]) -> None:
        """Keep the current assignments that fit.

        Slot by slot (every item's first member, then every second, ...), so primaries are
        the last to go; within a slot in a fixed pseudo-random order, so a member over its
        limit sheds replicas of items spread over the id space rather than every replica
        of the last items in id order.
        """
        edges = [(slot, _mix(i, k), i, k) for i in items for slot, k in enumerate(self.current[i])]
        edges.sort()
        for _, _, i, k in edges:
            assigned = self.assigned[i]
            if len(assigned) >= self.want[i] or k in assigned or self.load[k] >= self.limit[k]:
                continue
            if self.in_zone[i].get(self.zone_of[k], 0) >= self.zone_cap[i]:
                continue
            self._add(i, k)

    def _cheapest(self, z: int, i: int) -> int | None:
        """The member of zone `z` with room and the least cost, not yet holding item `i`."""
        heap, assigned = self.member_heaps[z], self.assigned[i]
        skipped: list[tuple[float, int]] = []
        found: int | None = None
        while heap:
            cost, k = heap[0]
            if cost != self._cost(k):
                heapq.heappop(heap)  # stale
                continue
            if self.load[k] >= self.limit[k]:
                break  # the zone is full
            if k in assigned:
                skipped.append(heapq.heappop(heap))
                continue
            found = k
            break
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found

    def _cheapest_new_zone(self, i: int) -> int | None:
        """The zone with the cheapest member with room, among zones without item `i`."""
        heap, in_zone = self.zone_heap, self.in_zone[i]
        skipped: dict[int, float] = {}
        found: int | None = None
        while heap:
            cost, z = heap[0]
            if cost != self.zone_least[z] or z in skipped:
                heapq.heappop(heap)  # stale, or a duplicate of a skipped entry
                continue
            if not self.room_in[z]:
                break  # the cheapest zone is full, so all are
            if in_zone.get(z, 0) > 0:
                skipped[z] = heapq.heappop(heap)[0]
                continue
            found = z
            break
        for z, cost in skipped.items():
            heapq.heappush(heap, (cost, z))
        return found

    def _fill_directly(self, i: int) -> None:
        """Add replicas of item `i` on members with room, without moving others.

        Prefers zones holding fewer of the item's replicas, then the least loaded member
        (relative to its limit), then member order.
        """
        in_zone, zone_cap = self.in_zone[i], self.zone_cap[i]
        while len(self.assigned[i]) < self.want[i]:
            best: tuple[int, float, int] | None = None
            z_new = self._cheapest_new_zone(i)
            zones = [z for z, held in in_zone.items() if 0 < held < zone_cap]
            if z_new is not None:
                zones.append(z_new)
            for z in zones:
                k = self._cheapest(z, i)
                if k is not None:
                    key = (in_zone.get(z, 0), self._cost(k), k)
                    if best is None or key < best:
                        best = key
            if best is None:
                return
            self._add(i, best[2])

    def _augment(self, i: int, dead: set[int]) -> bool:
        """Find a path from item `i` to the sink and push one replica along it.

        A path may move other items' replicas between members. The search is breadth
        first over members, but eager elsewhere: a zone-item is tested for a spare member
        as soon as it is discovered, and an item reached backwards (one of its replicas
        could move) is expanded at once, so the common short detours are found without
        sweeping a whole level of the network. Nodes explored by a failed search can never
        reach the sink again under the same capacities (augmenting only reverses arcs
        between nodes that can), so later searches skip them.
        """
        n, zs = len(self.items), self.n_zones
        base = n + n * zs
        parent: dict[int, int] = {i: -1}
        queue: deque[int] = deque()
        # Members not reached yet, per zone, and the zones that still have any (or have a
        # spare member): a zone-item of any other zone leads nowhere new.
        pool: list[dict[int, None]] = [
            {k: None for k in ms if base + k not in dead} for ms in self.zone_members
        ]
        open_zones = {z: None for z in range(zs) if pool[z] or self.room_in[z]}

        def reached(v: int, u: int) -> bool:
            """Record zone-item `v` reached from `u`; True once a path is applied."""
            parent[v] = u
            j, z = divmod(v - n, zs)
            assigned = self.assigned[j]
            for k in self.room_in[z]:
                if k not in assigned:
                    parent[base + k] = v
                    self._apply(base + k, parent)
                    return True
            if pool[z]:
                queue.append(v)
            return False

        def expand_item(j: int) -> bool:
            in_zone, zone_cap = self.in_zone[j], self.zone_cap[j]
            for z in list(open_zones):
                if not pool[z] and not self.room_in[z]:
                    del open_zones[z]
                    continue
                v = n + j * zs + z
                if in_zone.get(z, 0) < zone_cap and v not in parent and v not in dead:
                    if reached(v, j):
                        return True
            return False

        if expand_item(i):
            return True
        while queue:
            u = queue.popleft()
            if u < base:  # a zone-item: on to the zone's members not holding the item
                j, z = divmod(u - n, zs)
                assigned, members = self.assigned[j], pool[z]
                for k in [k for k in members if k not in assigned]:
                    del members[k]
                    parent[base + k] = u
                    queue.append(base + k)
            else:  # a full member: back to the zone-items of its items, and their items
                k = u - base
                z = self.zone_of[k]
                for j in self.held[k]:
                    v = n + j * zs + z
                    if v in parent or v in dead:
                        continue
                    if reached(v, u):
                        return True
                    if j not in parent and j not in dead:
                        parent[j] = v
                        if expand_item(j):
                            return True
        dead.update(parent)
        return False

    def _apply(self, end: int, parent: dict[int, int]) -> None:
        n, zs = len(self.items), self.n_zones
        base = n + n * zs
        path = [end]
        while parent[path[-1]] != -1:
            path.append(parent[path[-1]])
        path.reverse()
        for u, v in zip(path, path[1:], strict=False):
            if u < n:  # item -> zone-item: one more replica of the item in the zone
                j, z = divmod(v - n, zs)
                self.in_zone[j][z] = self.in_zone[j].get(z, 0) + 1
            elif u < base and v < n:  # zone-item -> item: one fewer in the zone
                j, z = divmod(u - n, zs)
                self.in_zone[j][z] -= 1
            elif u < base:  # zone-item -> member: the member takes the item
                j = (u - n) // zs
                k = v - base
                self.assigned[j][k] = None
                self.held[k][j] = None
            else:  # member -> zone-item: the member hands the item over
                k = u - base
                j = (v - n) // zs
                del self.assigned[j][k]
                del self.held[k][j]
        k = end - base
        self.load[k] += 1
        self._load_changed(k)

    # --- balance --------------------------------------------------------------------------
    def _movable(self, i: int, src: int, zone: int) -> bool:
        """Whether item `i` may move from member `src` to a member of `zone` (zone bound)."""
        return zone == self.zone_of[src] or self.in_zone[i].get(zone, 0) < self.zone_cap[i]

    def _rebalance(self) -> None:
        """Move single replicas from loaded to less loaded members while that lowers
        sum(load**2 / limit), honouring zone bounds; each move is one a balanced cluster
        needs, and a balanced assignment has none (so it solves to itself).

        Local search: it takes the most loaded member that can still shed and tries the
        least loaded takers first. A member that can shed to none is set aside until a
        move could give it an option: a move of one of its items, or a member in a zone
        it could shed to becoming less loaded.
        """
        stuck: dict[int, dict[int, bool]] = {}  # member -> zone -> has an item movable there
        members = range(len(self.member_ids))
        while True:
            sheddable = [k for k in members if k not in stuck and self.load[k] > 0]
            if not sheddable:
                return
            src = max(sheddable, key=lambda k: (self._relief(k), -k))
            relief = self._relief(src)
            takers = sorted(
                (k for k in members if k != src and self._cost(k) < relief),
                key=lambda k: (self._cost(k), k),
            )
            if not takers:
                return  # no member anywhere gains from any move
            moved = self._shed(src, takers)
            if moved is None:
                stuck[src] = {}
                continue
            for k in self.assigned[moved]:
                stuck.pop(k, None)
            zone, cost = self.zone_of[src], self._cost(src)
            for k, movable in list(stuck.items()):
                if self._relief(k) <= cost:
                    continue
                if zone not in movable:
                    movable[zone] = any(self._movable(i, k, zone) for i in self.held[k])
                if movable[zone]:
                    del stuck[k]

    def _relief(self, k: int) -> float:
        """What one replica fewer on member `k` takes off sum(load**2 / limit)."""
        return (2 * self.load[k] - 1) / self.limit[k]

    def _shed(self, src: int, takers: list[int]) -> int | None:
        """Move one replica from `src` to the first of `takers` that can take one; the
        moved item, or None."""
        current = self.current
        # Prefer replicas that are not the item's current primary.
        order = sorted(self.held[src], key=lambda i: bool(current[i]) and current[i][0] == src)
        by_zone: dict[int, list[int]] = {}
        for dst in takers:
            zone = self.zone_of[dst]
            if zone not in by_zone:
                by_zone[zone] = [i for i in order if self._movable(i, src, zone)]
            for i in by_zone[zone]:
                if dst not in self.assigned[i]:
                    self._move(i, src, dst)
                    return i
        return None

    def _move(self, i: int, src: int, dst: int) -> None:
        del self.assigned[i][src]
        del self.held[src][i]
        z = self.zone_of[src]
        self.in_zone[i][z] -= 1
        self.load[src] -= 1
        self._load_changed(src)
        self._add(i, dst)

    def _result(self) -> dict[str, list[MemberID]]:
        out: dict[str, list[MemberID]] = {}
        for i, item in enumerate(self.items):
            assigned = self.assigned[i]
            kept = [k for k in self.current[i] if k in assigned]
            kept_set = set(kept)
            new = sorted(k for k in assigned if k not in kept_set)
            out[item.id] = [self.member_ids[k] for k in kept + new]
        return out


_FULL = float("inf")


def _mix(i: int, k: int) -> int:
    """A well-spread 32-bit hash of an (item, member) index pair, stable across runs."""
    x = (i * 0x9E3779B1 + k * 0x85EBCA77 + 0x27D4EB2F) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    x ^= x >> 12
    x = (x * 0x297A2D39) & 0xFFFFFFFF
    return x ^ (x >> 15)
