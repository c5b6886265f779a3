"""The broker's gRPC channels to other brokers: one per peer endpoint, kept and reused.

Replication pipelines, proxied requests, catching up from a peer and judging a spool against
a journal's primary all reach other brokers through `Peers.stub`; the channels are closed
once, at shutdown. A peer advertising an ``https://`` endpoint is dialled with TLS (the
broker's peer TLS settings, else the system's CAs), others in plaintext: the scheme each
broker advertises says how it serves, as with upstream's brokers.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
import grpc.aio

from gazette.auth.tls import ClientTLS, endpoint_target
from gazette.broker.client.stuck_channels import CONNECT_WAIT, STUCK_AFTER, StuckChannels, connected
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

PEER_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class Peers:
    """`protocol.Journal` stubs on other brokers, by endpoint."""

    def __init__(self, tls: ClientTLS | None = None, *, stuck_after: float = STUCK_AFTER) -> None:
        self._tls = tls
        self._credentials: grpc.ChannelCredentials | None = None
        self._channels: dict[tuple[str, bool], grpc.aio.Channel] = {}
        self._stubs: dict[tuple[str, bool], Any] = {}
        self._stuck = StuckChannels(stuck_after)

    def stub(self, endpoint: str) -> Any:
        """A `protocol.Journal` stub on the broker at `endpoint` (its channel is reused,
        unless it has been failing for `STUCK_AFTER` seconds: then a new one replaces it).
        Raises `TLSConfigError` if the TLS files cannot be read at the first ``https://``
        peer (the broker checks them at start-up)."""
        key = endpoint_target(endpoint)
        stub = self._stubs.get(key)
        if stub is not None and self._stuck.stuck(key, self._channels[key]):
            log.warning(
                "channel to peer %s has failed for %.0fs; replacing it",
                endpoint,
                self._stuck.stuck_after,
            )
            self._stuck.retire(self._channels.pop(key))
            del self._stubs[key]
            stub = None
        if stub is None:
            target, secure = key
            if secure:
                if self._credentials is None:
                    self._credentials = (self._tls or ClientTLS()).grpc_credentials()
                channel = grpc.aio.secure_channel(
                    target, self._credentials, options=PEER_CHANNEL_OPTIONS
                )
            else:
                channel = grpc.aio.insecure_channel(target, options=PEER_CHANNEL_OPTIONS)
            self._channels[key] = channel
            stub = self._stubs[key] = pb_grpc.JournalStub(channel)
        return stub

    async def connected(self, endpoint: str, timeout: float = CONNECT_WAIT) -> None:
        """Give the channel to `endpoint` up to `timeout` seconds to connect, unless it is
        connected (`stuck_channels.connected`): before forwarding a request to that peer."""
        self.stub(endpoint)  # Made, or replaced if stuck.
        await connected(self._channels[endpoint_target(endpoint)], timeout)

    async def close(self) -> None:
        """Close every channel at once (pending calls on them fail)."""
        await self._stuck.close()
        for channel in self._channels.values():
            await channel.close(None)
