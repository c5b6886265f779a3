"""The gazette-journals source's planning and reading (what its Spark tasks run, without a
Spark session) against a real broker serving TLS, asking for client certificates and
verifying tokens: with the TLS files and the token of its options it lists the journals
the token's selector covers, reads their write heads, and reads them to those heads; a
journal outside the selector is not seen."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from gazette.auth.claims import LIST, READ, Claims
from gazette.auth.jwt import sign
from gazette.auth.keys import KeyedAuth
from gazette.auth.tls import ClientTLS
from gazette.broker.client import JournalClient, append, apply_journals
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.selector import parse_label_selector
from gazette.consumer.spark.journals_source import (
    JournalsOptions,
    read_journal,
    resolve_journals_async,
)
from gazette.message.framing import CONTENT_TYPE_JSON_LINES
from gazette.testing.broker import BrokerProcess
from gazette.testing.certs import Certs
from gazette.testing.etcd import EtcdServer
from tests.kit.specs import journal_spec

SECRET = b"spark journals secret"
KEY = base64.b64encode(SECRET).decode()
PREFIX = "spark-secured/"
DOCS = [{"i": i, "word": f"w{i}"} for i in range(20)]


@pytest.fixture(scope="module")
def broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory, certs: Certs
) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("spark-secured")
    with BrokerProcess(
        etcd_server.endpoint,
        root=f"/test-spark-secured/{os.getpid()}",
        spool_dir=tmp / "spool",
        extra_args=[*certs.server_flags(), f"--server-ca-file={certs.ca}", "--auth-keys", KEY],
    ) as b:
        yield b


def _token(capability: int, selector: str) -> str:
    now = int(time.time())
    return sign(Claims(capability, parse_label_selector(selector), now, now + 600), SECRET)


async def _publish(broker: BrokerProcess, certs: Certs, store: Path) -> None:
    tls = ClientTLS(certs.ca, certs.client_cert, certs.client_key)
    async with JournalClient(broker.endpoint, tls=tls, auth=KeyedAuth(KEY)) as client:
        changes = [
            pb.ApplyRequest.Change(
                upsert=journal_spec(
                    f"{PREFIX}{name}",
                    f"file://{store}/",
                    content_type=CONTENT_TYPE_JSON_LINES,
                    labels={"topic": "secured"},
                )
            )
            for name in ("words", "hidden")
        ]
        await apply_journals(client, pb.ApplyRequest(changes=changes))
        body = b"".join(json.dumps(d).encode() + b"\n" for d in DOCS)
        for name in ("words", "hidden"):
            await append(client, pb.AppendRequest(journal=f"{PREFIX}{name}"), body)


async def test_journals_source_reads_through_a_secured_broker(
    broker: BrokerProcess, certs: Certs, tmp_path: Path
) -> None:
    (tmp_path / "store").mkdir()
    await _publish(broker, certs, tmp_path / "store")
    options = {
        "broker": broker.endpoint,
        "selector": "topic=secured",
        "committed": "false",
        "broker_timeout": "30",
        "broker_trusted_ca_file": str(certs.ca),
        "broker_cert_file": str(certs.client_cert),
        "broker_cert_key_file": str(certs.client_key),
        "broker_auth_token": _token(LIST | READ, f"name={PREFIX}words"),
    }
    opts = JournalsOptions.parse(options)
    (plan,) = await resolve_journals_async(opts)  # The hidden journal is not listed.
    assert plan.journal == f"{PREFIX}words" and plan.end > 0
    docs = []
    async for env in read_journal(opts, plan):
        docs.append(env.message.doc)
    assert docs == DOCS

    # Without the client certificate the broker (--server-ca-file) refuses the handshake;
    # a token without LIST is refused saying so.
    no_cert = {k: v for k, v in options.items() if not k.startswith("broker_cert")}
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await resolve_journals_async(JournalsOptions.parse(no_cert))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    lacking = {**options, "broker_auth_token": _token(READ, "")}
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await resolve_journals_async(JournalsOptions.parse(lacking))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.details() == "authorization is missing required LIST capability"
