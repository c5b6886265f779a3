"""A direct-append connection speaking the framing by hand (`Raw`), for tests of what a
broker's direct-append listener answers to well- and ill-formed streams."""

from __future__ import annotations

import asyncio

import grpc

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.direct_framing import (
    END,
    ERROR,
    HEADER,
    MAGIC,
    REQUEST,
    RESPONSE,
    SERVICE_METHOD,
    decode_error,
)
from gazette.testing.broker import BrokerProcess

Answer = tuple[bytes, pb.AppendResponse | tuple[grpc.StatusCode, str]]


async def direct_port(broker: BrokerProcess) -> int:
    """The port of `broker`'s direct-append listener, as it answers over gRPC."""
    async with grpc.aio.insecure_channel(broker.endpoint) as channel:
        return int(await channel.unary_unary(SERVICE_METHOD, None, None)(b"", timeout=5))


class Raw:
    """A direct-append connection speaking the framing by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, broker: BrokerProcess, magic: bytes = MAGIC) -> Raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", await direct_port(broker))
        writer.write(magic)
        return cls(reader, writer)

    def send(self, *msgs: pb.AppendRequest, end: bool = True) -> None:
        for msg in msgs:
            payload = msg.SerializeToString()
            self.writer.write(HEADER.pack(REQUEST, len(payload)) + payload)
        if end:
            self.writer.write(HEADER.pack(END, 0))

    async def answer(self) -> Answer:
        kind, n = HEADER.unpack(await asyncio.wait_for(self.reader.readexactly(HEADER.size), 10))
        payload = await self.reader.readexactly(n)
        if kind == RESPONSE:
            return kind, pb.AppendResponse.FromString(payload)
        assert kind == ERROR, kind
        return kind, decode_error(payload)

    async def append(self, *msgs: pb.AppendRequest, end: bool = True) -> Answer:
        self.send(*msgs, end=end)
        return await self.answer()

    def close(self) -> None:
        self.writer.close()


def committed(journal: str, *chunks: bytes) -> list[pb.AppendRequest]:
    """The requests of an append of `chunks` to `journal`, ending with its commit."""
    return (
        [pb.AppendRequest(journal=journal)]
        + [pb.AppendRequest(content=c) for c in chunks]
        + [pb.AppendRequest()]
    )
