"""The broker's HTTP server (--http-port): /healthz and Prometheus /debug/metrics of a real
broker process, counted as upstream names them; a port in use fails the start."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from gazette.broker.metrics import ERROR, counted
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer, free_port
from tests.kit.eventually import eventually_blocking
from tests.prometheus_text import parse as parse_metrics

from .conftest import append, journal_spec, read_all


@pytest.fixture(scope="module")
def http_broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BrokerProcess, str]]:
    port = free_port()
    proc = BrokerProcess(
        etcd_server.endpoint,
        root=f"/test-http/{os.getpid()}",
        spool_dir=tmp_path_factory.mktemp("spool"),
        extra_args=["--http-port", str(port)],
    )
    with proc:
        yield proc, f"http://127.0.0.1:{port}"


async def test_healthz_and_metrics_of_appends_reads_and_errors(
    http_broker: tuple[BrokerProcess, str],
) -> None:
    proc, base = http_broker
    async with (
        grpc.aio.insecure_channel(proc.endpoint) as channel,
        aiohttp.ClientSession() as http,
    ):
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
            body = await resp.json()
        assert body["status"] == "ok" and body["member"] == "local#broker-1"

        stub = pb_grpc.JournalStub(channel)
        spec = journal_spec("tests/http-metrics")
        resp = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
        assert resp.status == pb.OK
        for i in range(3):
            assert (await append(stub, spec.name, b"x" * (10 + i))).status == pb.OK
        wrong = await append(stub, spec.name, b"late", offset=1)
        assert wrong.status == pb.WRONG_APPEND_OFFSET
        with pytest.raises(grpc.aio.AioRpcError):  # No commit message: rolled back.
            await append(stub, spec.name, b"never", commit=False)
        content, _ = await read_all(stub, spec.name)
        assert len(content) == 33

        async with http.get(f"{base}/debug/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            got = parse_metrics(await resp.text())

    def completed(op: str, status: str) -> float:
        return got.get(
            ("gazette_journal_server_completed_totals", (("operation", op), ("status", status))),
            0,
        )

    started = got[("gazette_journal_server_started_totals", (("operation", "Append"),))]
    assert started == 5
    assert completed("Append", "ok") == 3
    assert completed("Append", "WRONG_APPEND_OFFSET") == 1
    assert completed("Append", ERROR) == 1
    assert completed("Apply", "ok") == 1
    assert completed("Read", "OFFSET_NOT_YET_AVAILABLE") == 1  # A non-blocking read's end.
    assert got[("gazette_write_head", (("journal", spec.name),))] == 33
    assert got[("gazette_spool_commits_total", ())] == 3
    assert got[("gazette_spool_commit_bytes_total", ())] == 33
    assert got[("gazette_spool_rollbacks_total", ())] == 1
    assert got[("gazette_spool_rollback_bytes_total", ())] == 5


def test_http_port_in_use_fails_the_start(etcd_server: EtcdServer, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "gazette.broker.main", "--etcd", etcd_server.endpoint,
             "--suffix", "broker-taken", "--root",
             f"/test-http-taken/{os.getpid()}", "--listen", f"127.0.0.1:{free_port()}",
             "--spool-dir", str(tmp_path), "--http-port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert f"cannot serve HTTP on 127.0.0.1:{port}: address already in use" in out.stderr


def test_healthz_answers_starting_until_the_broker_serves(tmp_path: Path) -> None:
    """A broker whose etcd does not answer yet: HTTP is up (bound before registering) and says
    503 "starting"; the gRPC port is not served."""
    with socket.socket() as silent:  # Accepts connections, never answers: etcd hangs.
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port, grpc_port = free_port(), free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gazette.broker.main", "--etcd",
             f"http://127.0.0.1:{silent.getsockname()[1]}", "--suffix", "broker-starting",
             "--listen", f"127.0.0.1:{grpc_port}", "--spool-dir", str(tmp_path),
             "--http-port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:

            def answer() -> str:  # OSError: not listening yet.
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                        return "200"
                except urllib.error.HTTPError as err:
                    return f"{err.code} {json.loads(err.read())['status']}"

            seen = eventually_blocking(
                answer, what="/healthz to answer", timeout=20, interval=0.1, ignoring=(OSError,)
            )
            assert seen == "503 starting"
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", grpc_port), timeout=1).close()
        finally:
            proc.kill()
            proc.wait()


async def test_counted_statuses_of_unary_and_streaming_methods() -> None:
    """Upstream's statuses: ok, the response's other status, or <error> for an exception
    (including a cancellation) in unary and streaming methods alike."""
    from gazette.broker.metrics import COUNTERS

    class Service:
        @counted("TestUnary")
        async def unary(self, request: int, context: object) -> pb.AppendResponse:
            if request < 0:
                raise RuntimeError("failed")
            return pb.AppendResponse(status=pb.OK if request == 0 else pb.SUSPENDED)

        @counted("TestStream")
        async def stream(self, request: int, context: object):  # type: ignore[no-untyped-def]
            yield pb.ReadResponse(status=pb.OK)
            if request < 0:
                # Waits until the test cancels the stream.
                await asyncio.sleep(10)
            yield pb.ReadResponse(status=pb.OK if request == 0 else pb.OFFSET_NOT_YET_AVAILABLE)

    before = (COUNTERS.started.copy(), COUNTERS.completed.copy())
    svc, ctx = Service(), None  # The wrapper never looks at the context.
    assert (await svc.unary(0, ctx)).status == pb.OK
    assert (await svc.unary(1, ctx)).status == pb.SUSPENDED
    with pytest.raises(RuntimeError):
        await svc.unary(-1, ctx)
    assert len([r async for r in svc.stream(0, ctx)]) == 2
    assert len([r async for r in svc.stream(1, ctx)]) == 2

    async def consume() -> None:
        async for _ in svc.stream(-1, ctx):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.01)  # The stream sent its first response and waits.
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    started = COUNTERS.started - before[0]
    completed = COUNTERS.completed - before[1]
    assert started == {"TestUnary": 3, "TestStream": 3}
    assert completed == {
        ("TestUnary", "ok"): 1,
        ("TestUnary", "SUSPENDED"): 1,
        ("TestUnary", ERROR): 1,
        ("TestStream", "ok"): 1,
        ("TestStream", "OFFSET_NOT_YET_AVAILABLE"): 1,
        ("TestStream", ERROR): 1,
    }


async def test_a_stream_closed_between_responses_closes_the_method_at_once() -> None:
    """aclose() of a counted stream between responses runs the method's cleanup then (not
    when the garbage collector gets to it), and counts the call as an error."""
    from gazette.broker.metrics import COUNTERS

    cleaned: list[str] = []

    class Service:
        @counted("TestClosed")
        async def stream(self, request: int, context: object):  # type: ignore[no-untyped-def]
            try:
                for i in range(3):
                    yield pb.ReadResponse(offset=i)
            finally:
                cleaned.append("closed")

    errors = COUNTERS.completed["TestClosed", ERROR]
    gen = Service().stream(0, None)
    assert (await anext(gen)).offset == 0
    await gen.aclose()
    assert cleaned == ["closed"]
    assert COUNTERS.completed["TestClosed", ERROR] == errors + 1


async def test_grpc_port_in_use_fails_the_start_and_releases_the_member(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """The broker registered before it found its gRPC port taken: it exits with code 2 and
    a clear message, and its member key is gone at once (not after the lease's TTL)."""
    from gazette.allocator.model import members_prefix
    from gazette.keyspace.etcd import Etcd

    root = f"/test-grpc-taken/{os.getpid()}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "gazette.broker.main", "--etcd", etcd_server.endpoint,
             "--suffix", "broker-taken", "--root", root, "--listen", f"127.0.0.1:{port}",
             "--spool-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    async with Etcd(etcd_server.endpoint) as etcd:
        resp = await etcd.get_prefix(members_prefix(root).encode())
    assert list(resp.kvs) == []
