"""A channel kept per endpoint is replaced once it has failed for `stuck_after` seconds (a
gRPC Python channel has been seen to stay failed against a server that answers again), and
never while it is healthy or has failed for less."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from gazette.broker.client import JournalClient
from gazette.broker.client.stuck_channels import StuckChannels
from gazette.broker.peers import Peers
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.testing.etcd import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def failed_channel() -> grpc.aio.Channel:
    """A channel to a port nobody listens on, after a call failed on it."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await channel.unary_unary("/x.Y/Z")(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert channel.get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE
    return channel


async def test_a_channel_is_stuck_only_after_failing_for_the_whole_bound() -> None:
    clock = Clock()
    stuck = StuckChannels(10.0, clock)
    channel = await failed_channel()
    try:
        assert not stuck.stuck("a", channel)  # Failing from now on.
        clock.now += 9.9
        assert not stuck.stuck("a", channel)
        clock.now += 0.2
        assert stuck.stuck("a", channel)
        assert stuck.replaced == 1
        # Its replacement (here: the same channel, still failing) gets the whole bound again.
        assert not stuck.stuck("a", channel)
        clock.now += 10.1
        assert stuck.stuck("a", channel)
    finally:
        await channel.close()


async def test_a_channel_that_recovered_in_between_starts_over() -> None:
    clock = Clock()
    stuck = StuckChannels(10.0, clock)
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    failing = await failed_channel()
    healthy = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        await asyncio.wait_for(healthy.channel_ready(), 10)
        assert not stuck.stuck("a", failing)
        clock.now += 8
        assert not stuck.stuck("a", healthy)  # Key "a" is healthy again: the clock restarts.
        clock.now += 8
        assert not stuck.stuck("a", failing)
        clock.now += 100
        assert not stuck.stuck("b", healthy)  # A healthy channel is never stuck.
        assert stuck.replaced == 0
    finally:
        await failing.close()
        await healthy.close()
        await server.stop(None)


async def test_peers_replace_a_channel_that_kept_failing() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    peers = Peers(stuck_after=0.3)
    try:
        first = peers.stub(endpoint)
        with pytest.raises(grpc.aio.AioRpcError):
            await first.List(pb.ListRequest(), timeout=5).read()
        assert peers.stub(endpoint) is first  # Failing for less than the bound.
        await asyncio.sleep(0.4)
        second = peers.stub(endpoint)
        assert second is not first
        assert peers.stub(endpoint) is second
    finally:
        await peers.close()


async def test_a_client_replaces_a_channel_that_kept_failing() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    async with JournalClient(endpoint, direct_appends=False, stuck_after=0.3) as client:
        first_channel, first_stub = client.channel(endpoint), client.stub(endpoint)
        with pytest.raises(grpc.aio.AioRpcError):
            await first_stub.List(pb.ListRequest(), timeout=5).read()
        assert client.stub(endpoint) is first_stub
        await asyncio.sleep(0.4)
        second_stub = client.stub(endpoint)
        assert second_stub is not first_stub
        assert client.channel(endpoint) is not first_channel
