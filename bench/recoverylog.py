"""Recovery-log core benchmark: OpDecoder + FSM, as a Player drives them, without I/O.

- payload: a log of 1 MiB writes (fed in 256 KiB pieces, as journal reads arrive);
  MB/s of write payload decoded and applied, target >= 100 MB/s.
- small_ops: a log of small ops (creates, 100-byte writes, links, unlinks, properties)
  fed in 64 KiB pieces; ops/s decoded and applied, target >= 50k ops/s. The best of
  the runs is printed too: on a shared 2-core machine the median swings with load.
- record: the recorder side of small ops: encode + FSM apply, ops/s.

Payload chunks go to a sink that only counts them (file writes are the Player's I/O, not
measured here). Prints one JSON line. `--quick` uses smaller logs.
"""

from __future__ import annotations

import os.path
import sys

# This script is named after the package it measures; keep its directory off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import json
import os
import time

from recoverylog import _crc32c
from recoverylog import recoverylog_pb2 as rpb
from recoverylog.codec import DecodedOp, OpDecoder, PayloadChunk, encode_op
from recoverylog.fsm import FSM, FSMError

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
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
                "ratio_small_ops_vs_parse": round(
                    sorted(rates)[len(rates) // 2] / base_median, 2
                ),
                "target_small_ops_per_s": 50000,
                "target_payload_mb_per_s": 100,
            }
        )
    )


if __name__ == "__main__":
    main()
