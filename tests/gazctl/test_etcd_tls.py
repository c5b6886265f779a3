"""gazctl's etcd commands against etcd serving TLS with --client-cert-auth: ``shards recover``
and ``prune`` read a shard's hints given --etcd-trusted-ca-file, --etcd-cert-file and
--etcd-cert-key-file, ``shards export`` hands the files to the gazette-shards source as
options and resolves shards through them, and a file it cannot use is one error line naming
the flag."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gazette.auth.tls import ClientTLS
from gazette.broker.client import JournalClient
from gazette.consumer.hints import store_primary_hints
from gazette.consumer.spark.errors import InvalidOption
from gazette.consumer.spark.options import ShardsOptions
from gazette.gazctl.export import check_shards, shards_options
from gazette.gazctl.main import GazctlError, build_parser
from gazette.keyspace.etcd import Etcd
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.testing.broker import BrokerProcess
from gazette.testing.certs import Certs
from gazette.testing.etcd import EtcdServer
from tests.kit.specs import RECOVERY_LOG, apply_specs, journal_spec

from .conftest import Gazctl


@pytest.fixture(scope="module")
def mtls_etcd(certs: Certs) -> Iterator[EtcdServer]:
    with EtcdServer(tls=certs.etcd_tls()) as srv:
        yield srv


def test_recover_and_prune_read_hints_from_tls_etcd(
    gazctl: Gazctl,
    gazctl_broker: BrokerProcess,
    mtls_etcd: EtcdServer,
    certs: Certs,
    prefix: str,
    tmp_path: Path,
) -> None:
    log = f"{prefix}recovery/shard-a"
    hint_prefix = f"/test-gazctl-tls/{os.getpid()}/{tmp_path.name}"

    async def setup() -> None:
        async with JournalClient(gazctl_broker.endpoint) as client:
            spec = journal_spec(log, tmp_path / "store", content_type=RECOVERY_LOG)
            await apply_specs(client, [spec])
        tls = ClientTLS(certs.ca, certs.client_cert, certs.client_key)
        async with Etcd(mtls_etcd.endpoint, tls=tls) as etcd:
            await store_primary_hints(etcd, hint_prefix, "shard-a", rpb.FSMHints(log=log))

    asyncio.run(setup())
    etcd = ("--etcd", mtls_etcd.endpoint, "--hint-prefix", hint_prefix, "--shard", "shard-a")
    out = tmp_path / "played"
    r = gazctl(
        "shards", "recover", "--log", log, *etcd, *certs.etcd_client_flags(), "--dir", str(out)
    )
    assert r.rc == 0, r.err
    assert "using primary hints of shard shard-a" in r.err
    # Hints of an empty store: read over TLS, and nothing for prune to keep.
    r = gazctl("shards", "prune", "--log", log, *etcd, *certs.etcd_client_flags(), "--dry-run")
    assert r.err == "gazctl: error: hints #0 of shard shard-a have no live files; cannot prune\n"

    missing = tmp_path / "missing.pem"
    r = gazctl("shards", "prune", "--log", log, *etcd, "--etcd-trusted-ca-file", str(missing))
    assert r.rc == 1
    assert r.err == (
        f"gazctl: error: --etcd-trusted-ca-file {missing}: cannot read it "
        "(No such file or directory)\n"
    )


def test_export_resolves_shards_through_tls_etcd(mtls_etcd: EtcdServer, certs: Certs) -> None:
    argv = ["shards", "export", "--to", "/tmp/unused", "--etcd", mtls_etcd.endpoint]
    argv += ["--root", f"/test-gazctl-tls/{os.getpid()}/app", "--shards", "nope"]
    argv += ["--store", "json", *certs.etcd_client_flags()]
    options = shards_options(build_parser().parse_args(argv))
    assert options["etcd_trusted_ca_file"] == str(certs.ca)
    assert options["etcd_cert_file"] == str(certs.client_cert)
    assert options["etcd_cert_key_file"] == str(certs.client_key)
    files = (str(certs.ca), str(certs.client_cert), str(certs.client_key))
    assert ShardsOptions.parse(options).etcd_tls == ClientTLS(*files)
    # etcd answers over TLS (no "does not answer"); the source's resolution does too.
    with pytest.raises(GazctlError, match="shard 'nope' not found"):
        asyncio.run(check_shards(options))


def test_the_source_refuses_an_unusable_etcd_file(certs: Certs) -> None:
    options = {"etcd": "https://127.0.0.1:2379", "root": "/r", "broker": "b:1"}
    options |= {"shards": "s", "store": "json", "etcd_cert_file": str(certs.client_cert)}
    with pytest.raises(InvalidOption) as err:
        ShardsOptions.parse(options)
    assert err.value.option == "etcd_cert_file"
    assert "is given without etcd_cert_key_file" in str(err.value)
