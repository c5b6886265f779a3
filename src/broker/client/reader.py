"""Reader: the content of one Read RPC, as a stream of bytes.

A `Reader` issues a single Read RPC (lazily, at the first `read`) and returns the journal
content it streams. Per fragment, a broker sends one *metadata* response (the fragment, the
write head, and maybe a fragment URL) followed by content chunks. The Reader keeps the latest
metadata in `response` and exposes `offset` (the next journal offset `read` returns), `write_head`,
`fragment` and `fragment_url`.

Reads of persisted fragments made with ``do_not_proxy`` may be answered with a fragment URL
and no content. The Reader then fetches the fragment itself (`fragment_reader`), verifies its
SHA1 and serves it from the requested offset to the fragment's end; the read ends there, and a
`RetryReader` continues with a new RPC.

When a broker answers at a larger offset than requested (the requested offset was -1, the
write head; or a range of the journal is gone), the Reader records an `OffsetJump` in `jumps`
and logs it, then continues at the new offset: skipped ranges are never silent.

A Reader ends (``read`` returns b"") when the broker closes the stream, at ``end_offset``, at the
end of a directly read fragment, or after its RPC was cancelled. Use `RetryReader` to read
across those ends and across broker failures.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
import grpc.aio

from gazette.broker.client.errors import BrokerError, OffsetJump, error_for_status
from gazette.broker.client.fragment_reader import VerifiedFragment, fetch_verified_fragment
from gazette.broker.client.journal_client import JournalClient
from gazette.broker.client.metrics import CLIENT
from gazette.broker.protocol import protocol_pb2 as pb

if TYPE_CHECKING:
    ReadCall = grpc.aio.UnaryStreamCall[pb.ReadRequest, pb.ReadResponse]

__all__ = ["Reader"]

log = logging.getLogger(__name__)

_UNBOUNDED = 1 << 62


class Reader:
    """Bytes of one Read RPC of `request` (copied; `request.offset` advances as we read).

    `on_jump`, if given, is called with each `OffsetJump` as it is recorded.
    """

    def __init__(
        self,
        client: JournalClient,
        request: pb.ReadRequest,
        *,
        on_jump: Callable[[OffsetJump], None] | None = None,
    ) -> None:
        if not request.journal:
            raise ValueError("ReadRequest.journal is required")
        self.client = client
        self.request = pb.ReadRequest()
        self.request.CopyFrom(request)
        self.response = pb.ReadResponse()
        """The latest metadata response (fragment, write head, URL) of the RPC."""
        self.jumps: list[OffsetJump] = []
        self._on_jump = on_jump
        self._call: ReadCall | None = None
        self._chunk = memoryview(b"")
        self._from_store: VerifiedFragment | None = None
        self._url_pending = False
        self._ended = False

    # Views of the current position and metadata.

    @property
    def journal(self) -> str:
        return self.request.journal

    @property
    def offset(self) -> int:
        """Journal offset of the next byte `read` returns (-1 until a head read has begun)."""
        return self.request.offset

    @property
    def write_head(self) -> int:
        """The journal's write head as of the latest metadata response (0 before any)."""
        return self.response.write_head

    @property
    def fragment(self) -> pb.Fragment | None:
        """The fragment being read, per the latest metadata response."""
        return self.response.fragment if self.response.HasField("fragment") else None

    @property
    def fragment_url(self) -> str:
        """URL of the fragment being read directly (empty when content is proxied)."""
        return self.response.fragment_url

    @property
    def ended(self) -> bool:
        """Whether the Reader has ended; `read` now returns b""."""
        return self._ended and not self._chunk and self._from_store is None

    # Reading.

    async def read(self, n: int = -1) -> bytes:
        """The next journal content: at most `n` bytes if `n` > 0, else whatever is available.

        Waits for the broker when nothing is buffered (indefinitely for a blocking request at
        the write head). Returns b"" when the Reader has ended (see the module docstring).
        Raises a `BrokerError` subclass for a non-OK status (`OffsetNotYetAvailable` at the
        write head of a non-blocking read), `grpc.aio.AioRpcError` (or a raw gRPC core
        `grpc.aio.InternalError`) when the RPC fails in transport, and `FragmentCorrupted` /
        OSError when a direct fragment read fails; after any error the Reader has ended. If
        `read` is cancelled, the RPC is cancelled and the Reader ends; content already
        returned stays accounted for in `offset`.
        """
        if n == 0:
            return b""
        try:
            return await self._read(n)
        except BaseException:
            self._end()
            raise

    async def _read(self, n: int) -> bytes:
        while True:
            limit = n if n > 0 else _UNBOUNDED
            if self.request.end_offset:
                remain = self.request.end_offset - self.request.offset
                if remain <= 0 and self.request.offset >= 0:
                    self._end()
                    return b""
                limit = min(limit, remain)

            if self._chunk:
                data = bytes(self._chunk[:limit])
                self._chunk = self._chunk[len(data) :]
                self.request.offset += len(data)
                CLIENT.read_bytes[self.request.journal] += len(data)
                return data

            if self._from_store is not None:
                data = self._from_store.read(min(limit, 1 << 20))
                if data:
                    self.request.offset += len(data)
                    CLIENT.read_bytes[self.request.journal] += len(data)
                    return data
                self._from_store.close()
                self._from_store = None
                self._end()
                return b""

            if self._ended:
                return b""

            if self._url_pending:
                await self._open_from_store()
                continue

            if self._call is None:
                stub = self.client.stub_for(self.request.journal, primary=False)
                self._call = stub.Read(self.request)

            try:
                resp = await self._call.read()
            except (grpc.aio.AioRpcError, grpc.aio.InternalError):
                self.client.invalidate_route(self.request.journal)
                raise
            if not isinstance(resp, pb.ReadResponse):  # grpc.aio.EOF: the broker closed.
                self._end()
                return b""
            self._on_response(resp)

    def _on_response(self, resp: pb.ReadResponse) -> None:
        if resp.HasField("header"):
            self.client.update_route(self.request.journal, resp.header)
        if resp.content and resp.status == pb.OK:
            skip = self.request.offset - resp.offset
            if skip < 0:
                self._jump(resp.offset)
                skip = 0
            self._chunk = memoryview(resp.content)[skip:]
            return
        # A metadata response, describing the fragment that content comes from next, or a
        # final status. Either may move the offset (e.g. a read from the write head, -1).
        if resp.offset > self.request.offset:
            self._jump(resp.offset)
        if resp.status != pb.OK:
            # Keep describing the last fragment read; take the status and write head.
            self.response.status = resp.status
            if resp.write_head:
                self.response.write_head = resp.write_head
            raise error_for_status(
                resp.status, journal=self.request.journal, offset=self.request.offset
            )
        self.response = resp
        if resp.fragment_url and not self.request.metadata_only:
            self._url_pending = True

    def _jump(self, to_offset: int) -> None:
        jump = OffsetJump(self.request.journal, self.request.offset, to_offset)
        self.request.offset = to_offset
        self.jumps.append(jump)
        if jump.from_offset < 0:
            log.debug("read begins at write head journal=%s offset=%d", jump.journal, to_offset)
        else:
            log.warning(
                "offset jump journal=%s from=%d to=%d skipped=%d",
                jump.journal,
                jump.from_offset,
                jump.to_offset,
                jump.skipped,
            )
        if self._on_jump is not None:
            self._on_jump(jump)

    async def _open_from_store(self) -> None:
        self._url_pending = False
        # The broker is not going to proxy this fragment; don't hold its stream open.
        if self._call is not None:
            self._call.cancel()
            self._call = None
        fragment = pb.Fragment()
        fragment.CopyFrom(self.response.fragment)
        self._from_store = await asyncio.to_thread(
            fetch_verified_fragment, fragment, self.response.fragment_url, self.request.offset
        )

    def _end(self) -> None:
        self._ended = True
        if self._call is not None:
            self._call.cancel()
            self._call = None

    def close(self) -> None:
        """End the Reader now: cancel its RPC and drop buffered and direct-read content."""
        self._end()
        self._chunk = memoryview(b"")
        self._url_pending = False
        if self._from_store is not None:
            self._from_store.close()
            self._from_store = None

    def __aiter__(self) -> Reader:
        return self

    async def __anext__(self) -> bytes:
        data = await self.read()
        if not data:
            raise StopAsyncIteration
        return data

    async def __aenter__(self) -> Reader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


async def write_head(client: JournalClient, journal: str) -> int:
    """`journal`'s write head, from a non-blocking metadata read at offset -1 (any replica
    answers; an append in flight may land beyond it). Raises the `BrokerError` of a non-OK
    status."""
    req = pb.ReadRequest(journal=journal, offset=-1, block=False, metadata_only=True)
    call = client.stub_for(journal, primary=False).Read(req)
    try:
        async for resp in call:
            if resp.status not in (pb.OK, pb.OFFSET_NOT_YET_AVAILABLE):
                raise error_for_status(
                    resp.status, journal=journal, detail="reading its write head"
                )
            return int(resp.write_head)
    finally:
        call.cancel()
    raise BrokerError(journal=journal, detail="no response to a metadata read")
