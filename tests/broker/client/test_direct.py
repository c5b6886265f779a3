"""Direct appends, client side: discovery and falling back to gRPC."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from gazette.broker.client.direct_calls import DirectAppends, host_of
from gazette.broker.protocol.direct_framing import SERVICE_METHOD


@pytest.mark.parametrize(
    ("target", "host"),
    [
        ("127.0.0.1:8080", "127.0.0.1"),
        ("broker-1.example:8080", "broker-1.example"),
        ("[::1]:8080", "::1"),
        ("https://broker-1.example:8443", "broker-1.example"),  # dialled with TLS
        ("http://broker-1.example:8080", None),  # not a channel target of ours
        ("unix:/run/broker.sock", None),
        ("dns:///broker:8080", None),
        ("broker", None),
    ],
)
def test_host_of_a_target(target: str, host: str | None) -> None:
    assert host_of(target) == host


class PortServer:
    """A gRPC server answering only the direct-append port method, with `answer`."""

    def __init__(self, answer: bytes | None) -> None:
        self.answer = answer
        self.asked = 0
        self.server = grpc.aio.server()
        service, method = SERVICE_METHOD.lstrip("/").split("/")
        if answer is not None:
            handler = grpc.unary_unary_rpc_method_handler(self._port)
            self.server.add_generic_rpc_handlers(
                [grpc.method_handlers_generic_handler(service, {method: handler})]
            )
        self.target = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"

    async def _port(self, _request: bytes, _context: Any) -> bytes:
        self.asked += 1
        assert self.answer is not None
        return self.answer


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def channels() -> AsyncIterator[dict[str, grpc.aio.Channel]]:
    opened: dict[str, grpc.aio.Channel] = {}
    yield opened
    for ch in opened.values():
        await ch.close(None)


def _opener(opened: dict[str, grpc.aio.Channel]) -> Any:
    def channel(target: str) -> grpc.aio.Channel:
        if target not in opened:
            opened[target] = grpc.aio.insecure_channel(target)
        return opened[target]

    return channel


async def test_an_unreachable_port_falls_back_to_grpc_for_a_while(
    channels: dict[str, grpc.aio.Channel], caplog: pytest.LogCaptureFixture
) -> None:
    port = PortServer(str(_dead_port()).encode())
    await port.server.start()
    try:
        direct = DirectAppends(_opener(channels))
        with caplog.at_level(logging.WARNING):
            assert await direct.call(port.target) is None
        assert "unreachable" in caplog.text and "appending over gRPC for 10 s" in caplog.text
        assert await direct.call(port.target) is None  # Not asked again, nor dialled.
        assert port.asked == 1
        assert direct.answered == 0
    finally:
        await port.server.stop(None)


async def test_brokers_without_direct_appends_are_asked_once(
    channels: dict[str, grpc.aio.Channel],
) -> None:
    port = PortServer(None)  # UNIMPLEMENTED, as an upstream broker.
    await port.server.start()
    try:
        direct = DirectAppends(_opener(channels))
        assert await direct.call(port.target) is None
        assert await direct.call(port.target) is None
    finally:
        await port.server.stop(None)


async def test_a_nonsense_port_answer_is_ignored(
    channels: dict[str, grpc.aio.Channel], caplog: pytest.LogCaptureFixture
) -> None:
    port = PortServer(b"not a port")
    await port.server.start()
    try:
        direct = DirectAppends(_opener(channels))
        with caplog.at_level(logging.WARNING):
            assert await direct.call(port.target) is None
            assert await direct.call(port.target) is None
        assert port.asked == 1
        assert "answered no port" in caplog.text
    finally:
        await port.server.stop(None)
