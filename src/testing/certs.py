"""Real certificates for TLS tests and development clusters (``gazette-dev --secure``,
``make demo SECURE=1``): a CA, a server and a client certificate it signed, and a second CA
that signed neither (a client trusting it must refuse the server). Needs `cryptography` (the
``dev`` extra); never for production, where certificates come from the operator's CA.

EC P-256 keys, so that making them all takes milliseconds. The server's certificate names
127.0.0.1 (an IP SAN) and localhost (a DNS SAN), where the test processes listen. Given
`hosts`, `write_certs` also makes one certificate per host of a multi-host cluster, naming the
host's name and address, for serving and as a client alike (its peer and etcd certificate).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gazette.testing.etcd import EtcdTLS

__all__ = ["Certs", "write_certs"]


@dataclass(frozen=True)
class Certs:
    """Paths of PEM files in one directory."""

    ca: Path
    """The CA that signed `server_cert` and `client_cert`."""
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    wrong_ca: Path
    """A CA that signed nothing here."""
    wrong_client_cert: Path
    """A client certificate signed by `wrong_ca`."""
    wrong_client_key: Path
    hosts: dict[str, tuple[Path, Path]] = field(default_factory=dict)
    """Each host's certificate and key, by host name (`write_certs`' `hosts`)."""

    def etcd_tls(self, *, client_cert_auth: bool = True) -> EtcdTLS:
        """etcd serving TLS with the server certificate (and, with `client_cert_auth`,
        refusing clients without a certificate the CA signed)."""
        client = (self.client_cert, self.client_key) if client_cert_auth else (None, None)
        return EtcdTLS(
            self.server_cert,
            self.server_key,
            self.ca,
            client_cert_auth=client_cert_auth,
            client_cert_file=client[0],
            client_key_file=client[1],
        )

    def server_flags(self, *, client_certs: bool = False) -> list[str]:
        """The flags of a broker or consumer serving TLS with the server certificate; with
        `client_certs`, also requiring clients' certificates of the CA, and presenting the
        client certificate to its peers (trusting the CA for theirs)."""
        flags = [
            f"--server-cert-file={self.server_cert}",
            f"--server-cert-key-file={self.server_key}",
        ]
        if client_certs:
            flags += [
                f"--server-ca-file={self.ca}",
                f"--peer-cert-file={self.client_cert}",
                f"--peer-cert-key-file={self.client_key}",
                f"--peer-ca-file={self.ca}",
            ]
        return flags

    def etcd_client_flags(self) -> list[str]:
        """The flags of our commands reaching such an etcd with the client certificate."""
        return [
            f"--etcd-trusted-ca-file={self.ca}",
            f"--etcd-cert-file={self.client_cert}",
            f"--etcd-cert-key-file={self.client_key}",
        ]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    cert = (
        _builder(name, _name(name), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    name: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    *,
    server: bool,
    client: bool = False,
    address: tuple[str, str] = ("localhost", "127.0.0.1"),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A certificate `ca` signed; with `server`, for serving at `address` (DNS name, IP),
    and with `client` as well, for presenting as a client too."""
    ca_cert, ca_key = ca
    key = _key()
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    if client or not server:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        _builder(name, ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        dns, ip = address
        sans: list[x509.GeneralName] = [
            x509.IPAddress(ipaddress.ip_address(ip)),
            x509.DNSName(dns),
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _write(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


def write_certs(directory: Path, hosts: Mapping[str, str] | None = None) -> Certs:
    """Make the certificates and keys, written to `directory` (created if needed); with
    `hosts` (name -> IP address), also each host's certificate (``NAME.pem``) and key
    (``NAME-key.pem``), naming both, for serving and as a client."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca("gazette test CA")
    wrong = _ca("gazette wrong CA")
    server = _leaf("gazette test server", ca, server=True)
    client = _leaf("gazette test client", ca, server=False)
    wrong_client = _leaf("gazette wrong client", wrong, server=False)
    host_files = {}
    for name, ip in (hosts or {}).items():
        cert, key = _leaf(name, ca, server=True, client=True, address=(name, ip))
        host_files[name] = (
            _write(directory / f"{name}.pem", cert),
            _write_key(directory / f"{name}-key.pem", key),
        )
    return Certs(
        ca=_write(directory / "ca.pem", ca[0]),
        server_cert=_write(directory / "server.pem", server[0]),
        server_key=_write_key(directory / "server-key.pem", server[1]),
        client_cert=_write(directory / "client.pem", client[0]),
        client_key=_write_key(directory / "client-key.pem", client[1]),
        wrong_ca=_write(directory / "wrong-ca.pem", wrong[0]),
        wrong_client_cert=_write(directory / "wrong-client.pem", wrong_client[0]),
        wrong_client_key=_write_key(directory / "wrong-client-key.pem", wrong_client[1]),
        hosts=host_files,
    )
