"""NATS JetStream's side of bench/peers.py's broker comparison: one nats-py client publishing
to a file-backed stream, awaiting each message's acknowledgement before the next.

Runs under the virtualenv bench/peers.py makes for its peers, as

    python peers_nats.py URL STREAM SIZE COUNT

It makes stream STREAM (subject STREAM, file storage, the server's default limits), publishes
one warm-up message, then COUNT messages of SIZE random bytes, each `await js.publish(...)`,
deletes the stream, and prints ``{"seconds": S, "cpu_seconds": C, "latencies": [...]}`` as
its last stdout line: the COUNT publishes' wall time, this client's CPU time over them, and
each one's round trip, in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import nats
from nats.js.api import StorageType


async def run(url: str, stream: str, size: int, count: int) -> dict[str, object]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[stream], storage=StorageType.FILE)
        payload = os.urandom(size)
        await js.publish(stream, payload)
        lat = []
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        for _ in range(count):
            t = time.perf_counter()
            await js.publish(stream, payload)
            lat.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        await js.delete_stream(stream)
    finally:
        await nc.close()
    return {"seconds": elapsed, "cpu_seconds": cpu, "latencies": lat}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("stream")
    parser.add_argument("size", type=int)
    parser.add_argument("count", type=int)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.url, args.stream, args.size, args.count))))


if __name__ == "__main__":
    main()
