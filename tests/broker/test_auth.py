"""Authorization on real brokers started with ``--auth-keys``: every refusal with its status
and reason (no token, wrong key, expired, wrong capability, a selector not covering the
journal), the calls a claim allows, replication and proxying signed by the brokers."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import time
from collections.abc import Iterator

import grpc
import grpc.aio
import pytest

from gazette.auth.claims import APPEND, APPLY, LIST, READ, Claims, name_selector
from gazette.auth.jwt import sign
from gazette.auth.keys import BearerAuth, KeyedAuth
from gazette.broker.client import (
    JournalClient,
    JournalNotFound,
    append,
    apply_journals,
    list_all_journals,
)
from gazette.broker.client.reader import write_head
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.broker.protocol.direct_framing import AUTHORIZATION, ERROR, HEADER, RESPONSE
from gazette.broker.protocol.selector import parse_label_selector
from gazette.gazctl.main import Streams, run
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.broker.conftest import read_all
from tests.broker.raw_direct import Raw
from tests.kit.specs import journal_spec

KEY = base64.b64encode(b"broker secret").decode()
WRONG = base64.b64encode(b"not the key").decode()


@pytest.fixture(scope="module")
def brokers(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[BrokerProcess]]:
    root = f"/test-auth/{os.getpid()}"
    procs = [
        BrokerProcess(
            etcd_server.endpoint,
            root=root,
            spool_dir=tmp_path_factory.mktemp(f"auth-spool-{i}"),
            zone=f"zone-{i}",
            extra_args=["--auth-keys", KEY],
        )
        for i in range(2)
    ]
    for p in procs:
        p.start()
    try:
        yield procs
    finally:
        for p in procs:
            p.close()


def bearer(
    capability: int, selector: str = "", *, exp_in: int = 600, key: bytes = b"broker secret"
) -> BearerAuth:
    now = int(time.time())
    sel = parse_label_selector(selector) if selector else pb.LabelSelector()
    return BearerAuth(sign(Claims(capability, sel, now, now + exp_in), key))


@pytest.fixture(scope="module")
def journals(brokers: list[BrokerProcess]) -> tuple[str, str]:
    """team-a/log and team-b/log, replicated to both brokers."""
    specs = [journal_spec(f"team-{t}/log-{os.getpid()}", replication=2) for t in "ab"]

    async def create() -> None:
        async with JournalClient(brokers[0].endpoint, auth=KeyedAuth(KEY)) as client:
            changes = [pb.ApplyRequest.Change(upsert=s) for s in specs]
            await apply_journals(client, pb.ApplyRequest(changes=changes))

    asyncio.run(create())
    return specs[0].name, specs[1].name


async def status_of(
    endpoint: str, call: str, request: object, auth: BearerAuth | None
) -> tuple[grpc.StatusCode, str]:
    metadata = [("authorization", auth.authorization(Claims(0), 60))] if auth else []
    async with grpc.aio.insecure_channel(endpoint.split("://")[-1]) as ch:
        stub = pb_grpc.JournalStub(ch)
        try:
            if call in ("List", "Read"):
                async for _ in getattr(stub, call)(request, metadata=metadata):
                    pass
            else:
                await getattr(stub, call)(request, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


async def test_calls_without_a_valid_authorization_are_refused_saying_why(
    brokers: list[BrokerProcess], journals: tuple[str, str]
) -> None:
    ep, (a, _) = brokers[0].endpoint, journals
    unauth = grpc.StatusCode.UNAUTHENTICATED
    read = pb.ReadRequest(journal=a, block=False)
    assert await status_of(ep, "List", pb.ListRequest(), None) == (
        unauth,
        "missing or empty authorization token",
    )
    code, details = await status_of(ep, "List", pb.ListRequest(), bearer(LIST, key=b"not the key"))
    assert (code, "signature is invalid" in details) == (unauth, True)
    code, details = await status_of(ep, "List", pb.ListRequest(), bearer(LIST, exp_in=-60))
    assert (code, "token is expired" in details) == (unauth, True)
    assert await status_of(ep, "List", pb.ListRequest(), bearer(READ)) == (
        unauth,
        "authorization is missing required LIST capability",
    )
    assert await status_of(ep, "ListFragments", pb.FragmentsRequest(journal=a), bearer(APPEND)) == (
        unauth,
        "authorization is missing required READ capability",
    )
    code, details = await status_of(ep, "Read", read, bearer(LIST))
    assert (code, details) == (unauth, "authorization is missing required READ capability")
    # No secret reaches the message.
    assert KEY not in details and "broker secret" not in details


async def test_a_claims_selector_limits_what_is_listed_read_appended_and_applied(
    brokers: list[BrokerProcess], journals: tuple[str, str]
) -> None:
    a, b = journals
    team_a = bearer(LIST | READ | APPEND | APPLY, "prefix=team-a/")
    async with JournalClient(brokers[1].endpoint, auth=team_a) as client:
        listed = [j.spec.name for j in await list_all_journals(client)]
        assert a in listed and b not in listed
        await append(client, pb.AppendRequest(journal=a), b"for team a\n")
        assert (await read_all(client.stub(), a, block=False))[0] == b"for team a\n"
        with pytest.raises(JournalNotFound):
            await append(client, pb.AppendRequest(journal=b), b"not for team a\n")
        content, metas = await read_all(client.stub(), b, block=False)
        assert (content, [m.status for m in metas]) == (b"", [pb.JOURNAL_NOT_FOUND])
        # Appends went over the direct-append port, each opening with its authorization.
        assert client.direct is not None and client.direct.answered == 2
        spec = journal_spec(b, replication=2)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await apply_journals(
                client,
                pb.ApplyRequest(
                    changes=[pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=-1)]
                ),
            )
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.details() == f"not authorized to {b}"
    # The other team's journal was not touched.
    async with JournalClient(brokers[0].endpoint, auth=KeyedAuth(KEY)) as client:
        assert (await read_all(client.stub(), b, block=False))[0] == b""


async def test_keyed_clients_append_through_replication_and_proxying(
    brokers: list[BrokerProcess], journals: tuple[str, str]
) -> None:
    """Both brokers replicate the journal (REPLICATE calls the primary signs) and either
    takes the append (one proxies it to the primary, signing on the client's behalf)."""
    a, _ = journals
    for proc in brokers:
        async with JournalClient(proc.endpoint, auth=KeyedAuth(KEY)) as client:
            await append(client, pb.AppendRequest(journal=a), f"via {proc.endpoint}\n".encode())
    async with JournalClient(brokers[1].endpoint, auth=KeyedAuth(KEY)) as client:
        data = (await read_all(client.stub(), a, block=False))[0]
    assert all(f"via {p.endpoint}\n".encode() in data for p in brokers)


def test_gazctl_signs_with_keys_or_sends_a_token(
    brokers: list[BrokerProcess], journals: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = journals

    def gazctl(*argv: str) -> tuple[int, str, str]:
        streams = Streams(stdin=io.BytesIO(), stdout=io.BytesIO(), stderr=io.StringIO())
        rc = run(["journals", "list", "--broker", brokers[0].endpoint, *argv], streams)
        assert isinstance(streams.stdout, io.BytesIO) and isinstance(streams.stderr, io.StringIO)
        return rc, streams.stdout.getvalue().decode(), streams.stderr.getvalue()

    rc, _, err = gazctl()
    assert rc == 1 and "UNAUTHENTICATED" in err and "missing or empty authorization" in err, err
    assert "give --auth-keys (BROKER_AUTH_KEYS) or --auth-token" in err
    rc, out, err = gazctl("--auth-keys", KEY)
    assert rc == 0 and a in out and b in out, err
    rc, out, err = gazctl("--auth-keys", "not base64!")
    assert (
        rc == 1
        and err == "gazctl: error: --auth-keys/--auth-token: auth key at index 0 is not base64\n"
    )
    token = bearer(LIST, "prefix=team-b/").authorization(Claims(0), 60).split()[1]
    monkeypatch.setenv("BROKER_AUTH_TOKEN", token)
    rc, out, err = gazctl()
    assert rc == 0 and a not in out and b in out, err
    assert token not in err and KEY not in err


async def test_a_direct_append_is_verified_as_a_grpc_one(
    brokers: list[BrokerProcess], journals: tuple[str, str]
) -> None:
    """Without an AUTHORIZATION frame, or with one lacking APPEND, a direct append is refused
    UNAUTHENTICATED; the connection then carries an authorized append."""
    a, _ = journals
    msgs = (pb.AppendRequest(journal=a), pb.AppendRequest(content=b"raw\n"), pb.AppendRequest())
    raw = await Raw.open(brokers[0])
    try:
        kind, answer = await raw.append(*msgs)
        assert (kind, answer) == (
            ERROR,
            (grpc.StatusCode.UNAUTHENTICATED, "missing or empty authorization token"),
        )
        raw = await Raw.open(brokers[0])
        for auth, expect in (
            (bearer(READ), "authorization is missing required APPEND capability"),
            (KeyedAuth(KEY), None),
        ):
            value = auth.authorization(Claims(APPEND, name_selector("name", a)), 60)
            assert value is not None
            raw.writer.write(HEADER.pack(AUTHORIZATION, len(value)) + value.encode())
            kind, answer = await raw.append(*msgs)
            if expect is None:
                assert kind == RESPONSE and isinstance(answer, pb.AppendResponse)
                assert answer.status == pb.OK
            else:
                assert (kind, answer) == (ERROR, (grpc.StatusCode.UNAUTHENTICATED, expect))
                raw = await Raw.open(brokers[0])  # the broker closes after an error
    finally:
        raw.writer.close()


async def test_a_blocking_read_ends_when_its_token_expires(
    brokers: list[BrokerProcess], journals: tuple[str, str]
) -> None:
    """As upstream binds a call to its claims' expiry: a blocking read waiting for content
    ends DEADLINE_EXCEEDED at its token's expiry (a client retries it with a fresh token)."""
    a, _ = journals
    auth = bearer(READ, exp_in=2)
    start = time.monotonic()
    async with JournalClient(brokers[0].endpoint, auth=auth) as client:
        head = await write_head(client, a)
        call = client.stub().Read(pb.ReadRequest(journal=a, offset=head, block=True))
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for _ in call:
                pass
    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert ended.value.details() == "authorization expired"
    assert 1 < time.monotonic() - start < 10
