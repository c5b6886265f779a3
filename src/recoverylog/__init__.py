"""The recovery log: a journal recording every operation on a directory of files.

A Recorder appends file operations (create, write, link, unlink) as `RecordedOp`s; a Player
reads them back into a directory. The sans-I/O `FSM` validates the sequence of operations (seq
numbers, a CRC-32C checksum chain, authors) and tracks live files and the log Segments holding
them, from which `FSMHints` let a Player skip dead portions of the log.

Modules: `fsm` (the FSM and its errors), `codec` (op framing and the sans-I/O `OpDecoder`),
`segments` (Segment validation and `SegmentSet`), `hints` (hints' JSON encoding), `author`
(authors and their fences), `recorder` (the asyncio Recorder), `recorded_files` (file objects
that record through a Recorder), `player` (playback, hot-standby tailing and handoff: the
loop), with `playback_reader` (positioned reads feeding the decoder), `staging` (the playback
directory and staged Fnode files), `progress` (`PlayerState`, `PlaybackProgress`) and
`playback_errors`, `prune` (which fragments no hints need). Shards keep their hints in etcd
(`gazette.consumer.hints`).

The Recorder and Player speak to brokers (grpc) and are imported on first use, so that the
sans-I/O core stays cheap to import.
"""

from gazette.recoverylog.author import AUTHOR_LABEL, author_fence, format_author, new_author
from gazette.recoverylog.codec import (
    HEADER_LENGTH,
    MAGIC,
    DecodedOp,
    Desync,
    OpDecodeError,
    OpDecoder,
    OpEvent,
    PayloadChunk,
    PayloadEnd,
    encode_op,
    encode_write,
)
from gazette.recoverylog.fsm import (
    FSM,
    ChecksumMismatch,
    ExpectedHintedFnode,
    FnodeNotTracked,
    FnodeState,
    FSMError,
    LinkExists,
    NoSuchLink,
    NotHintedAuthor,
    PropertyExists,
    WrongChecksum,
    WrongSeqNo,
)
from gazette.recoverylog.hints import (
    hints_from_bytes,
    hints_from_json,
    hints_to_json,
    validate_hints,
)
from gazette.recoverylog.segments import (
    AuthorMismatch,
    FirstChecksumMismatch,
    InconsistentSegments,
    InvalidHints,
    LogMismatch,
    MissingLastOffset,
    NonMonotonicFirstOffset,
    NonMonotonicLastOffset,
    OpenSegmentLogChange,
    SegmentSet,
    flatten_hints,
    live_log_segments,
    reduce_segments,
    validate_segment,
)

_LAZY = {
    **dict.fromkeys(
        [
            "Recorder",
            "RecorderBroken",
            "RecorderFenced",
            "RecorderInconsistent",
            "RecordingFailed",
            "InvalidPath",
        ],
        "gazette.recoverylog.recorder",
    ),
    **dict.fromkeys(["RecordedFS", "NotRecorded"], "gazette.recoverylog.recorded_files"),
    **dict.fromkeys(
        [
            "Player",
            "PlayerState",
            "PlaybackProgress",
            "PlaybackError",
            "DataLoss",
            "UnusedHints",
            "UnsafeDirectory",
            "EXIT_AT_HEAD",
            "TAIL",
        ],
        "gazette.recoverylog.player",
    ),
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'recoverylog' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    *_LAZY,
    "AUTHOR_LABEL",
    "FSM",
    "HEADER_LENGTH",
    "MAGIC",
    "AuthorMismatch",
    "ChecksumMismatch",
    "DecodedOp",
    "Desync",
    "ExpectedHintedFnode",
    "FSMError",
    "FirstChecksumMismatch",
    "FnodeNotTracked",
    "FnodeState",
    "InconsistentSegments",
    "InvalidHints",
    "LinkExists",
    "LogMismatch",
    "MissingLastOffset",
    "NoSuchLink",
    "NonMonotonicFirstOffset",
    "NonMonotonicLastOffset",
    "NotHintedAuthor",
    "OpDecodeError",
    "OpDecoder",
    "OpEvent",
    "OpenSegmentLogChange",
    "PayloadChunk",
    "PayloadEnd",
    "PropertyExists",
    "SegmentSet",
    "WrongChecksum",
    "WrongSeqNo",
    "author_fence",
    "encode_op",
    "encode_write",
    "flatten_hints",
    "format_author",
    "hints_from_bytes",
    "hints_from_json",
    "hints_to_json",
    "live_log_segments",
    "new_author",
    "reduce_segments",
    "validate_hints",
    "validate_segment",
]
