"""The chunker's record of a run: what it published, for the verifier to check against.

A record is a file of JSON lines, written as the run goes so that a chunker killed at any
moment leaves a usable one:

    {"run": "3f9a0c1e", "sums_journal": "examples/stream-sum/sums", "sums_offset": 1024}
    {"stream": "3f9a0c1e-0000000", "chunks": 20, "total": 10170412}
    ...
    {"complete": true, "streams": 500}

The header names the run (every stream id of the run starts with ``{run}-``) and the write
head of the sums journal before the run published anything: its sums all lie beyond it.
Then one line per stream whose last chunk was committed (the chunker writes them after each
barrier), and, if the chunker stopped cleanly, a trailer. Without the trailer the record may
lack the streams of the chunker's last barrier: a verifier then cannot call a sum of this run
absent from the record a violation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["Expected", "RecordError", "RecordWriter", "RunRecord", "load_record"]


@dataclass(frozen=True)
class Expected:
    """A stream the chunker finished: `chunks` data chunks adding up to `total`."""

    stream: str
    chunks: int
    total: int


@dataclass
class RunRecord:
    """A record file, loaded."""

    run: str
    sums_journal: str
    sums_offset: int
    streams: dict[str, Expected] = field(default_factory=dict)
    complete: bool = False

    def owns(self, stream: str) -> bool:
        """Whether `stream` is an id of this run."""
        return stream.startswith(self.run + "-")


class RecordError(Exception):
    """A record file that is not one (no header, or a malformed line before the last)."""


class RecordWriter:
    """Writes a record file at `path` (replacing it): the header now, streams with `add`, the
    trailer with `complete`. Each call writes whole lines and flushes them."""

    def __init__(self, path: Path, run: str, sums_journal: str, sums_offset: int) -> None:
        self.path = path
        self.streams = 0
        self._file: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115
        header = {"run": run, "sums_journal": sums_journal, "sums_offset": sums_offset}
        self._write([header])

    def add(self, streams: Iterable[Expected]) -> None:
        docs = [{"stream": e.stream, "chunks": e.chunks, "total": e.total} for e in streams]
        self.streams += len(docs)
        self._write(docs)

    def complete(self) -> None:
        """Mark the record complete: every stream of the run whose last chunk was published
        is in it."""
        self._write([{"complete": True, "streams": self.streams}])

    def close(self) -> None:
        self._file.close()

    def _write(self, docs: list[dict[str, object]]) -> None:
        if docs:
            self._file.write("".join(json.dumps(d) + "\n" for d in docs))
            self._file.flush()


def load_record(path: Path) -> RunRecord:
    """Read the record at `path`. A last line cut short (the chunker was killed while writing
    it) is ignored; raises `RecordError` for anything else that is not a record."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1]:
        lines.pop()  # Cut short: its stream is not recorded.
    docs = []
    for n, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            docs.append(json.loads(line))
        except ValueError as err:
            raise RecordError(f"{path}:{n}: not JSON: {err}") from err
    if not docs or "run" not in docs[0]:
        raise RecordError(f"{path}: no record header")
    head = docs[0]
    rec = RunRecord(str(head["run"]), str(head["sums_journal"]), int(head["sums_offset"]))
    for n, doc in enumerate(docs[1:], 2):
        if doc.get("complete"):
            rec.complete = True
        elif "stream" in doc:
            e = Expected(str(doc["stream"]), int(doc["chunks"]), int(doc["total"]))
            rec.streams[e.stream] = e
        else:
            raise RecordError(f"{path}:{n}: neither a stream nor the trailer: {doc}")
    return rec
