"""An in-process, scripted `protocol.Journal` servicer for tests of client edge cases.

Each RPC pops the next scripted behaviour for its method: a list of responses (Read, List; an
`asyncio.Event` in a Read list hangs until set), a single response (Append, Apply, ...), or a
`grpc.StatusCode` to abort the call with. Requests are recorded in `calls`.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc

Script = Any


class FakeJournal(pb_grpc.JournalServicer):
    def __init__(self) -> None:
        self.scripts: dict[str, deque[Script]] = defaultdict(deque)
        self.calls: dict[str, list[Any]] = defaultdict(list)

    def script(self, method: str, *behaviours: Script) -> None:
        self.scripts[method].extend(behaviours)

    async def _next(self, method: str, context: Any) -> Script:
        if not self.scripts[method]:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"no script for {method}")
        b = self.scripts[method].popleft()
        if isinstance(b, grpc.StatusCode):
            await context.abort(b, f"scripted {b.name}")
        return b

    async def Read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.ReadResponse]:
        self.calls["Read"].append(request)
        for resp in await self._next("Read", context):
            if isinstance(resp, asyncio.Event):  # Hang until set.
                await resp.wait()
                continue
            if isinstance(resp, grpc.StatusCode):
                await context.abort(resp, f"scripted {resp.name}")
            yield resp

    async def Append(self, request_iterator: Any, context: Any) -> pb.AppendResponse:
        msgs = [m async for m in request_iterator]
        self.calls["Append"].append(msgs)
        resp: pb.AppendResponse = await self._next("Append", context)
        return resp

    async def List(self, request: pb.ListRequest, context: Any) -> AsyncIterator[pb.ListResponse]:
        self.calls["List"].append(request)
        for resp in await self._next("List", context):
            yield resp

    async def Apply(self, request: pb.ApplyRequest, context: Any) -> pb.ApplyResponse:
        self.calls["Apply"].append(request)
        resp: pb.ApplyResponse = await self._next("Apply", context)
        return resp

    async def ListFragments(
        self, request: pb.FragmentsRequest, context: Any
    ) -> pb.FragmentsResponse:
        self.calls["ListFragments"].append(request)
        resp: pb.FragmentsResponse = await self._next("ListFragments", context)
        return resp

    async def FragmentStoreHealth(self, request: Any, context: Any) -> Any:
        self.calls["FragmentStoreHealth"].append(request)
        return await self._next("FragmentStoreHealth", context)

    async def Replicate(self, request_iterator: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no")


class FakeBroker:
    """``async with FakeBroker() as fb``: a grpc.aio server on 127.0.0.1 serving `fb.journal`."""

    def __init__(self) -> None:
        self.journal = FakeJournal()
        self.server = grpc.aio.server()
        pb_grpc.add_JournalServicer_to_server(self.journal, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeBroker:
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(None)
