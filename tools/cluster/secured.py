"""What a secured namespace cluster runs with: a CA, one certificate per host naming its
address, a client certificate for the harness, and an authorization key, all made for the run.

Each host's processes get them through the node contract's variables (`node_env`:
``GAZETTE_TLS_CA``, ``GAZETTE_TLS_CERT``, ``GAZETTE_TLS_KEY``, ``GAZETTE_AUTH_KEYS``), as a
VM's ``node.env`` gives them. The harness's own clients (the convergence checks, the
verifier, gazctl, the appender and chunker processes) present the client certificate and sign
with the key: `settings` for clients made here, `client_env` (upstream's ``BROKER_*`` and
``CONSUMER_*`` variables) for processes, `ssl_context` for etcd's JSON gateway.
"""

from __future__ import annotations

import base64
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gazette.auth.client_settings import BROKER_ENV, ClientSettings
from gazette.testing.certs import Certs, write_certs

CONSUMER_ENV = "CONSUMER_"


@dataclass(frozen=True)
class Secured:
    certs: Certs
    keys: str = field(repr=False)
    """Base64 authorization keys (one here: it signs and verifies)."""

    @classmethod
    def make(cls, directory: Path, hosts: Mapping[str, str]) -> Secured:
        """Certificates for `hosts` (name -> address) under `directory`, and a new key."""
        certs = write_certs(directory, hosts)
        return cls(certs, base64.b64encode(os.urandom(32)).decode())

    def node_env(self, host: str) -> dict[str, str]:
        """The node contract's security variables of `host`."""
        cert, key = self.certs.hosts[host]
        return {
            "GAZETTE_TLS_CA": str(self.certs.ca),
            "GAZETTE_TLS_CERT": str(cert),
            "GAZETTE_TLS_KEY": str(key),
            "GAZETTE_AUTH_KEYS": self.keys,
        }

    def settings(self) -> ClientSettings:
        """A client's TLS (the CA, the client certificate) and keys."""
        return ClientSettings(
            trusted_ca_file=self.certs.ca,
            cert_file=self.certs.client_cert,
            cert_key_file=self.certs.client_key,
            auth_keys=self.keys,
        )

    def client_env(self) -> dict[str, str]:
        """`settings` as the environment of a client process, of brokers and consumers."""
        s = self.settings()
        return {**s.environ(BROKER_ENV), **s.environ(CONSUMER_ENV)}

    def gazctl_flags(self) -> list[str]:
        """gazctl's broker TLS flags (its keys come from `client_env`)."""
        c = self.certs
        return [
            "--trusted-ca-file", str(c.ca),
            "--cert-file", str(c.client_cert),
            "--cert-key-file", str(c.client_key),
        ]  # fmt: skip

    def ssl_context(self) -> ssl.SSLContext:
        """TLS to etcd's members: trusting the CA, presenting the client certificate."""
        ctx = ssl.create_default_context(cafile=self.certs.ca)
        ctx.load_cert_chain(self.certs.client_cert, self.certs.client_key)
        return ctx
