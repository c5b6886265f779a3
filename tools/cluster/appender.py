"""Appends numbered records to one journal at a steady rate and logs each acknowledgement.

Usage: python tools/cluster/appender.py --broker IP:8080,... --journal NAME --log ACKS.jsonl
       [--rate 20] [--run ID]

Each append is one record (`ack_check.record`), retried until acknowledged, one at a time;
the acknowledgement's offsets are then logged (`ack_check.Ack`, flushed at once) so that a
later read can check the record is still there. Runs until SIGTERM or SIGINT, finishing the
append in flight. Runs from the runner's own namespace, a client of every broker, so that no
fault on a host stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import signal
import sys
import time
from pathlib import Path

from ack_check import Ack, record

from gazette.broker.client.appender import append
from gazette.broker.client.journal_client import JournalClient
from gazette.broker.protocol import pb


async def run(brokers: list[str], journal: str, log_path: Path, rate: float, run_id: str) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    seq = 0
    t0 = time.monotonic()
    async with JournalClient(brokers) as client:
        with open(log_path, "a") as out:
            while not stop.is_set():
                seq += 1
                id = f"{run_id}-{seq:07d}"
                resp = await append(client, pb.AppendRequest(journal=journal), record(id))
                ack = Ack(id, resp.commit.begin, resp.commit.end, time.time())
                out.write(ack.to_json() + "\n")
                out.flush()
                ahead = t0 + seq / rate - time.monotonic()
                if ahead > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), ahead)
                    except TimeoutError:
                        pass
    return seq


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", required=True, help="broker endpoints, comma separated")
    p.add_argument("--journal", required=True)
    p.add_argument("--log", type=Path, required=True, help="acknowledgements (JSON lines)")
    p.add_argument("--rate", type=float, default=20.0, help="appends per second at most")
    p.add_argument("--run", default=secrets.token_hex(4), help="prefix of the record ids")
    args = p.parse_args()
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    brokers = [b.strip() for b in args.broker.split(",") if b.strip()]
    n = asyncio.run(run(brokers, args.journal, args.log, args.rate, args.run))
    print(f"appender run={args.run}: {n} appends acknowledged", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
