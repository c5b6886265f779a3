"""Consumers with TLS and authorization on, against brokers with both on, all real processes
and real certificates (gazette.testing.certs): two counter consumers requiring client certificates
and tokens signed by their shared key run their shards (RocksDB stores, recorded by fusefs
processes through the secured broker), proxy Stat to each other signed and over TLS, serve
/healthz over HTTPS only, and answer ``gazctl shards list`` only with a token, limited to
what its selector covers. The Spark sources read through the same broker with the TLS and
token of their options. Also: the consumer's flags."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import grpc
import grpc.aio
import pytest

from gazette.auth.claims import ALL, APPEND, APPLY, LIST, READ, Claims
from gazette.auth.jwt import sign
from gazette.auth.keys import BearerAuth, KeyedAuth
from gazette.auth.tls import ClientTLS
from gazette.broker.client import JournalClient
from gazette.broker.protocol.selector import parse_label_selector
from gazette.consumer.config import parse_args
from gazette.consumer.protocol import pb
from gazette.consumer.shard_client import ShardClient, list_shards, stat_shard
from gazette.consumer.spark.errors import ExportError
from gazette.consumer.spark.options import ShardsOptions
from gazette.consumer.spark.playback import play
from gazette.consumer.spark.resolve import plan_splits
from gazette.gazctl.main import Streams, run
from gazette.testing.broker import BrokerProcess
from gazette.testing.certs import Certs
from gazette.testing.consumer import ConsumerProcess
from gazette.testing.etcd import EtcdServer
from tests.consumer.secured_app import GET_METHOD
from tests.consumer.support import REPO, Setup, check_totals, feed, write_head
from tests.kit.eventually import eventually

SECURED_COUNTER = "tests.consumer.secured_app:SecuredCounter"
SQLITE_COUNTER = "tests.consumer.spark.apps:SQLiteCounter"
SECRET = b"consumer and broker secret"
KEY = base64.b64encode(SECRET).decode()


@dataclass
class Secured:
    setup: Setup
    consumers: list[ConsumerProcess]
    certs: Certs

    @property
    def tls(self) -> ClientTLS:
        """A client's TLS: trusting the CA, presenting the client certificate."""
        return ClientTLS(self.certs.ca, self.certs.client_cert, self.certs.client_key)

    def journal_client(self) -> JournalClient:
        return JournalClient(self.setup.broker.endpoint, tls=self.tls, auth=KeyedAuth(KEY))

    def shard_client(self, i: int = 0) -> ShardClient:
        return ShardClient(self.consumers[i].endpoint, tls=self.tls, auth=KeyedAuth(KEY))


async def _primaries(s: Secured) -> dict[str, str]:
    """Each shard's primary consumer (suffix), once every shard has one that is PRIMARY."""
    async with s.shard_client() as sc:

        async def ready() -> bool:
            shards = await list_shards(sc)
            return len(shards) == 2 and all(
                [st.code for st in sh.status] == [pb.ReplicaStatus.PRIMARY] for sh in shards
            )

        assert await eventually(ready, what="both shards PRIMARY", timeout=60, interval=0.2)
        return {
            sh.spec.id: sh.route.members[sh.route.primary].suffix for sh in await list_shards(sc)
        }


async def _start(s: Secured) -> None:
    async with s.journal_client() as client, s.shard_client() as sc:
        await s.setup.create_journals(client)
        specs = s.setup.shard_specs(hot_standbys=0)
        await sc.stub.Apply(
            pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=x) for x in specs])
        )
    await _primaries(s)


def _secured_consumer(setup: Setup, certs: Certs, i: int) -> ConsumerProcess:
    """Consumer process `i` of `setup`'s application (not started): TLS with client
    certificates required, tokens verified with `KEY`, and its broker calls over TLS."""
    c = ConsumerProcess(
        setup.app,
        setup.etcd.endpoint,
        [setup.broker.endpoint],
        root=setup.root,
        zone="z",
        suffix=f"consumer-{i}",
        workdir=setup.tmp / f"consumer-{i}",
        extra_env={"COUNTER_OUTPUT": setup.output, "PYTHONPATH": str(REPO)},
        extra_args=[
            "--hint-interval",
            "1",
            *certs.server_flags(client_certs=True),
            "--auth-keys",
            KEY,
            # Broker keys are left to default to --auth-keys.
            "--broker-trusted-ca-file",
            str(certs.ca),
            "--broker-cert-file",
            str(certs.client_cert),
            "--broker-cert-key-file",
            str(certs.client_key),
        ],
    )
    setup.consumers.append(c)
    return c


@pytest.fixture(scope="module")
def secured(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory, certs: Certs
) -> Iterator[Secured]:
    tmp = tmp_path_factory.mktemp("secured")
    broker = BrokerProcess(
        etcd_server.endpoint,
        root=f"/test-security/{os.getpid()}/brokers",
        spool_dir=tmp / "spool",
        extra_args=[
            *certs.server_flags(),
            f"--server-ca-file={certs.ca}",
            "--auth-keys",
            KEY,
        ],
    )
    setup = Setup(etcd_server, broker, tmp, shards=2, app=SECURED_COUNTER)
    consumers = [_secured_consumer(setup, certs, i) for i in range(2)]
    s = Secured(setup, consumers, certs)
    try:
        broker.start()
        for c in consumers:
            c.start()
        asyncio.run(_start(s))
        yield s
    finally:
        setup.close()
        broker.close()


async def test_a_secured_consumer_processes_input_through_secured_brokers(
    secured: Secured,
) -> None:
    """shard-000 sums what is published to its input, exactly once, and its RocksDB store
    is recorded (by its fusefs process) into its recovery log on the TLS + auth broker."""
    s = secured
    primaries = await _primaries(s)
    primary = int(primaries["shard-000"].rsplit("-", 1)[1])
    log = f"{s.setup.prefix}/recovery/shard-000"
    async with s.journal_client() as client, s.shard_client(primary) as sc:
        recorded = await write_head(client, log)  # the hand-off, at least
        stop, expected = asyncio.Event(), dict[str, int]()
        feeding = asyncio.create_task(feed(client, s.setup.inputs[0], stop, expected))
        await asyncio.sleep(1.0)
        stop.set()
        await feeding
        assert expected
        await check_totals(client, sc.stub, s.setup, expected)
        assert await write_head(client, log) > recorded, "the fusefs process recorded nothing"


def test_a_secured_consumer_records_a_sqlite_store(secured: Secured, tmp_path: Path) -> None:
    """A consumer of a SQLite store (whose recorder appends through the consumer's own
    broker client) processes its input through the TLS + auth broker and records it: the
    shard commits through the input's head and its recovery log grows."""
    s = secured
    setup = Setup(s.setup.etcd, s.setup.broker, tmp_path, shards=1, app=SQLITE_COUNTER)
    consumer = _secured_consumer(setup, s.certs, 0)
    try:
        consumer.start()
        asyncio.run(_sqlite_flow(s, setup, consumer))
    finally:
        setup.close()


async def _sqlite_flow(s: Secured, setup: Setup, consumer: ConsumerProcess) -> None:
    log = f"{setup.prefix}/recovery/shard-000"
    auth = KeyedAuth(KEY)
    async with (
        s.journal_client() as client,
        ShardClient(consumer.endpoint, tls=s.tls, auth=auth) as sc,
    ):
        await setup.create_journals(client)
        (spec,) = setup.shard_specs(hot_standbys=0)
        await sc.stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))

        async def primary() -> bool:
            (shard,) = await list_shards(sc)
            return [st.code for st in shard.status] == [pb.ReplicaStatus.PRIMARY]

        assert await eventually(primary, what="shard-000 PRIMARY", timeout=60, interval=0.2)
        recorded = await write_head(client, log)
        stop, expected = asyncio.Event(), dict[str, int]()
        feeding = asyncio.create_task(feed(client, setup.inputs[0], stop, expected))
        await asyncio.sleep(1.0)
        stop.set()
        await feeding
        assert expected
        head = await write_head(client, setup.inputs[0])
        resp = await sc.stub.Stat(
            pb.StatRequest(shard="shard-000", read_through={setup.inputs[0]: head}), timeout=60
        )
        assert resp.status == pb.OK, resp
        assert await write_head(client, log) > recorded, "the SQLite store recorded nothing"


async def test_stat_is_proxied_to_the_primary_signed_and_over_tls(secured: Secured) -> None:
    """A Stat asked of the consumer that is not the shard's primary is proxied to it: over
    TLS with the peer certificate (the primary requires one) and signed with the shared key
    (the primary verifies it)."""
    s = secured
    primaries = await _primaries(s)
    for shard, primary in primaries.items():
        other = 1 - int(primary.rsplit("-", 1)[1])
        async with s.shard_client(other) as sc:
            resp = await stat_shard(sc, shard)
        assert resp.status == pb.OK
        assert resp.header.process_id.suffix == primary


async def test_application_grpc_calls_are_authorized_through_the_runtime(
    secured: Secured,
) -> None:
    """The application's query verifies its caller (`ConsumerRuntime.verify`): no token, or
    one without READ, is refused UNAUTHENTICATED saying why; a token not covering the shard
    finds nothing; one covering it is answered by the primary, to which the process asked
    forwards the call over TLS with the caller's token."""
    s = secured
    primaries = await _primaries(s)
    primary = int(primaries["shard-000"].rsplit("-", 1)[1])
    other = s.consumers[1 - primary]
    request = json.dumps({"shard": "shard-000", "key": "k1"}).encode()

    async def status(token: str | None) -> tuple[grpc.StatusCode, str]:
        metadata = [("authorization", f"Bearer {token}")] if token else []
        async with grpc.aio.secure_channel(other.endpoint, s.tls.grpc_credentials()) as ch:
            try:
                get = ch.unary_unary(
                    GET_METHOD, request_serializer=None, response_deserializer=None
                )
                answer = await get(request, metadata=metadata, timeout=30)
            except grpc.aio.AioRpcError as err:
                return err.code(), err.details() or ""
            return grpc.StatusCode.OK, json.loads(answer)["served_by"]

    unauth = grpc.StatusCode.UNAUTHENTICATED
    assert await status(None) == (unauth, "missing or empty authorization token")
    assert await status(_token(LIST, "")) == (
        unauth,
        "authorization is missing required READ capability",
    )
    assert (await status(_token(READ, "id=shard-001")))[0] == grpc.StatusCode.NOT_FOUND
    assert await status(_token(READ, "id=shard-000")) == (
        grpc.StatusCode.OK,
        f"z#{primaries['shard-000']}",
    )


async def test_http_requests_are_forwarded_to_the_primary_over_https(
    secured: Secured,
) -> None:
    """A request to the process that is not the shard's primary is forwarded over HTTPS,
    with the peer certificate the primary asks for."""
    s = secured
    primaries = await _primaries(s)
    other = s.consumers[1 - int(primaries["shard-000"].rsplit("-", 1)[1])]
    url = f"https://127.0.0.1:{other.http_port}/totals/shard-000/k1"
    async with aiohttp.ClientSession() as http:
        async with http.get(url, ssl=s.tls.ssl_context()) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["served_by"] == f"z#{primaries['shard-000']}"


async def test_healthz_is_served_over_https_only(secured: Secured) -> None:
    c = secured.consumers[0]
    url = f"127.0.0.1:{c.http_port}/healthz"
    ssl = secured.tls.ssl_context()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"https://{url}", ssl=ssl) as resp:
            assert resp.status == 200
            assert (await resp.json())["endpoint"] == f"https://{c.endpoint}"
        with pytest.raises(aiohttp.ClientError):
            async with http.get(f"http://{url}") as resp:
                await resp.read()


def _gazctl(*argv: str) -> tuple[int, str, str]:
    streams = Streams(stdin=io.BytesIO(), stdout=io.BytesIO(), stderr=io.StringIO())
    rc = run(list(argv), streams)
    assert isinstance(streams.stdout, io.BytesIO) and isinstance(streams.stderr, io.StringIO)
    return rc, streams.stdout.getvalue().decode(), streams.stderr.getvalue()


def _token(capability: int, selector: str, *, key: bytes = SECRET, expires_in: int = 600) -> str:
    now = int(time.time())
    claims = Claims(capability, parse_label_selector(selector), now - 1200, now + expires_in)
    return sign(claims, key)


EXPIRED: dict[str, Any] = {"expires_in": -60}  # past the verifier's leeway (5 s)
WRONG_KEY: dict[str, Any] = {"key": b"another secret"}
NOT_SHARD = "shard-not-applied"
"""A shard no test applies: the allowed Apply deletes it (a no-op), at any revision."""


def _delete_absent() -> pb.ApplyRequest.Change:
    return pb.ApplyRequest.Change(delete=NOT_SHARD, expect_mod_revision=-1)


async def _shard_call(
    s: Secured, method: str, token: str, selector: str = ""
) -> tuple[grpc.StatusCode, str, int]:
    """Call `method` (Stat of shard-000, List, or Apply) with `token`: its gRPC code and
    details, and the response's status (-1 when the call failed). Apply deletes
    `NOT_SHARD`, and with `selector` "touch" also rewrites shard-000's spec as it is."""
    async with s.shard_client() as sc:
        (current,) = [sh for sh in await list_shards(sc) if sh.spec.id == "shard-000"]
    async with ShardClient(s.consumers[0].endpoint, tls=s.tls, auth=BearerAuth(token)) as sc:
        try:
            if method == "Stat":
                resp: Any = await sc.stub.Stat(pb.StatRequest(shard="shard-000"))
            elif method == "List":
                resp = await sc.stub.List(pb.ListRequest())
            else:
                changes = [_delete_absent()]
                if selector == "touch":
                    changes.append(
                        pb.ApplyRequest.Change(
                            upsert=current.spec, expect_mod_revision=current.mod_revision
                        )
                    )
                resp = await sc.stub.Apply(pb.ApplyRequest(changes=changes))
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details() or "", -1
    return grpc.StatusCode.OK, "", resp.status


_UNAUTH = grpc.StatusCode.UNAUTHENTICATED
_OK = grpc.StatusCode.OK
_METHODS = ("Stat", "List", "Apply")


Grant = tuple[int, str, dict[str, Any]]
"""A token's capability, selector and `_token` keywords, signed when the test runs."""


def _case(method: str, grant: Grant, code: grpc.StatusCode, reason: str, status: int) -> Any:
    what = reason or pb.Status.Name(cast(Any, status))
    return pytest.param(method, grant, code, reason, status, id=f"{method}: {what}")


@pytest.mark.parametrize(
    ("method", "grant", "code", "reason", "status"),
    [
        # Refused whatever the call: an expired token, one signed with another key.
        *(_case(m, (ALL, "", EXPIRED), _UNAUTH, "token is expired", -1) for m in _METHODS),
        *(
            _case(m, (ALL, "", WRONG_KEY), _UNAUTH, "token signature is invalid", -1)
            for m in _METHODS
        ),
        # A capability other than the one the call needs.
        _case("Stat", (LIST | APPLY, "", {}), _UNAUTH, "missing required READ capability", -1),
        _case("List", (READ | APPLY, "", {}), _UNAUTH, "missing required LIST capability", -1),
        _case("Apply", (READ | LIST, "", {}), _UNAUTH, "missing required APPLY capability", -1),
        # The selector: a shard it does not cover is not found, as upstream's resolver
        # answers (an Apply touching one: the next test).
        _case("Stat", (READ, "id=shard-001", {}), _OK, "", pb.SHARD_NOT_FOUND),
        # And allowed calls go through.
        _case("Stat", (READ, "id=shard-000", {}), _OK, "", pb.OK),
        _case("List", (LIST, "", {}), _OK, "", pb.OK),
        _case("Apply", (APPLY, f"id={NOT_SHARD}", {}), _OK, "", pb.OK),
    ],
)
async def test_shard_calls_are_refused_saying_why(
    secured: Secured,
    method: str,
    grant: Grant,
    code: grpc.StatusCode,
    reason: str,
    status: int,
) -> None:
    capability, selector, keywords = grant
    token = _token(capability, selector, **keywords)
    got_code, details, got_status = await _shard_call(secured, method, token)
    assert got_code == code, details
    assert reason in details
    assert got_status == status
    assert KEY not in details and token not in details


async def test_shard_apply_touching_an_uncovered_shard_is_refused(secured: Secured) -> None:
    """The selector covers the deleted shard but not shard-000, whose spec the Apply also
    rewrites: nothing is applied, and the refusal names shard-000."""
    s = secured
    async with s.shard_client() as sc:
        (before,) = [sh for sh in await list_shards(sc) if sh.spec.id == "shard-000"]
    code, details, _ = await _shard_call(s, "Apply", _token(APPLY, f"id={NOT_SHARD}"), "touch")
    assert (code, details) == (_UNAUTH, "not authorized to shard-000")
    async with s.shard_client() as sc:
        (after,) = [sh for sh in await list_shards(sc) if sh.spec.id == "shard-000"]
    assert after.mod_revision == before.mod_revision


def test_gazctl_shards_list_needs_a_token_and_sees_what_it_covers(secured: Secured) -> None:
    certs = secured.certs
    listing = [
        "shards",
        "list",
        "-o",
        "json",
        "--consumer",
        secured.consumers[0].endpoint,
        "--consumer-trusted-ca-file",
        str(certs.ca),
        "--consumer-cert-file",
        str(certs.client_cert),
        "--consumer-cert-key-file",
        str(certs.client_key),
    ]

    def ids(out: str) -> list[str]:
        return sorted(sh["spec"]["id"] for sh in json.loads(out))

    rc, out, err = _gazctl(*listing, "--consumer-auth-keys", KEY)
    assert rc == 0, err
    assert ids(out) == ["shard-000", "shard-001"]

    rc, out, err = _gazctl(*listing)
    assert rc != 0
    assert "UNAUTHENTICATED" in err and "missing or empty authorization token" in err, err

    rc, out, err = _gazctl(*listing, "--consumer-auth-token", _token(LIST, "id=shard-000"))
    assert rc == 0, err
    assert ids(out) == ["shard-000"]

    rc, out, err = _gazctl(*listing[:6], "--consumer-auth-keys", KEY)  # no TLS
    assert rc != 0 and "unavailable" in err, err


async def test_spark_shards_source_plays_through_secured_brokers(
    secured: Secured, tmp_path: Path
) -> None:
    """The gazette-shards source plans (an empty append to the recovery log) and plays the
    log with the TLS files and token of its options."""
    s, certs = secured, secured.certs
    options = {
        "etcd": s.setup.etcd.endpoint,
        "root": s.setup.root,
        "broker": s.setup.broker.endpoint,
        "shards": "shard-000",
        "store": "rocksdb",
        "broker_timeout": "20",
        "broker_trusted_ca_file": str(certs.ca),
        "broker_cert_file": str(certs.client_cert),
        "broker_cert_key_file": str(certs.client_key),
        "broker_auth_token": _token(READ | APPEND, ""),
    }
    opts = ShardsOptions.parse(options)

    async def planned() -> bool:
        try:
            return len(await plan_splits(opts)) == 1
        except ExportError:
            return False  # The primary hints are not written yet.

    assert await eventually(planned, what="shard-000 planned", timeout=30, interval=0.5)
    (split,) = await plan_splits(opts)
    played = await play(
        split.plan,
        opts.brokers,
        tmp_path / "store",
        split.end_offset,
        10.0,
        client_settings=opts.broker_client,
    )
    assert played.write_head == split.end_offset > 0
    # Keys would show in query plans: they come from the environment only.
    with pytest.raises(ExportError, match="option 'broker_auth_keys': unknown option"):
        ShardsOptions.parse({**options, "broker_auth_token": "", "broker_auth_keys": KEY})


def test_consumer_flags(
    certs: Certs, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Broker calls sign with the consumer's keys unless given their own keys or a token;
    the server's TLS makes the advertised endpoint https://; keys never show in --help."""
    base = ["m:App", "--auth-keys", KEY]
    cfg = parse_args(base)
    assert cfg.broker_client.auth_keys == KEY and isinstance(cfg.broker_auth, KeyedAuth)
    assert cfg.endpoint.startswith("http://") and cfg.server_tls is None
    cfg = parse_args([*base, "--broker-auth-token", "tok"])
    assert isinstance(cfg.broker_auth, BearerAuth)
    assert cfg.broker_client.environ()["BROKER_AUTH_TOKEN"] == "tok"
    cfg = parse_args([*base, *certs.server_flags(client_certs=True)])
    assert cfg.endpoint.startswith("https://") and cfg.server_tls is not None
    assert cfg.peer_tls is not None
    with pytest.raises(SystemExit):
        parse_args(["m:App", "--peer-cert-file", str(certs.client_cert)])
    with pytest.raises(SystemExit):
        parse_args(["m:App", "--broker-auth-keys", KEY, "--broker-auth-token", "tok"])
    for variable in ("CONSUMER_AUTH_KEYS", "BROKER_AUTH_KEYS", "BROKER_AUTH_TOKEN"):
        monkeypatch.setenv(variable, KEY)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert KEY not in capsys.readouterr().out


def test_gazctl_exports_hand_the_broker_flags_to_the_sources(certs: Certs) -> None:
    """``shards export`` and ``journals export`` turn gazctl's broker TLS files and token into
    the sources' options (which the sources accept)."""
    from gazette.gazctl.export import journals_options, shards_options
    from gazette.gazctl.main import build_parser

    broker = ["--trusted-ca-file", str(certs.ca), "--cert-file", str(certs.client_cert)]
    broker += ["--cert-key-file", str(certs.client_key), "--auth-token", "tok"]
    expected = {
        "broker_trusted_ca_file": str(certs.ca),
        "broker_cert_file": str(certs.client_cert),
        "broker_cert_key_file": str(certs.client_key),
        "broker_auth_token": "tok",
    }
    shards = build_parser().parse_args(
        [
            "shards",
            "export",
            "--to",
            "x",
            "--root",
            "/r",
            "--shards",
            "shard-000",
            "--store",
            "rocksdb",
        ]
        + broker
    )
    options = shards_options(shards)
    assert expected.items() <= options.items()
    assert ShardsOptions.parse(options).broker_client.auth_token == "tok"
    journals = build_parser().parse_args(["journals", "export", "--to", "x", "-l", "a=b", *broker])
    assert expected.items() <= journals_options(journals).items()
