"""The broker's HTTP server (--http-port): /healthz and Prometheus /debug/metrics of a real
broker process, counted as upstream names them; a port in use fails the start."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from broker.metrics import ERROR, counted
from broker.protocol import protocol_pb2 as pb
from broker.protocol import protocol_pb2_grpc as pb_grpc
from broker.testing.broker import BrokerProcess
from broker.testing.etcd import EtcdServer, free_port
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
            [sys.executable, "-m", "broker.main", "--etcd", etcd_server.endpoint, "--suffix",
             "broker-taken", "--root",
             f"/test-http-taken/{os.getpid()}", "--listen", f"127.0.0.1:{free_port()}",
             "--spool-dir", str(tmp_path), "--http-port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert f"cannot serve HTTP on 127.0.0.1:{port}: address already in use" in out.stderr


class _Context:
    def __init__(self) -> None:
        self.aborted = False


async def test_counted_statuses_of_unary_and_streaming_methods() -> None:
    """Upstream's statuses: ok, the response's other status, or <error> for an exception
    (including a cancellation) in unary and streaming methods alike."""
    from broker.metrics import COUNTERS

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
                await asyncio.sleep(10)
            yield pb.ReadResponse(status=pb.OK if request == 0 else pb.OFFSET_NOT_YET_AVAILABLE)

    svc, ctx = Service(), _Context()
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
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert COUNTERS.started["TestUnary"] == 3 and COUNTERS.started["TestStream"] == 3
    for op, status in (("TestUnary", "ok"), ("TestUnary", "SUSPENDED"), ("TestUnary", ERROR)):
        assert COUNTERS.completed[op, status] == 1
    for status in ("ok", "OFFSET_NOT_YET_AVAILABLE", ERROR):
        assert COUNTERS.completed["TestStream", status] == 1


async def test_a_stream_closed_between_responses_closes_the_method_at_once() -> None:
    """aclose() of a counted stream between responses runs the method's cleanup then (not
    when the garbage collector gets to it), and counts the call as an error."""
    from broker.metrics import COUNTERS

    cleaned: list[str] = []

    class Service:
        @counted("TestClosed")
        async def stream(self, request: int, context: object):  # type: ignore[no-untyped-def]
            try:
                for i in range(3):
                    yield pb.ReadResponse(offset=i)
            finally:
                cleaned.append("closed")

    gen = Service().stream(0, _Context())
    assert (await anext(gen)).offset == 0
    await gen.aclose()
    assert cleaned == ["closed"]
    assert COUNTERS.completed["TestClosed", ERROR] == 1
