"""A real broker process whose etcd serves TLS with --client-cert-auth: given the etcd TLS
flags it announces itself, serves its journals and appends; a file it cannot use stops it
at start-up with one line naming the flag."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gazette.auth.tls import ClientTLS
from gazette.broker.client import JournalClient, RetryReader, append
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.keyspace.etcd import Etcd
from gazette.testing.broker import BrokerProcess
from gazette.testing.certs import Certs
from gazette.testing.etcd import EtcdServer
from tests.broker.conftest import journal_spec


@pytest.fixture(scope="module")
def mtls_etcd(certs: Certs) -> Iterator[EtcdServer]:
    with EtcdServer(tls=certs.etcd_tls()) as srv:
        yield srv


async def test_a_broker_on_tls_etcd_serves_appends_and_reads(
    mtls_etcd: EtcdServer, certs: Certs, tmp_path: Path
) -> None:
    root = f"/test/{os.getpid()}/etcd-tls"
    with BrokerProcess(
        mtls_etcd.endpoint,
        root=root,
        spool_dir=tmp_path / "spool",
        extra_args=certs.etcd_client_flags(),
    ) as broker:
        spec = journal_spec("etcd-tls/it", f"file://{tmp_path / 'store'}/")
        (tmp_path / "store").mkdir()
        async with JournalClient(broker.endpoint) as client:
            resp = await client.stub().Apply(
                pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]), timeout=10
            )
            assert resp.status == pb.OK
            for line in (b"over\n", b"tls\n"):
                await append(client, pb.AppendRequest(journal=spec.name), line)
            reader = RetryReader(client, pb.ReadRequest(journal=spec.name, offset=0))
            assert [await reader.readline(), await reader.readline()] == [b"over\n", b"tls\n"]
        # The broker's membership and the journal's spec are in the TLS etcd.
        async with Etcd(
            mtls_etcd.endpoint, tls=ClientTLS(certs.ca, certs.client_cert, certs.client_key)
        ) as etcd:
            keys = [bytes(kv.key).decode() for kv in (await etcd.get_prefix(root.encode())).kvs]
        assert f"{root}/items/{spec.name}" in keys
        assert any(key.startswith(f"{root}/members/") for key in keys)


def test_an_unusable_etcd_file_stops_the_broker_at_start(certs: Certs, tmp_path: Path) -> None:
    missing = tmp_path / "missing-ca.pem"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gazette.broker.main",
            "--etcd",
            "https://127.0.0.1:1",
            "--etcd-trusted-ca-file",
            str(missing),
            "--spool-dir",
            str(tmp_path / "spool"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gazette-broker: error: --etcd-trusted-ca-file ")
    assert f"{missing}: cannot read it" in last
