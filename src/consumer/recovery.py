"""Recovery of a recorded store's files: play its recovery log, hand the log off to this
process's author, and describe the result as a `RecoveredLog` that the store opens.

Every recorded store starts this way, in the runtime (a replica plays as a standby and hands
off once promoted: `hand_off`) or when opened on its own (`recover`). The hand-off is what
fences an earlier primary: from then on its Recorder's appends fail.
"""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gazette.consumer.store import RecoveredLog

if TYPE_CHECKING:
    from gazette.broker.client import AppendService, JournalClient
    from gazette.recoverylog import recoverylog_pb2 as rpb
    from gazette.recoverylog.fsm import FSM
    from gazette.recoverylog.player import Player

__all__ = ["hand_off", "recover"]


async def hand_off(
    player: Player,
    playing: Awaitable[FSM],
    *,
    author: int,
    client: JournalClient,
    append_service: AppendService,
    broker_endpoint: str,
    hints: rpb.FSMHints | None = None,
    **fields: Any,
) -> RecoveredLog:
    """Ask `player` (whose `playing` is its ``play(until=TAIL)``) to hand its log off to
    `author`, wait for playback to end there, and return the `RecoveredLog` of its
    directory. `fields`: the RecoveredLog's other fields. Raises what playback raises; if
    cancelled, `playing` is left to its owner."""
    player.inject_handoff(author)
    fsm = await playing
    return RecoveredLog(
        log=player.log,
        directory=player.directory,
        fsm=fsm,
        author=author,
        write_head=player.write_head,
        client=client,
        append_service=append_service,
        broker_endpoint=broker_endpoint,
        hints=hints,
        **fields,
    )


async def recover(
    client: JournalClient,
    append_service: AppendService,
    log: str,
    directory: Path,
    *,
    hints: rpb.FSMHints | None = None,
    author: int | None = None,
    broker_endpoint: str = "",
    **fields: Any,
) -> RecoveredLog:
    """Play `log` from `hints` (None: from its beginning) into `directory` and hand it off to
    `author` (a new one by default), as the runtime does for a primary: a store opened on the
    result records onwards from the played state. `broker_endpoint`: for a store recording
    from a process of its own (default: `client`'s). `fields`: the RecoveredLog's other
    fields. Raises the Player's errors (`DataLoss`...)."""
    from gazette.recoverylog.author import new_author
    from gazette.recoverylog.player import TAIL, Player

    author = author or new_author()
    player = Player(client, log, hints, directory)
    return await hand_off(
        player,
        player.play(until=TAIL),
        author=author,
        client=client,
        append_service=append_service,
        broker_endpoint=broker_endpoint or client.default_endpoint,
        hints=hints,
        **fields,
    )
