"""TLS settings of a server and of a client, as certificate files.

A server's TLS is a certificate, its private key and optionally a CA: with the CA, every
client must present a certificate it signed (upstream Gazette's ``--server-ca-file``). A
client's TLS is optionally a CA to trust instead of the system's, and a certificate and key
to present. Each setting turns into what our transports take: gRPC credentials, or an
`ssl.SSLContext` for asyncio and aiohttp.

Files are read and checked whenever credentials or a context are made, so a process that
makes them at start-up (as the broker does) fails there, with one line naming the flag and
the file, rather than at its first connection. docs/security.md states the design.

Endpoints say whether to dial with TLS: ``https://host:port`` does (upstream's brokers
advertise their endpoint so when serving TLS), ``http://host:port`` and a bare ``host:port``
do not (`endpoint_target`).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

import grpc

__all__ = [
    "CLIENT_FLAGS",
    "ClientTLS",
    "PEER_FLAGS",
    "SERVER_FLAGS",
    "ServerTLS",
    "TLSConfigError",
    "TLSFlags",
    "endpoint_target",
]


class TLSConfigError(Exception):
    """A TLS setting cannot be used: a file is missing or unreadable, holds no certificate or
    key, or a key is not its certificate's. The message is one line naming the flag and the
    file."""


@dataclass(frozen=True)
class TLSFlags:
    """What the operator calls the certificate, key and CA files (for error messages)."""

    cert: str
    key: str
    ca: str


SERVER_FLAGS = TLSFlags("--server-cert-file", "--server-cert-key-file", "--server-ca-file")
PEER_FLAGS = TLSFlags("--peer-cert-file", "--peer-cert-key-file", "--peer-ca-file")
CLIENT_FLAGS = TLSFlags("--cert-file", "--cert-key-file", "--trusted-ca-file")


@dataclass(frozen=True)
class _Files:
    """The contents of checked TLS files."""

    cert: bytes | None
    key: bytes | None
    ca: bytes | None


def _read(flag: str, path: str | Path, marker: bytes, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise TLSConfigError(f"{flag} {path}: cannot read it ({err.strerror})") from None
    if marker not in data:
        raise TLSConfigError(f"{flag} {path}: no PEM {what} in it")
    return data


def _load(
    flags: TLSFlags,
    cert_file: str | Path | None,
    key_file: str | Path | None,
    ca_file: str | Path | None,
) -> _Files:
    """Read and check the files given: a certificate comes with its key, the key matches
    it, and the CA file holds certificates."""
    if (cert_file is None) != (key_file is None):
        given, missing = (flags.cert, flags.key) if key_file is None else (flags.key, flags.cert)
        raise TLSConfigError(f"{given} is given without {missing}")
    cert = key = ca = None
    if cert_file is not None and key_file is not None:
        cert = _read(flags.cert, cert_file, b"-----BEGIN CERTIFICATE-----", "certificate")
        key = _read(flags.key, key_file, b"PRIVATE KEY-----", "private key")
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert_file, key_file)
        except ssl.SSLError as err:
            raise TLSConfigError(
                f"{flags.key} {key_file}: not the key of {flags.cert} {cert_file} "
                f"({err.reason or err})"
            ) from None
    if ca_file is not None:
        ca = _read(flags.ca, ca_file, b"-----BEGIN CERTIFICATE-----", "certificate")
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=ca_file)
        except ssl.SSLError as err:
            raise TLSConfigError(
                f"{flags.ca} {ca_file}: not a CA certificate ({err.reason or err})"
            ) from None
    return _Files(cert, key, ca)


@dataclass(frozen=True)
class ServerTLS:
    """A server's certificate and key, and the CA its clients' certificates must be signed
    by (None: clients present none)."""

    cert_file: str | Path
    key_file: str | Path
    ca_file: str | Path | None = None
    flags: TLSFlags = field(default=SERVER_FLAGS, compare=False)

    @property
    def verifies_clients(self) -> bool:
        """Whether a client must present a certificate signed by `ca_file`."""
        return self.ca_file is not None

    def check(self) -> None:
        """Raise `TLSConfigError` if the files cannot be used."""
        _load(self.flags, self.cert_file, self.key_file, self.ca_file)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """For ``server.add_secure_port``. Raises `TLSConfigError`."""
        files = _load(self.flags, self.cert_file, self.key_file, self.ca_file)
        assert files.cert is not None and files.key is not None
        return grpc.ssl_server_credentials(
            [(files.key, files.cert)],
            root_certificates=files.ca,
            require_client_auth=files.ca is not None,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """For asyncio and aiohttp servers. Raises `TLSConfigError`."""
        self.check()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.ca_file is not None:
            ctx.load_verify_locations(cafile=self.ca_file)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


@dataclass(frozen=True)
class ClientTLS:
    """A client's TLS: the CA its servers' certificates must be signed by (None: the
    system's CAs), and the certificate and key it presents (None: none)."""

    ca_file: str | Path | None = None
    cert_file: str | Path | None = None
    key_file: str | Path | None = None
    flags: TLSFlags = field(default=CLIENT_FLAGS, compare=False)

    def check(self) -> None:
        """Raise `TLSConfigError` if the files cannot be used."""
        _load(self.flags, self.cert_file, self.key_file, self.ca_file)

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        """For ``grpc.aio.secure_channel``. Raises `TLSConfigError`."""
        files = _load(self.flags, self.cert_file, self.key_file, self.ca_file)
        return grpc.ssl_channel_credentials(
            root_certificates=files.ca, private_key=files.key, certificate_chain=files.cert
        )

    def ssl_context(self) -> ssl.SSLContext:
        """For asyncio and aiohttp clients (the server's name is checked). Raises
        `TLSConfigError`."""
        self.check()
        ctx = ssl.create_default_context(cafile=None if self.ca_file is None else str(self.ca_file))
        if self.cert_file is not None and self.key_file is not None:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def endpoint_target(endpoint: str) -> tuple[str, bool]:
    """The gRPC dial target of `endpoint`, and whether to dial it with TLS.

    ``https://host:port`` is ``host:port`` with TLS; ``http://`` (and ``grpc://``) URLs and a
    bare ``host:port`` are without; other gRPC targets (``unix:``, ``dns:``) pass unchanged,
    without TLS.
    """
    for scheme, secure in (("https://", True), ("http://", False), ("grpc://", False)):
        if endpoint.startswith(scheme):
            return endpoint[len(scheme) :].rstrip("/"), secure
    return endpoint, False
