"""Exactly-once messages atop Gazette journals: UUIDs, envelopes and framings.

A message carries a version-1 UUID (`uuid`) naming its producer, its clock and its part in a
transaction. Journals hold messages laid out by a `Framing`, chosen by the journal's
`content-type` label: JSON lines, CSV, or length-prefixed protobuf. `JSONMessage`,
`CSVMessage` and `ProtoMessage` make dataclasses and generated protobuf messages into Messages.
"""

from message.csv_message import CSVMessage
from message.envelope import Envelope, Message, Validator
from message.framing import (
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
from message.framing_csv import CSV_FRAMING, CSVFrameable, CSVFraming
from message.framing_fixed import (
    FIXED_FRAME_HEADER_LENGTH,
    FIXED_FRAME_WORD,
    PROTO_FIXED_FRAMING,
    FixedFraming,
    ProtoFrameable,
    encode_fixed_frame,
)
from message.framing_json import JSON_FRAMING, JSONFrameable, JSONFraming
from message.json_message import JSONMessage
from message.proto_message import ProtoMessage
from message.uuid import (
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

# --- Exports of sequencer.py, publisher.py, mapping.py and iterators.py go here. ---

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
    # --- sequencer, publisher, mapping, iterators: add their names here. ---
]
