"""What a direct append writes to its socket, and when."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gazette.broker.client.direct_calls import DirectAppendCall, DirectAppends, _Connection
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.direct_framing import (
    END,
    HEADER,
    MAGIC,
    REQUEST,
    RESPONSE,
    content_frame_header,
    frame,
)


@pytest.mark.parametrize("length", [1, 127, 128, 300, 16_383, 16_384, 173_056, 262_144, 2_097_157])
def test_content_frame_header_is_the_serialized_message_prefix(length: int) -> None:
    content = bytes(range(256)) * (length // 256) + b"x" * (length % 256)
    whole = frame(REQUEST, pb.AppendRequest(content=content).SerializeToString())
    assert content_frame_header(length) + content == whole


class Sink:
    """A TCP server keeping every byte received."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.changed = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(1 << 20):
            self.data += chunk
            self.changed.set()

    async def settled(self) -> bytes:
        """The bytes received once nothing more arrives for a moment."""
        while True:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), 0.2)
            except TimeoutError:
                return bytes(self.data)


@pytest.fixture
async def call() -> AsyncIterator[tuple[DirectAppendCall, Sink]]:
    sink = Sink()
    server = await asyncio.start_server(sink.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    owner = DirectAppends(lambda _target: None)  # type: ignore[arg-type,return-value]
    c = DirectAppendCall(owner, f"127.0.0.1:{port}", _Connection(reader, writer))
    yield c, sink
    c.cancel()
    server.close()


async def test_the_request_waits_for_the_content_and_the_commit_for_the_end(
    call: tuple[DirectAppendCall, Sink],
) -> None:
    c, sink = call
    request = pb.AppendRequest(journal="a/journal", offset=1234)
    small, page = b"op-frame", bytes(200_000)
    await c.write(request)
    assert await sink.settled() == b""  # Held: it travels with the content.

    await c.write_content([small, page])
    expect = frame(REQUEST, request.SerializeToString()) + frame(
        REQUEST, pb.AppendRequest(content=small + page).SerializeToString()
    )
    assert await sink.settled() == expect

    await c.write(pb.AppendRequest())  # The commit message: held for the end.
    assert await sink.settled() == expect
    await c.done_writing()
    assert await sink.settled() == expect + frame(REQUEST) + HEADER.pack(END, 0)


async def test_an_empty_append_is_written_at_its_end(call: tuple[DirectAppendCall, Sink]) -> None:
    c, sink = call
    request = pb.AppendRequest(journal="a/journal")
    await c.write(request)
    await c.write(pb.AppendRequest())
    assert await sink.settled() == b""
    await c.done_writing()
    assert await sink.settled() == (
        frame(REQUEST, request.SerializeToString()) + frame(REQUEST) + HEADER.pack(END, 0)
    )


async def test_content_after_the_first_goes_out_as_it_comes(
    call: tuple[DirectAppendCall, Sink],
) -> None:
    c, sink = call
    request = pb.AppendRequest(journal="a/journal")
    await c.write(request)
    await c.write(pb.AppendRequest(content=b"first"))
    first = frame(REQUEST, request.SerializeToString()) + frame(
        REQUEST, pb.AppendRequest(content=b"first").SerializeToString()
    )
    assert await sink.settled() == first
    await c.write(pb.AppendRequest(content=b"second"))  # Small, but not held.
    assert await sink.settled() == first + frame(
        REQUEST, pb.AppendRequest(content=b"second").SerializeToString()
    )


async def test_an_empty_content_message_is_refused(call: tuple[DirectAppendCall, Sink]) -> None:
    c, _ = call
    with pytest.raises(ValueError, match="would commit"):
        await c.write_content([b"", b""])


class Answerer:
    """A direct-append listener keeping the bytes of each append up to its END, then
    answering it OK."""

    def __init__(self) -> None:
        self.appends: list[bytes] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.readexactly(len(MAGIC)) == MAGIC
        data = bytearray()
        while chunk := await reader.read(1 << 20):
            data += chunk
            if data.endswith(HEADER.pack(END, 0)):
                self.appends.append(bytes(data))
                data.clear()
                answer = pb.AppendResponse(status=pb.OK).SerializeToString()
                writer.write(frame(RESPONSE, answer))


@pytest.mark.parametrize("content", [[], [b"op-frame"], [b"op-frame", bytes(200_000), b"!"]])
async def test_a_whole_append_is_the_messages_an_appender_writes(content: list[bytes]) -> None:
    answerer = Answerer()
    server = await asyncio.start_server(answerer.serve, "127.0.0.1", 0)
    owner = DirectAppends(lambda _target: None)  # type: ignore[arg-type,return-value]
    target = "127.0.0.1:1"  # Its gRPC port is never asked: its direct port is known.
    owner._ports[target] = server.sockets[0].getsockname()[1]
    request = pb.AppendRequest(journal="a/journal", offset=1234)
    try:
        for _ in range(2):
            resp = await owner.append(target, request, content)
            assert resp is not None and resp.status == pb.OK
        assert owner.idle(target) == 1  # One connection, for both appends.
    finally:
        owner.close()
        server.close()
    expect = frame(REQUEST, request.SerializeToString())
    if content:
        expect += frame(REQUEST, pb.AppendRequest(content=b"".join(content)).SerializeToString())
    expect += frame(REQUEST) + HEADER.pack(END, 0)
    assert answerer.appends == [expect, expect]
