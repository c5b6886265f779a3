"""The consumer process's HTTP server (consumer.http_api): the application's handlers
(`register_http`), /healthz and /debug/shards of a real `gazette-consumer` process against
etcd and a broker; a port in use fails the start; the start-up gate, in process."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import grpc.aio
import pytest
from aiohttp import web

from gazette.allocator.model import MemberID, member_key
from gazette.broker.client import AppendService, JournalClient
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.config import ConsumerConfig, parse_args
from gazette.consumer.http_api import DEFAULT_SHUTDOWN_TIMEOUT, ConsumerHTTP, HTTPAddressInUse
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.consumer.runtime import ConsumerRuntime
from gazette.keyspace.etcd import Etcd
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.publisher import Publisher
from gazette.testing.consumer import ConsumerProcess, ConsumerUnavailable
from gazette.testing.etcd import free_port
from tests.consumer.counter_app import Add
from tests.consumer.support import (
    REPO,
    Setup,
    apply_shards,
    stat_through,
    until_ready,
    write_head,
)
from tests.kit.eventually import eventually
from tests.prometheus_text import parse as parse_metrics

_names = itertools.count()


def http_consumer(s: Setup, **kw: Any) -> ConsumerProcess:
    c = ConsumerProcess(
        "tests.consumer.http_app:HTTPCounter",
        s.etcd.endpoint,
        [s.broker.endpoint],
        root=s.root,
        suffix=f"http-{next(_names)}",
        workdir=s.tmp / "consumer",
        extra_env={"PYTHONPATH": str(REPO)},
        **kw,
    )
    s.consumers.append(c)
    return c


@pytest.fixture
def setup(new_setup: Callable[..., Setup]) -> Setup:
    return new_setup()


async def get_json(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as resp:
        return resp.status, await resp.json()


async def test_app_handler_and_builtin_endpoints_of_a_consumer_process(
    setup: Setup, client: JournalClient
) -> None:
    s = setup
    await s.create_journals(client)
    proc = http_consumer(s, extra_args=["--drain-timeout", "3"]).start()
    base = proc.http_endpoint
    async with aiohttp.ClientSession() as http, grpc.aio.insecure_channel(proc.endpoint) as ch:
        status, body = await get_json(http, f"{base}/healthz")
        assert status == 200, body
        assert body["status"] == "ok"
        assert body["member"] == f"local#{proc.suffix}"
        assert body["etcd_revision"] > 0
        assert f"http={base}" in proc.tail_log()

        stub = pb_grpc.ShardStub(ch)
        await apply_shards(stub, s.shard_specs(hot_standbys=0))
        await until_ready(stub, [pb.ReplicaStatus.PRIMARY], "a primary")
        async with AppendService(client) as svc:
            pub = Publisher(svc)
            mapping = lambda _m: (s.inputs[0], CONTENT_TYPE_JSON_LINES)  # noqa: E731
            for i in range(10):
                pub.publish_committed(mapping, Add(f"k{i % 2}", i))
            await pub.barrier()
        head = await write_head(client, s.inputs[0])
        await stat_through(stub, "shard-000", s.inputs[0], head)

        # The application's handler, answering from the primary's store.
        status, body = await get_json(http, f"{base}/counter/shard-000/k1")
        assert status == 200, body
        assert body == {"shard": "shard-000", "key": "k1", "total": 1 + 3 + 5 + 7 + 9}
        status, body = await get_json(http, f"{base}/counter/no-such-shard/k1")
        assert status == 404
        assert body["status"] == "SHARD_NOT_FOUND"

        status, body = await get_json(http, f"{base}/debug/shards")
        assert status == 200
        assert body["member"] == f"local#{proc.suffix}"
        (shard,) = body["shards"]
        assert shard["id"] == "shard-000"
        assert shard["status"] == "PRIMARY"
        assert shard["primary"] is True
        assert shard["errors"] == []
        assert shard["read_through"] == {s.inputs[0]: head}
        assert shard["messages"] == 10
        assert shard["transactions"] >= 1

        # Prometheus metrics, with upstream's names: every byte of the input was read by
        # transactions (10 messages outside transactions: no ACKs).
        async with http.get(f"{base}/debug/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            metrics = parse_metrics(await resp.text())
        me = (("shard", "shard-000"),)
        assert metrics[("gazette_shard_up", (*me, ("status", "PRIMARY")))] == 1
        assert metrics[("gazette_shard_read_messages_total", me)] == 10
        assert metrics[("gazette_shard_read_bytes_total", me)] == head
        assert metrics[("gazette_shard_read_head", (*me, ("journal", s.inputs[0])))] == head
        assert metrics[("gazette_shard_transactions_total", me)] == shard["transactions"]
        phases = {
            labels[1][1]: v
            for (name, labels), v in metrics.items()
            if name == "gazette_shard_phase_seconds_total"
        }
        assert len(phases) == 6 and all(v >= 0 for v in phases.values())
        assert phases["50-committing"] > 0  # A RocksDB commit through the recovery log.
        # The process's journal client: it read the input; it appended to the recovery log
        # (the hand-off no-op of its recovery; the store's own appends are fusefs's).
        assert metrics[("gazette_read_bytes_total", (("journal", s.inputs[0]),))] >= head
        appended = {
            labels[0][1]: v
            for (name, labels), v in metrics.items()
            if name == "gazette_append_bytes_total"
        }
        assert appended and all(v > 0 for v in appended.values()), appended

        async with http.get(f"{base}/no-such-path") as resp:
            assert resp.status == 404

        # SIGTERM: while it tries to hand its shard over, the process says it is draining.
        # The shard goes to a member that never takes it (announced here, it runs nothing):
        # the drain waits out --drain-timeout (with nobody to take it, it would not wait).
        async with Etcd(s.etcd.endpoint) as etcd:
            lease = await etcd.grant_lease(30)
            ghost = MemberID("local", "ghost")
            spec = pb.ConsumerSpec(
                process_spec=bpb.ProcessSpec(
                    id=bpb.ProcessSpec.ID(zone=ghost.zone, suffix=ghost.suffix),
                    endpoint="http://127.0.0.1:1",
                ),
                shard_limit=10,
            )
            await etcd.put(
                member_key(s.root, ghost).encode(), spec.SerializeToString(), lease=lease
            )
            try:
                assert proc.proc is not None
                proc.proc.send_signal(signal.SIGTERM)

                async def unhealthy() -> str | None:
                    status, body = await get_json(http, f"{base}/healthz")
                    return body["status"] if status == 503 else None

                seen = await eventually(
                    unhealthy, what="/healthz to answer 503", timeout=2.5, interval=0.05
                )
                assert seen == "draining"
                await asyncio.to_thread(proc.stop)
            finally:
                await etcd.revoke_lease(lease)


async def test_http_port_in_use_fails_the_start_clearly(setup: Setup) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = http_consumer(setup, http_port=port)
        with pytest.raises(ConsumerUnavailable) as err:
            proc.start()
    assert "exited with 2" in str(err.value)
    log = proc.tail_log()
    assert f"cannot serve HTTP on 127.0.0.1:{port}: address already in use" in log, log
    assert "--http-port" in log


async def test_http_port_zero_disables_http(setup: Setup) -> None:
    proc = http_consumer(setup, http_port=0).start()
    assert "http=none" in proc.tail_log()


class RegistersRoute:
    def __init__(self) -> None:
        self.runtime: Any = None

    def register_http(self, app: web.Application, runtime: ConsumerRuntime) -> None:
        self.runtime = runtime

        async def hello(request: web.Request) -> web.Response:
            return web.json_response({"hello": "world"})

        app.router.add_get("/hello", hello)


async def test_gate_until_registered_and_draining() -> None:
    """Before the member is registered /healthz says "starting" (503) and the
    application's routes answer 503; then both serve; draining makes /healthz 503 again."""
    runtime = ConsumerRuntime(ConsumerConfig(zone="z", suffix="s"), None)  # type: ignore[arg-type]
    app = RegistersRoute()
    server = ConsumerHTTP(runtime, "127.0.0.1", 0)
    await server.start(app.register_http)
    try:
        assert app.runtime is runtime
        assert server.port != 0
        async with aiohttp.ClientSession() as http:
            status, body = await get_json(http, f"{server.endpoint}/healthz")
            assert (status, body["status"]) == (503, "starting")
            status, body = await get_json(http, f"{server.endpoint}/hello")
            assert status == 503
            status, body = await get_json(http, f"{server.endpoint}/debug/shards")
            assert (status, body["shards"]) == (200, [])
            server.set_ready()
            status, body = await get_json(http, f"{server.endpoint}/healthz")
            assert (status, body["status"], body["member"]) == (200, "ok", "z#s")
            status, body = await get_json(http, f"{server.endpoint}/hello")
            assert (status, body) == (200, {"hello": "world"})
            server.set_draining()
            status, body = await get_json(http, f"{server.endpoint}/healthz")
            assert (status, body["status"]) == (503, "draining")
    finally:
        await server.close()


async def test_gate_answers_503_once_stopped() -> None:
    """Once the drain is over (`set_stopped`), the application's routes answer 503: the
    runtime is about to shut down, and must not run their handlers any more."""
    runtime = ConsumerRuntime(ConsumerConfig(zone="z", suffix="s"), None)  # type: ignore[arg-type]
    app = RegistersRoute()
    server = ConsumerHTTP(runtime, "127.0.0.1", 0)
    await server.start(app.register_http)
    try:
        server.set_ready()
        server.set_draining()
        async with aiohttp.ClientSession() as http:
            status, body = await get_json(http, f"{server.endpoint}/hello")
            assert (status, body) == (200, {"hello": "world"})  # Draining: still served.
            server.set_stopped()
            status, body = await get_json(http, f"{server.endpoint}/hello")
            assert status == 503, body
            assert "stopping" in body["error"]
            status, body = await get_json(http, f"{server.endpoint}/healthz")
            assert (status, body["status"]) == (503, "stopped")
    finally:
        await server.close()


async def test_close_does_not_wait_long_for_app_handlers() -> None:
    """`close` waits a few seconds at most for a handler in flight (aiohttp's default of 60
    s stalled the process exit well beyond --drain-timeout), cancelling it."""
    runtime = ConsumerRuntime(ConsumerConfig(zone="z", suffix="s"), None)  # type: ignore[arg-type]
    entered, cancelled = asyncio.Event(), asyncio.Event()

    def register(app: web.Application, runtime: ConsumerRuntime) -> None:
        async def slow(request: web.Request) -> web.Response:
            entered.set()
            try:
                # Longer than the test: only its cancellation ends it.
                await asyncio.sleep(120)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return web.json_response({})

        app.router.add_get("/slow", slow)

    server = ConsumerHTTP(runtime, "127.0.0.1", 0)
    await server.start(register)
    server.set_ready()
    async with aiohttp.ClientSession() as http:

        async def call() -> None:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{server.endpoint}/slow") as resp:
                    await resp.read()

        request = asyncio.create_task(call())
        try:
            await asyncio.wait_for(entered.wait(), 5)
            t0 = time.monotonic()
            async with asyncio.timeout(15):
                await server.close()
            took = time.monotonic() - t0
        finally:
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await request
    # aiohttp waits shutdown_timeout, cancels, then waits up to as long for the handler.
    assert took < 2 * DEFAULT_SHUTDOWN_TIMEOUT + 2, took
    assert cancelled.is_set()


class _Recorder:
    def __init__(self, calls: list[str], name: str) -> None:
        self.calls, self.name = calls, name

    def __getattr__(self, method: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> None:
            self.calls.append(f"{self.name}.{method}")

        return call


async def test_exit_closes_http_before_the_runtime_shuts_down() -> None:
    """After the drain the HTTP server stops admitting application requests and is closed
    before `runtime.shutdown()` (a handler must not run on a shut-down runtime); long-lived
    handlers were told to end first (`resolver.stopping`)."""
    from gazette.consumer.main import ConsumerProcess as Process

    calls: list[str] = []
    proc = Process(ConsumerConfig(zone="z", suffix="s"), None)  # type: ignore[arg-type]
    server = ConsumerHTTP(proc.runtime, "127.0.0.1", 0)
    await server.start()
    server.set_ready()
    server.set_draining()
    real_close = server.close

    resolver = proc.runtime.resolver

    async def close() -> None:
        assert server.state == "stopped"
        assert resolver.stopping.is_set()
        calls.append("http.close")
        await real_close()

    server.close = close  # type: ignore[method-assign]
    proc.http = server
    proc.runtime = _Recorder(calls, "runtime")  # type: ignore[assignment]
    proc.runtime.resolver = resolver
    proc.server = _Recorder(calls, "grpc")  # type: ignore[assignment]
    # The order of the shared life cycle (mainboilerplate.process.serve).
    await proc.stop_serving()
    await proc.shutdown()
    assert calls.index("http.close") < calls.index("runtime.shutdown"), calls
    assert calls.index("grpc.stop") < calls.index("runtime.shutdown"), calls
    assert server._runner is None


async def test_in_process_port_in_use_raises_address_in_use() -> None:
    runtime = ConsumerRuntime(ConsumerConfig(), None)  # type: ignore[arg-type]
    first = ConsumerHTTP(runtime, "127.0.0.1", free_port())
    await first.start()
    try:
        with pytest.raises(HTTPAddressInUse, match="address already in use"):
            await ConsumerHTTP(runtime, "127.0.0.1", first.port).start()
    finally:
        await first.close()


def test_http_port_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_args(["m:A"]).http_port == 8091
    assert parse_args(["m:A", "--listen", "0.0.0.0:9000"]).http_host == "0.0.0.0"
    assert parse_args(["m:A", "--listen", "[::1]:9000"]).http_host == "::1"
    monkeypatch.setenv("CONSUMER_HTTP_PORT", "9123")
    assert parse_args(["m:A"]).http_port == 9123
    assert parse_args(["m:A", "--http-port", "0"]).http_port == 0
    with pytest.raises(SystemExit):
        parse_args(["m:A", "--http-port", "70000"])
    monkeypatch.setenv("CONSUMER_HTTP_PORT", "eighty")
    with pytest.raises(SystemExit):
        parse_args(["m:A"])


def test_fusefs_prestart_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The RocksDB store kind's flag (`stores.rocksdb.prestart`, registered by importing the
    store, as RocksDB applications do)."""
    from gazette.stores.rocksdb.prestart import FUSEFS_PRESTART

    def prestart(*args: str) -> int:
        return int(parse_args(["m:A", *args]).store_options[FUSEFS_PRESTART.name].prestart)

    assert prestart() == 1
    assert prestart("--fusefs-prestart", "0") == 0
    monkeypatch.setenv("CONSUMER_FUSEFS_PRESTART", "3")
    assert prestart() == 3
    for bad in ("-1", "65", "many"):
        with pytest.raises(SystemExit):
            prestart("--fusefs-prestart", bad)


async def test_word_count_registers_its_http_query(monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/word-count's `register_http` wiring: its /ngrams route answers through the
    runtime's resolution (no shards here: SHARD_NOT_FOUND) and rejects empty queries.
    Its counts over HTTP on a live cluster are shown by the word-count README/demo."""
    monkeypatch.syspath_prepend(str(REPO / "examples" / "word-count"))
    from word_count.app import WordCount

    runtime = ConsumerRuntime(ConsumerConfig(zone="z", suffix="s"), WordCount())
    server = ConsumerHTTP(runtime, "127.0.0.1", 0)
    await server.start(runtime.app.register_http)  # type: ignore[attr-defined]
    server.set_ready()
    try:
        async with aiohttp.ClientSession() as http:
            status, body = await get_json(http, f"{server.endpoint}/ngrams?shard=nope")
            assert (status, body["status"]) == (404, "SHARD_NOT_FOUND")
            status, body = await get_json(http, f"{server.endpoint}/ngrams")
            assert (status, body["status"]) == (400, "INVALID_ARGUMENT")
    finally:
        await server.close()


class ResolvesTo:
    """A stand-in runtime for word-count's query: its resolver yields `resolution` or
    raises `error`."""

    def __init__(self, resolution: Any = None, error: Exception | None = None) -> None:
        self.cfg = ConsumerConfig(zone="z", suffix="s")
        self.spec = pb.ConsumerSpec()
        self.resolver = self
        self.resolution, self.error = resolution, error

    @contextlib.asynccontextmanager
    async def resolve(self, shard: str, **kwargs: Any) -> AsyncIterator[Any]:
        if self.error is not None:
            raise self.error
        yield self.resolution


@pytest.mark.parametrize("failure", ["forwarded request", "resolve"])
async def test_word_count_http_query_answers_503_when_it_cannot_answer(
    monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """GET /ngrams answers 503 UNAVAILABLE (JSON, as its other errors) when the request
    forwarded to the shard's primary fails (the primary just died: nothing listens there)
    or the resolution raises; not aiohttp's plain-text 500."""
    monkeypatch.syspath_prepend(str(REPO / "examples" / "word-count"))
    from word_count.app import WordCount

    from gazette.broker.protocol import protocol_pb2 as bpb
    from gazette.consumer.resolver import Resolution, Resolver

    resolver = Resolver(ConsumerRuntime(ConsumerConfig(zone="z", suffix="s"), WordCount()))
    if failure == "forwarded request":
        dead = f"127.0.0.1:{free_port()}"
        res = Resolution(
            pb.OK,
            bpb.Header(),
            shard_id="shard-000",
            primary_endpoint=dead,
            primary_http=f"http://{dead}",
            resolver=resolver,
        )
        runtime: Any = ResolvesTo(res)
    else:
        runtime = ResolvesTo(error=RuntimeError("etcd went away"))
    app = WordCount()
    server = ConsumerHTTP(runtime, "127.0.0.1", 0)
    await server.start(app.register_http)
    server.set_ready()
    try:
        async with aiohttp.ClientSession() as http:
            url = f"{server.endpoint}/ngrams?shard=shard-000&ngram=a"
            async with http.get(url) as resp:
                assert resp.status == 503, await resp.text()
                assert resp.content_type == "application/json"
                body = await resp.json()
            assert body["status"] == "UNAVAILABLE"
            assert body["error"]
    finally:
        await server.close()
        await resolver.close()
