"""The stream-sum chunker: a load generator of many concurrent streams of chunks.

It keeps `ChunkerConfig.concurrency` streams open; each next chunk belongs to one of them
picked at random, so the streams interleave in every partition. A stream is
`ChunkerConfig.chunks` data chunks of random values, then its last chunk, which carries the
expected sum. Chunks are published committed (``publish_committed``) to the chunk partition
of FNV-1a(stream id) modulo the partitions listed by the brokers, so each stream is summed by
one shard. Every `ChunkerConfig.barrier_every` chunks the chunker waits for its appends to
commit, then adds the streams they finished to its record (`stream_sum.record`).

Bounds: the number of streams (0: until stopped), chunks per stream, streams open at once,
and chunks per second. Stopping (`run_chunker`'s `stop`, SIGTERM or SIGINT for the command)
publishes nothing more, waits for what was published, and completes the record: streams
left open are abandoned (never ended, never summed, not in the record).

    python -m stream_sum.chunker --broker 127.0.0.1:8080 --streams 1000 --chunks 20 \\
        --concurrency 50 --rate 2000 --record /tmp/stream-sum/run-1.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import secrets
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gazette.broker.client import AppendService, JournalClient, list_all_journals, write_head
from gazette.message.mapping import NoPartitions, modulo_mapping
from gazette.message.publisher import Publisher
from stream_sum.messages import SUMS, Chunk, RunningSum, chunks_selector
from stream_sum.record import Expected, RecordWriter

__all__ = ["ChunkerConfig", "ChunkerStats", "generate", "main", "run_chunker"]

log = logging.getLogger("stream_sum.chunker")

PROGRESS_INTERVAL = 5.0
"""Seconds between progress lines."""


@dataclass(frozen=True)
class ChunkerConfig:
    """The bounds of a chunker's load."""

    streams: int = 100
    """Streams to publish; 0: no limit (until stopped)."""
    chunks: int = 20
    """Data chunks per stream (a stream is these and its last chunk)."""
    concurrency: int = 10
    """Streams open at once."""
    rate: float = 0.0
    """Chunks per second at most; 0: as fast as the brokers commit them."""
    max_value: int = 1_000_000
    """Data chunks carry values in [1, max_value]."""
    barrier_every: int = 500
    """Chunks between waits for the appends to commit (and record updates)."""
    seed: int | None = None
    """Seed of the chunks' random choices (None: fresh); stream ids come from the run id."""

    def validate(self) -> None:
        if self.streams < 0 or self.chunks < 0 or self.rate < 0:
            raise ValueError("streams, chunks and rate must not be negative")
        if self.concurrency < 1 or self.barrier_every < 1 or self.max_value < 1:
            raise ValueError("concurrency, barrier_every and max_value must be at least 1")


@dataclass
class ChunkerStats:
    """What a run published: `chunks` in all, of which the last chunks of `streams` streams,
    all committed, in `seconds`."""

    run: str
    chunks: int = 0
    streams: int = 0
    seconds: float = 0.0


def generate(run: str, cfg: ChunkerConfig, rng: random.Random) -> Iterator[Chunk]:
    """The chunks of run `run`, in publishing order (module docs). Stream ids are
    ``{run}-NNNNNNN``, numbered from 0 in the order the streams open."""
    open_streams: list[RunningSum] = []
    opened = 0
    while True:
        while len(open_streams) < cfg.concurrency and (cfg.streams == 0 or opened < cfg.streams):
            open_streams.append(RunningSum(f"{run}-{opened:07d}"))
            opened += 1
        if not open_streams:
            return
        i = rng.randrange(len(open_streams))
        s = open_streams[i]
        if s.seq < cfg.chunks:
            chunk = Chunk(s.stream, s.seq + 1, rng.randint(1, cfg.max_value))
        else:
            chunk = Chunk(s.stream, s.seq + 1, end=True, total=s.total)
        if s.add(chunk):
            open_streams[i] = open_streams[-1]
            open_streams.pop()
        yield chunk


async def run_chunker(
    client: JournalClient,
    cfg: ChunkerConfig,
    record: Path | None = None,
    *,
    run: str | None = None,
    stop: asyncio.Event | None = None,
) -> ChunkerStats:
    """Publish the load `cfg` describes to the current chunk partitions, recording it to
    `record` (if given) as it commits; return once everything published committed.

    `run` names the run (default: 8 random hex digits; it must differ from every other run
    summed by the same shards). Setting `stop` ends the run early (module docs). Raises
    `NoPartitions` if there are no chunk partitions, and the first append error. Cancelled or
    failed, the record is left without its trailer.
    """
    cfg.validate()
    partitions = await list_all_journals(client, chunks_selector())
    if not partitions:
        raise NoPartitions("no chunk partitions: apply the stream-sum journals first")
    run = run or secrets.token_hex(4)
    sums_offset = await write_head(client, SUMS)
    stats = ChunkerStats(run)
    writer = RecordWriter(record, run, SUMS, sums_offset) if record is not None else None
    service = AppendService(client)
    pub = Publisher(service)
    mapping = modulo_mapping(lambda c: c.stream, lambda: partitions)
    rng = random.Random(cfg.seed)
    ended: list[Expected] = []

    async def barrier() -> None:
        await pub.barrier()
        stats.streams += len(ended)
        if writer is not None:
            writer.add(ended)
        ended.clear()

    log.info(
        "chunker starting run=%s partitions=%d sums_offset=%d streams=%d chunks=%d "
        "concurrency=%d rate=%g",
        *(run, len(partitions), sums_offset, cfg.streams, cfg.chunks),
        *(cfg.concurrency, cfg.rate),
    )
    t0 = time.monotonic()
    next_progress = t0 + PROGRESS_INTERVAL
    try:
        for chunk in generate(run, cfg, rng):
            if stop is not None and stop.is_set():
                break
            now = time.monotonic()
            if cfg.rate > 0:
                ahead = t0 + stats.chunks / cfg.rate - now
                if ahead > 0.001:
                    await asyncio.sleep(ahead)
            pub.publish_committed(mapping, chunk)
            stats.chunks += 1
            if chunk.end:
                ended.append(Expected(chunk.stream, chunk.seq - 1, chunk.total))
            if stats.chunks % cfg.barrier_every == 0:
                await barrier()
            if now >= next_progress:
                next_progress = now + PROGRESS_INTERVAL
                log.info(
                    "chunker progress run=%s chunks=%d streams_committed=%d",
                    *(run, stats.chunks, stats.streams),
                )
        await barrier()
        if writer is not None:
            writer.complete()
    finally:
        pub.flush()
        await service.close()
        if writer is not None:
            writer.close()
    stats.seconds = time.monotonic() - t0
    return stats


async def _main(args: argparse.Namespace) -> ChunkerStats:
    cfg = ChunkerConfig(
        streams=args.streams,
        chunks=args.chunks,
        concurrency=args.concurrency,
        rate=args.rate,
        max_value=args.max_value,
        seed=args.seed,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    brokers = [b.strip() for b in args.broker.split(",") if b.strip()]
    async with JournalClient(brokers) as client:
        return await run_chunker(client, cfg, args.record, run=args.run, stop=stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stream_sum.chunker", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--broker",
        default=os.environ.get("BROKER_ADDRESS", "127.0.0.1:8080"),
        help="broker endpoint(s), comma separated [BROKER_ADDRESS]",
    )
    parser.add_argument("--streams", type=int, default=100, help="streams in all (0: no limit)")
    parser.add_argument("--chunks", type=int, default=20, help="data chunks per stream")
    parser.add_argument("--concurrency", type=int, default=10, help="streams open at once")
    parser.add_argument("--rate", type=float, default=0.0, help="chunks per second (0: no limit)")
    parser.add_argument("--max-value", type=int, default=1_000_000, help="largest chunk value")
    parser.add_argument("--seed", type=int, default=None, help="seed of the random chunks")
    parser.add_argument("--run", default=None, help="run id (default: random)")
    parser.add_argument(
        "--record", type=Path, default=None, help="record file of the expected sums (JSON lines)"
    )
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "info"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    stats = asyncio.run(_main(args))
    print(
        f"run {stats.run}: {stats.chunks} chunks, {stats.streams} streams ended, in "
        f"{stats.seconds:.1f}s" + (f"; record {args.record}" if args.record else ""),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
