"""A writer of the RocksDB store for crash tests: ``python -m tests.stores.rocksdb.crash_writer
ENDPOINT LOG WORKDIR SEED``. Recovers the store from LOG, prints ``FUSEFS <pid>`` and
``RECOVERED <n>`` (the checkpoint found), then commits transactions n+1, n+2, ... of `model`,
each with ``checkpoint(n)``, printing ``ACK <n>`` once each is committed to the log, until
killed. Small memtables make RocksDB flush and compact all the time."""

from __future__ import annotations

import asyncio
import random
import sys

from rocksdict import Options

from gazette.consumer.protocol import pb
from gazette.stores.rocksdb import RocksDBStore

KEYS = 3000
SOURCE = "crash/input"
PUTS = 150


def txn(n: int) -> tuple[dict[bytes, bytes], list[bytes]]:
    """Transaction `n` (from 1) of the model: its puts and deletes."""
    rnd = random.Random(n)
    puts = {
        b"\x01k%05d" % rnd.randrange(KEYS): b"%d:%d:" % (n, j) + bytes(rnd.randbytes(80))
        for j in range(PUTS)
    }
    deletes = [b"\x01k%05d" % rnd.randrange(KEYS) for _ in range(10)]
    return puts, [d for d in deletes if d not in puts]


def model(n: int) -> dict[bytes, bytes]:
    """The application state after transactions 1..n."""
    state: dict[bytes, bytes] = {}
    for i in range(1, n + 1):
        puts, deletes = txn(i)
        state.update(puts)
        for d in deletes:
            state.pop(d, None)
    return state


def checkpoint(n: int) -> pb.Checkpoint:
    """The Checkpoint of transaction `n`: read through offset `n` of a source, with an ACK
    intent naming it."""
    return pb.Checkpoint(
        sources={SOURCE: pb.Checkpoint.Source(read_through=n)},
        ack_intents={SOURCE: b"ack %d" % n},
    )


def counter(cp: pb.Checkpoint) -> int:
    """The transaction of `cp` (0 for the empty checkpoint of a new store)."""
    return cp.sources[SOURCE].read_through if SOURCE in cp.sources else 0


def options() -> Options:
    opt = Options(raw_mode=True)
    opt.set_write_buffer_size(64 << 10)
    opt.set_level_zero_file_num_compaction_trigger(2)
    opt.set_target_file_size_base(64 << 10)
    return opt


async def main(endpoint: str, log: str, workdir: str, seed: int) -> None:
    store = await RocksDBStore.open(endpoint, log, workdir, options=options())
    print("FUSEFS", store.mount.pid, flush=True)
    cp = await store.restore_checkpoint(None)
    n = counter(cp)
    assert cp == (checkpoint(n) if n else pb.Checkpoint()), cp
    print("RECOVERED", n, flush=True)
    rnd = random.Random(seed)
    while True:
        n += 1
        puts, deletes = txn(n)
        for k, v in puts.items():
            store.put(k, v)
        for d in deletes:
            store.delete(d)
        await store.start_commit(None, checkpoint(n), [])
        print("ACK", n, flush=True)
        if rnd.random() < 0.05:
            await store.compact()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
