"""Framing micro-benchmark: µs per message to marshal, decode, and decode + unmarshal.

Messages are ~100-byte frames: a 4-field JSONMessage (JSON lines), the same as a CSVMessage,
and a protobuf message of similar size through ProtoMessage (fixed framing). Decoding feeds
64 KiB chunks. Each figure is the best of several repeats. Prints a table, then one JSON line.
"""

from __future__ import annotations

import os.path
import sys

# bench/ holds scripts named after packages; keep it off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse  # noqa: E402
import json  # noqa: E402
import timeit  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

from gazette.message import (  # noqa: E402
    CSV_FRAMING,
    JSON_FRAMING,
    PROTO_FIXED_FRAMING,
    Clock,
    CSVMessage,
    Flags,
    Framing,
    JSONMessage,
    ProtoMessage,
    build_uuid,
    new_producer_id,
)


@dataclass
class JsonMsg(JSONMessage):
    user: str = ""
    page: str = ""
    n: int = 0
    score: float = 0.0


@dataclass
class CsvMsg(CSVMessage):
    user: str = ""
    page: str = ""
    n: int = 0
    score: float = 0.0


def _best_us(fn: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def _decode_us(framing: Framing, frame: bytes, new: Callable[[], Any] | None, n: int) -> float:
    stream = frame * n
    step = 64 << 10

    def run() -> None:
        dec = framing.decoder()
        for i in range(0, len(stream), step):
            dec.feed(stream[i : i + step])
            while (ev := dec.next_event()) is not None:
                if new is not None:
                    framing.unmarshal(ev.payload, new())  # type: ignore[union-attr]

    return _best_us(run, 1, 5) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 20_000 if args.quick else 100_000

    from gazette.broker.protocol import protocol_pb2 as pb

    uid = build_uuid(new_producer_id(), Clock(123456789 << 4), Flags.CONTINUE_TXN)
    jm = JsonMsg(user="user-12345", page="/index.html", n=42, score=0.5)
    cm = CsvMsg(user="user-12345", page="/index.html", n=42, score=0.5)
    pm = ProtoMessage(pb.Label(name="user-12345/index.html", value="x" * 30), uuid_field="value")
    for m in (jm, cm, pm):
        m.set_uuid(uid)

    results: dict[str, dict[str, float]] = {}
    cases: list[tuple[str, Framing, Any, Callable[[], Any]]] = [
        ("json", JSON_FRAMING, jm, JsonMsg),
        ("csv", CSV_FRAMING, cm, CsvMsg),
        ("fixed", PROTO_FIXED_FRAMING, pm, lambda: ProtoMessage(pb.Label(), "value")),
    ]
    for name, framing, msg, new in cases:
        frame = framing.marshal(msg)
        results[name] = {
            "frame_bytes": len(frame),
            "marshal_us": round(_best_us(lambda: framing.marshal(msg), n // 4, 7), 3),  # noqa: B023
            "decode_us": round(_decode_us(framing, frame, None, n), 3),
            "decode_unmarshal_us": round(_decode_us(framing, frame, new, n), 3),
        }
        r = results[name]
        print(
            f"{name:6} {r['frame_bytes']:4.0f} B  marshal {r['marshal_us']:.2f} µs "
            f"({1e6 / r['marshal_us']:,.0f}/s)  decode {r['decode_us']:.2f} µs  "
            f"decode+unmarshal {r['decode_unmarshal_us']:.2f} µs",
            flush=True,
        )
    print(json.dumps({"bench": "message_framing", **results}))


if __name__ == "__main__":
    main()
