"""Brokers serving TLS, with real certificates (gazette.testing.certs) and real broker processes.

A TLS broker serves gRPC, HTTP and its direct-append port over TLS only, advertises
``https://``, and with ``--server-ca-file`` serves only clients presenting a
certificate its CA signed; brokers replicate to each other over TLS with their peer
certificates; clients that do not speak TLS, or do not trust the broker, fail at once with
UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import grpc.aio
import pytest

from gazette.auth.tls import ClientTLS
from gazette.broker.client import JournalClient, RetryReader, append
from gazette.broker.config import parse_args
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.broker.protocol.direct_framing import END, MAGIC, SERVICE_METHOD, frame
from gazette.gazctl.main import Streams, run
from gazette.testing.broker import BrokerProcess
from gazette.testing.certs import Certs
from gazette.testing.etcd import EtcdServer, free_port
from tests.broker.conftest import journal_spec, read_all

_names = itertools.count()


@pytest.fixture(scope="module")
def tls_broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory, certs: Certs
) -> Iterator[BrokerProcess]:
    """A TLS broker (no client certificates asked) serving HTTP too."""
    proc = BrokerProcess(
        etcd_server.endpoint,
        root=f"/test/{os.getpid()}/tls",
        spool_dir=tmp_path_factory.mktemp("spool-tls"),
        extra_args=[*certs.server_flags(), "--http-port", str(free_port())],
    )
    with proc:
        yield proc


@pytest.fixture(scope="module")
def mtls_brokers(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory, certs: Certs
) -> Iterator[list[BrokerProcess]]:
    """Two brokers requiring client certificates signed by the CA, and presenting theirs to
    each other."""
    args = certs.server_flags(client_certs=True)
    procs = [
        BrokerProcess(
            etcd_server.endpoint,
            root=f"/test/{os.getpid()}/mtls",
            suffix=f"broker-{i}",
            spool_dir=tmp_path_factory.mktemp(f"spool-mtls-{i}"),
            extra_args=args,
        )
        for i in (1, 2)
    ]
    try:
        for proc in procs:
            proc.start()
        yield procs
    finally:
        for proc in procs:
            proc.close()


def _spec(tmp_path: Path, replication: int = 1) -> pb.JournalSpec:
    return journal_spec(
        f"tests/tls-{next(_names)}", f"file://{tmp_path}/store/", replication=replication
    )


async def _apply(client: JournalClient, spec: pb.JournalSpec) -> None:
    (Path(spec.fragment.stores[0].removeprefix("file://"))).mkdir(exist_ok=True)
    resp = await client.stub().Apply(
        pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]), timeout=10
    )
    assert resp.status == pb.OK


async def test_a_tls_client_appends_and_reads(
    tls_broker: BrokerProcess, certs: Certs, tmp_path: Path
) -> None:
    spec = _spec(tmp_path)
    async with JournalClient(tls_broker.endpoint, tls=ClientTLS(certs.ca)) as client:
        await _apply(client, spec)
        for line in (b"hello\n", b"world\n"):
            await append(client, pb.AppendRequest(journal=spec.name), line)
        reader = RetryReader(client, pb.ReadRequest(journal=spec.name, offset=0))
        assert [await reader.readline(), await reader.readline()] == [b"hello\n", b"world\n"]
        # The route learned from the broker names its https:// endpoint, dialled with TLS.
        route = client.routes.get(spec.name)
        assert route is not None
        assert list(route.endpoints) == [f"https://{tls_broker.endpoint}"]
        assert client.endpoint_for(spec.name) == f"https://{tls_broker.endpoint}"
        # The appends went over the broker's direct-append port, with TLS as its gRPC.
        assert client.direct is not None and client.direct.answered == 2


async def test_an_https_endpoint_is_dialled_with_tls(
    tls_broker: BrokerProcess, certs: Certs, tmp_path: Path
) -> None:
    # Without a ClientTLS the system's CAs are trusted, which did not sign the test CA.
    async with JournalClient(f"https://{tls_broker.endpoint}") as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.stub().Apply(pb.ApplyRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "certificate" in (err.value.details() or "").lower()


@pytest.mark.parametrize("trust", ["plaintext", "wrong CA"])
async def test_clients_that_cannot_trust_the_broker_fail_at_once(
    tls_broker: BrokerProcess, certs: Certs, trust: str
) -> None:
    tls = None if trust == "plaintext" else ClientTLS(certs.wrong_ca)
    started = time.monotonic()
    async with JournalClient(tls_broker.endpoint, tls=tls) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.stub().Apply(pb.ApplyRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - started < 5  # Refused, not left to time out.


async def test_the_direct_append_port_serves_tls_only(
    tls_broker: BrokerProcess, certs: Certs
) -> None:
    log = tls_broker.log_path.read_text()
    ready = [line for line in log.splitlines() if line.startswith("broker ready")][-1]
    assert f"endpoint=https://{tls_broker.endpoint}" in ready
    port = int(ready.split(" direct=")[1].split()[0])
    credentials = ClientTLS(certs.ca).grpc_credentials()
    async with grpc.aio.secure_channel(tls_broker.endpoint, credentials) as channel:
        assert (
            await channel.unary_unary(SERVICE_METHOD, None, None)(b"", timeout=5)
            == str(port).encode()
        )
    # A plaintext client of the direct port gets no answer: the broker expects a handshake.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(MAGIC + frame(END))
        await writer.drain()
        async with asyncio.timeout(10):
            assert await reader.read() == b""  # closed, nothing served in clear
    finally:
        writer.close()


async def test_http_is_served_over_tls(tls_broker: BrokerProcess, certs: Certs) -> None:
    log = tls_broker.log_path.read_text()
    ready = [line for line in log.splitlines() if line.startswith("broker ready")][-1]
    url = ready.split(" http=")[1].split()[0]
    assert url.startswith("https://127.0.0.1:")
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.get(f"{url}/healthz", ssl=ClientTLS(certs.ca).ssl_context()) as resp:
            assert resp.status == 200
            assert (await resp.json())["endpoint"] == f"https://{tls_broker.endpoint}"
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"http{url.removeprefix('https')}/healthz") as resp:
                await resp.read()


async def test_a_server_ca_requires_client_certificates(
    mtls_brokers: list[BrokerProcess], certs: Certs, tmp_path: Path
) -> None:
    endpoint = mtls_brokers[0].endpoint
    refused = [
        ClientTLS(certs.ca),
        ClientTLS(certs.ca, certs.wrong_client_cert, certs.wrong_client_key),
    ]
    for tls in refused:
        async with JournalClient(endpoint, tls=tls) as client:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.stub().Apply(pb.ApplyRequest(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    spec = _spec(tmp_path)
    tls = ClientTLS(certs.ca, certs.client_cert, certs.client_key)
    async with JournalClient(endpoint, tls=tls) as client:
        await _apply(client, spec)
        resp = await append(client, pb.AppendRequest(journal=spec.name), b"signed\n")
        assert resp.commit.end == 7


async def test_brokers_replicate_over_tls(
    mtls_brokers: list[BrokerProcess], certs: Certs, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, replication=2)
    tls = ClientTLS(certs.ca, certs.client_cert, certs.client_key)
    endpoints = [b.endpoint for b in mtls_brokers]
    async with JournalClient(endpoints, tls=tls) as client:
        await _apply(client, spec)
        # Committed only once the peer has it: the pipeline to it is TLS, with certificates
        # (else the append is retried until the deadline).
        async with asyncio.timeout(20):
            resp = await append(client, pb.AppendRequest(journal=spec.name), b"twice\n")
        assert resp.commit.end == 6
        route = client.routes.get(spec.name)
        assert route is not None and len(route.members) == 2
        assert sorted(route.endpoints) == sorted(f"https://{ep}" for ep in endpoints)
        for ep in endpoints:  # Each replica serves the content itself.
            content, _ = await read_all(
                pb_grpc.JournalStub(client.channel(ep)),
                spec.name,
                end_offset=6,
                do_not_proxy=True,
            )
            assert content == b"twice\n"


def _broker_main(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gazette.broker.main", "--etcd", "http://127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_unusable_files_are_one_line_start_up_errors(certs: Certs, tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    done = _broker_main(
        "--server-cert-file", str(missing), "--server-cert-key-file", str(certs.server_key)
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"gazette-broker: --server-cert-file {missing}: cannot read it (No such file or directory)"
    )
    assert "Traceback" not in done.stderr
    done = _broker_main(
        "--server-cert-file",
        str(certs.server_cert),
        "--server-cert-key-file",
        str(certs.client_key),
    )
    assert done.stderr.splitlines()[-1].startswith(
        f"gazette-broker: --server-cert-key-file {certs.client_key}: not the key of "
    )
    done = _broker_main(*certs.server_flags(), "--peer-ca-file", str(missing))
    assert done.stderr.splitlines()[-1].startswith(f"gazette-broker: --peer-ca-file {missing}: ")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["--server-cert-key-file", "k"],
            "--server-cert-key-file is given without --server-cert-file",
        ),
        (["--server-ca-file", "ca"], "--server-ca-file is given without --server-cert-file"),
        (["--server-cert-file", "c"], "--server-cert-file is given without --server-cert-key-file"),
        (["--peer-ca-file", "ca"], "--peer-ca-file is given without --server-cert-file"),
        (
            ["--server-cert-file", "c", "--server-cert-key-file", "k", "--peer-cert-file", "p"],
            "--peer-cert-file is given without --peer-cert-key-file",
        ),
        (
            ["--server-cert-file", "c", "--server-cert-key-file", "k", "--advertise", "http://h:1"],
            "--advertise http://h:1 is http:// but --server-cert-file serves TLS only",
        ),
    ],
)
def test_tls_flags_that_cannot_go_together_are_usage_errors(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(args)
    assert exit_.value.code == 2
    assert error in capsys.readouterr().err


def test_tls_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = parse_args(["--server-cert-file", "c.pem", "--server-cert-key-file", "k.pem"])
    assert cfg.endpoint == "https://127.0.0.1:8080"
    assert cfg.peer_tls == ClientTLS()
    monkeypatch.setenv("BROKER_SERVER_CERT_FILE", "c.pem")
    monkeypatch.setenv("BROKER_SERVER_CERT_KEY_FILE", "k.pem")
    monkeypatch.setenv("BROKER_SERVER_CA_FILE", "ca.pem")
    monkeypatch.setenv("BROKER_PEER_CERT_FILE", "p.pem")
    monkeypatch.setenv("BROKER_PEER_CERT_KEY_FILE", "pk.pem")
    monkeypatch.setenv("BROKER_PEER_CA_FILE", "pca.pem")
    cfg = parse_args(["--advertise", "broker.example:8080"])
    assert cfg.server_tls is not None and cfg.server_tls.verifies_clients
    assert cfg.peer_tls == ClientTLS(Path("pca.pem"), Path("p.pem"), Path("pk.pem"))
    assert cfg.endpoint == "https://broker.example:8080"
    assert parse_args([]).endpoint.startswith("https://")
    monkeypatch.delenv("BROKER_SERVER_CERT_FILE")
    monkeypatch.delenv("BROKER_SERVER_CERT_KEY_FILE")
    monkeypatch.delenv("BROKER_SERVER_CA_FILE")
    monkeypatch.delenv("BROKER_PEER_CERT_FILE")
    monkeypatch.delenv("BROKER_PEER_CERT_KEY_FILE")
    monkeypatch.delenv("BROKER_PEER_CA_FILE")
    cfg = parse_args([])
    assert cfg.endpoint == "http://127.0.0.1:8080"
    assert cfg.server_tls is None and cfg.peer_tls is None


def _gazctl(*argv: str) -> tuple[int, str, str]:
    streams = Streams(stdin=io.BytesIO(), stdout=io.BytesIO(), stderr=io.StringIO())
    rc = run(list(argv), streams)
    assert isinstance(streams.stdout, io.BytesIO) and isinstance(streams.stderr, io.StringIO)
    return rc, streams.stdout.getvalue().decode(), streams.stderr.getvalue()


@pytest.fixture(scope="module")
def listed_journal(
    tls_broker: BrokerProcess, certs: Certs, tmp_path_factory: pytest.TempPathFactory
) -> str:
    spec = _spec(tmp_path_factory.mktemp("gazctl-store"))

    async def apply() -> None:
        async with JournalClient(tls_broker.endpoint, tls=ClientTLS(certs.ca)) as client:
            await _apply(client, spec)

    asyncio.run(apply())
    return spec.name


def test_gazctl_lists_journals_of_a_tls_broker(
    tls_broker: BrokerProcess, certs: Certs, listed_journal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = ["--broker", tls_broker.endpoint]
    rc, out, err = _gazctl("journals", "list", *broker, "--trusted-ca-file", str(certs.ca))
    assert (rc, err) == (0, "")
    assert listed_journal in out
    # The environment, upstream's name, and an https:// --broker.
    monkeypatch.setenv("BROKER_TRUSTED_CA_FILE", str(certs.ca))
    rc, out, err = _gazctl("journals", "list", "--broker", f"https://{tls_broker.endpoint}")
    assert (rc, err) == (0, "")
    assert listed_journal in out
    monkeypatch.delenv("BROKER_TRUSTED_CA_FILE")
    rc, out, err = _gazctl("journals", "list", *broker, "--trusted-ca-file", str(certs.wrong_ca))
    assert rc == 1
    assert err.startswith(f"gazctl: error: broker {tls_broker.endpoint} is unavailable")
    rc, out, err = _gazctl("journals", "list", *broker, "--cert-file", str(certs.client_cert))
    assert (rc, err) == (1, "gazctl: error: --cert-file is given without --cert-key-file\n")
    # Plaintext against TLS: the broker hangs up, and gazctl says what may be missing.
    rc, out, err = _gazctl("journals", "list", *broker)
    assert rc == 1 and "if the broker serves TLS, give --trusted-ca-file" in err, err
