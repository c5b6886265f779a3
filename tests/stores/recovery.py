"""Recovery as the consumer runtime does it, for the stores' tests."""

from __future__ import annotations

from pathlib import Path

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer import RecoveredLog, recover
from gazette.recoverylog import recoverylog_pb2 as rpb

__all__ = ["recovered_log"]


async def recovered_log(
    client: JournalClient,
    service: AppendService,
    endpoint: str,
    log: str,
    directory: Path,
    author: int,
    hints: rpb.FSMHints | None = None,
) -> RecoveredLog:
    """Play `log` into `directory` and hand it off to `author`, as the consumer runtime does."""
    return await recover(
        client, service, log, directory, hints=hints, author=author, broker_endpoint=endpoint
    )
