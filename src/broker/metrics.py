"""Prometheus metrics of a broker process, served at ``GET /debug/metrics`` (``--http-port``).

Upstream Gazette's names, so its dashboards read these too:

- ``gazette_journal_server_started_totals{operation}`` and
  ``gazette_journal_server_completed_totals{operation, status}``: Journal RPCs by operation
  (Append, Read, List, Apply, ListFragments, FragmentStoreHealth, Replicate). As upstream,
  a completed one's status is ``ok``, another status, or ``<error>`` when it ended with an
  error (aborted, cancelled, failed); the status is that of its response (of a stream: its
  last response, e.g. ``OFFSET_NOT_YET_AVAILABLE`` for a non-blocking Read that reached the
  head), where upstream's is its route resolution's, so that ``WRONG_APPEND_OFFSET`` or
  ``REGISTER_MISMATCH`` appends show here.
- ``gazette_write_head{journal}`` (gauge): each local replica's write head.
- ``gazette_spool_commits_total``, ``gazette_spool_commit_bytes_total``,
  ``gazette_spool_rollbacks_total``, ``gazette_spool_rollback_bytes_total``: appends (and
  replicated appends) committed to or rolled back from spools (a rollback of no bytes is not
  counted);
  ``gazette_spool_completed_total``: spools closed, ready to persist;
  ``gazette_spool_persisted_total``: rolled spools persisted (or found persisted already).

Ours, beyond upstream's (broker.reservation, broker.quarantine):

- ``gazette_offset_reservations_total``: reservation markers written by replication-1
  primaries; ``gazette_reservation_rolls_total``: fresh primaries that started beyond an
  earlier primary's reservation (each a hole in the journal's offsets).
- ``gazette_spools_quarantined_total`` and ``gazette_spool_quarantined_bytes_total``: spools
  of journals this broker no longer serves that conflicted with the journal's content and
  were set aside instead of persisted; ``gazette_spools_redundant_total``: such spools whose
  content the journal already held, dropped.
- ``gazette_spool_disk_full_total``: times an append found the spool disk full (ENOSPC) and
  the broker dropped its fragment cache and rolled its spools to persist and remove them.

The counters are plain integers of this process (`COUNTERS`), updated where the events happen
and rendered at each scrape.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.mainboilerplate.prometheus import Family
from gazette.mainboilerplate.prometheus import render as render_families

__all__ = ["COUNTERS", "ERROR", "Counters", "counted", "render"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Counters:
    """This process's broker counters (module docs)."""

    started: Counter[str] = field(default_factory=Counter)
    completed: Counter[tuple[str, str]] = field(default_factory=Counter)
    spool_commits: int = 0
    spool_commit_bytes: int = 0
    spool_rollbacks: int = 0
    spool_rollback_bytes: int = 0
    spool_completed: int = 0
    spool_persisted: int = 0
    reservations: int = 0
    reservation_rolls: int = 0
    spools_quarantined: int = 0
    spool_quarantined_bytes: int = 0
    spools_redundant: int = 0
    spool_disk_full: int = 0


COUNTERS = Counters()
ERROR = "<error>"
"""The status of an RPC that ended with an error, as upstream."""


def _status_of(status: int) -> str:
    return "ok" if status == pb.OK else pb.Status.Name(pb.Status.ValueType(status))


def counted(operation: str) -> Callable[[F], F]:
    """Count calls of a servicer method as `operation`: started, then completed with the
    status of its response (a stream's last), or `ERROR` if it raised."""

    def wrap(method: F) -> F:
        if inspect.isasyncgenfunction(method):

            @functools.wraps(method)
            async def stream(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
                COUNTERS.started[operation] += 1
                status = pb.OK
                responses = method(self, request, context)
                try:
                    async for resp in responses:
                        status = resp.status
                        yield resp
                except BaseException:
                    COUNTERS.completed[operation, ERROR] += 1
                    raise
                finally:
                    # Closed now, not by the garbage collector, if this generator is closed
                    # between responses: the method's cleanup (descriptors, waiters) runs.
                    await responses.aclose()
                COUNTERS.completed[operation, _status_of(status)] += 1

            return stream  # type: ignore[return-value]

        @functools.wraps(method)
        async def unary(self: Any, request: Any, context: Any) -> Any:
            COUNTERS.started[operation] += 1
            try:
                resp = await method(self, request, context)
            except BaseException:
                COUNTERS.completed[operation, ERROR] += 1
                raise
            COUNTERS.completed[operation, _status_of(getattr(resp, "status", pb.OK))] += 1
            return resp

        return unary  # type: ignore[return-value]

    return wrap


def render(write_heads: Iterable[tuple[str, int]], counters: Counters = COUNTERS) -> str:
    """The broker's metrics in Prometheus' text format; `write_heads`: (journal, head) of each
    local replica."""
    started = Family(
        "gazette_journal_server_started_totals",
        "counter",
        "Total number of started JournalServer RPC invocations, by operation.",
    )
    for op, n in sorted(counters.started.items()):
        started.add(n, [("operation", op)])
    completed = Family(
        "gazette_journal_server_completed_totals",
        "counter",
        "Total number of completed JournalServer RPC invocations, by operation & response status",
    )
    for (op, status), n in sorted(counters.completed.items()):
        completed.add(n, [("operation", op), ("status", status)])
    heads = Family(
        "gazette_write_head",
        "gauge",
        "Current write head of the journal (i.e., next byte offset to be written).",
    )
    for journal, head in sorted(write_heads):
        heads.add(head, [("journal", journal)])
    plain = [
        (
            "gazette_spool_commits_total",
            counters.spool_commits,
            "commits of journal fragment spools",
        ),
        (
            "gazette_spool_commit_bytes_total",
            counters.spool_commit_bytes,
            "bytes committed to journal fragment spools",
        ),
        (
            "gazette_spool_rollbacks_total",
            counters.spool_rollbacks,
            "rollbacks of journal fragment spools",
        ),
        (
            "gazette_spool_rollback_bytes_total",
            counters.spool_rollback_bytes,
            "bytes rolled-back from journal fragment spools",
        ),
        (
            "gazette_spool_completed_total",
            counters.spool_completed,
            "journal fragment spools which have been completed, and are ready for persisting",
        ),
        (
            "gazette_spool_persisted_total",
            counters.spool_persisted,
            "journal fragment spools which were persisted (or found persisted already)",
        ),
        (
            "gazette_offset_reservations_total",
            counters.reservations,
            "offset reservations written by replication-1 primaries",
        ),
        (
            "gazette_reservation_rolls_total",
            counters.reservation_rolls,
            "fresh primaries which started beyond an earlier primary's reservation",
        ),
        (
            "gazette_spools_quarantined_total",
            counters.spools_quarantined,
            "spools set aside because they conflict with the journal's content",
        ),
        (
            "gazette_spool_quarantined_bytes_total",
            counters.spool_quarantined_bytes,
            "bytes of spools set aside because they conflict with the journal's content",
        ),
        (
            "gazette_spools_redundant_total",
            counters.spools_redundant,
            "spools of unserved journals dropped because the journal already holds them",
        ),
        (
            "gazette_spool_disk_full_total",
            counters.spool_disk_full,
            "times the spool disk was found full and spools were rolled to free it",
        ),
    ]
    families = [started, completed, heads]
    for name, value, what in plain:
        f = Family(name, "counter", f"Total number of {what}.")
        f.add(value)
        families.append(f)
    return render_families(families)
