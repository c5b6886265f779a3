"""The namespace cluster secured, fast: three hosts whose processes the node script starts with
each host's certificate and the key (`secured.Secured`), the specs applied by its one-shots,
the cluster converged as the harness sees it through TLS and tokens, and one record appended
and read back; a client without the certificate, or without a token, is refused (the quick
fault schedule secured is test_quick_run's, marked `cluster`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from node_cluster import (
    ACK_JOURNAL,
    BROKER_PORT,
    ETCD_PORT,
    NODE_SCRIPT,
    Layout,
    NodeCluster,
    Settings,
)
from secured import Secured

from gazette.auth.tls import ClientTLS
from gazette.broker.client.appender import append
from gazette.broker.client.journal_client import JournalClient
from gazette.broker.client.list import list_all_journals
from gazette.broker.client.retry_reader import RetryReader
from gazette.broker.protocol import pb
from gazette.testing.netns import Net

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("nsenter") or not os.access(NODE_SCRIPT, os.X_OK),
    reason="needs root, nsenter and vagrant/provision/gazette-node",
)

LAYOUT = Layout(hosts=3, etcd=(0, 1, 2), summers=(1, 2), s3=2)


async def append_and_read(cluster: NodeCluster, broker: str) -> bytes:
    async with cluster.journal_client(broker) as client:
        resp = await append(client, pb.AppendRequest(journal=ACK_JOURNAL), b"secured\n")
        req = pb.ReadRequest(
            journal=ACK_JOURNAL, offset=resp.commit.begin, end_offset=resp.commit.end, block=True
        )
        reader = RetryReader(client, req)
        data = b""
        try:
            while chunk := await asyncio.wait_for(reader.read(), 30):
                data += chunk
        finally:
            reader.close()
        return data


async def refused(broker: str, tls: ClientTLS | None = None) -> grpc.StatusCode:
    """The status a client with `tls` and no token gets listing journals."""
    async with JournalClient(broker, tls=tls) as c:
        try:
            await asyncio.wait_for(list_all_journals(c, None), 20)
        except grpc.aio.AioRpcError as err:
            return err.code()
    raise AssertionError(f"listed journals with tls={tls} and no token")


def test_secured_cluster_serves_tls_and_tokens_only(tmp_path: Path) -> None:
    with Net(LAYOUT.hosts, directory=tmp_path) as net:
        secured = Secured.make(tmp_path / "certs", {h.name: h.address for h in net.hosts})
        cluster = NodeCluster(net, LAYOUT, Settings(lease_ttl=6, partitions=2), secured)
        # Up means converged as the harness sees it: etcd's gateway, the brokers' and the
        # summers' List, all through TLS with tokens.
        cluster.up(timeout=60)
        broker = f"{net.hosts[0].address}:{BROKER_PORT}"
        assert asyncio.run(append_and_read(cluster, broker)) == b"secured\n"

        # Not without the CA's client certificate, nor without a token.
        tls = secured.settings().tls()
        assert asyncio.run(refused(broker)) == grpc.StatusCode.UNAVAILABLE
        assert asyncio.run(refused(broker, tls=tls)) == grpc.StatusCode.UNAUTHENTICATED
        # etcd: a client certificate the CA signed, over https.
        url = f"https://{net.hosts[0].address}:{ETCD_PORT}/health"
        no_cert = ssl.create_default_context(cafile=secured.certs.ca)
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(url, timeout=5, context=no_cert).read()
        with urllib.request.urlopen(url, timeout=5, context=secured.ssl_context()) as r:
            assert json.loads(r.read())["health"] == "true"
