"""MountConfig: what the fusefs process needs, written as JSON by its parent."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from gazette.recoverylog.handover import dump_fsm, load_fsm

__all__ = ["MountConfig", "dump_fsm", "load_fsm"]


@dataclass(frozen=True)
class MountConfig:
    """What the fusefs process needs; written as JSON by the parent."""

    endpoint: str
    log: str
    author: int
    backing: str
    mountpoint: str
    fsm_in: str  # Pickle of (FSM, write_head) to record onwards from.
    fsm_out: str = ""  # Where to write the final (FSM, write_head) on a clean stop.
    fence_log: bool | None = None  # Recorder.open's fence_log.
    writeback: bool = True
    # File-name suffixes whose files are opened for writing with direct I/O (FuseMount.start).
    direct_writes: tuple[str, ...] = ()
    parent_pid: int = 0
    # The directory the parent made for these files (and this configuration): the process
    # removes it if it outlives the parent, who would have removed it.
    hand_over_dir: str = ""

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, text: str) -> MountConfig:
        fields = json.loads(text)
        fields["direct_writes"] = tuple(fields.get("direct_writes", ()))  # A JSON list.
        return cls(**fields)
