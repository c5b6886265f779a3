"""The JSON file store's exporter (`gazette.consumer.export`): a played state file read as one
row, the state as a JSON string, with the checkpoint stored beside it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence, Set
from typing import Any

from gazette.consumer.export import ExportedRows, ExportRequest, PlayedFiles, UnreadableStore
from gazette.consumer.protocol import pb
from gazette.stores.jsonfile.store import NEXT_FILE, STATE_FILE, decode_state_file

__all__ = ["EXPORTER", "JSONFileExporter"]


class JSONFileExporter:
    """Reads a played JSON file store: no row for a store that never committed."""

    kind = "json"
    description = "a JSON store"

    def recognizes(self, names: Set[str]) -> bool:
        return STATE_FILE in names or NEXT_FILE in names

    def columns(self, played: PlayedFiles, request: ExportRequest) -> list[tuple[str, str]]:
        return [("state", "string")]

    @contextlib.contextmanager
    def rows(self, played: PlayedFiles, request: ExportRequest) -> Iterator[ExportedRows]:
        path = played.directory / STATE_FILE
        if not path.exists():
            yield _Rows(pb.Checkpoint(), None)
            return
        try:
            checkpoint, state = decode_state_file(path.read_bytes())
        except ValueError as err:
            raise UnreadableStore(f"an unreadable {STATE_FILE}: {err}") from err
        yield _Rows(checkpoint, json.dumps(state, separators=(",", ":"), sort_keys=True))


EXPORTER = JSONFileExporter()


class _Rows:
    def __init__(self, checkpoint: pb.Checkpoint, state: str | None) -> None:
        self.checkpoint = checkpoint
        self._state = state

    def __iter__(self) -> Iterator[Sequence[Any]]:
        if self._state is not None:
            yield ([self._state],)
