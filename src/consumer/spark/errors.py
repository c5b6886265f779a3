"""Errors of the Spark export sources, raised on the driver (before any job) or by a task.

Each names the shard (and what to do about it) so that the message Spark wraps around it
still says what went wrong.
"""

from __future__ import annotations

__all__ = [
    "BrokersUnresponsive",
    "ExportError",
    "InvalidOption",
    "MissingHints",
    "NoShardsMatched",
    "SharedPlaybackFailed",
    "ShardNotFound",
    "WrongStoreKind",
]


class ExportError(Exception):
    """An export of shard state cannot proceed."""


class InvalidOption(ExportError, ValueError):
    """An option of the data source is missing, unknown or has a bad value."""

    def __init__(self, option: str, why: str) -> None:
        super().__init__(f"gazette-shards option {option!r}: {why}")
        self.option = option


class ShardNotFound(ExportError):
    """A shard named by the `shards` option has no ShardSpec under the consumer root."""

    def __init__(self, shard: str, root: str) -> None:
        super().__init__(f"shard {shard!r} not found: no ShardSpec at {root}/items/{shard}")
        self.shard = shard


class NoShardsMatched(ExportError):
    """The selection matched no shard of the consumer application."""


class MissingHints(ExportError):
    """A selected shard has no hints of the requested kind (or no recovery log at all).

    Pruning's refusal for a shard without any hints is another class,
    `gazette.recoverylog.prune.ShardNotHinted` (a `PruneError`; its docstring says why)."""

    def __init__(self, shard: str, why: str) -> None:
        super().__init__(f"shard {shard!r}: {why}")
        self.shard = shard


class WrongStoreKind(ExportError):
    """The shard's recovery log does not hold a store of the requested kind."""

    def __init__(self, shard: str, expected: str, found: str) -> None:
        super().__init__(
            f"shard {shard!r}: option store={expected} but its recovery log holds {found}"
        )
        self.shard = shard
        self.expected = expected
        self.found = found


class BrokersUnresponsive(ExportError):
    """No broker answered (planning), or a playback read nothing, for option
    ``broker_timeout`` seconds: the brokers are unreachable, or option ``broker`` is wrong."""


class SharedPlaybackFailed(ExportError):
    """Another task of this host failed to play the snapshot this task was waiting for
    (shared playback): this task fails with that error rather than playing it again."""

    def __init__(self, shard: str, log: str, error: str) -> None:
        super().__init__(
            f"shard {shard!r}: the shared playback of recovery log {log} failed in another "
            f"task on this host: {error}"
        )
        self.shard = shard
        self.error = error
