"""MemberSession: a member's announcement in etcd, held under a lease it keeps alive.

A member (broker or consumer) announces itself by creating its member key under a fresh
lease; the allocator writes the member's assignments under the same lease, so when the
lease ends (revoked, or expired because the process died) the member key and all of its
assignments disappear in one etcd revision.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gazette.keyspace.etcd import Compare, Etcd, EtcdError, op_delete, op_put

log = logging.getLogger(__name__)


class MemberExistsError(Exception):
    """The member key is held by another live process (or a predecessor's unexpired lease)."""


class LeaseLostError(Exception):
    """The session's lease expired or was revoked: the member key and its assignments are gone."""


class MemberSession:
    """The member key `key`, announced under a lease of `ttl` seconds.

    Lifecycle: `announce()` once, run `keep_alive()` in a task for as long as the member
    serves, `update()` to change the announced value (e.g. to set the exiting flag), and
    `release()` to end the session, which deletes the member key and its assignments.
    """

    def __init__(self, etcd: Etcd, key: str, ttl: int) -> None:
        if ttl <= 0:
            raise ValueError(f"lease ttl must be positive, not {ttl}")
        self.etcd = etcd
        self.key = key
        self.ttl = ttl
        self._lease_id = 0
        self._create_revision = 0
        self._valid_until = 0.0  # time.monotonic() before which etcd cannot end the lease

    @property
    def lease_id(self) -> int:
        """The session's lease id, or 0 before `announce()` and after `release()`."""
        return self._lease_id

    @property
    def create_revision(self) -> int:
        """The etcd revision at which this session created its member key (0 if none)."""
        return self._create_revision

    async def announce(
        self, value: bytes, *, replace_if: Callable[[bytes], bool] | None = None
    ) -> None:
        """Grant a lease and create the member key with `value` under it.

        If the key exists and `replace_if(existing value)` says it is our own crashed
        predecessor (e.g. it advertises our endpoint), its lease is revoked first, which
        removes its assignments at once instead of after its TTL.

        Raises MemberExistsError if the key is held by someone else, EtcdError if etcd
        fails. On any failure (or cancellation) the new lease is revoked again.
        """
        if self._lease_id:
            raise RuntimeError(f"member {self.key} is already announced")
        key = self.key.encode()
        granted_at = time.monotonic()
        lease = await self.etcd.grant_lease(self.ttl)
        try:
            existing = await self.etcd.get(key)
            if existing.kvs and replace_if is not None and replace_if(bytes(existing.kvs[0].value)):
                old = existing.kvs[0]
                log.info(
                    "member session: replacing previous instance key=%s lease=%x",
                    self.key,
                    old.lease,
                )
                if old.lease:
                    await self.etcd.revoke_lease(int(old.lease))
                else:
                    await self.etcd.txn(
                        [Compare(key, "mod", int(old.mod_revision))], [op_delete(key)]
                    )
            resp = await self.etcd.txn([Compare(key, "create", 0)], [op_put(key, value, lease)])
            if not resp.succeeded:
                held = await self.etcd.get(key)
                holder = f"lease {held.kvs[0].lease:x}" if held.kvs else "a lease just ended"
                raise MemberExistsError(
                    f"member key {self.key} exists ({holder}): another process runs as this "
                    f"member, or a previous instance's lease has not expired yet "
                    f"(it expires within {self.ttl}s of that process's death)"
                )
        except BaseException:
            await self.etcd.revoke_lease(lease)
            raise
        self._lease_id = lease
        self._create_revision = int(resp.header.revision)
        self._valid_until = granted_at + self.ttl

    def lease_valid_for(self) -> float:
        """Seconds for which the lease is certainly still held (<= 0: it may have ended).

        Measured from the moment the last confirmed renewal (or the grant) was *sent*, on
        the monotonic clock, so a process that was paused (SIGSTOP, a long GC, a VM
        migration) past its TTL sees its lease as possibly lost as soon as it runs again,
        before any watch tells it so. Work that must not outlive the lease (a primary
        reserving journal offsets) checks this first.
        """
        if not self._lease_id:
            return 0.0
        return self._valid_until - time.monotonic()

    def _renewed(self, sent_at: float, ttl: int) -> None:
        self._valid_until = max(self._valid_until, sent_at + ttl)

    async def keep_alive(self) -> None:
        """Refresh the lease until cancelled.

        Transient etcd errors are retried; raises LeaseLostError once etcd reports the
        lease gone (then the member key and its assignments are gone too).
        """
        if not self._lease_id:
            raise RuntimeError(f"member {self.key} is not announced")
        lease = self._lease_id
        try:
            await self.etcd.keep_alive(lease, self.ttl, self._renewed)
        except EtcdError as err:
            raise LeaseLostError(f"member {self.key}: lease {lease:x} lost: {err}") from err

    async def update(self, value: bytes) -> None:
        """Replace the announced value, keeping the lease (e.g. to set `exiting`).

        Raises LeaseLostError if our member key no longer exists, EtcdError if etcd fails.
        """
        if not self._lease_id:
            raise RuntimeError(f"member {self.key} is not announced")
        key = self.key.encode()
        resp = await self.etcd.txn(
            [Compare(key, "create", self._create_revision)],
            [op_put(key, value, self._lease_id)],
        )
        if not resp.succeeded:
            raise LeaseLostError(
                f"member {self.key}: key is gone (lease {self._lease_id:x} expired or revoked)"
            )

    async def release(self) -> None:
        """Revoke the lease, deleting the member key and its assignments.

        Idempotent. An etcd error is ignored: the lease then ends by expiry instead.
        """
        lease, self._lease_id = self._lease_id, 0
        self._valid_until = 0.0
        if lease:
            await self.etcd.revoke_lease(lease)
