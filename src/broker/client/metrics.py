"""Client-side counters of this process's journal traffic, with upstream Gazette's names
(``gazette_append_bytes_total{journal}``, ``gazette_read_bytes_total{journal}``), rendered by
the ``/debug/metrics`` endpoints of the processes that use the client (consumers)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gazette.mainboilerplate.prometheus import Family

__all__ = ["CLIENT", "ClientCounters", "client_families"]


@dataclass
class ClientCounters:
    append_bytes: Counter[str] = field(default_factory=Counter)
    """Bytes committed by `Appender`s (and so `AppendService`), by journal."""
    read_bytes: Counter[str] = field(default_factory=Counter)
    """Bytes `Reader`s returned (from brokers, or fragments read directly), by journal."""
    fetched_bytes: int = 0
    """Decompressed bytes of fragments fetched directly from their stores so far (counted as
    they arrive, before a fragment is verified and read: a progress signal for long fetches;
    not rendered)."""


CLIENT = ClientCounters()


def client_families(counters: ClientCounters = CLIENT) -> list[Family]:
    appended = Family(
        "gazette_append_bytes_total", "counter", "Total number of journal bytes appended."
    )
    for journal, n in sorted(counters.append_bytes.items()):
        appended.add(n, [("journal", journal)])
    read = Family("gazette_read_bytes_total", "counter", "Total number of journal bytes read.")
    for journal, n in sorted(counters.read_bytes.items()):
        read.add(n, [("journal", journal)])
    return [appended, read]
