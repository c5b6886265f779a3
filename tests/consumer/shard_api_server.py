"""A `ShardAPI` served by grpc.aio in a thread of its own, over a real etcd.

The thread owns its event loop, so the server keeps serving while a test runs gazctl (which
runs its own loop with `asyncio.run`) or its own async code. `call(coro_fn)` runs a coroutine
on the server's loop, with the server's `Etcd`, e.g. to seed assignment keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from gazette.allocator.model import MemberID, assignment_key, member_key
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.consumer.shard_api import ShardAPI
from gazette.consumer.spec import ShardKeys, decode_consumer_value
from gazette.keyspace.etcd import Etcd
from gazette.keyspace.keyspace import KeySpace
from gazette.testing.etcd import free_port

T = TypeVar("T")

_roots = itertools.count()


class ShardAPIServer:
    """Serves ``consumer.Shard`` for a fresh consumer root on 127.0.0.1:`port`.

    `read_through[shard]` is what the test Stat answers for an existing shard. `root` shares
    another server's consumer root (two processes of one application). After `max_applies`
    Apply calls (if given), Apply answers UNAVAILABLE as a draining consumer does; `applied`
    holds the requests served.
    """

    def __init__(
        self,
        etcd_endpoint: str,
        *,
        with_stat: bool = True,
        root: str | None = None,
        max_applies: int | None = None,
    ) -> None:
        self.etcd_endpoint = etcd_endpoint
        self.root = root or f"/test-consumer/{os.getpid()}/app{next(_roots)}"
        self.max_applies = max_applies
        self.applied: list[pb.ApplyRequest] = []
        self.keys = ShardKeys(self.root)
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.read_through: dict[str, dict[str, int]] = {}
        self.with_stat = with_stat
        self.api: ShardAPI | None = None
        self.etcd: Etcd | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._stop: asyncio.Event | None = None
        self._main: Any = None

    async def _stat(self, req: pb.StatRequest, context: Any) -> pb.StatResponse:
        assert self.api is not None
        return pb.StatResponse(
            status=pb.OK, header=self.api.header(), read_through=self.read_through.get(req.shard)
        )

    async def _serve(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        async with Etcd(self.etcd_endpoint) as etcd:
            self.etcd = etcd
            ks = KeySpace(self.keys.keyspace_prefix, decode_consumer_value(self.root))
            await ks.load(etcd)
            self.keyspace = ks
            self.api = ShardAPI(
                etcd,
                ks,
                self.root,
                bpb.ProcessSpec.ID(zone="local", suffix="shard-api"),
                stat=self._stat if self.with_stat else None,
            )
            apply = self.api.Apply

            async def counted_apply(req: pb.ApplyRequest, context: Any) -> pb.ApplyResponse:
                if self.max_applies is not None and len(self.applied) >= self.max_applies:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "consumer is draining")
                resp = await apply(req, context)
                self.applied.append(req)
                return resp

            self.api.Apply = counted_apply  # type: ignore[method-assign,assignment]
            server = grpc.aio.server()
            pb_grpc.add_ShardServicer_to_server(self.api, server)
            server.add_insecure_port(self.endpoint)
            await server.start()
            async with asyncio.TaskGroup() as tg:
                watch = tg.create_task(ks.watch(etcd))
                ready.set()
                try:
                    await self._stop.wait()
                finally:
                    await server.stop(None)
                    watch.cancel()

    def start(self) -> ShardAPIServer:
        self._thread.start()
        ready = threading.Event()
        self._main = asyncio.run_coroutine_threadsafe(self._serve(ready), self._loop)
        if not ready.wait(10):
            self._main.result(1)  # raises what kept the server from starting
            raise TimeoutError("ShardAPIServer did not start within 10s")
        return self

    def call(self, fn: Callable[[Etcd], Awaitable[T]], timeout: float = 30) -> T:
        """Run ``fn(etcd)`` on the server's loop and return its result."""

        async def run() -> T:
            assert self.etcd is not None
            return await fn(self.etcd)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def put(self, key: str, value: bytes) -> int:
        """Put `key` and (if under the root) wait until the server's keyspace has it; returns
        the revision."""

        async def put(etcd: Etcd) -> int:
            resp = await etcd.put(key.encode(), value)
            if key.startswith(self.keys.keyspace_prefix):
                await self.keyspace.wait_for_revision(int(resp.header.revision), timeout=10)
            return int(resp.header.revision)

        return self.call(put)

    def delete(self, key: str) -> None:
        async def delete(etcd: Etcd) -> None:
            resp = await etcd.delete(key.encode())
            await self.keyspace.wait_for_revision(int(resp.header.revision), timeout=10)

        self.call(delete)

    def put_member(self, zone: str, suffix: str, endpoint: str = "") -> None:
        spec = pb.ConsumerSpec(
            process_spec=bpb.ProcessSpec(
                id=bpb.ProcessSpec.ID(zone=zone, suffix=suffix),
                endpoint=endpoint or f"http://{zone}-{suffix}:8081",
            ),
            shard_limit=100,
        )
        self.put(member_key(self.root, MemberID(zone, suffix)), spec.SerializeToString())

    def put_assignment(
        self,
        shard: str,
        zone: str,
        suffix: str,
        slot: int,
        code: int = pb.ReplicaStatus.PRIMARY,
        errors: tuple[str, ...] = (),
    ) -> str:
        key = assignment_key(self.root, shard, MemberID(zone, suffix), slot)
        status = pb.ReplicaStatus(code=code, errors=list(errors))  # type: ignore[arg-type]
        self.put(key, status.SerializeToString())
        return key

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._main is not None:
            with contextlib.suppress(Exception):
                self._main.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> ShardAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
