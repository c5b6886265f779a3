"""The stream-sum verifier: the sums journal, read committed, against the chunkers' records.

For each stream in a record there must be exactly one committed `Sum`, equal to the expected
one (chunks and total). The verifier reads the sums journal from the lowest ``sums_offset``
of its records with a `ReadCommittedIter` (its `Sequencer` drops duplicated appends and
messages of transactions never acknowledged, as any read-committed reader does), until every
expected stream has a sum and it has read through the journal's write head as of that moment
(so that a duplicate committed by then is seen too), or until its timeout.

Violations, each naming its stream:

- ``missing``: no sum of the stream by the timeout;
- ``duplicate``: a second sum of the stream (one violation per extra sum);
- ``wrong``: a sum whose chunks or total differ from the record's;
- ``unexpected``: a sum of a run whose record is complete, for a stream not in it.

Sums of streams of other runs are counted and ignored; so are sums of a run whose record is
incomplete (its chunker was killed) for streams not in it (``unrecorded``).
`SumChecker` is the check alone, fed sums by the caller; `verify_sums` reads and feeds it.

    python -m stream_sum.verifier --broker 127.0.0.1:8080 --record /tmp/stream-sum/run-1.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gazette.broker.client import JournalClient, write_head
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.message.iterators import ReadCommittedIter
from gazette.message.uuid import Flags, get_flags
from stream_sum.messages import Sum
from stream_sum.record import Expected, RunRecord, load_record

__all__ = [
    "EXIT_VIOLATIONS",
    "VIOLATION_KINDS",
    "SumChecker",
    "VerifyResult",
    "Violation",
    "main",
    "verify_sums",
]


VIOLATION_KINDS = ("missing", "duplicate", "wrong", "unexpected")
EXIT_VIOLATIONS = 1
"""Exit status of the command when it found violations."""


@dataclass(frozen=True)
class Violation:
    """A broken guarantee: `kind` (one of `VIOLATION_KINDS`) about `stream`."""

    kind: str
    stream: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} stream={self.stream}: {self.detail}"


@dataclass
class VerifyResult:
    """What a verification found (module docs). `ok` if no violation."""

    expected: int
    verified: int
    violations: list[Violation] = field(default_factory=list)
    sums_read: int = 0
    unrecorded: int = 0
    other_runs: int = 0
    read_through: int | None = None
    """The write head read through once every expected sum was seen (None: not reached)."""
    seconds: float = 0.0
    read_to: int | None = None
    """The journal offset the reader had read to when the verification ended."""

    @property
    def ok(self) -> bool:
        return not self.violations

    def of_kind(self, kind: str) -> list[Violation]:
        return [v for v in self.violations if v.kind == kind]

    def summary(self) -> str:
        kinds = Counter(v.kind for v in self.violations)
        counts = ", ".join(f"{kinds[k]} {k}" for k in VIOLATION_KINDS)
        through = "not reached" if self.read_through is None else str(self.read_through)
        return (
            f"{'OK' if self.ok else 'VIOLATIONS'}: {self.verified}/{self.expected} streams "
            f"summed exactly once; {counts}; {self.sums_read} sums read "
            f"({self.unrecorded} unrecorded, {self.other_runs} of other runs) in "
            f"{self.seconds:.1f}s; write head read through: {through}"
            + ("" if self.ok or self.read_to is None else f"; read to offset {self.read_to}")
        )


class SumChecker:
    """Checks sums, in the order they committed, against `records` (no I/O)."""

    def __init__(self, records: Sequence[RunRecord]) -> None:
        self.records = list(records)
        self.expected: dict[str, Expected] = {}
        for rec in self.records:
            self.expected.update(rec.streams)
        self.seen: Counter[str] = Counter()
        self.violations: list[Violation] = []
        self.sums_read = self.unrecorded = self.other_runs = 0
        self._unseen = set(self.expected)

    @property
    def complete(self) -> bool:
        """Whether every expected stream has a sum."""
        return not self._unseen

    def observe(self, s: Sum) -> None:
        """Check one committed sum."""
        self.sums_read += 1
        want = self.expected.get(s.stream)
        if want is None:
            rec = next((r for r in self.records if r.owns(s.stream)), None)
            if rec is None:
                self.other_runs += 1
            elif not rec.complete:
                self.unrecorded += 1
            else:
                self._violation("unexpected", s.stream, f"run {rec.run} did not publish it")
            return
        self.seen[s.stream] += 1
        if self.seen[s.stream] > 1:
            got = f"chunks={s.chunks} total={s.total}"
            self._violation("duplicate", s.stream, f"sum #{self.seen[s.stream]}: {got}")
            return
        self._unseen.discard(s.stream)
        if (s.chunks, s.total) != (want.chunks, want.total):
            self._violation(
                "wrong",
                s.stream,
                f"chunks={s.chunks} total={s.total}, expected chunks={want.chunks} "
                f"total={want.total}",
            )

    def result(
        self, *, read_through: int | None = None, seconds: float = 0.0, read_to: int | None = None
    ) -> VerifyResult:
        """The verdict as of now: streams without a sum so far are missing."""
        missing = [
            Violation("missing", stream, "no committed sum") for stream in sorted(self._unseen)
        ]
        wrong_or_dup = {v.stream for v in self.violations}
        verified = sum(1 for s in self.seen if s in self.expected and s not in wrong_or_dup)
        return VerifyResult(
            expected=len(self.expected),
            verified=verified,
            violations=missing + self.violations,
            sums_read=self.sums_read,
            unrecorded=self.unrecorded,
            other_runs=self.other_runs,
            read_through=read_through,
            seconds=seconds,
            read_to=read_to,
        )

    def _violation(self, kind: str, stream: str, detail: str) -> None:
        self.violations.append(Violation(kind, stream, detail))


POLL_SECONDS = 0.5
"""How often a verification waiting for the next message checks how far it has read."""


async def verify_sums(
    client: JournalClient, records: Sequence[RunRecord], *, timeout: float = 60.0
) -> VerifyResult:
    """Read the sums journal committed and check it against `records` (module docs); give up
    waiting for missing sums after `timeout` seconds. Raises `ValueError` if the records name
    different sums journals, and the reader's errors (other than transient ones, retried).
    Cancellation stops the read."""
    if not records:
        raise ValueError("no records to verify")
    journals = {r.sums_journal for r in records}
    if len(journals) != 1:
        raise ValueError(f"records of different sums journals: {sorted(journals)}")
    journal = journals.pop()
    offset = min(r.sums_offset for r in records)
    checker = SumChecker(records)
    t0 = time.monotonic()
    deadline = t0 + timeout
    head: int | None = None
    req = bpb.ReadRequest(journal=journal, offset=offset, block=True)
    it = ReadCommittedIter(client, req, None, lambda _spec: Sum())
    reader = it.uncommitted.reader
    try:
        while True:
            if head is None and checker.complete:
                head = await write_head(client, journal)
            if head is not None and reader.offset >= head:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            # Poll: what the reader has read is sequenced before it waits for more, so once it
            # is past the head nothing more is due, though messages of a transaction never
            # acknowledged (a fenced zombie's) may be all that stands there.
            try:
                env = await asyncio.wait_for(it.next(), min(remaining, POLL_SECONDS))
            except TimeoutError:
                continue
            if get_flags(env.message.uuid) != Flags.ACK_TXN:
                checker.observe(env.message)
    finally:
        it.close()
    through = head if head is not None and reader.offset >= head else None
    return checker.result(
        read_through=through, seconds=time.monotonic() - t0, read_to=reader.offset
    )


async def _main(args: argparse.Namespace) -> VerifyResult:
    records = [load_record(p) for p in args.record]
    brokers = [b.strip() for b in args.broker.split(",") if b.strip()]
    async with JournalClient(brokers) as client:
        return await verify_sums(client, records, timeout=args.timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stream_sum.verifier", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--broker",
        default=os.environ.get("BROKER_ADDRESS", "127.0.0.1:8080"),
        help="broker endpoint(s), comma separated [BROKER_ADDRESS]",
    )
    parser.add_argument(
        "--record",
        type=Path,
        action="append",
        required=True,
        help="a chunker's record file (repeat for several chunkers)",
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for missing sums"
    )
    parser.add_argument("--show", type=int, default=20, help="violations listed at most")
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "warning"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    result = asyncio.run(_main(args))
    for v in result.violations[: args.show]:
        print(v)
    if len(result.violations) > args.show:
        print(f"... and {len(result.violations) - args.show} more")
    print(result.summary(), flush=True)
    return 0 if result.ok else EXIT_VIOLATIONS


if __name__ == "__main__":
    sys.exit(main())
