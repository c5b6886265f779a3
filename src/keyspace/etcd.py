"""A small typed asyncio client of etcd v3 that fails over between the members of a cluster,
over the gRPC stubs that `aetcd` ships.

We use aetcd's generated `etcdserverpb` stubs directly rather than its high-level client
because the keyspace mirror needs every response header (revisions) and whole watch
responses, which the high-level client folds away.

The client is given the endpoints of several members and talks to one at a time. A transport
failure (the member is gone, does not answer in time, or has no leader) moves it to the next.
Reads, lease grants and renewals and watches are retried there; a write is retried only when
etcd cannot have applied it, and otherwise fails with `EtcdOutcomeUnknown`, for its caller to
read again and decide. docs/etcd.md gives the reasons.

Members are dialed over TLS when their endpoint is ``https://`` (trusting the system's CAs),
or whenever the client is given a `ClientTLS` (its CA, and its certificate for etcd's
``--client-cert-auth``): TLS files given for etcd mean no plaintext connection to it, whatever
an endpoint's scheme (docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from aetcd import rpc

from gazette.auth.tls import ClientTLS
from gazette.mainboilerplate.etcd_endpoints import (
    is_tls_endpoint,
    parse_endpoint,
    parse_endpoints,
)

log = logging.getLogger(__name__)

REQUIRE_LEADER = (("hasleader", "true"),)
"""Metadata asking a member to refuse a request while it has no leader (rather than hold it),
and to end a watch when it loses its leader (rather than keep a watch that can see no new
revision): a member cut off from the others then fails fast and the client moves on."""

NOT_SENT = ("etcdserver: no leader", "failed to connect to all addresses")
"""How a call fails that no member ran: a member refuses a `REQUIRE_LEADER` request while it
has no leader before running it; gRPC fails a call it found no connection for. A write that
failed so was not applied and may be sent to another member."""

RETRY_PAUSE = (0.05, 1.0)
"""The pause after every member failed once: from the first value, doubling to the second."""

CONNECT_TIMEOUT = 1.0
"""Longest wait for a connection to a member before moving to the next."""

PROBE_TIMEOUT = 0.25
"""Deadline of the call that asks a channel which failed to connect why it failed."""

NOT_CONNECTED = "failed to connect to all addresses; last error:"
"""How gRPC begins the error of a call on a channel that failed to connect."""

CHANNEL_OPTIONS = (
    # A restarted member is used again within a second, not after gRPC's default backoff
    # (which grows to two minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Pings during calls find a member that vanished without closing its connections (a
    # partition, a paused process) under a watch that would otherwise wait for ever. etcd
    # refuses pings more often than every 5 s, and pings outside calls.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
)

_TRANSPORT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# What gRPC core, not the server, answers when a member's connection breaks under a stream.
_CORE_INTERNAL = "Internal error from Core"


def is_transport_failure(err: grpc.aio.AioRpcError) -> bool:
    """Whether `err` says the member could not be reached or its connection broke (the
    request then goes to the next member), rather than that etcd refused the request."""
    code = err.code()
    return code in _TRANSPORT or (
        code == grpc.StatusCode.INTERNAL and err.details() == _CORE_INTERNAL
    )


class EtcdError(Exception):
    """An etcd request failed (transport error or rejected request)."""


class EtcdUnreachable(EtcdError):
    """No member served a request within the client's timeout."""


class EtcdOutcomeUnknown(EtcdError):
    """A write reached a member whose answer was lost (the member died, or the deadline
    passed): etcd may or may not have applied it. The caller reads again and decides; a
    transaction guarded on the revisions it read fails its compare if it was applied."""


class EtcdCompacted(EtcdError):
    """A watch asked for revisions etcd has compacted away: load again, then watch."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class EtcdLeaseExpired(EtcdError):
    """etcd reports the lease gone (expired or revoked)."""


def prefix_range_end(prefix: bytes) -> bytes:
    """The exclusive range end covering every key that starts with `prefix`."""
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"


@dataclass(frozen=True)
class Compare:
    """A txn comparison of a key's mod or create revision."""

    key: bytes
    target: str  # "mod" | "create" | "version"
    value: int
    op: str = "=="

    def to_rpc(self) -> Any:
        c = rpc.Compare(key=self.key)
        c.result = {
            "==": rpc.Compare.EQUAL,
            "!=": rpc.Compare.NOT_EQUAL,
            ">": rpc.Compare.GREATER,
            "<": rpc.Compare.LESS,
        }[self.op]
        if self.target == "mod":
            c.target = rpc.Compare.MOD
            c.mod_revision = self.value
        elif self.target == "create":
            c.target = rpc.Compare.CREATE
            c.create_revision = self.value
        elif self.target == "version":
            c.target = rpc.Compare.VERSION
            c.version = self.value
        else:
            raise ValueError(f"unknown compare target {self.target!r}")
        return c


def op_put(key: bytes, value: bytes, lease: int = 0) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def op_delete(key: bytes, prefix: bool = False) -> Any:
    req = rpc.DeleteRangeRequest(key=key)
    if prefix:
        req.range_end = prefix_range_end(key)
    return rpc.RequestOp(request_delete_range=req)


class _Member:
    """One endpoint: a channel and its stubs, opened at first use, over TLS with
    `credentials` (None: plaintext)."""

    def __init__(self, endpoint: str, credentials: grpc.ChannelCredentials | None) -> None:
        self.endpoint = endpoint
        self.target = parse_endpoint(endpoint)
        self.credentials = credentials
        self._channel: grpc.aio.Channel | None = None
        self.kv: Any = None
        self.watch: Any = None
        self.lease: Any = None

    async def connect(self, timeout: float) -> str | None:
        """None once the channel is (or becomes, within `timeout` seconds) connected, else why
        not: a request is sent only then, so a write that fails here was not sent at all."""
        if self._channel is None:
            if self.credentials is None:
                self._channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
            else:
                self._channel = grpc.aio.secure_channel(
                    self.target, self.credentials, options=CHANNEL_OPTIONS
                )
            self.kv = rpc.KVStub(self._channel)
            self.watch = rpc.WatchStub(self._channel)
            self.lease = rpc.LeaseStub(self._channel)
        if self._channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
            return None
        try:
            # Not `wait_for`: on Python 3.11 it can swallow a cancellation that arrives as the
            # channel becomes ready, and a cancelled keep-alive would then renew the lease on.
            async with asyncio.timeout(max(timeout, 0.0)):
                await self._channel.channel_ready()
        except TimeoutError:
            return await self._why_unconnected()
        return None

    async def _why_unconnected(self) -> str:
        """Why the channel failed to connect, as gRPC last saw it (a refused connection, a
        TLS handshake that failed and how): a channel that failed fails a call at once, with
        its last error. The call is a read of no key, harmless if it does reach the member."""
        assert self._channel is not None
        if self._channel.get_state() != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return "cannot connect"
        try:
            await self.kv.Range(rpc.RangeRequest(key=b"\0"), timeout=PROBE_TIMEOUT)
        except grpc.aio.AioRpcError as err:
            details = (err.details() or "").removeprefix(NOT_CONNECTED).strip()
            return f"cannot connect ({details})" if details else "cannot connect"
        return "cannot connect (in time)"

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None


class _Attempts:
    """The attempts of one call, member after member, within a time budget (None: no end)."""

    def __init__(self, etcd: Etcd, what: str, budget: float | None, attempt: float) -> None:
        self.etcd = etcd
        self.what = what
        self.budget = budget
        self.deadline = math.inf if budget is None else time.monotonic() + budget
        self.attempt = attempt
        self.failures: list[str] = []
        self.pause = RETRY_PAUSE[0]

    def timeout(self) -> float:
        """The deadline of the next attempt."""
        return max(min(self.attempt, self.deadline - time.monotonic()), 0.001)

    async def failed(self, member: _Member, reason: str) -> None:
        """Move to the next member; pause after a round in which every member failed. Raises
        `EtcdUnreachable` once the budget is spent."""
        self.etcd._fail_over(member, f"{self.what}: {reason}")
        self.failures.append(f"{member.endpoint}: {reason}")
        rounds, rest = divmod(len(self.failures), len(self.etcd.endpoints))
        if rest == 0 and rounds > 0:
            await asyncio.sleep(max(min(self.pause, self.deadline - time.monotonic()), 0.0))
            self.pause = min(self.pause * 2, RETRY_PAUSE[1])
        if time.monotonic() >= self.deadline:
            recent = "; ".join(self.failures[-len(self.etcd.endpoints) :])
            raise EtcdUnreachable(
                f"etcd {','.join(self.etcd.endpoints)}: {self.what} failed on every member "
                f"for {self.budget}s: {recent}"
            )


async def _create_then_wait(create: Any) -> AsyncIterator[Any]:
    """A watch's request stream: the one create request, then nothing until cancelled (the
    stream stays open, so the server keeps sending)."""
    yield rpc.WatchRequest(create_request=create)
    await asyncio.Event().wait()


class Etcd:
    """An etcd client of the members at `endpoints` (a comma-separated list, or a sequence;
    module docs). Use as an async context manager or call close().

    Every call is bounded by `timeout` seconds, over all the members it tries; one attempt
    takes at most its share of it (`timeout` / the number of members, at least
    `CONNECT_TIMEOUT`), so a member that hangs leaves time for the others. A member that
    refuses the TLS handshake (a certificate its CA did not sign, or none when it asks for
    one) is one that cannot be reached.

    With `tls`, every member is dialed over TLS with its files (module docs); without,
    ``https://`` endpoints are, trusting the system's CAs. Raises `InvalidEndpoint`
    (`gazette.mainboilerplate.etcd_endpoints`) if an endpoint is not ``http://host[:port]``,
    ``https://host[:port]`` or ``host[:port]``; `TLSConfigError` (`gazette.auth.tls`) if the
    TLS files cannot be used.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout: float = 10.0,
        tls: ClientTLS | None = None,
    ) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self.timeout = timeout
        secure = [tls is not None or is_tls_endpoint(ep) for ep in self.endpoints]
        credentials = None
        if tls is not None:
            credentials = tls.grpc_credentials()
        elif any(secure):
            credentials = grpc.ssl_channel_credentials()
        self._members = [
            _Member(endpoint, credentials if tls_on else None)
            for endpoint, tls_on in zip(self.endpoints, secure, strict=True)
        ]
        self._current = 0
        self._attempt = min(timeout, max(timeout / len(self._members), CONNECT_TIMEOUT))

    @property
    def endpoint(self) -> str:
        """The endpoint of the member in use."""
        return self.endpoints[self._current]

    async def close(self) -> None:
        for member in self._members:
            await member.close()

    async def __aenter__(self) -> Etcd:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _fail_over(self, member: _Member, reason: str) -> None:
        """Use the next member, unless another call already moved away from `member`."""
        if self._members[self._current] is member:
            self._current = (self._current + 1) % len(self._members)
            log.warning(
                "etcd fail-over from=%s to=%s err=%s", member.endpoint, self.endpoint, reason
            )

    async def _unary(self, stub: str, method: str, req: Any, *, write: bool = False) -> Any:
        """Call `method` of the `stub` ("kv", "lease") of the member in use, moving to the next
        member on a transport failure. A `write` moves on only if no member ran it
        (`NOT_SENT`); else it raises `EtcdOutcomeUnknown`."""
        attempts = _Attempts(self, method, self.timeout, self._attempt)
        while True:
            member = self._members[self._current]
            timeout = attempts.timeout()
            if (unreached := await member.connect(min(timeout, CONNECT_TIMEOUT))) is not None:
                await attempts.failed(member, unreached)
                continue
            try:
                fn = getattr(getattr(member, stub), method)
                return await fn(req, timeout=timeout, metadata=REQUIRE_LEADER)
            except grpc.aio.AioRpcError as err:
                reason = f"{err.code().name}: {err.details()}"
                if not is_transport_failure(err):
                    raise EtcdError(f"etcd {member.endpoint}: {reason}") from err
                if write and not (err.details() or "").startswith(NOT_SENT):
                    self._fail_over(member, f"{method}: {reason}")
                    raise EtcdOutcomeUnknown(
                        f"etcd {member.endpoint}: {method} may or may not have been applied: "
                        f"{reason}"
                    ) from err
                await attempts.failed(member, reason)

    async def get_prefix(self, prefix: bytes, *, revision: int = 0) -> Any:
        """A RangeResponse of every key under `prefix`, sorted by key."""
        req = rpc.RangeRequest(key=prefix, range_end=prefix_range_end(prefix), revision=revision)
        return await self._unary("kv", "Range", req)

    async def get(self, key: bytes) -> Any:
        return await self._unary("kv", "Range", rpc.RangeRequest(key=key))

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> Any:
        """Raises `EtcdOutcomeUnknown` if the put may or may not have been applied."""
        req = rpc.PutRequest(key=key, value=value, lease=lease)
        return await self._unary("kv", "Put", req, write=True)

    async def delete(self, key: bytes, *, prefix: bool = False) -> Any:
        """Raises `EtcdOutcomeUnknown` if the delete may or may not have been applied."""
        req = rpc.DeleteRangeRequest(key=key)
        if prefix:
            req.range_end = prefix_range_end(key)
        return await self._unary("kv", "DeleteRange", req, write=True)

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Any], failure: Sequence[Any] = ()
    ) -> Any:
        """Run a transaction; returns the TxnResponse (check `.succeeded`).

        Raises `EtcdOutcomeUnknown` if it may or may not have been applied: it is not sent
        again, because a second run would answer for the first (a guarded transaction
        applied once fails its compare the second time, and would read as a conflict)."""
        req = rpc.TxnRequest(
            compare=[c.to_rpc() for c in compare], success=list(success), failure=list(failure)
        )
        return await self._unary("kv", "Txn", req, write=True)

    async def grant_lease(self, ttl: int) -> int:
        """A new lease of `ttl` seconds. Retried on another member like a read: a grant whose
        answer was lost leaves a lease nothing is attached to, which expires after `ttl`."""
        resp = await self._unary("lease", "LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl))
        return int(resp.ID)

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke the lease (idempotent); a failure is ignored: the lease then expires."""
        with contextlib.suppress(EtcdError):
            await self._unary("lease", "LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease_id))

    async def keep_alive(
        self, lease_id: int, ttl: int, on_renewed: Callable[[float, int], None] | None = None
    ) -> None:
        """Refresh the lease every ttl/3 seconds until cancelled; raises `EtcdLeaseExpired`
        once etcd reports it gone.

        Leases belong to the cluster, so a renewal that fails on one member is sent to the
        next at once (each attempt bounded by ttl/3), without end: the caller judges from
        `on_renewed` whether the lease may have lapsed. `on_renewed(sent_at, ttl)` is called
        after each renewal etcd confirms, with the `time.monotonic()` at which its request
        was sent and the TTL granted: the lease cannot end before `sent_at + ttl`.
        """
        interval = max(ttl / 3.0, 0.5)
        while True:
            await self._renew(lease_id, interval, on_renewed)
            await asyncio.sleep(interval)

    async def _renew(
        self, lease_id: int, interval: float, on_renewed: Callable[[float, int], None] | None
    ) -> None:
        attempts = _Attempts(self, "lease keep-alive", None, min(interval, self.timeout))
        while True:
            member = self._members[self._current]
            timeout = attempts.timeout()
            if (unreached := await member.connect(min(timeout, CONNECT_TIMEOUT))) is not None:
                await attempts.failed(member, unreached)
                continue
            sent_at = time.monotonic()
            call = member.lease.LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]),
                timeout=timeout,
                metadata=REQUIRE_LEADER,
            )
            try:
                async for reply in call:
                    if reply.TTL <= 0:
                        raise EtcdLeaseExpired(f"lease {lease_id:x} expired")
                    if on_renewed is not None:
                        on_renewed(sent_at, int(reply.TTL))
                    return
                reason = "no answer"
            except grpc.aio.AioRpcError as err:
                reason = f"{err.code().name}: {err.details()}"
                if not is_transport_failure(err):
                    raise EtcdError(f"etcd {member.endpoint}: lease keep-alive: {reason}") from err
            finally:
                call.cancel()
            log.warning("lease keep-alive failed lease=%x err=%s", lease_id, reason)
            await attempts.failed(member, reason)

    async def watch_prefix(self, prefix: bytes, start_revision: int) -> AsyncIterator[Any]:
        """Yield WatchResponses of `prefix` from `start_revision` (inclusive), with headers.

        When the member in use fails, the watch resumes on the next one at the revision after
        the last one delivered, so no event is missed or repeated. Raises `EtcdCompacted` if
        that revision was compacted away, `EtcdUnreachable` if no member serves the watch
        for `timeout` seconds, `EtcdError` if the server cancels it for another reason.
        Cancelling the consuming task closes the stream.
        """
        next_revision = start_revision
        attempts = _Attempts(self, "watch", self.timeout, self._attempt)
        while True:
            member = self._members[self._current]
            if (
                unreached := await member.connect(min(attempts.timeout(), CONNECT_TIMEOUT))
            ) is not None:
                await attempts.failed(member, unreached)
                continue
            create = rpc.WatchCreateRequest(
                key=prefix,
                range_end=prefix_range_end(prefix),
                start_revision=next_revision,
                progress_notify=True,
            )
            call = member.watch.Watch(_create_then_wait(create), metadata=REQUIRE_LEADER)
            try:
                async for resp in call:
                    if resp.canceled:
                        message = (
                            f"watch of {prefix!r} from revision {next_revision} cancelled: "
                            f"{resp.cancel_reason}"
                        )
                        if resp.compact_revision:
                            raise EtcdCompacted(
                                f"{message} (compacted to {resp.compact_revision})",
                                int(resp.compact_revision),
                            )
                        raise EtcdError(message)
                    attempts = _Attempts(self, "watch", self.timeout, self._attempt)
                    if resp.created and not resp.events:
                        continue
                    if resp.events:
                        last = max(int(ev.kv.mod_revision) for ev in resp.events)
                        next_revision = max(next_revision, last + 1)
                    else:
                        # A progress notification: every revision up to its header's is sent.
                        next_revision = max(next_revision, int(resp.header.revision) + 1)
                    yield resp
                reason = "stream ended"
            except grpc.aio.AioRpcError as err:
                reason = f"{err.code().name}: {err.details()}"
                if not is_transport_failure(err):
                    raise EtcdError(f"etcd watch {member.endpoint}: {reason}") from err
            finally:
                call.cancel()
            log.warning(
                "etcd watch interrupted prefix=%r resume_at=%d err=%s",
                prefix,
                next_revision,
                reason,
            )
            await attempts.failed(member, reason)
