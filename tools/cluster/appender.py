"""Appends numbered records to one journal at a steady rate and logs each acknowledgement.

Usage: python tools/cluster/appender.py --broker IP:8080,... --journal NAME --log ACKS.jsonl
       [--rate 20] [--run ID] [--max-seconds 3600]

Each append is one record (`ack_check.record`), retried until acknowledged, one at a time;
the acknowledgement's offsets are then logged (`ack_check.Ack`, flushed at once) so that a
later read can check the record is still there. Runs from the runner's own namespace, a
client of every broker, so that no fault on a host stops it. Its TLS and keys are the
``BROKER_*`` variables' (`gazette.auth.client_settings.broker_client`), as a secured
cluster's runner sets them.

It stops on SIGTERM or SIGINT, finishing the append in flight. It also stops, abandoning the
append in flight (whose acknowledgement is then not logged, so not checked), after
`--max-seconds`, or once its parent is gone (its parent pid changed): a runner killed
outright, whose brokers went with it, must not leave an appender retrying for ever.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import signal
import sys
import time
from pathlib import Path

from ack_check import Ack, record

from gazette.auth.client_settings import broker_client
from gazette.broker.client.appender import append
from gazette.broker.client.journal_client import JournalClient
from gazette.broker.protocol import pb

PARENT_POLL_S = 0.5


async def run(
    brokers: list[str], journal: str, log_path: Path, rate: float, run_id: str, max_s: float
) -> tuple[int, str]:
    """Append until stopped; the count acknowledged and why it stopped."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    acked = 0

    async def appending(client: JournalClient) -> None:
        nonlocal acked
        t0 = time.monotonic()
        with open(log_path, "a") as out:
            while not stop.is_set():
                id = f"{run_id}-{acked + 1:07d}"
                resp = await append(client, pb.AppendRequest(journal=journal), record(id))
                ack = Ack(id, resp.commit.begin, resp.commit.end, time.time())
                out.write(ack.to_json() + "\n")
                out.flush()
                acked += 1
                ahead = t0 + acked / rate - time.monotonic()
                if ahead > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), ahead)
                    except TimeoutError:
                        pass

    deadline = time.monotonic() + max_s
    why = "stopped by a signal"
    tls, auth = broker_client()
    async with JournalClient(brokers, tls=tls, auth=auth) as client:
        task = asyncio.create_task(appending(client))
        try:
            while not task.done():
                await asyncio.wait([task], timeout=PARENT_POLL_S)
                if os.getppid() != parent:
                    why = f"parent {parent} gone"
                elif time.monotonic() > deadline:
                    why = f"--max-seconds {max_s:g} reached"
                else:
                    continue
                task.cancel()
                break
        finally:
            if not task.done():
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
    return acked, why


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", required=True, help="broker endpoints, comma separated")
    p.add_argument("--journal", required=True)
    p.add_argument("--log", type=Path, required=True, help="acknowledgements (JSON lines)")
    p.add_argument("--rate", type=float, default=20.0, help="appends per second at most")
    p.add_argument("--run", default=secrets.token_hex(4), help="prefix of the record ids")
    p.add_argument("--max-seconds", type=float, default=3600.0, help="stop after this long at most")
    args = p.parse_args()
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    brokers = [b.strip() for b in args.broker.split(",") if b.strip()]
    n, why = asyncio.run(
        run(brokers, args.journal, args.log, args.rate, args.run, args.max_seconds)
    )
    print(f"appender run={args.run}: {n} appends acknowledged; {why}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
