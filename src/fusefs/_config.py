"""MountConfig: what the fusefs process needs, written as JSON by its parent."""

from __future__ import annotations

import json
import pickle
from dataclasses import asdict, dataclass

from recoverylog import recoverylog_pb2 as rpb
from recoverylog.fsm import FSM, FnodeState

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


def dump_fsm(fsm: FSM, write_head: int) -> bytes:
    """`fsm` (complete: no remaining hints) and a write head, as bytes for `load_fsm`.

    (Protobuf messages of this package do not pickle: their classes' module is the generated
    module's bare name.)"""
    if fsm.has_remaining_hints():
        raise ValueError("an FSM with remaining hints cannot be handed over")
    state = {
        "next_seq_no": fsm.next_seq_no,
        "next_checksum": fsm.next_checksum,
        "last_log": fsm.last_log,
        "properties": dict(fsm.properties),
        "links": dict(fsm.links),
        "live_nodes": {
            fnode: (sorted(node.links), [s.SerializeToString() for s in node.segments])
            for fnode, node in fsm.live_nodes.items()
        },
        "write_head": write_head,
    }
    return pickle.dumps(state)


def load_fsm(data: bytes) -> tuple[FSM, int]:
    """The (FSM, write head) of `dump_fsm`."""
    state = pickle.loads(data)
    fsm = FSM(state["last_log"])
    fsm.next_seq_no = state["next_seq_no"]
    fsm.next_checksum = state["next_checksum"]
    fsm.properties = dict(state["properties"])
    fsm.links = dict(state["links"])
    fsm.live_nodes = {
        fnode: FnodeState(links=set(links), segments=[rpb.Segment.FromString(s) for s in segments])
        for fnode, (links, segments) in state["live_nodes"].items()
    }
    return fsm, int(state["write_head"])
