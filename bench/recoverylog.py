"""Recovery-log core benchmark: OpDecoder + FSM, as a Player drives them, without I/O.

- payload: a log of 1 MiB writes (fed in 256 KiB pieces, as journal reads arrive);
  MB/s of write payload decoded and applied, target >= 100 MB/s.
- small_ops: a log of small ops (creates, 100-byte writes, links, unlinks, properties)
  fed in 64 KiB pieces; ops/s decoded and applied, target >= 50k ops/s. The best of
  the runs is printed too: on a shared 2-core machine the median swings with load.
- record: the recorder side of small ops: encode + FSM apply, ops/s.

Payload chunks go to a sink that only counts them (file writes are the Player's I/O, not
measured here).

Then, against a real etcd + broker (a file:// fragment store), the same run measures:

- playback: a write-heavy log recorded by a Recorder (1 MiB files written in 256 KiB
  pieces), played by a Player into a directory; MB/s, against a plain RetryReader reading the
  same bytes (ratio of times).
- dead_data: a log holding 10x dead data (files written, then deleted) around scattered live
  files, played from the Recorder's hints, against reading only the live byte ranges with
  RetryReaders; target: playback time <= 1.5x the time to read the live bytes.

Prints progress, then one JSON line. `--quick` uses smaller logs (total < 1 minute);
`--no-broker` skips the real-broker section.
"""

from __future__ import annotations

import os.path
import sys

# This script is named after the package it measures; keep its directory off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import asyncio
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import AppendService, JournalClient, RetryReader, apply_journals
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog import _crc32c
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.codec import DecodedOp, OpDecoder, PayloadChunk, encode_op
from gazette.recoverylog.fsm import FSM, FSMError
from gazette.recoverylog.player import Player
from gazette.recoverylog.recorder import Recorder
from gazette.recoverylog.segments import flatten_hints
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer

LOG = "bench/recovery/log"
MiB = 1 << 20


def record(ops: list[rpb.RecordedOp], payloads: dict[int, bytes]) -> bytes:
    """Sequence `ops` as a Recorder does, returning the log bytes."""
    fsm = FSM(LOG)
    out = bytearray()
    for i, op in enumerate(ops):
        op.seq_no, op.checksum, op.author = fsm.next_seq_no, fsm.next_checksum, 0xA1
        frame = encode_op(op)
        out += frame
        if i in payloads:
            out += payloads[i]
        op.log = LOG
        fsm.apply(op, memoryview(frame)[8:])
    return bytes(out)


def play(log: bytes, piece: int) -> tuple[int, int, float]:
    """Decode and apply `log` as a Player would; returns (ops, payload bytes, seconds)."""
    fsm = FSM(LOG)
    dec = OpDecoder(log=LOG)
    ops = payload = 0
    view = memoryview(log)
    start = time.perf_counter()
    for i in range(0, len(log), piece):
        dec.feed(view[i : i + piece])
        while (ev := dec.next_event()) is not None:
            if type(ev) is PayloadChunk:
                payload += len(ev.data)
            elif type(ev) is DecodedOp:
                ops += 1
                try:
                    fsm.apply(ev.op, ev.frame)
                except FSMError as err:
                    if not err.transitioned and ev.op.HasField("write"):
                        dec.discard_payload()
    elapsed = time.perf_counter() - start
    assert fsm.next_seq_no == ops + 1, "every op should apply"
    return ops, payload, elapsed


def payload_log(total_mib: int) -> bytes:
    ops = [rpb.RecordedOp(create=rpb.RecordedOp.Create(path="/big"))]
    payloads = {}
    block = os.urandom(MiB)
    for i in range(total_mib):
        ops.append(rpb.RecordedOp(write=rpb.RecordedOp.Write(fnode=1, offset=i * MiB, length=MiB)))
        payloads[len(ops) - 1] = block
    return record(ops, payloads)


def small_ops(n: int) -> tuple[list[rpb.RecordedOp], dict[int, bytes]]:
    ops: list[rpb.RecordedOp] = []
    payloads: dict[int, bytes] = {}
    data = os.urandom(100)
    while len(ops) < n:
        base = len(ops) + 1  # Fnode of the create below.
        ops.append(rpb.RecordedOp(create=rpb.RecordedOp.Create(path=f"/db/{base:08d}.sst")))
        for k in range(6):
            ops.append(
                rpb.RecordedOp(write=rpb.RecordedOp.Write(fnode=base, offset=k * 100, length=100))
            )
            payloads[len(ops) - 1] = data
        ops.append(rpb.RecordedOp(link=rpb.RecordedOp.Link(fnode=base, path=f"/db/{base}.lnk")))
        ops.append(rpb.RecordedOp(unlink=rpb.RecordedOp.Link(fnode=base, path=f"/db/{base}.lnk")))
        ops.append(rpb.RecordedOp(property=rpb.Property(path="/CURRENT", content=f"M-{base}")))
    return ops, payloads


def parse_only(log: bytes) -> tuple[int, float]:
    """Native baseline: walk the frames and parse each op with protobuf, nothing else."""
    t0 = time.perf_counter()
    view = memoryview(log)
    pos = count = 0
    from_string = rpb.RecordedOp.FromString
    while pos < len(view):
        length = int.from_bytes(view[pos + 4 : pos + 8], "little")
        op = from_string(view[pos + 8 : pos + 8 + length])
        pos += 8 + length + (op.write.length if op.HasField("write") else 0)
        count += 1
    return count, time.perf_counter() - t0


# --- Against a real broker ---------------------------------------------------------------


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def make_log(client: JournalClient, name: str, store: Path) -> str:
    frag = pb.JournalSpec.Fragment(
        length=64 * MiB, compression_codec=pb.NONE, refresh_interval=Duration(seconds=600)
    )
    frag.stores.append(f"file://{store}/")
    spec = pb.JournalSpec(name=name, replication=1, fragment=frag)
    spec.labels.labels.add(name="content-type", value="application/x-gazette-recoverylog")
    await apply_journals(client, pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
    return name


def record_file(rec: Recorder, name: str, block: bytes, size: int) -> None:
    """Record a file of `size` bytes written in pieces of len(`block`)."""
    fnode = rec.record_create(name)
    for offset in range(0, size, len(block)):
        rec.record_write(fnode, offset, block[: min(len(block), size - offset)])


async def read_range(client: JournalClient, log: str, begin: int, end: int) -> int:
    """Read [begin, end) of `log` with a plain RetryReader; returns the bytes read."""
    rr = RetryReader(client, pb.ReadRequest(journal=log, offset=begin, end_offset=end, block=True))
    n = 0
    try:
        while chunk := await rr.read():
            n += len(chunk)
    finally:
        rr.close()
    return n


async def timed_play(client: JournalClient, log: str, hints: Any, out: Path) -> tuple[float, int]:
    """Seconds to play `log` into `out`, and the bytes the Player read."""
    shutil.rmtree(out, ignore_errors=True)
    player = Player(client, log, hints, out)
    t0 = time.perf_counter()
    await player.play()
    return time.perf_counter() - t0, player.progress.bytes_read


def op_extents(data: bytes, log: str) -> dict[tuple[int, int], tuple[int, int]]:
    dec = OpDecoder(0, log)
    dec.feed(data)
    out: dict[tuple[int, int], tuple[int, int]] = {}
    while (ev := dec.next_event()) is not None:
        if type(ev) is DecodedOp:
            out.setdefault((ev.op.author, ev.op.seq_no), (ev.op.first_offset, ev.op.last_offset))
    return out


async def read_all(client: JournalClient, log: str, end: int) -> bytes:
    rr = RetryReader(client, pb.ReadRequest(journal=log, offset=0, end_offset=end, block=True))
    out = bytearray()
    while chunk := await rr.read():
        out += chunk
    rr.close()
    return bytes(out)


async def bench_playback(
    client: JournalClient, svc: AppendService, store: Path, tmp: Path, total: int, runs: int
) -> dict[str, float]:
    """(a) Playback of a write-heavy log vs a plain read of the same bytes."""
    log = await make_log(client, "bench/recoverylog/write-heavy", store)
    src = tmp / "heavy-src"
    src.mkdir()
    rec = await Recorder.open(FSM(), 0xBE1, src, svc, log)
    block = os.urandom(256 << 10)
    for i in range(total // MiB):
        record_file(rec, f"{i:06d}.sst", block, MiB)
        await rec.throttle(16 * MiB)
    await rec.barrier()
    head = rec.write_head
    await rec.close()
    reads, plays = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        assert await read_range(client, log, 0, head) == head
        reads.append(time.perf_counter() - t0)
        secs, n = await timed_play(client, log, None, tmp / "heavy-out")
        assert n == head
        plays.append(secs)
    t_read, t_play = sorted(reads)[runs // 2], sorted(plays)[runs // 2]
    say(
        f"playback of {head / MiB:.0f} MiB: {head / t_play / 1e6:.0f} MB/s; plain RetryReader "
        f"{head / t_read / 1e6:.0f} MB/s; playback time {t_play / t_read:.2f}x the read"
    )
    return {
        "broker_playback_mb_per_s": round(head / t_play / 1e6, 1),
        "broker_read_mb_per_s": round(head / t_read / 1e6, 1),
        "ratio_playback_vs_read": round(t_play / t_read, 2),
    }


async def bench_dead_data(
    client: JournalClient, svc: AppendService, store: Path, tmp: Path, live_files: int, runs: int
) -> dict[str, float]:
    """(b) Hinted playback of a log of 10x dead data vs reading only the live bytes."""
    log = await make_log(client, "bench/recoverylog/dead-data", store)
    src = tmp / "dead-src"
    src.mkdir()
    rec = await Recorder.open(FSM(), 0xDEAD, src, svc, log)
    rnd = random.Random(1)
    block = os.urandom(256 << 10)
    doomed: list[str] = []
    for i in range(live_files):
        # A compaction-like round: 11 tables written, of which one lives on; the others are
        # removed in the next round.
        names = [f"{i:04d}-{k:02d}.sst" for k in range(11)]
        keep = rnd.randrange(11)
        for k, name in enumerate(names):
            record_file(rec, name, block, MiB)
            if k != keep:
                doomed.append(name)
        while len(doomed) > 10:
            rec.record_unlink(doomed.pop(0))
        await rec.throttle(16 * MiB)
    for name in doomed:
        rec.record_unlink(name)
    record_file(rec, "MANIFEST", block[:4096], 4096)  # The log ends with a live op.
    hints = await rec.build_hints()
    head = rec.write_head
    await rec.close()

    extents = op_extents(await read_all(client, log, head), log)
    ranges = [
        (extents[(s.author, s.first_seq_no)][0], extents[(s.author, s.last_seq_no)][1])
        for s in flatten_hints(hints)
    ]
    live = sum(e - b for b, e in ranges)
    reads, plays, read_by_player = [], [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        for b, e in ranges:
            assert await read_range(client, log, b, e) == e - b
        reads.append(time.perf_counter() - t0)
        secs, read_by_player = await timed_play(client, log, hints, tmp / "dead-out")
        plays.append(secs)
    t_read, t_play = sorted(reads)[runs // 2], sorted(plays)[runs // 2]
    ratio = t_play / t_read
    say(
        f"dead data: log {head / MiB:.0f} MiB, live {live / MiB:.1f} MiB in {len(ranges)} "
        f"segments ({(head - live) / live:.1f}x dead); hinted playback read "
        f"{read_by_player / MiB:.1f} MiB in {t_play:.2f}s vs {t_read:.2f}s to read the live "
        f"bytes: {ratio:.2f}x (target <= 1.5x)"
    )
    return {
        "dead_data_log_mib": round(head / MiB, 1),
        "dead_data_live_mib": round(live / MiB, 1),
        "dead_data_ratio_dead_to_live": round((head - live) / live, 1),
        "dead_data_player_read_vs_live": round(read_by_player / live, 3),
        "dead_data_playback_s": round(t_play, 3),
        "dead_data_read_live_s": round(t_read, 3),
        "ratio_dead_data_playback_vs_live_read": round(ratio, 2),
        "target_dead_data_ratio": 1.5,
    }


async def broker_section(quick: bool, tmp: Path, endpoint: str) -> dict[str, float]:
    store = tmp / "store"
    store.mkdir()
    total, live_files, runs = (64 * MiB, 8, 3) if quick else (256 * MiB, 32, 5)
    async with JournalClient(endpoint) as client, AppendService(client) as svc:
        say(f"real broker: recording {total // MiB} MiB of 1 MiB files ...")
        out = await bench_playback(client, svc, store, tmp, total, runs)
        say(f"real broker: recording {live_files} live MiB among 10x dead data ...")
        out.update(await bench_dead_data(client, svc, store, tmp, live_files, runs))
    return out


def run_broker_section(quick: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-recoverylog-", dir="/var/tmp") as d:
        tmp = Path(d)
        with EtcdServer() as etcd:
            broker = BrokerProcess(etcd.endpoint, spool_dir=tmp / "spool")
            with broker:
                return asyncio.run(broker_section(quick, tmp, broker.endpoint))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-broker", action="store_true", help="skip the real-broker section")
    args = parser.parse_args()
    total_mib, n_small, runs = (64, 50_000, 3) if args.quick else (256, 200_000, 5)

    big = payload_log(total_mib)
    mbps = []
    for _ in range(runs):
        _, nbytes, secs = play(big, 256 << 10)
        mbps.append(nbytes / secs / 1e6)
    print(f"payload: {sorted(mbps)} MB/s", file=sys.stderr)

    ops, payloads = small_ops(n_small)
    t0 = time.perf_counter()
    small = record(ops, payloads)
    rec_rate = len(ops) / (time.perf_counter() - t0)
    rates = []
    for _ in range(runs):
        count, _, secs = play(small, 64 << 10)
        rates.append(count / secs)
    print(f"small ops: {sorted(rates)} ops/s; record {rec_rate:.0f} ops/s", file=sys.stderr)
    base = []
    for _ in range(runs):
        count, secs = parse_only(small)
        base.append(count / secs)
    base_median = sorted(base)[len(base) // 2]
    print(f"baseline (protobuf parse of the same frames): {base_median:.0f} ops/s", file=sys.stderr)

    broker_figures = {} if args.no_broker else run_broker_section(args.quick)

    print(
        json.dumps(
            {
                "bench": "recoverylog",
                "crc32c_backend": _crc32c.BACKEND,
                "payload_mb_per_s_median": round(sorted(mbps)[len(mbps) // 2], 1),
                "payload_mb_per_s_min": round(min(mbps), 1),
                "small_ops_per_s_median": round(sorted(rates)[len(rates) // 2]),
                "small_ops_per_s_best": round(max(rates)),
                "record_ops_per_s": round(rec_rate),
                "small_op_bytes_avg": round(len(small) / len(ops), 1),
                "parse_only_ops_per_s": round(base_median),
                "ratio_small_ops_vs_parse": round(sorted(rates)[len(rates) // 2] / base_median, 2),
                "target_small_ops_per_s": 50000,
                "target_payload_mb_per_s": 100,
                **broker_figures,
            }
        )
    )


if __name__ == "__main__":
    main()
