"""Exactly-once messages atop Gazette journals: UUIDs, envelopes and framings.

A message carries a version-1 UUID (`uuid`) naming its producer, its clock and its part in a
transaction. Journals hold messages laid out by a `Framing`, chosen by the journal's
`content-type` label: JSON lines, CSV, or length-prefixed protobuf. `JSONMessage`,
`CSVMessage` and `ProtoMessage` make dataclasses and generated protobuf messages into Messages.
"""

from gazette.message.csv_message import CSVMessage
from gazette.message.envelope import Envelope, Message, Validator
from gazette.message.framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_LABEL,
    CONTENT_TYPE_PROTO_FIXED,
    DEFAULT_MAX_FRAME_SIZE,
    Desync,
    Frame,
    FrameDecoder,
    Framing,
    FramingError,
    MarshalError,
    UnknownFramingError,
    UnmarshalError,
    framing_for,
    framing_for_spec,
    known_content_types,
    register_framing,
)
from gazette.message.framing_csv import CSV_FRAMING, CSVFrameable, CSVFraming
from gazette.message.framing_fixed import (
    FIXED_FRAME_HEADER_LENGTH,
    FIXED_FRAME_WORD,
    PROTO_FIXED_FRAMING,
    FixedFraming,
    ProtoFrameable,
    encode_fixed_frame,
)
from gazette.message.framing_json import JSON_FRAMING, JSONFrameable, JSONFraming
from gazette.message.json_message import JSONMessage
from gazette.message.mapping import (
    JournalNotInPartitions,
    MappingError,
    MappingFunc,
    MappingKeyFunc,
    NoPartitions,
    PartitionsFunc,
    direct_mapping,
    fnv1a_32,
    modulo_mapping,
    random_mapping,
    rendezvous_mapping,
)
from gazette.message.proto_message import ProtoMessage
from gazette.message.sequencer import (
    MustStartReplay,
    ProducerState,
    QueueOutcome,
    ReplayError,
    Sequencer,
    SequencerError,
    SequencerStateError,
    states_from_checkpoint,
    states_to_checkpoint,
)
from gazette.message.uuid import (
    GREGORIAN_OFFSET_100NS,
    Clock,
    Flags,
    ProducerID,
    UUIDError,
    build_uuid,
    clock_from_unix,
    clock_from_unix_ns,
    clock_to_unix_ns,
    get_clock,
    get_flags,
    get_producer_id,
    new_producer_id,
    tick,
    update,
)

# The publisher and iterators speak to brokers (grpc): imported on first use, so that
# `import gazette.message` stays cheap for code that only frames or sequences messages.
_LAZY = {
    "Publisher": "gazette.message.publisher",
    "AckIntent": "gazette.message.publisher",
    "JournalBatcher": "gazette.message.publisher",
    "DEFAULT_MAX_BATCH_BYTES": "gazette.message.publisher",
    "ReadUncommittedIter": "gazette.message.iterators",
    "ReadCommittedIter": "gazette.message.iterators",
    "NewMessageFunc": "gazette.message.iterators",
    "MessageDecodeError": "gazette.message.iterators",
    "TruncatedFrame": "gazette.message.iterators",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'message' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    # uuid
    "Clock",
    "Flags",
    "GREGORIAN_OFFSET_100NS",
    "ProducerID",
    "UUIDError",
    "build_uuid",
    "clock_from_unix",
    "clock_from_unix_ns",
    "clock_to_unix_ns",
    "get_clock",
    "get_flags",
    "get_producer_id",
    "new_producer_id",
    "tick",
    "update",
    # envelope
    "Envelope",
    "Message",
    "Validator",
    # framing
    "CONTENT_TYPE_CSV",
    "CONTENT_TYPE_JSON_LINES",
    "CONTENT_TYPE_LABEL",
    "CONTENT_TYPE_PROTO_FIXED",
    "DEFAULT_MAX_FRAME_SIZE",
    "Desync",
    "Frame",
    "FrameDecoder",
    "Framing",
    "FramingError",
    "MarshalError",
    "UnknownFramingError",
    "UnmarshalError",
    "framing_for",
    "framing_for_spec",
    "known_content_types",
    "register_framing",
    # framing_json, framing_csv, framing_fixed
    "CSV_FRAMING",
    "CSVFrameable",
    "CSVFraming",
    "FIXED_FRAME_HEADER_LENGTH",
    "FIXED_FRAME_WORD",
    "FixedFraming",
    "JSON_FRAMING",
    "JSONFrameable",
    "JSONFraming",
    "PROTO_FIXED_FRAMING",
    "ProtoFrameable",
    "encode_fixed_frame",
    # message helpers
    "CSVMessage",
    "JSONMessage",
    "ProtoMessage",
    # mapping
    "MappingFunc",
    "MappingKeyFunc",
    "PartitionsFunc",
    "MappingError",
    "NoPartitions",
    "JournalNotInPartitions",
    "fnv1a_32",
    "modulo_mapping",
    "rendezvous_mapping",
    "random_mapping",
    "direct_mapping",
    # sequencer
    "Sequencer",
    "QueueOutcome",
    "ProducerState",
    "SequencerError",
    "SequencerStateError",
    "MustStartReplay",
    "ReplayError",
    "states_to_checkpoint",
    "states_from_checkpoint",
    # publisher, iterators (lazily imported)
    *_LAZY,
]
