"""`probe_http2` tells apart a port nobody listens on, a listener that never handshakes, and a
gRPC server: what the report of a failed cluster test says of each broker."""

from __future__ import annotations

import asyncio
import socket

import grpc

from gazette.testing.etcd import free_port
from gazette.testing.process import probe_http2


def test_a_port_nobody_listens_on_is_refused() -> None:
    assert probe_http2(free_port()) == "refused"


def test_a_listener_that_never_handshakes_is_told_from_a_refused_port() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:  # Accepts; never answers.
        port = listener.getsockname()[1]
        assert probe_http2(port, timeout=0.3) == "no SETTINGS within 0.3s"


async def test_a_grpc_server_answers() -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        assert await asyncio.to_thread(probe_http2, port) == "HTTP/2 answers"
    finally:
        await server.stop(None)
