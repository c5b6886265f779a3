"""The benchmarks' input: `Ping` messages published to a journal, and a journal's bytes.

Shared by bench/consumer.py and bench/peers.py (both put this directory on the import path).
"""

from __future__ import annotations

import asyncio

from consumer_bench_app import Ping

from gazette.broker.client import AppendService, JournalClient
from gazette.broker.client.reader import write_head
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.publisher import Publisher

__all__ = ["journal_bytes", "publish_pings"]


async def publish_pings(client: JournalClient, journal: str, n: int, keys: int = 1000) -> None:
    """Publish `n` committed Pings over `keys` keys to `journal`, and wait for them."""
    async with AppendService(client) as svc:
        pub = Publisher(svc)
        mapping = lambda _m: (journal, CONTENT_TYPE_JSON_LINES)  # noqa: E731
        for i in range(n):
            pub.publish_committed(mapping, Ping(f"k{i % keys}", 0))
            if i % 2000 == 0:
                await asyncio.sleep(0)
        await pub.barrier()


async def journal_bytes(client: JournalClient, journal: str) -> bytes:
    """Every byte of `journal` up to its write head."""
    head = await write_head(client, journal)
    req = bpb.ReadRequest(journal=journal, offset=0, end_offset=head, block=True)
    data = b"".join([resp.content async for resp in client.stub_for(journal).Read(req)])
    assert len(data) == head, (len(data), head)
    return data
