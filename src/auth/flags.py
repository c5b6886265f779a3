"""The authorization and TLS flags of our commands, named as upstream names them.

Servers take ``--auth-keys`` (``<PREFIX>AUTH_KEYS``): they verify calls with the keys, and sign
their own calls to peers with the first. Clients take ``--auth-keys`` to sign their calls, or
``--auth-token`` (``<PREFIX>AUTH_TOKEN``) to send a token issued elsewhere. Neither flag shows
its value in ``--help``, and a bad key is a usage error naming its index, never the key.

Servers take the TLS flags of upstream's ``mainboilerplate.ServiceConfig``
(`add_server_tls_flags`: ``--server-cert-file`` ... ``--peer-ca-file``). A process's client of
another service takes upstream's client flags under a prefix (`add_client_flags`: e.g. the
consumer's ``--broker-cert-file`` ... ``--broker-auth-token``, env ``BROKER_CERT_FILE`` ...),
read into a `ClientSettings` (`client_settings_from_args`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from gazette.auth.client_settings import ClientSettings
from gazette.auth.keys import NO_AUTH, BearerAuth, KeyedAuth, NoAuth
from gazette.auth.tls import PEER_FLAGS, SERVER_FLAGS, TLSFlags

__all__ = [
    "add_auth_flags",
    "add_client_flags",
    "add_server_tls_flags",
    "auth_from_args",
    "auth_keys_from_args",
    "check_server_tls_flags",
    "client_settings_from_args",
    "server_tls_values",
]


def add_auth_flags(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    prefix: str,
    *,
    token: bool,
    signs: str = "its calls",
) -> None:
    """Declare ``--auth-keys`` (and, with `token`, ``--auth-token``) on `p`; their
    environment variables are `prefix` + ``AUTH_KEYS`` / ``AUTH_TOKEN``."""
    p.add_argument(
        "--auth-keys",
        default=None,
        metavar="KEYS",
        help="base64 keys, separated by whitespace or commas: the first signs "
        f"{signs}, any verifies; AA== also admits calls without a token (for a roll-out); "
        f"default: none, authorization off [{prefix}AUTH_KEYS]",
    )
    if token:
        p.add_argument(
            "--auth-token",
            default=None,
            metavar="TOKEN",
            help=f"a bearer token to send instead of signing with keys [{prefix}AUTH_TOKEN]",
        )


def auth_from_args(
    p: argparse.ArgumentParser, a: argparse.Namespace, prefix: str
) -> KeyedAuth | BearerAuth | NoAuth:
    """What the flags declared by `add_auth_flags` (or their environment) configure; exits
    through `p` (status 2) on a bad key."""
    keys = auth_keys_from_args(a, prefix)
    token = getattr(a, "auth_token", None)
    if token is None and hasattr(a, "auth_token"):
        token = os.environ.get(f"{prefix}AUTH_TOKEN", "")
    if keys.strip() and token:
        p.error("--auth-keys and --auth-token exclude each other: give one")
    if keys.strip():
        try:
            return KeyedAuth(keys)
        except ValueError as err:
            p.error(f"--auth-keys ({prefix}AUTH_KEYS): {err}")
    if token:
        return BearerAuth(token)
    return NO_AUTH


def auth_keys_from_args(a: argparse.Namespace, prefix: str) -> str:
    """The text of ``--auth-keys`` (or of its environment variable; '' when neither)."""
    keys: str = a.auth_keys if a.auth_keys is not None else os.environ.get(f"{prefix}AUTH_KEYS", "")
    return keys


_SERVER_TLS = {
    "server-cert-file": "the server's TLS certificate (PEM): gRPC and HTTP are served over "
    "TLS, and the advertised endpoint is https:// (default: none, plaintext; the other TLS "
    "flags need it)",
    "server-cert-key-file": "the private key of --server-cert-file (PEM)",
    "server-ca-file": "a CA certificate (PEM): clients must present a certificate it signed",
    "peer-cert-file": "the TLS certificate this {process} presents to {peers}",
    "peer-cert-key-file": "the private key of --peer-cert-file",
    "peer-ca-file": "the CA the certificates of {peers} must be signed by (default: the "
    "system's CAs)",
}


def add_server_tls_flags(
    p: argparse.ArgumentParser, prefix: str, *, process: str, peers: str
) -> None:
    """Declare the server's TLS flags (`_SERVER_TLS`) on `p`, read from `prefix` + their name
    (``BROKER_SERVER_CERT_FILE``...) when not given. `process` and `peers` name, in the help,
    who presents the peer certificate to whom ("broker", "other brokers")."""
    for name, text in _SERVER_TLS.items():
        variable = prefix + name.upper().replace("-", "_")
        p.add_argument(
            f"--{name}",
            type=Path,
            default=os.environ.get(variable, "") or None,
            metavar="FILE",
            help=f"{text.format(process=process, peers=peers)} [{variable}]",
        )


def server_tls_values(a: argparse.Namespace) -> dict[str, Any]:
    """The values of the flags of `add_server_tls_flags`, by `MemberConfig` field name."""
    return {name.replace("-", "_"): getattr(a, name.replace("-", "_")) for name in _SERVER_TLS}


def _pair(p: argparse.ArgumentParser, flags: TLSFlags, cert: object, key: object) -> None:
    if (cert is None) != (key is None):
        given, missing = (flags.cert, flags.key) if key is None else (flags.key, flags.cert)
        p.error(f"{given} is given without {missing}")


def check_server_tls_flags(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Exit through `p` (status 2) on server TLS flags that cannot go together, or an
    ``http://`` ``--advertise`` of a TLS server."""
    for flag, file in (
        (SERVER_FLAGS.key, a.server_cert_key_file),
        (SERVER_FLAGS.ca, a.server_ca_file),
        (PEER_FLAGS.cert, a.peer_cert_file),
        (PEER_FLAGS.key, a.peer_cert_key_file),
        (PEER_FLAGS.ca, a.peer_ca_file),
    ):
        if file is not None and a.server_cert_file is None:
            p.error(f"{flag} is given without {SERVER_FLAGS.cert} (TLS is off without it)")
    if a.server_cert_file is not None and a.server_cert_key_file is None:
        p.error(f"{SERVER_FLAGS.cert} is given without {SERVER_FLAGS.key}")
    _pair(p, PEER_FLAGS, a.peer_cert_file, a.peer_cert_key_file)
    if a.server_cert_file is not None and a.advertise.startswith("http://"):
        p.error(
            f"--advertise {a.advertise} is http:// but {SERVER_FLAGS.cert} serves TLS only "
            "(advertise https://, or host:port)"
        )


def _client_dest(flag_prefix: str, name: str) -> str:
    return (flag_prefix + name).replace("-", "_").replace(".", "_")


def add_client_flags(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag_prefix: str,
    env_prefix: str,
    *,
    service: str,
    keys_default: str = "none, authorization off",
    alias_prefix: str | None = None,
) -> None:
    """Declare upstream's client flags for calls to `service` on `p`, as
    ``--<flag_prefix>cert-file`` ... ``--<flag_prefix>auth-token``, read from `env_prefix` +
    ``CERT_FILE`` ... ``AUTH_TOKEN`` when not given; with `alias_prefix`, each is also
    ``--<alias_prefix>cert-file`` ... (e.g. upstream gazctl's ``--consumer.cert-file``). Keys
    and tokens never show in --help; `keys_default` says what signs without them."""

    def names(name: str) -> list[str]:
        return [f"--{prefix}{name}" for prefix in (flag_prefix, alias_prefix) if prefix is not None]

    files = (
        ("cert-file", f"the TLS certificate (PEM) presented to the {service}, if it asks"),
        ("cert-key-file", f"the private key of --{flag_prefix}cert-file (PEM)"),
        (
            "trusted-ca-file",
            f"the CA (PEM) the {service}'s certificate must be signed by (default: the "
            "system's); any of these three makes the connections TLS, as an https:// "
            "endpoint does",
        ),
    )
    for name, text in files:
        variable = env_prefix + name.upper().replace("-", "_")
        p.add_argument(
            *names(name),
            dest=_client_dest(flag_prefix, name),
            default=None,
            metavar="FILE",
            help=f"{text} [{variable}]",
        )
    p.add_argument(
        *names("auth-keys"),
        dest=_client_dest(flag_prefix, "auth-keys"),
        default=None,
        metavar="KEYS",
        help=f"base64 keys, separated by whitespace or commas, the first signing calls to the "
        f"{service}; default: {keys_default} [{env_prefix}AUTH_KEYS]",
    )
    p.add_argument(
        *names("auth-token"),
        dest=_client_dest(flag_prefix, "auth-token"),
        default=None,
        metavar="TOKEN",
        help=f"a bearer token to send to the {service} instead of signing with keys "
        f"[{env_prefix}AUTH_TOKEN]",
    )


def client_settings_from_args(
    a: argparse.Namespace, flag_prefix: str, env_prefix: str
) -> ClientSettings:
    """What the flags declared by `add_client_flags` (or their environment) configure.
    ValueError, saying which flags, for bad keys, keys with a token, or a certificate
    without its key (a command reports it as a usage error)."""
    values = []
    for name in ("cert-file", "cert-key-file", "trusted-ca-file", "auth-keys", "auth-token"):
        given = getattr(a, _client_dest(flag_prefix, name))
        if given is None:
            given = os.environ.get(env_prefix + name.upper().replace("-", "_"), "")
        values.append(given)
    cert, key, ca, keys, token = values
    flags = TLSFlags(
        *(f"--{flag_prefix}{n}" for n in ("cert-file", "cert-key-file", "trusted-ca-file"))
    )
    if bool(cert) != bool(key):
        given, missing = (flags.cert, flags.key) if not key else (flags.key, flags.cert)
        raise ValueError(f"{given} is given without {missing}")
    if keys.strip() and token.strip():
        raise ValueError(
            f"--{flag_prefix}auth-keys and --{flag_prefix}auth-token exclude each other: give one"
        )
    settings = ClientSettings(
        trusted_ca_file=ca or None,
        cert_file=cert or None,
        cert_key_file=key or None,
        auth_keys=keys,
        auth_token=token,
        flags=flags,
    )
    try:
        settings.authorizer()
    except ValueError as err:
        raise ValueError(f"--{flag_prefix}auth-keys ({env_prefix}AUTH_KEYS): {err}") from None
    return settings
