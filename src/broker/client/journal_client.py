"""JournalClient: gRPC channels to brokers, and routing of journal RPCs among them.

A `JournalClient` is created with one or more broker endpoints; the first is the *default*
endpoint, used for RPCs with no journal (List, Apply) and for journals whose route is not yet
known. Any broker can serve any request (it proxies to the journal's primary when needed), so
routing is an optimisation: responses carry the journal's route in their header, the client
remembers it in a `RouteCache`, and later RPCs of that journal dial the primary (or, for reads,
a replica in the client's zone) directly. Channels are opened lazily, one per endpoint, and
closed by `close()`.

Channels use TLS to ``https://`` endpoints (those TLS brokers advertise, and so the routes
learned from them) and, when the client is given a `ClientTLS`, to every endpoint; direct
appends to such brokers use TLS too, with the same settings.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import grpc
import grpc.aio

from gazette.auth.grpc_auth import append_authorization, authorized, journal_scope
from gazette.auth.keys import NO_AUTH, Authorizer
from gazette.auth.tls import ClientTLS, endpoint_target
from gazette.broker.client.direct_calls import DirectAppendCall, DirectAppends
from gazette.broker.client.route_cache import RouteCache, pick_endpoint
from gazette.broker.client.stuck_channels import STUCK_AFTER, StuckChannels
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from gazette.broker.protocol.protocol_pb2_grpc import JournalAsyncStub as JournalStub

    AppendCall = grpc.aio.StreamUnaryCall[pb.AppendRequest, pb.AppendResponse]
else:
    JournalStub = pb_grpc.JournalStub

__all__ = ["JournalClient", "JournalStub", "MAX_MESSAGE_SIZE"]

log = logging.getLogger(__name__)

MAX_MESSAGE_SIZE = 64 << 20
"""Largest gRPC message sent or received, both ways (64 MiB)."""

_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
    ("grpc.max_receive_message_length", MAX_MESSAGE_SIZE),
    # Fail fast while a broker is down, and reconnect quickly once it is back.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


class JournalClient:
    """Channels to brokers plus a `RouteCache`. Use as ``async with JournalClient(...)``.

    `endpoints` is a target (``127.0.0.1:8080`` or ``http://host:8080``) or a sequence of them;
    the first is the default endpoint. `zone` is the client's availability zone, used to prefer
    same-zone replicas for reads. With `direct_appends` (the default), appends to our
    brokers go over their direct-append port rather than gRPC (docs/direct-appends.md).
    With `tls`, every channel is TLS (its files are read here: `TLSConfigError`); without,
    only those to ``https://`` endpoints are, trusting the system's CAs. `auth` (a
    `gazette.auth.keys.KeyedAuth` or `BearerAuth`) authorizes every call for what it does
    (`gazette.auth.grpc_auth`). A channel that has failed for `stuck_after` seconds is
    replaced by a new one (`gazette.broker.client.stuck_channels`).
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        zone: str = "",
        route_cache: RouteCache | None = None,
        direct_appends: bool = True,
        tls: ClientTLS | None = None,
        auth: Authorizer = NO_AUTH,
        stuck_after: float = STUCK_AFTER,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        self._tls = tls
        self.auth = auth
        self._credentials = None if tls is None else tls.grpc_credentials()
        targets = [self._target(e) for e in endpoints if e]
        if not targets:
            raise ValueError("JournalClient needs at least one broker endpoint")
        self.endpoints: tuple[str, ...] = tuple(targets)
        self.zone = zone
        self.routes = route_cache if route_cache is not None else RouteCache()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, JournalStub] = {}
        self._stuck = StuckChannels(stuck_after)
        self._closed = False
        self._default = 0
        self._direct = (
            DirectAppends(
                self.channel,
                ssl_for=(tls or ClientTLS()).ssl_context,
                authorization=partial(append_authorization, auth),
            )
            if direct_appends
            else None
        )

    @property
    def default_endpoint(self) -> str:
        """The gRPC target of the configured broker currently used by default (as
        ``https://host:port`` if dialled with TLS): the first,
        until a journal's route is invalidated after a failure, which moves on to the next
        (so a client configured with several brokers survives the loss of any one)."""
        return self.endpoints[self._default]

    def _target(self, endpoint: str) -> str:
        """The key of `endpoint`'s channel: its gRPC target, as ``https://`` when dialled
        with TLS (so that no plaintext channel, nor a direct append, reaches it)."""
        target, secure = endpoint_target(endpoint)
        return f"https://{target}" if secure or self._tls is not None else target

    def channel(self, target: str | None = None) -> grpc.aio.Channel:
        """The (lazily opened) channel to `target`, or to the default endpoint."""
        if self._closed:
            raise RuntimeError("JournalClient is closed")
        target = self._target(target) if target else self.default_endpoint
        ch = self._channels.get(target)
        if ch is not None and self._stuck.stuck(target, ch):
            log.warning(
                "channel to %s has failed for %.0fs; replacing it",
                target,
                self._stuck.stuck_after,
            )
            self._stuck.retire(ch)
            del self._channels[target]
            self._stubs.pop(target, None)
            ch = None
        if ch is None:
            dial, secure = endpoint_target(target)
            if secure:
                if self._credentials is None:  # An https:// endpoint: the system's CAs.
                    self._credentials = ClientTLS().grpc_credentials()
                ch = grpc.aio.secure_channel(dial, self._credentials, options=_CHANNEL_OPTIONS)
            else:
                ch = grpc.aio.insecure_channel(dial, options=_CHANNEL_OPTIONS)
            self._channels[target] = ch
        return ch

    def stub(self, target: str | None = None) -> JournalStub:
        """A `protocol.Journal` stub on `target`, or on the default endpoint."""
        target = self._target(target) if target else self.default_endpoint
        channel = self.channel(target)  # Replaces a stuck channel, and drops its stub.
        st = self._stubs.get(target)
        if st is None:
            st = authorized(pb_grpc.JournalStub(channel), self.auth)
            self._stubs[target] = st
        return st

    def endpoint_for(self, journal: str, *, primary: bool = True) -> str:
        """The target an RPC of `journal` should be dispatched to.

        With `primary` (appends), the cached route's primary; otherwise (reads) a replica in
        our zone if there is one. Falls back to the default endpoint when the route is
        unknown or names no usable endpoint.
        """
        route = self.routes.get(journal)
        if route is not None:
            ep = pick_endpoint(route, primary=primary, zone=self.zone)
            if ep:
                return self._target(ep)
        return self.default_endpoint

    def stub_for(self, journal: str, *, primary: bool = True) -> JournalStub:
        """A stub dialing `endpoint_for(journal, primary=primary)`."""
        return self.stub(self.endpoint_for(journal, primary=primary))

    @property
    def direct(self) -> DirectAppends | None:
        """The client's direct-append connections (None if direct appends are off)."""
        return self._direct

    async def append_call(self, journal: str) -> AppendCall | DirectAppendCall:
        """Start an Append of `journal` at its primary (as `endpoint_for`): a direct append
        if that broker offers them, else a gRPC call. Write the request messages to it."""
        target = self.endpoint_for(journal, primary=True)
        if self._direct is not None:
            call = await self._direct.call(target)
            if call is not None:
                return call
        with journal_scope(journal):  # what a signed call asks for
            return self.stub(target).Append(None)

    def update_route(self, journal: str, header: pb.Header | None) -> None:
        """Remember the route of `journal` carried by a response `header` (if any)."""
        if header is not None and header.HasField("route"):
            self.routes.update(journal, header.route)

    def invalidate_route(self, journal: str) -> None:
        """Forget the route of `journal`, e.g. after its broker failed to answer; the next
        RPC goes to the next configured broker (any broker proxies to the primary)."""
        self.routes.invalidate(journal)
        self.next_default()

    def next_default(self) -> None:
        """Use the next configured broker by default (the current one failed to answer)."""
        self._default = (self._default + 1) % len(self.endpoints)

    async def close(self, grace: float | None = None) -> None:
        """Close every channel. In-flight RPCs are cancelled (after `grace` seconds, if
        given). Idempotent."""
        self._closed = True
        if self._direct is not None:
            self._direct.close()
        channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        await self._stuck.close()
        for ch in channels:
            await ch.close(grace)

    async def __aenter__(self) -> JournalClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
