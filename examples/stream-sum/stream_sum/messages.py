"""The messages of stream-sum, the journals holding them, and how chunks fold into a sum.

A *stream* is an id and a sequence of chunks numbered from 1: data chunks carry a value, and
the last chunk carries none but marks the end (``end``) and the expected sum (``total``).
`RunningSum` is the fold the summer applies; it refuses a chunk out of sequence, which
exactly-once delivery never produces.
"""

from __future__ import annotations

from dataclasses import dataclass

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.message import CONTENT_TYPE_JSON_LINES, JSONMessage

__all__ = [
    "CHUNKS_PREFIX",
    "CONTENT_TYPE",
    "MESSAGE_TYPE_LABEL",
    "SUMS",
    "Chunk",
    "ChunkOutOfSequence",
    "RunningSum",
    "Sum",
    "chunks_partition",
    "chunks_selector",
    "shard_id",
]

CHUNKS_PREFIX = "examples/stream-sum/chunks/"
"""Partitions of Chunk: ``{CHUNKS_PREFIX}part-NNN``."""
SUMS = "examples/stream-sum/sums"
"""The journal of final Sums."""
MESSAGE_TYPE_LABEL = "app.gazette.dev/message-type"
CONTENT_TYPE = CONTENT_TYPE_JSON_LINES


@dataclass
class Chunk(JSONMessage):
    """Chunk `seq` (from 1) of `stream`: a data chunk adding `value`, or, with `end` set, the
    stream's last chunk, whose `total` is the sum of the values before it."""

    stream: str = ""
    seq: int = 0
    value: int = 0
    end: bool = False
    total: int = 0


@dataclass
class Sum(JSONMessage):
    """The final sum of `stream`: its `chunks` data chunks add up to `total`."""

    stream: str = ""
    chunks: int = 0
    total: int = 0


class ChunkOutOfSequence(Exception):
    """A chunk that does not follow the stream's last one: duplicated, lost or reordered
    delivery, or a chunk after the stream ended."""

    def __init__(self, stream: str, got: int, want: int, ended: bool) -> None:
        after = " after its end" if ended else ""
        super().__init__(f"stream {stream}: chunk {got}{after}, expected chunk {want}")
        self.stream, self.got, self.want, self.ended = stream, got, want, ended


@dataclass
class RunningSum:
    """A stream's sum through chunk `seq`; `ended` once its last chunk was added."""

    stream: str
    seq: int = 0
    total: int = 0
    ended: bool = False

    def add(self, chunk: Chunk) -> bool:
        """Fold `chunk` in; True if it ended the stream. Raises `ChunkOutOfSequence` (and
        changes nothing) unless it is the next chunk of this stream."""
        if chunk.stream != self.stream:
            raise ValueError(f"chunk of stream {chunk.stream} added to the sum of {self.stream}")
        if self.ended or chunk.seq != self.seq + 1:
            raise ChunkOutOfSequence(self.stream, chunk.seq, self.seq + 1, self.ended)
        self.seq = chunk.seq
        if chunk.end:
            self.ended = True
        else:
            self.total += chunk.value
        return self.ended

    def final(self) -> Sum:
        """The Sum to publish once the stream ended (its last chunk carries no value)."""
        return Sum(self.stream, self.seq - 1, self.total)


def chunks_partition(i: int) -> str:
    return f"{CHUNKS_PREFIX}part-{i:03d}"


def shard_id(i: int) -> str:
    """The shard reading chunks partition `i`."""
    return f"stream-sum-part-{i:03d}"


def chunks_selector() -> bpb.LabelSelector:
    """The chunk partitions: journals labelled ``message-type=stream_sum.Chunk`` under
    `CHUNKS_PREFIX` (brokers list them ordered by name, as the mapping needs)."""
    sel = bpb.LabelSelector()
    sel.include.labels.add(name=MESSAGE_TYPE_LABEL, value="stream_sum.Chunk")
    sel.include.labels.add(name="prefix", value=CHUNKS_PREFIX)
    return sel
