"""A transactional producer process, driven over stdin/stdout by a test that may SIGKILL it.

    python -m tests.message.txn_producer ENDPOINT SELECTOR NAME FIRST_TXN TXNS PER_TXN

For each transaction t in [FIRST_TXN, FIRST_TXN + TXNS): publish PER_TXN uncommitted `Note`s
(producer NAME, txn t, i) mapped by rendezvous over the journals of SELECTOR, wait until they
are durable, print ``published t`` and wait for the line ``ack`` on stdin; then append the ACK
intents and print ``committed t`` once they are durable. Prints ``done`` at the end. The test
kills the process between ``published`` and ``ack`` to leave a transaction that never commits
(a replacement process has a new ProducerID, so nothing ever acknowledges it).
"""

from __future__ import annotations

import asyncio
import sys

from gazette.broker.client import AppendService, JournalClient, list_all_journals
from gazette.broker.protocol.selector import parse_label_selector
from gazette.message.mapping import rendezvous_mapping
from gazette.message.publisher import Publisher
from tests.message.notes import Note


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(endpoint: str, selector: str, name: str, first: int, txns: int, per: int) -> None:
    async with JournalClient(endpoint) as client:
        parts = await list_all_journals(client, parse_label_selector(selector))
        mapping = rendezvous_mapping(lambda n: f"{n.producer}/{n.i}", lambda: parts)
        async with AppendService(client) as svc, Publisher(svc) as pub:
            for t in range(first, first + txns):
                for i in range(per):
                    pub.publish_uncommitted(mapping, Note(producer=name, txn=t, i=i))
                    if i % 7 == 6:
                        await asyncio.sleep(0)  # Several batches per transaction.
                await pub.barrier()
                say(f"published {t}")
                command = (await asyncio.to_thread(sys.stdin.readline)).strip()
                if command != "ack":
                    raise SystemExit(f"unexpected command {command!r}")
                await pub.commit()
                say(f"committed {t}")
    say("done")


if __name__ == "__main__":
    endpoint, selector, name, first, txns, per = sys.argv[1:]
    asyncio.run(main(endpoint, selector, name, int(first), int(txns), int(per)))
