"""A SQLite store writer to be killed: recovers the store from its log, then commits
deterministic transactions forever, printing ``ACK <txn>`` once each commit is in the log.

Usage: python -m tests.stores.sqlite.crash_writer ENDPOINT LOG DIRECTORY MODE SEED

MODE is a journal mode, or ``<journal mode>-on_loop`` for SQLite on the event loop.

Transaction `t` applies `txn_ops(seed, t)` to table ``kv`` and commits ``checkpoint(t)``;
`model(seed, t)` is the table after it, for the test to compare against.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

import apsw

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.protocol import pb
from gazette.stores.sqlite import recover

Op = tuple[int, bytes | None]  # (key, value); None deletes.

SOURCE = "crash/input"


def checkpoint(t: int) -> pb.Checkpoint:
    """The Checkpoint of transaction `t`: read through offset `t` of a source, with an ACK
    intent naming it."""
    return pb.Checkpoint(
        sources={SOURCE: pb.Checkpoint.Source(read_through=t)},
        ack_intents={SOURCE: b"ack %d" % t},
    )


def counter(cp: pb.Checkpoint) -> int:
    """The transaction of `cp` (0 for the empty checkpoint of a new store)."""
    return cp.sources[SOURCE].read_through if SOURCE in cp.sources else 0


def txn_ops(seed: int, t: int) -> list[Op]:
    rnd = random.Random(seed * 1_000_003 + t)
    if rnd.random() < 0.15:  # A large transaction: hundreds of KiB to a few MiB.
        n, size = rnd.randrange(50, 400), rnd.choice((4000, 9000))
    else:
        n, size = rnd.randrange(1, 30), rnd.choice((8, 100, 1500))
    ops: list[Op] = []
    for _ in range(n):
        k = rnd.randrange(2000)
        ops.append((k, None) if rnd.random() < 0.1 else (k, rnd.randbytes(rnd.randrange(size))))
    return ops


def model(seed: int, t: int) -> dict[int, bytes]:
    """The table after transactions 1..t."""
    out: dict[int, bytes] = {}
    for i in range(1, t + 1):
        for k, v in txn_ops(seed, i):
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
    return out


def _apply(conn: apsw.Connection, ops: list[Op]) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS kv (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
    for k, v in ops:
        if v is None:
            conn.execute("DELETE FROM kv WHERE k = ?", (k,))
        else:
            conn.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", (k, v))


async def main(endpoint: str, log: str, directory: Path, mode: str, seed: int) -> None:
    journal_mode, _, variant = mode.partition("-")
    async with JournalClient(endpoint) as client, AppendService(client) as svc:
        store = await recover(
            client,
            svc,
            log,
            directory,
            journal_mode=journal_mode,
            min_compaction_bytes=512 << 10,
            # Frequent checkpoints (WAL mode): WALs kept as WAL generations, and compactions.
            wal_checkpoint_pages=50,
            on_loop=variant == "on_loop",
        )
        cp = await store.restore_checkpoint()
        t = counter(cp)
        assert cp == (checkpoint(t) if t else pb.Checkpoint()), cp
        print(f"RECOVERED {t}", flush=True)
        while True:
            t += 1
            await store.transact(_apply, txn_ops(seed, t))
            await store.start_commit(None, checkpoint(t), [])
            print(f"ACK {t}", flush=True)


if __name__ == "__main__":
    endpoint, log, directory, mode, seed = sys.argv[1:6]
    asyncio.run(main(endpoint, log, Path(directory), mode, int(seed)))
