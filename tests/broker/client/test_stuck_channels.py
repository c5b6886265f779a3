"""Channels kept per endpoint (`gazette.broker.client.stuck_channels`): one that is backing
off from a peer's absence is given a moment to connect before a request is forwarded on it,
and one is replaced once it has failed for `stuck_after` seconds (gRPC Python has had
channels stay failed against a server that answers again), never while it is healthy or has
failed for less."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

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


async def test_peers_give_a_channel_backing_off_from_a_restarted_peer_time_to_connect() -> None:
    """A peer that was down and is back: the channel to it fails calls at once with its last
    error ("Connection refused") until its reconnect backoff ends. `connected` waits that out,
    so a request forwarded right after the peer's restart reaches it."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    peers = Peers()
    server = grpc.aio.server()

    async def list_(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        yield pb.ListResponse(status=pb.OK).SerializeToString()

    try:
        for _ in range(5):  # Down: calls fail, and the channel's backoff grows.
            with pytest.raises(grpc.aio.AioRpcError):
                await peers.stub(endpoint).List(pb.ListRequest(), timeout=5).read()
            await asyncio.sleep(0.3)
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "protocol.Journal",
                    {"List": grpc.unary_stream_rpc_method_handler(list_)},
                )
            ]
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()  # Back.
        await peers.connected(endpoint)
        got = await peers.stub(endpoint).List(pb.ListRequest(), timeout=5).read()
        assert got.status == pb.OK
        # And a peer that stays down costs a caller the bound, not more.
        down = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(grpc.aio.AioRpcError):
            await peers.stub(down).List(pb.ListRequest(), timeout=5).read()
        t0 = asyncio.get_running_loop().time()
        await peers.connected(down, timeout=0.5)
        assert 0.4 < asyncio.get_running_loop().time() - t0 < 2.0
    finally:
        await peers.close()
        await server.stop(None)
