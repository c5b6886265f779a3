"""What the client's tests share beyond their fixtures: reading a journal back whole."""

from __future__ import annotations

from gazette.broker.client import JournalClient, OffsetNotYetAvailable, RetryReader
from gazette.broker.protocol import protocol_pb2 as pb


async def read_all(client: JournalClient, journal: str) -> bytes:
    """The journal's content from offset 0 to its write head, through a RetryReader."""
    rr = RetryReader(client, pb.ReadRequest(journal=journal))
    out = bytearray()
    try:
        while True:
            out += await rr.read()
    except OffsetNotYetAvailable:
        return bytes(out)
