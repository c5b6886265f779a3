"""Acknowledged appends and the check that each is readable where it was acknowledged (no I/O).

The appender writes one record per append, ``ack <id>\\n``, and after the broker's
acknowledgement logs a JSON line ``{"id": ..., "begin": ..., "end": ..., "t": ...}``: the
offsets of the commit and the time. A broker acknowledges an append once every replica of the
journal's route has it, so with replication of 2 or more, no single crash, partition or pause
may lose it: the journal, read back later, must hold exactly that record at exactly those
offsets. An append retried after an ambiguous failure may be written twice (appends are
at-least-once); only the acknowledged copy is checked, and an unacknowledged one is never
counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Ack:
    id: str
    begin: int
    end: int
    t: float = 0.0
    """When it was acknowledged (seconds since the epoch)."""

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "begin": self.begin, "end": self.end, "t": self.t})


@dataclass(frozen=True)
class LostAck:
    ack: Ack
    reason: str

    def __str__(self) -> str:
        a = self.ack
        return f"lost append id={a.id} offsets=[{a.begin},{a.end}): {self.reason}"


def record(id: str) -> bytes:
    """The content of the append of `id`."""
    return f"ack {id}\n".encode()


def parse_acks(text: str) -> list[Ack]:
    """The acks of an appender's log; a partial last line (the appender killed while writing
    it) is skipped, any other malformed line raises ValueError."""
    lines = [line for line in text.splitlines(keepends=True) if line.strip()]
    acks = []
    for i, line in enumerate(lines):
        try:
            d = json.loads(line)
            acks.append(Ack(str(d["id"]), int(d["begin"]), int(d["end"]), float(d.get("t", 0))))
        except (ValueError, KeyError, TypeError) as err:
            if i == len(lines) - 1 and not line.endswith("\n"):
                break
            raise ValueError(f"ack log line {i + 1}: {err}: {line!r}") from None
    return acks


class JournalContent:
    """What a read of the journal returned: runs of bytes at their offsets (a read skips
    what is missing, so runs need not be contiguous)."""

    def __init__(self, runs: Iterable[tuple[int, bytes]] = ()) -> None:
        self._runs: list[tuple[int, bytes]] = []
        for offset, data in runs:
            self.add(offset, data)

    def add(self, offset: int, data: bytes) -> None:
        """Content read at `offset`; appended to the previous run if it continues it."""
        if not data:
            return
        if self._runs:
            last_off, last = self._runs[-1]
            if offset < last_off + len(last):
                raise ValueError(
                    f"content at {offset} overlaps the run ending {last_off + len(last)}"
                )
            if offset == last_off + len(last):
                self._runs[-1] = (last_off, last + data)
                return
        self._runs.append((offset, data))

    @property
    def end(self) -> int:
        """The offset after the last byte read (0 if nothing)."""
        if not self._runs:
            return 0
        off, data = self._runs[-1]
        return off + len(data)

    def at(self, begin: int, end: int) -> bytes | None:
        """The bytes [begin, end) if all were read, else None."""
        for off, data in self._runs:
            if off <= begin and end <= off + len(data):
                return data[begin - off : end - off]
        return None


def lost_acks(acks: Sequence[Ack], content: JournalContent) -> list[LostAck]:
    """The acknowledged appends not found, exactly, at their offsets in `content`."""
    lost = []
    for a in acks:
        got = content.at(a.begin, a.end)
        want = record(a.id)
        if got is None:
            where = "beyond what was read" if a.end > content.end else "in a gap of the read"
            lost.append(LostAck(a, f"offsets not readable ({where})"))
        elif got != want:
            lost.append(LostAck(a, f"holds {got[:60]!r}, not {want!r}"))
    return lost


def longest_gap(times: Sequence[float], start: float, stop: float) -> float:
    """The longest time within [start, stop] without an acknowledgement, given the times of
    acknowledgements (sorted): how long appends stalled during a trial."""
    inside = [t for t in times if start <= t <= stop]
    points = [start, *inside, stop]
    return max((b - a for a, b in zip(points, points[1:], strict=False)), default=0.0)
