"""Framing of *direct appends*: the Append RPC carried over a plain TCP stream.

Our brokers also accept appends on a second port, as a sequence of frames on a TCP
connection instead of a gRPC call: per append, Python gRPC costs ~1-2 ms of CPU on each side,
which a recorded store pays on every commit (docs/direct-appends.md). The messages are
`protocol.AppendRequest` and `protocol.AppendResponse`, unchanged; only their transport
differs, so the broker runs the very same Append handler for both.

A connection starts with `MAGIC` from the client. Then, per append, the client sends the
append's messages as `REQUEST` frames, exactly as it would write them to the gRPC stream, and
ends the stream with an `END` frame (its half-close). With authorization on, an append's
first frame is `AUTHORIZATION`, the value a gRPC call would carry as its ``authorization``
metadata (``Bearer <token>``). The broker answers each append with one
`RESPONSE` frame (a serialized AppendResponse) or one `ERROR` frame (what a gRPC status
would say: a code and its details). One append at a time per connection; once a client has
sent `END` and read the answer, the connection carries the next append.

A frame is a 5-byte header, its kind (one byte) and its payload's length (u32 little
endian), then the payload.
"""

from __future__ import annotations

import asyncio
import struct

import grpc

__all__ = [
    "AUTHORIZATION",
    "END",
    "ERROR",
    "HEADER",
    "MAGIC",
    "MAX_FRAME",
    "REQUEST",
    "RESPONSE",
    "SERVICE_METHOD",
    "DirectProtocolError",
    "content_frame_header",
    "decode_error",
    "encode_error",
    "frame",
    "read_frame",
]

MAGIC = b"GZPYDA1\n"
"""First bytes of a connection: the protocol and its version."""

HEADER = struct.Struct("<cI")
REQUEST = b"M"  # client: a serialized AppendRequest
END = b"E"  # client: the end of the append's stream
AUTHORIZATION = b"A"  # client, first of an append (optional): its ``authorization`` value
RESPONSE = b"R"  # broker: a serialized AppendResponse
ERROR = b"X"  # broker: the append failed: u8 gRPC status code, then UTF-8 details

MAX_FRAME = 64 << 20
"""Largest payload accepted, as the brokers' largest gRPC message."""

SERVICE_METHOD = "/pygazette.DirectAppend/Port"
"""gRPC method of our brokers answering the port of their direct-append listener (ASCII
digits); other brokers answer UNIMPLEMENTED, and clients then append over gRPC."""

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class DirectProtocolError(Exception):
    """The peer broke the direct-append framing."""


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One frame of `kind` carrying `payload`."""
    return HEADER.pack(kind, len(payload)) + payload


_CONTENT_TAG = b"\x22"  # AppendRequest.content: field 4, length-delimited.


def content_frame_header(length: int) -> bytes:
    """The bytes preceding `length` bytes of content in the `REQUEST` frame of an
    AppendRequest which carries only that content (what ``AppendRequest(content=...)``
    serializes to): a client writes this, then the content as it is, without building and
    serializing a message around a copy of it."""
    varint = bytearray()
    n = length
    while n >= 0x80:
        varint.append((n & 0x7F) | 0x80)
        n >>= 7
    varint.append(n)
    return HEADER.pack(REQUEST, len(_CONTENT_TAG) + len(varint) + length) + _CONTENT_TAG + varint


async def read_frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The next frame's kind and payload. Raises DirectProtocolError for a payload over
    `MAX_FRAME` (unread), asyncio.IncompleteReadError if the stream ends first."""
    kind, n = HEADER.unpack(await reader.readexactly(HEADER.size))
    if n > MAX_FRAME:
        raise DirectProtocolError(f"a frame of {n} bytes (at most {MAX_FRAME})")
    return kind, await reader.readexactly(n) if n else b""


def encode_error(code: grpc.StatusCode, details: str) -> bytes:
    """The payload of an `ERROR` frame."""
    return bytes([code.value[0]]) + details.encode("utf-8", "replace")


def decode_error(payload: bytes) -> tuple[grpc.StatusCode, str]:
    """The status code and details of an `ERROR` frame's payload (UNKNOWN for a code this
    grpc does not know)."""
    if not payload:
        raise DirectProtocolError("an error frame without a status code")
    code = _CODES.get(payload[0], grpc.StatusCode.UNKNOWN)
    return code, payload[1:].decode("utf-8", "replace")
