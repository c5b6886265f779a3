"""How a client reaches a secured service: its TLS files and its authorization, as one value
that a process can take from flags, hand to a client, and pass on to the processes it spawns.

A `ClientSettings` holds what upstream's client flags hold (``--cert-file``,
``--cert-key-file``, ``--trusted-ca-file``, ``--auth-keys``, ``--auth-token``): any of the
three files makes the client's channels TLS (`ClientTLS`); keys sign each call for what it
does, a token is sent as it is, and neither means no authorization.

Child processes get the settings through the environment, under upstream's names with a
prefix (``BROKER_CERT_FILE`` ... ``BROKER_AUTH_TOKEN`` for broker clients): `environ` writes
them, `from_environ` reads them back, and `broker_client` is what a spawned process that
dials brokers calls (the fusefs process recording a RocksDB store, the Spark export's
workers). Secrets travel in the environment, never on a command line (which any local user
can list) nor in files handed over.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from gazette.auth.keys import NO_AUTH, BearerAuth, KeyedAuth, NoAuth
from gazette.auth.tls import ClientTLS, TLSFlags

__all__ = ["BROKER_ENV", "ClientSettings", "broker_client", "env_flags"]

BROKER_ENV = "BROKER_"
"""The prefix of the environment of a broker client (upstream's ``BROKER_CERT_FILE`` ...)."""

_NAMES = ("CERT_FILE", "CERT_KEY_FILE", "TRUSTED_CA_FILE", "AUTH_KEYS", "AUTH_TOKEN")


def env_flags(prefix: str) -> TLSFlags:
    """The environment variables of a client's TLS files, as errors name them."""
    return TLSFlags(f"{prefix}CERT_FILE", f"{prefix}CERT_KEY_FILE", f"{prefix}TRUSTED_CA_FILE")


@dataclass(frozen=True)
class ClientSettings:
    """A client's TLS files and authorization (module docs); the default is a plaintext,
    unauthorized client. `flags` names the files in errors."""

    trusted_ca_file: str | Path | None = None
    cert_file: str | Path | None = None
    cert_key_file: str | Path | None = None
    auth_keys: str = field(default="", repr=False)
    auth_token: str = field(default="", repr=False)
    flags: TLSFlags = field(default=env_flags(BROKER_ENV), compare=False)

    @property
    def has_tls(self) -> bool:
        return any(
            f is not None for f in (self.trusted_ca_file, self.cert_file, self.cert_key_file)
        )

    def tls(self) -> ClientTLS | None:
        """The TLS of every channel, if a file is given (None: plaintext, except to
        ``https://`` endpoints, which trust the system's CAs). Files are checked when
        credentials are made (`TLSConfigError`)."""
        if not self.has_tls:
            return None
        return ClientTLS(self.trusted_ca_file, self.cert_file, self.cert_key_file, flags=self.flags)

    def authorizer(self) -> KeyedAuth | BearerAuth | NoAuth:
        """What authorizes the client's calls. ValueError (naming a key's index, never the
        key) for keys that are not base64, or both keys and a token."""
        if self.auth_keys.strip() and self.auth_token.strip():
            raise ValueError("auth keys and an auth token exclude each other: give one")
        if self.auth_keys.strip():
            return KeyedAuth(self.auth_keys)
        if self.auth_token.strip():
            return BearerAuth(self.auth_token)
        return NO_AUTH

    def with_default_keys(self, keys: str) -> ClientSettings:
        """These settings, signing with `keys` if they have neither keys nor a token."""
        if self.auth_keys.strip() or self.auth_token.strip():
            return self
        return replace(self, auth_keys=keys)

    def environ(self, prefix: str = BROKER_ENV) -> dict[str, str]:
        """The environment variables of these settings (every one of `prefix`, empty when
        unset, so that a child does not inherit a parent's other value)."""
        values = (
            self.cert_file,
            self.cert_key_file,
            self.trusted_ca_file,
            self.auth_keys,
            self.auth_token,
        )
        return {
            prefix + name: "" if value is None else str(value)
            for name, value in zip(_NAMES, values, strict=True)
        }

    @classmethod
    def from_environ(
        cls, prefix: str = BROKER_ENV, environ: Mapping[str, str] | None = None
    ) -> ClientSettings:
        """The settings of `prefix`'s variables in `environ` (default: this process's)."""
        env = os.environ if environ is None else environ
        cert, key, ca, keys, token = (env.get(prefix + name, "") for name in _NAMES)
        return cls(
            trusted_ca_file=ca or None,
            cert_file=cert or None,
            cert_key_file=key or None,
            auth_keys=keys,
            auth_token=token,
            flags=env_flags(prefix),
        )


def broker_client(
    environ: Mapping[str, str] | None = None,
) -> tuple[ClientTLS | None, KeyedAuth | BearerAuth | NoAuth]:
    """The TLS and authorizer of a broker client, from ``BROKER_*`` variables (`environ`,
    default this process's), for ``JournalClient(..., tls=, auth=)``. ValueError for bad
    keys; the TLS files are checked when the client is made (`TLSConfigError`)."""
    settings = ClientSettings.from_environ(BROKER_ENV, environ)
    return settings.tls(), settings.authorizer()
