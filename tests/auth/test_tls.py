"""gazette.auth.tls with real certificates (gazette.testing.certs): files checked when loaded, and
real handshakes over loopback, through asyncio's TLS and through gRPC."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from gazette.auth.tls import PEER_FLAGS, ClientTLS, ServerTLS, TLSConfigError, endpoint_target
from gazette.testing.certs import Certs


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("https://host:8080", ("host:8080", True)),
        ("https://host:8080/", ("host:8080", True)),
        ("http://host:8080", ("host:8080", False)),
        ("grpc://host:8080", ("host:8080", False)),
        ("127.0.0.1:8080", ("127.0.0.1:8080", False)),
        ("unix:///tmp/sock", ("unix:///tmp/sock", False)),
    ],
)
def test_endpoint_target(endpoint: str, expected: tuple[str, bool]) -> None:
    assert endpoint_target(endpoint) == expected


# -- Files checked when loaded --------------------------------------------------------------


def test_a_missing_file_names_its_flag_and_path(certs: Certs, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(TLSConfigError) as err:
        ServerTLS(missing, certs.server_key).check()
    assert str(err.value) == (
        f"--server-cert-file {missing}: cannot read it (No such file or directory)"
    )
    with pytest.raises(TLSConfigError, match=f"^--server-ca-file {missing}: cannot read it"):
        ServerTLS(certs.server_cert, certs.server_key, missing).grpc_credentials()
    with pytest.raises(TLSConfigError, match=f"^--trusted-ca-file {missing}: cannot read it"):
        ClientTLS(missing).grpc_credentials()
    with pytest.raises(TLSConfigError, match=f"^--peer-cert-key-file {missing}: cannot read"):
        ClientTLS(None, certs.client_cert, missing, flags=PEER_FLAGS).ssl_context()


def test_a_key_not_of_the_certificate_is_refused(certs: Certs) -> None:
    with pytest.raises(TLSConfigError) as err:
        ServerTLS(certs.server_cert, certs.client_key).grpc_credentials()
    message = str(err.value)
    assert message.startswith(
        f"--server-cert-key-file {certs.client_key}: not the key of "
        f"--server-cert-file {certs.server_cert} ("
    )
    assert "\n" not in message


def test_files_without_pem_content_are_refused(certs: Certs, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(TLSConfigError, match="^--server-cert-file .*: no PEM certificate in it$"):
        ServerTLS(junk, certs.server_key).check()
    with pytest.raises(TLSConfigError, match="^--cert-key-file .*: no PEM private key in it$"):
        ClientTLS(certs.ca, certs.client_cert, junk).check()
    with pytest.raises(TLSConfigError, match="^--trusted-ca-file .*: no PEM certificate in it$"):
        ClientTLS(junk).check()


def test_a_certificate_needs_its_key(certs: Certs) -> None:
    with pytest.raises(TLSConfigError, match="^--cert-file is given without --cert-key-file$"):
        ClientTLS(certs.ca, cert_file=certs.client_cert).grpc_credentials()
    with pytest.raises(TLSConfigError, match="^--cert-key-file is given without --cert-file$"):
        ClientTLS(certs.ca, key_file=certs.client_key).ssl_context()


def test_good_files_load(certs: Certs) -> None:
    assert ServerTLS(certs.server_cert, certs.server_key, certs.ca).verifies_clients
    assert not ServerTLS(certs.server_cert, certs.server_key).verifies_clients
    ServerTLS(certs.server_cert, certs.server_key, certs.ca).grpc_credentials()
    ClientTLS(certs.ca, certs.client_cert, certs.client_key).grpc_credentials()
    ClientTLS().grpc_credentials()  # The system's CAs.


# -- asyncio handshakes (ssl contexts) ------------------------------------------------------


async def _echo(server: ServerTLS, client: ClientTLS) -> bytes:
    """One line echoed by an asyncio TLS server on loopback, read by a TLS client."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(await reader.readline())
            await writer.drain()
        except (ssl.SSLError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server.ssl_context())
    port = srv.sockets[0].getsockname()[1]
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client.ssl_context()
            )
            writer.write(b"hello\n")
            line = await reader.readline()
            writer.close()
            return line
    finally:
        srv.close()
        await srv.wait_closed()


async def test_ssl_contexts_handshake(certs: Certs) -> None:
    server = ServerTLS(certs.server_cert, certs.server_key)
    assert await _echo(server, ClientTLS(certs.ca)) == b"hello\n"


async def test_ssl_context_of_a_client_trusting_another_ca_fails(certs: Certs) -> None:
    server = ServerTLS(certs.server_cert, certs.server_key)
    with pytest.raises(ssl.SSLCertVerificationError):
        await _echo(server, ClientTLS(certs.wrong_ca))


async def _refused(server: ServerTLS, client: ClientTLS) -> bool:
    """Whether the server refused the client: with TLS 1.3 the server's refusal arrives
    after the client's handshake, as an error or an end at the first read."""
    try:
        return await _echo(server, client) == b""
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
        return True


async def test_ssl_context_requires_a_client_certificate_with_a_ca(certs: Certs) -> None:
    server = ServerTLS(certs.server_cert, certs.server_key, certs.ca)
    assert await _refused(server, ClientTLS(certs.ca))
    assert await _refused(
        server, ClientTLS(certs.ca, certs.wrong_client_cert, certs.wrong_client_key)
    )
    client = ClientTLS(certs.ca, certs.client_cert, certs.client_key)
    assert not await _refused(server, client)


# -- gRPC handshakes (credentials) ----------------------------------------------------------

_METHOD = "/test.Echo/Echo"


def _echo_handler() -> grpc.GenericRpcHandler:
    async def echo(request: bytes, _context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return request

    handler = grpc.unary_unary_rpc_method_handler(echo)
    return grpc.method_handlers_generic_handler("test.Echo", {"Echo": handler})


async def _grpc_server(tls: ServerTLS) -> AsyncIterator[str]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([_echo_handler()])
    port = server.add_secure_port("127.0.0.1:0", tls.grpc_credentials())
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


@pytest.fixture
async def tls_server(certs: Certs) -> AsyncIterator[str]:
    async for target in _grpc_server(ServerTLS(certs.server_cert, certs.server_key)):
        yield target


@pytest.fixture
async def mtls_server(certs: Certs) -> AsyncIterator[str]:
    async for target in _grpc_server(ServerTLS(certs.server_cert, certs.server_key, certs.ca)):
        yield target


async def _call(target: str, tls: ClientTLS | None) -> bytes:
    if tls is None:
        channel = grpc.aio.insecure_channel(target)
    else:
        channel = grpc.aio.secure_channel(target, tls.grpc_credentials())
    async with channel:
        answer: bytes = await channel.unary_unary(_METHOD)(b"ping", timeout=10)
        return answer


async def test_grpc_over_tls(tls_server: str, certs: Certs) -> None:
    assert await _call(tls_server, ClientTLS(certs.ca)) == b"ping"


@pytest.mark.parametrize("client", ["plaintext", "wrong CA", "system CAs"])
async def test_grpc_clients_not_trusting_the_server_are_unavailable(
    tls_server: str, certs: Certs, client: str
) -> None:
    tls = {"plaintext": None, "wrong CA": ClientTLS(certs.wrong_ca), "system CAs": ClientTLS()}
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _call(tls_server, tls[client])
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_grpc_with_a_server_ca_requires_a_client_certificate(
    mtls_server: str, certs: Certs
) -> None:
    for tls in (
        ClientTLS(certs.ca),
        ClientTLS(certs.ca, certs.wrong_client_cert, certs.wrong_client_key),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(mtls_server, tls)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    client = ClientTLS(certs.ca, certs.client_cert, certs.client_key)
    assert await _call(mtls_server, client) == b"ping"
