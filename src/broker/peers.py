"""The broker's gRPC channels to other brokers: one per peer endpoint, kept and reused.

Replication pipelines, proxied requests, catching up from a peer and judging a spool against
a journal's primary all reach other brokers through `Peers.stub`; the channels are closed
once, at shutdown.
"""

from __future__ import annotations

from typing import Any

import grpc
import grpc.aio

from gazette.broker.client.route_cache import endpoint_to_target
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc

PEER_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class Peers:
    """`protocol.Journal` stubs on other brokers, by endpoint."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, Any] = {}

    def stub(self, endpoint: str) -> Any:
        """A `protocol.Journal` stub on the broker at `endpoint` (its channel is reused)."""
        target = endpoint_to_target(endpoint)
        stub = self._stubs.get(target)
        if stub is None:
            channel = grpc.aio.insecure_channel(target, options=PEER_CHANNEL_OPTIONS)
            self._channels[target] = channel
            stub = self._stubs[target] = pb_grpc.JournalStub(channel)
        return stub

    async def close(self) -> None:
        """Close every channel at once (pending calls on them fail)."""
        for channel in self._channels.values():
            await channel.close(None)
