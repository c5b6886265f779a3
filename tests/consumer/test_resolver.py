"""consumer.resolver in process, over the runtime with a fake keyspace and etcd: a held
resolution keeps its replica's store until released (a stop and a new replica of the shard
wait for it), the stopped state, proxying rules, read-through, shards_with_source."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

import gazette.consumer.replica as replica_mod
from gazette.allocator.model import MemberID, assignment_key, item_key, member_key
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import pb
from gazette.consumer.resolver import GRPC_PROXY_METADATA, ResolverStopped
from gazette.consumer.runtime import ConsumerRuntime
from tests.consumer.fakes import (
    JOURNAL,
    ROOT,
    FakeStore,
    IdleApp,
    IdleReaders,
    make_runtime,
    outside,
)
from tests.kit.eventually import eventually

Code = pb.ReplicaStatus.Code
OTHER = MemberID("z", "other")


class DestroyedStore(FakeStore):
    def __init__(self) -> None:
        super().__init__()
        self.destroyed = False

    def destroy(self) -> None:
        self.destroyed = True


class App(IdleApp):
    def __init__(self) -> None:
        self.stores: list[DestroyedStore] = []

    def new_store(self, shard: Any, recovered: Any) -> DestroyedStore:
        self.stores.append(DestroyedStore())
        return self.stores[-1]


@pytest.fixture
def runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[ConsumerRuntime, Any, MemberID]:
    monkeypatch.setattr(replica_mod, "SourceReaders", IdleReaders)
    rt, ks, me = make_runtime(tmp_path)
    rt.app = App()  # type: ignore[assignment]
    ks.put(
        member_key(ROOT, OTHER),
        pb.ConsumerSpec(
            process_spec=bpb.ProcessSpec(endpoint="http://10.0.0.2:8090"),
            http_endpoint="http://10.0.0.2:8091",
        ),
    )
    return rt, ks, me


async def primary_here(rt: ConsumerRuntime, ks: Any, me: MemberID) -> str:
    akey = assignment_key(ROOT, "shard", me, 0)
    ks.put(akey, pb.ReplicaStatus())
    await rt._reconcile_once()
    replica = rt.replicas["shard"]
    await eventually(lambda: replica.status.code == Code.PRIMARY, what="PRIMARY", timeout=5)
    return akey


async def stop_all(rt: ConsumerRuntime) -> None:
    for r in list(rt.replicas.values()):
        await r.stop()
    await asyncio.gather(*rt._stopping.values(), return_exceptions=True)


async def test_a_held_resolution_keeps_the_store_until_released(
    runtime: tuple[ConsumerRuntime, Any, MemberID],
) -> None:
    """The shard is unassigned (its successor elsewhere takes over) while a handler holds
    its resolution: the replica stops processing and says so (`shard.stopping`), but its
    store stays open until the handler is done; the shard assigned here again meanwhile
    waits for that too (its directory is the old replica's until released)."""
    rt, ks, me = runtime
    akey = await primary_here(rt, ks, me)
    app: App = rt.app  # type: ignore[assignment]
    try:
        async with rt.resolver.resolve("shard") as res:
            assert res.status == pb.OK and res.local
            assert res.store is app.stores[0] and res.shard is not None
            del ks.kvs[akey]
            await rt._reconcile_once()  # Stops the replica: in the background.
            stopping = rt._stopping["shard"]
            ks.put(akey, pb.ReplicaStatus())
            await rt._reconcile_once()  # Assigned here again.
            # A window in which the stop and the new replica wait for the held store.
            await asyncio.sleep(0.3)
            assert res.shard.stopping.is_set()
            assert not app.stores[0].destroyed, "the store was destroyed while held"
            assert not stopping.done() and "shard" not in rt.replicas
        await asyncio.wait_for(stopping, 5)
        assert app.stores[0].destroyed
        await rt._reconcile_once()
        assert "shard" in rt.replicas, "the shard did not start again once released"
    finally:
        await stop_all(rt)


async def test_a_holder_that_never_exits_keeps_the_store_only_so_long(
    runtime: tuple[ConsumerRuntime, Any, MemberID], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler that ignores ``shard.stopping`` and keeps its resolution: past
    `HOLD_RELEASE_TIMEOUT` the store is released anyway, so the shard is not wedged here."""
    from gazette.consumer import replica as replica_module

    monkeypatch.setattr(replica_module, "HOLD_RELEASE_TIMEOUT", 0.5)
    rt, ks, me = runtime
    akey = await primary_here(rt, ks, me)
    app: App = rt.app  # type: ignore[assignment]
    try:
        async with rt.resolver.resolve("shard") as res:
            assert res.local
            del ks.kvs[akey]
            await rt._reconcile_once()  # Stops the replica: in the background.
            await asyncio.wait_for(rt._stopping["shard"], 5)
            assert app.stores[0].destroyed
    finally:
        await stop_all(rt)


class FailingApp(App):
    def consume_message(self, shard: Any, store: Any, env: Any, pub: Any) -> None:
        raise RuntimeError("the application fails")


async def test_a_failed_replica_keeps_a_held_store_until_released(
    runtime: tuple[ConsumerRuntime, Any, MemberID], monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = asyncio.Event()

    class GatedReaders(IdleReaders):
        async def run(self) -> None:
            await gate.wait()
            self.queue.put_nowait(outside(0))
            await asyncio.Event().wait()

    monkeypatch.setattr(replica_mod, "SourceReaders", GatedReaders)
    rt, ks, me = runtime
    rt.app = app = FailingApp()  # type: ignore[assignment]
    await primary_here(rt, ks, me)
    replica = rt.replicas["shard"]
    try:
        async with rt.resolver.resolve("shard") as res:
            gate.set()  # A message: the application fails, so does the shard.
            await eventually(lambda: replica.status.code == Code.FAILED, what="FAILED")
            # A window in which the failed shard's stop waits for the held store.
            await asyncio.sleep(0.1)
            assert res.shard is not None and res.shard.stopping.is_set()
            assert not app.stores[0].destroyed, "the store was destroyed while held"
        await eventually(lambda: app.stores[0].destroyed, what="the store released", timeout=2)
    finally:
        await stop_all(rt)


async def test_stopped_resolver_refuses_local_shards_and_still_routes_others(
    runtime: tuple[ConsumerRuntime, Any, MemberID],
) -> None:
    rt, ks, me = runtime
    await primary_here(rt, ks, me)
    ks.put(item_key(ROOT, "elsewhere"), pb.ShardSpec(id="elsewhere"))
    ks.put(assignment_key(ROOT, "elsewhere", OTHER, 0), pb.ReplicaStatus(code=Code.PRIMARY))
    rt.resolver.stop()
    try:
        assert rt.resolver.stopping.is_set()
        with pytest.raises(ResolverStopped, match="shard"):
            async with rt.resolver.resolve("shard"):
                pass
        async with rt.resolver.resolve("elsewhere", may_proxy=True) as res:
            assert (res.status, res.local) == (pb.OK, False)
            assert res.primary_endpoint == "http://10.0.0.2:8090"
    finally:
        await stop_all(rt)


class Context:
    """What `resolve` reads of a gRPC servicer context."""

    def __init__(self, metadata: list[tuple[str, Any]], remaining: float | None = None) -> None:
        self.metadata, self.remaining = metadata, remaining

    def invocation_metadata(self) -> list[tuple[str, Any]]:
        return self.metadata

    def time_remaining(self) -> float | None:
        return self.remaining


async def test_a_primary_elsewhere_is_named_proxied_requests_are_not_proxied_again(
    runtime: tuple[ConsumerRuntime, Any, MemberID],
) -> None:
    rt, ks, _me = runtime
    ks.put(assignment_key(ROOT, "shard", OTHER, 0), pb.ReplicaStatus(code=Code.PRIMARY))
    async with rt.resolver.resolve("shard") as res:
        assert res.status == pb.NOT_SHARD_PRIMARY and not res.local
        assert "NOT_SHARD_PRIMARY" in res.error
    async with rt.resolver.resolve("shard", may_proxy=True) as res:
        assert (res.status, res.local) == (pb.OK, False)
        assert (res.primary_endpoint, res.primary_http) == (
            "http://10.0.0.2:8090",
            "http://10.0.0.2:8091",
        )
        assert res.header.process_id == bpb.ProcessSpec.ID(zone="z", suffix="other")
        header = res.header
    # The same request forwarded here (the route changed meanwhile): never forwarded on, and
    # answered once this process's view reached the forwarder's revision.
    header.etcd.revision = ks.revision + 5
    incoming = Context([(GRPC_PROXY_METADATA, header.SerializeToString())])
    async with rt.resolver.resolve("shard", may_proxy=True, incoming=incoming) as res:
        assert res.status == pb.NOT_SHARD_PRIMARY and res.proxied
        with pytest.raises(ValueError, match="not forwarded again"):
            await res.forward_unary("/x.Y/Z", b"")
    assert ks.awaited == [header.etcd.revision]
    # A caller's deadline bounds the wait for a forwarder's revision, whatever it claims.
    incoming = Context([(GRPC_PROXY_METADATA, header.SerializeToString())], remaining=0.25)
    async with rt.resolver.resolve("shard", may_proxy=True, incoming=incoming):
        pass
    assert ks.bounds[-1] == 0.25
    async with rt.resolver.resolve("nope", may_proxy=True) as res:
        assert res.status == pb.SHARD_NOT_FOUND
    ks.kvs.pop(assignment_key(ROOT, "shard", OTHER, 0))
    async with rt.resolver.resolve("shard", may_proxy=True) as res:
        assert res.status == pb.NO_SHARD_PRIMARY


async def test_read_through_waits_for_commits_and_ends_when_the_shard_stops(
    runtime: tuple[ConsumerRuntime, Any, MemberID],
) -> None:
    rt, ks, me = runtime
    await primary_here(rt, ks, me)
    shard = rt.replicas["shard"].shard
    try:

        async def resolved(offset: int) -> tuple[int, bool]:
            async with rt.resolver.resolve("shard", read_through={JOURNAL: offset}) as res:
                return res.status, res.local

        waiting = asyncio.create_task(resolved(10))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        await shard._set_progress({JOURNAL: 10}, {})
        assert await asyncio.wait_for(waiting, 2) == (pb.OK, True)

        waiting = asyncio.create_task(resolved(11))
        with pytest.raises(TimeoutError):
            async with rt.resolver.resolve("shard", read_through={JOURNAL: 11}, timeout=0.1):
                pass
        await rt.replicas["shard"].stop()
        assert await asyncio.wait_for(waiting, 2) == (pb.SHARD_STOPPED, False)
    finally:
        await stop_all(rt)


async def test_a_restarting_primary_is_waited_for_then_answers_from_its_next_replica(
    runtime: tuple[ConsumerRuntime, Any, MemberID],
) -> None:
    """A spec change restarts the local primary: between the old replica's stop and the new
    one's start the shard has no replica here, while its assignment still names this
    process. A resolution asked then waits and answers from the new replica, as for a
    primary still recovering; with no time to wait it says NOT_SHARD_PRIMARY at once."""
    rt, ks, me = runtime
    await primary_here(rt, ks, me)
    old = rt.replicas["shard"]
    rt._stop_replica("shard", "restarted (spec)")
    located = asyncio.create_task(rt.resolver.locate("shard", wait=5))
    try:
        quick = await rt.resolver.locate("shard", wait=0)
        assert quick.status == pb.NOT_SHARD_PRIMARY
        await asyncio.wait_for(rt._stopping["shard"], 5)
        await asyncio.sleep(0.1)
        assert not located.done(), "answered before the next replica was there"
        await rt._reconcile_once()  # The runtime starts the next replica.
        res = await asyncio.wait_for(located, 5)
        assert res.status == pb.OK and res.local
        assert res.replica is rt.replicas["shard"] and res.replica is not old
        assert res.replica.status.code == Code.PRIMARY
    finally:
        located.cancel()
        await stop_all(rt)


async def test_a_restarting_replica_is_waited_for_only_so_long(
    runtime: tuple[ConsumerRuntime, Any, MemberID],
) -> None:
    rt, ks, me = runtime
    await primary_here(rt, ks, me)
    try:
        rt._stop_replica("shard", "restarted (spec)")
        await asyncio.wait_for(rt._stopping["shard"], 5)
        # No next replica comes (no reconciliation runs): the wait ends with the answer.
        t0 = time.monotonic()
        res = await asyncio.wait_for(rt.resolver.locate("shard", wait=0.3), 5)
        assert res.status == pb.NOT_SHARD_PRIMARY
        assert 0.3 <= time.monotonic() - t0 < 2
    finally:
        await stop_all(rt)


def test_shards_with_source(runtime: tuple[ConsumerRuntime, Any, MemberID]) -> None:
    rt, ks, _me = runtime
    src = pb.ShardSpec.Source
    ks.put(item_key(ROOT, "b"), pb.ShardSpec(id="b", sources=[src(journal="j1")]))
    ks.put(item_key(ROOT, "a"), pb.ShardSpec(id="a", sources=[src(journal="j1")]))
    assert [s.id for s in rt.resolver.shards_with_source("j1")] == ["a", "b"]
    assert [s.id for s in rt.resolver.shards_with_source(JOURNAL)] == ["shard"]
    assert rt.resolver.shards_with_source("j2") == []
    ks.put(item_key(ROOT, "c"), pb.ShardSpec(id="c", sources=[src(journal="j2")]))
    assert [s.id for s in rt.resolver.shards_with_source("j2")] == ["c"]


def stat_handler(stat: Any) -> grpc.GenericRpcHandler:
    """A service ``t.T`` whose unary ``Stat`` is `stat` (a primary's application method)."""
    return grpc.method_handlers_generic_handler(
        "t.T",
        {
            "Stat": grpc.unary_unary_rpc_method_handler(
                stat,
                request_deserializer=pb.StatRequest.FromString,
                response_serializer=pb.StatResponse.SerializeToString,
            )
        },
    )


async def test_forward_unary_sends_messages_with_the_proxy_header() -> None:
    """A typed unary call forwarded to a primary: serialized by the request's type, the
    response by `response_deserializer`, the resolution's header in the metadata; the
    primary's error comes back as it is."""
    from gazette.consumer.config import ConsumerConfig
    from gazette.consumer.resolver import Resolution, Resolver, proxy_header_of

    seen: list[bpb.Header | None] = []

    async def stat(req: pb.StatRequest, context: Any) -> pb.StatResponse:
        seen.append(proxy_header_of(context)[1])
        if req.shard == "fails":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no")
        return pb.StatResponse(status=pb.OK, read_through={req.shard: 7})

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((stat_handler(stat),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    resolver = Resolver(ConsumerRuntime(ConsumerConfig(zone="z", suffix="me"), App()))  # type: ignore[arg-type]
    header = bpb.Header(etcd=bpb.Header.Etcd(revision=42))
    res = Resolution(
        pb.OK,
        header,
        shard_id="s",
        primary_endpoint=f"http://127.0.0.1:{port}",
        resolver=resolver,
    )
    try:
        got = await res.forward_unary(
            "/t.T/Stat",
            pb.StatRequest(shard="s"),
            response_deserializer=pb.StatResponse.FromString,
            timeout=10,
        )
        assert got == pb.StatResponse(status=pb.OK, read_through={"s": 7})
        assert seen == [header]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await res.forward_unary(
                "/t.T/Stat",
                pb.StatRequest(shard="fails"),
                response_deserializer=pb.StatResponse.FromString,
                timeout=10,
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        await resolver.close()
        await server.stop(None)


async def test_forward_unary_reaches_a_primary_right_after_its_restart() -> None:
    """The primary was down (forwarded calls failed, and the channel to it backs off) and is
    back on its address: a call forwarded at once reaches it, instead of failing with the
    channel's last error ("Connection refused") until the backoff ends."""
    from gazette.consumer.config import ConsumerConfig
    from gazette.consumer.resolver import Resolution, Resolver
    from gazette.testing.etcd import free_port

    async def stat(req: pb.StatRequest, context: Any) -> pb.StatResponse:
        return pb.StatResponse(status=pb.OK)

    port = free_port()
    resolver = Resolver(ConsumerRuntime(ConsumerConfig(zone="z", suffix="me"), App()))  # type: ignore[arg-type]
    res = Resolution(
        pb.OK,
        bpb.Header(),
        shard_id="s",
        primary_endpoint=f"http://127.0.0.1:{port}",
        resolver=resolver,
    )

    async def forward() -> pb.StatResponse:
        got: pb.StatResponse = await res.forward_unary(
            "/t.T/Stat",
            pb.StatRequest(shard="s"),
            response_deserializer=pb.StatResponse.FromString,
            timeout=10,
        )
        return got

    server = grpc.aio.server()
    try:
        for _ in range(2):  # Down: forwarding fails after the connect wait.
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await forward()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        server.add_generic_rpc_handlers((stat_handler(stat),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()  # Back.
        assert (await forward()).status == pb.OK
    finally:
        await resolver.close()
        await server.stop(None)


async def test_forward_unary_never_forwards_a_forwarded_call_again() -> None:
    """A handler that resolved without `incoming` and forwards with its context: a call that
    was itself forwarded is refused (UNAVAILABLE) instead of being passed on, so processes
    that disagree on the route cannot pass a call back and forth."""
    from gazette.consumer.config import ConsumerConfig
    from gazette.consumer.resolver import GRPC_PROXY_METADATA, Resolution, Resolver

    reached: list[str] = []
    resolver = Resolver(ConsumerRuntime(ConsumerConfig(zone="z", suffix="me"), App()))  # type: ignore[arg-type]
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")

    async def stat(req: pb.StatRequest, context: Any) -> pb.StatResponse:
        reached.append(req.shard)
        return pb.StatResponse(status=pb.OK)

    async def forwarding(req: pb.StatRequest, context: Any) -> pb.StatResponse:
        res = Resolution(
            pb.OK,
            bpb.Header(),
            shard_id="s",
            primary_endpoint=f"127.0.0.1:{port}",
            resolver=resolver,
        )
        out: pb.StatResponse = await res.forward_unary(
            "/t.T/Stat", req, context, response_deserializer=pb.StatResponse.FromString
        )
        return out

    def unary(fn: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(
            fn,
            request_deserializer=pb.StatRequest.FromString,
            response_serializer=pb.StatResponse.SerializeToString,
        )

    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "t.T", {"Stat": unary(stat), "Fwd": unary(forwarding)}
            ),
        )
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary(
                "/t.T/Fwd",
                request_serializer=pb.StatRequest.SerializeToString,
                response_deserializer=pb.StatResponse.FromString,
            )
            await call(pb.StatRequest(shard="first"), timeout=10)
            forwarded = [(GRPC_PROXY_METADATA, bpb.Header().SerializeToString())]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(pb.StatRequest(shard="again"), timeout=10, metadata=forwarded)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "not forwarded again" in (err.value.details() or "")
        assert reached == ["first"]
    finally:
        await resolver.close()
        await server.stop(None)


async def test_channels_to_departed_processes_are_closed_and_a_closed_resolver_refuses(
    runtime: tuple[ConsumerRuntime, Any, MemberID],
) -> None:
    rt, ks, _ = runtime
    resolver = rt.resolver
    first = resolver.channel("http://10.0.0.2:8090")
    assert resolver.channel("10.0.0.2:8090") is first  # one channel per process

    # The other process restarts under a new address: its old channel goes when a new one
    # is made (channels would otherwise pile up, one per restart).
    ks.put(
        member_key(ROOT, OTHER),
        pb.ConsumerSpec(process_spec=bpb.ProcessSpec(endpoint="http://10.0.0.3:8090")),
    )
    second = resolver.channel("http://10.0.0.3:8090")
    assert second is not first
    await eventually(
        lambda: first.get_state() == grpc.ChannelConnectivity.SHUTDOWN,
        what="the departed process's channel closed",
        timeout=5,
    )
    assert second.get_state() != grpc.ChannelConnectivity.SHUTDOWN

    resolver.http_session()
    await resolver.close()
    assert second.get_state() == grpc.ChannelConnectivity.SHUTDOWN
    for make in (lambda: resolver.channel("10.0.0.3:8090"), resolver.http_session):
        with pytest.raises(RuntimeError, match="the resolver is closed"):
            make()


class ReadThroughApp(App):
    """A MessageProducer (producing nothing) whose read_through hook reads its store,
    slowly: it waits on `gate`."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.store_open_in_hook: list[bool] = []

    async def start_reading_messages(
        self, shard: Any, store: Any, checkpoint: Any, into: Any
    ) -> None:
        await asyncio.Event().wait()

    def replay_range(self, shard: Any, store: Any, journal: str, begin: int, end: int) -> Any:
        return []

    async def read_through(self, shard: Any, store: Any, args: Any) -> dict[str, int]:
        self.entered.set()
        await self.gate.wait()
        self.store_open_in_hook.append(not store.destroyed)
        return {JOURNAL: 100}  # never read through here: the Stat waits until the stop


async def test_stat_holds_the_store_while_the_read_through_hook_uses_it(
    runtime: tuple[ConsumerRuntime, Any, MemberID],
) -> None:
    """The shard stops while a Stat's read_through hook is using its store: the store stays
    open until the hook returns, and the Stat then answers SHARD_STOPPED."""
    rt, ks, me = runtime
    app = ReadThroughApp()
    rt.app = app  # type: ignore[assignment]
    akey = await primary_here(rt, ks, me)
    try:
        stat = asyncio.create_task(
            rt.stat(pb.StatRequest(shard="shard", read_through={JOURNAL: 100}), None)
        )
        await asyncio.wait_for(app.entered.wait(), 5)
        del ks.kvs[akey]
        await rt._reconcile_once()  # Stops the replica: in the background.
        stopping = rt._stopping["shard"]
        await asyncio.sleep(0.3)
        assert not app.stores[0].destroyed, "the store was destroyed while the hook used it"
        assert not stopping.done()
        app.gate.set()
        resp = await asyncio.wait_for(stat, 5)
        assert resp.status == pb.SHARD_STOPPED
        assert app.store_open_in_hook == [True]
        await asyncio.wait_for(stopping, 5)
        assert app.stores[0].destroyed
    finally:
        await stop_all(rt)
