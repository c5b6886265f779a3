"""Checkpoints for the store tests: `labeled` ones to tell commits apart, and `rich`, one of
every field of ``consumer.Checkpoint`` (sources read through, producers, ACK intents)."""

from __future__ import annotations

from gazette.consumer.protocol import pb

__all__ = ["labeled", "rich"]

Source = pb.Checkpoint.Source


def labeled(label: str) -> pb.Checkpoint:
    """A checkpoint told apart by `label` (an ACK intent of a test journal)."""
    return pb.Checkpoint(ack_intents={"test/label": label.encode()})


def rich(n: int) -> pb.Checkpoint:
    """A checkpoint of two sources, with producers (a pending transaction's `begin`, and -1
    for none) and ACK intents of two journals, all depending on `n`."""
    return pb.Checkpoint(
        sources={
            "examples/input/part-000": Source(
                read_through=1000 * n + 17,
                producers=[
                    Source.ProducerEntry(
                        id=bytes([1, 2, 3, 4, 5, n % 256]),
                        state=pb.Checkpoint.ProducerState(last_ack=(1 << 63) + n, begin=-1),
                    ),
                    Source.ProducerEntry(
                        id=b"\xff\xfe\xfd\xfc\xfb\xfa",
                        state=pb.Checkpoint.ProducerState(last_ack=n, begin=1000 * n),
                    ),
                ],
            ),
            "examples/input/part-001": Source(read_through=n),
        },
        ack_intents={
            "examples/output/part-000": b'{"uuid": "ack-%d"}\n' % n,
            "examples/output/part-001": b"\x00\x01ack" * (n + 1),
        },
    )
