"""What a recorder running in a process of its own (the fusefs server) needs of its parent:
the FSM it records onwards from and hands back (`dump_fsm`, `load_fsm`), and its parent's
death (`set_parent_death_signal`).
"""

from __future__ import annotations

import ctypes
import pickle

from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.fsm import FSM, FnodeState

__all__ = ["dump_fsm", "load_fsm", "set_parent_death_signal"]


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


def set_parent_death_signal(sig: int) -> None:
    """Have the kernel send this process `sig` when the thread of its parent which started it
    exits (Linux ``PR_SET_PDEATHSIG``). Check the parent's pid afterwards: it may be gone
    already."""
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, sig, 0, 0, 0)
