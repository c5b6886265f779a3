"""Recovery as the consumer runtime does it, for the stores' tests."""

from __future__ import annotations

from pathlib import Path

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.store import RecoveredLog
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.player import TAIL, Player

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
    player = Player(client, log, hints, directory)
    player.inject_handoff(author)
    fsm = await player.play(until=TAIL)
    return RecoveredLog(
        log, directory, fsm, author, player.write_head, client, service, endpoint, hints
    )
