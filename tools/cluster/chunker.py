"""stream-sum's chunker as the fault runner starts it: a client of the brokers whose TLS and
keys are the ``BROKER_*`` variables' (`gazette.auth.client_settings.broker_client`), as a
secured cluster's runner sets them; without them, plaintext, as ``python -m
stream_sum.chunker`` is (the example's command line takes no TLS or keys).

Usage: python tools/cluster/chunker.py --broker IP:8080,... --streams N --chunks N
       --concurrency N --rate R --record RECORD.jsonl

Stops early on SIGTERM or SIGINT, as the example's does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from stream_sum.chunker import ChunkerConfig, run_chunker

from gazette.auth.client_settings import broker_client
from gazette.broker.client.journal_client import JournalClient


async def run(args: argparse.Namespace) -> str:
    cfg = ChunkerConfig(
        streams=args.streams, chunks=args.chunks, concurrency=args.concurrency, rate=args.rate
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    brokers = [b.strip() for b in args.broker.split(",") if b.strip()]
    tls, auth = broker_client()
    async with JournalClient(brokers, tls=tls, auth=auth) as client:
        stats = await run_chunker(client, cfg, args.record, stop=stop)
    return f"run {stats.run}: {stats.chunks} chunks, {stats.streams} streams ended"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", required=True, help="broker endpoints, comma separated")
    p.add_argument("--streams", type=int, required=True)
    p.add_argument("--chunks", type=int, required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--rate", type=float, required=True, help="chunks per second at most")
    p.add_argument("--record", type=Path, required=True, help="record of the expected sums")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args()
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    print(asyncio.run(run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
