"""`write_certs` with hosts: each host's certificate names its address and serves TLS there,
and presents itself as a client to a server asking for the CA's certificates."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from gazette.testing.certs import write_certs


def test_a_host_certificate_names_the_host_and_serves_and_dials(tmp_path: Path) -> None:
    certs = write_certs(tmp_path, {"h0": "127.0.0.2", "h1": "127.0.0.3"})
    assert sorted(certs.hosts) == ["h0", "h1"]
    cert_file, key_file = certs.hosts["h0"]
    assert key_file.stat().st_mode & 0o777 == 0o600
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.2")]
    assert sans.get_values_for_type(x509.DNSName) == ["h0"]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}

    # h0 serves at its address, asking for a client certificate; h1 dials it with its own.
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=certs.ca)
    server_ctx.load_cert_chain(cert_file, key_file)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=certs.ca)
    client_ctx.load_cert_chain(*certs.hosts["h1"])
    peer: list[object] = []
    with socket.create_server(("127.0.0.2", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                peer.append(tls.getpeercert())
                tls.sendall(b"ok")

        t = threading.Thread(target=serve)
        t.start()
        with socket.create_connection(("127.0.0.2", port), timeout=5) as raw:
            with client_ctx.wrap_socket(raw, server_hostname="127.0.0.2") as tls:
                assert tls.recv(2) == b"ok"
        t.join(5)
    assert peer and peer[0]
    # The same certificate does not name another address.
    with socket.create_server(("127.0.0.3", 0)) as listener:
        port = listener.getsockname()[1]
        failed: list[BaseException] = []

        def serve_wrong() -> None:
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError) as err:
                failed.append(err)

        t = threading.Thread(target=serve_wrong)
        t.start()
        with socket.create_connection(("127.0.0.3", port), timeout=5) as raw:
            try:
                client_ctx.wrap_socket(raw, server_hostname="127.0.0.3")
                raise AssertionError("h0's certificate was accepted for 127.0.0.3")
            except ssl.SSLCertVerificationError as err:
                assert "IP address mismatch" in str(err)
        t.join(5)


def test_without_hosts_there_are_no_host_certificates(tmp_path: Path) -> None:
    assert write_certs(tmp_path).hosts == {}
