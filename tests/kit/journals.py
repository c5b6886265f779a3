"""Reading a journal back in tests, through the client library as an application does."""

from __future__ import annotations

from gazette.broker.client import JournalClient, OffsetNotYetAvailable, RetryReader
from gazette.broker.protocol import protocol_pb2 as pb


async def read_to_head(client: JournalClient, journal: str, offset: int = 0) -> bytes:
    """The journal's content from `offset` to its write head, through a RetryReader."""
    rr = RetryReader(client, pb.ReadRequest(journal=journal, offset=offset))
    out = bytearray()
    try:
        while True:
            out += await rr.read()
    except OffsetNotYetAvailable:
        return bytes(out)
