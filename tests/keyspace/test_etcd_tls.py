"""The etcd client over TLS, against real etcd processes serving TLS (gazette.testing.certs).

A client trusting the CA that signed etcd's certificate reads, writes and watches; one
trusting another CA, or dialing without TLS, fails within its timeout with the reason; with
etcd's ``--client-cert-auth``, only a client presenting a certificate the CA signed is
served.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from gazette.auth.tls import ClientTLS, TLSConfigError
from gazette.keyspace.etcd import Etcd, EtcdUnreachable
from gazette.mainboilerplate.etcd_endpoints import ETCD_TLS_FLAGS
from gazette.testing.certs import Certs
from gazette.testing.etcd import EtcdServer

TIMEOUT = 1.5
"""The clients' timeout in the failure cases: each fails within it, never hangs."""


@pytest.fixture(scope="module")
def tls_etcd(certs: Certs) -> Iterator[EtcdServer]:
    """etcd serving TLS, asking clients for no certificate."""
    with EtcdServer(tls=certs.etcd_tls(client_cert_auth=False)) as srv:
        yield srv


@pytest.fixture(scope="module")
def mtls_etcd(certs: Certs) -> Iterator[EtcdServer]:
    """etcd serving TLS with --client-cert-auth: clients present a certificate the CA signed."""
    with EtcdServer(tls=certs.etcd_tls()) as srv:
        yield srv


async def _put_get(etcd: Etcd, key: bytes, value: bytes) -> bytes:
    await etcd.put(key, value)
    return bytes((await etcd.get(key)).kvs[0].value)


async def _unreachable(endpoint: str, tls: ClientTLS | None) -> str:
    """The error of a client that cannot be served, checked to come within its timeout."""
    started = time.monotonic()
    async with Etcd(endpoint, timeout=TIMEOUT, tls=tls) as etcd:
        with pytest.raises(EtcdUnreachable) as err:
            await etcd.get(b"/tls/any")
    assert time.monotonic() - started < TIMEOUT + 2
    return str(err.value)


def test_the_test_server_serves_https(tls_etcd: EtcdServer) -> None:
    assert tls_etcd.endpoint.startswith("https://127.0.0.1:")


async def test_a_client_trusting_the_ca_reads_writes_and_watches(
    tls_etcd: EtcdServer, certs: Certs
) -> None:
    async with Etcd(tls_etcd.endpoint, tls=ClientTLS(certs.ca)) as etcd:
        assert await _put_get(etcd, b"/tls/rw/a", b"1") == b"1"
        start = int((await etcd.get(b"/tls/rw/a")).header.revision) + 1

        async def first_event() -> bytes:
            async for resp in etcd.watch_prefix(b"/tls/rw/", start):
                for ev in resp.events:
                    return bytes(ev.kv.value)
            raise AssertionError("watch ended")

        watching = asyncio.create_task(first_event())
        await etcd.put(b"/tls/rw/b", b"2")
        assert await asyncio.wait_for(watching, 10) == b"2"
        lease = await etcd.grant_lease(5)
        await etcd.put(b"/tls/rw/leased", b"3", lease=lease)
        await etcd.revoke_lease(lease)
        assert not (await etcd.get(b"/tls/rw/leased")).kvs


async def test_tls_files_make_every_endpoint_tls(tls_etcd: EtcdServer, certs: Certs) -> None:
    # Given TLS files, the client never dials etcd in plaintext: a bare host:port (and an
    # http:// URL) of a TLS member is served over TLS.
    host_port = tls_etcd.endpoint.removeprefix("https://")
    for endpoint in (host_port, f"http://{host_port}"):
        async with Etcd(endpoint, tls=ClientTLS(certs.ca)) as etcd:
            assert await _put_get(etcd, b"/tls/bare", endpoint.encode()) == endpoint.encode()


async def test_a_client_trusting_another_ca_fails_clearly(
    tls_etcd: EtcdServer, certs: Certs
) -> None:
    message = await _unreachable(tls_etcd.endpoint, ClientTLS(certs.wrong_ca))
    assert f"etcd {tls_etcd.endpoint}: Range failed on every member" in message
    assert "CERTIFICATE_VERIFY_FAILED" in message


async def test_an_https_endpoint_without_tls_files_trusts_the_system_cas(
    tls_etcd: EtcdServer,
) -> None:
    # The system's CAs did not sign the test CA: the handshake is refused, so TLS was used.
    assert "CERTIFICATE_VERIFY_FAILED" in await _unreachable(tls_etcd.endpoint, None)


async def test_a_plaintext_client_of_a_tls_member_fails(tls_etcd: EtcdServer) -> None:
    plain = tls_etcd.endpoint.replace("https://", "http://")
    assert "cannot connect" in await _unreachable(plain, None)


async def test_a_tls_client_of_a_plaintext_member_fails(
    etcd_server: EtcdServer, certs: Certs
) -> None:
    assert "cannot connect" in await _unreachable(etcd_server.endpoint, ClientTLS(certs.ca))


async def test_client_cert_auth_serves_only_certificates_the_ca_signed(
    mtls_etcd: EtcdServer, certs: Certs
) -> None:
    for tls in (
        ClientTLS(certs.ca),
        ClientTLS(certs.ca, certs.wrong_client_cert, certs.wrong_client_key),
    ):
        assert "cannot connect" in await _unreachable(mtls_etcd.endpoint, tls)
    tls = ClientTLS(certs.ca, certs.client_cert, certs.client_key, flags=ETCD_TLS_FLAGS)
    async with Etcd(mtls_etcd.endpoint, tls=tls) as etcd:
        assert await _put_get(etcd, b"/tls/mtls", b"ok") == b"ok"


def test_unusable_files_fail_when_the_client_is_made(certs: Certs) -> None:
    tls = ClientTLS(certs.ca, certs.client_cert, certs.server_key, flags=ETCD_TLS_FLAGS)
    with pytest.raises(TLSConfigError, match="--etcd-cert-key-file .*: not the key of"):
        Etcd("https://127.0.0.1:2379", tls=tls)
