"""The options of both Spark sources that say how to reach secured brokers.

``broker_cert_file``, ``broker_cert_key_file`` and ``broker_trusted_ca_file`` are the TLS
files of the broker client (any of them makes its channels TLS; an ``https://`` broker is
dialled with TLS anyway), and ``broker_auth_token`` a bearer token sent with every call. An
option not given is taken from the driver's environment, under upstream's names
(``BROKER_CERT_FILE`` ... ``BROKER_AUTH_TOKEN``; `gazette.auth.client_settings`), where
``BROKER_AUTH_KEYS`` may hold keys to sign calls with instead of a token.

Keys are taken from the environment only, never from an option: a DataFrame's options show
in query plans and the Spark UI, and while Spark redacts a value whose name says ``token``,
a key would show as it is, and a key signs any call, where a token grants what it says. The
settings are read once, on the driver, and travel with the source's other options to its
tasks, which may run where the driver's environment is not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gazette.auth.client_settings import BROKER_ENV, ClientSettings
from gazette.auth.tls import TLSConfigError, TLSFlags

__all__ = ["BROKER_CLIENT_OPTIONS", "BrokerOptionError", "broker_client_options"]

_TLS = TLSFlags("broker_cert_file", "broker_cert_key_file", "broker_trusted_ca_file")
_TOKEN = "broker_auth_token"

BROKER_CLIENT_OPTIONS = frozenset({_TLS.cert, _TLS.key, _TLS.ca, _TOKEN})
"""The options of the broker client's TLS and token (module docs)."""


class BrokerOptionError(ValueError):
    """A broker client option (or its environment variable) cannot be used; `option` names
    it."""

    def __init__(self, option: str, why: str) -> None:
        super().__init__(why)
        self.option = option


def broker_client_options(
    opts: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> ClientSettings:
    """The broker client settings of `opts` (lower-cased option names), each missing one from
    `environ` (default: this process's). Raises `BrokerOptionError` for a TLS file that
    cannot be used, keys that are not base64, or both keys and a token."""
    env = os.environ if environ is None else environ

    def value(option: str, variable: str) -> str:
        return opts.get(option, "").strip() or env.get(BROKER_ENV + variable, "").strip()

    settings = ClientSettings(
        trusted_ca_file=value(_TLS.ca, "TRUSTED_CA_FILE") or None,
        cert_file=value(_TLS.cert, "CERT_FILE") or None,
        cert_key_file=value(_TLS.key, "CERT_KEY_FILE") or None,
        auth_keys=env.get(BROKER_ENV + "AUTH_KEYS", ""),
        auth_token=value(_TOKEN, "AUTH_TOKEN"),
        flags=_TLS,
    )
    tls = settings.tls()
    if tls is not None:
        try:
            tls.check()
        except TLSConfigError as err:
            # The message begins with the option it is about.
            text = str(err)
            option = next(
                (o for o in (_TLS.cert, _TLS.key, _TLS.ca) if text.startswith(o)), _TLS.ca
            )
            raise BrokerOptionError(option, text) from None
    try:
        settings.authorizer()
    except ValueError as err:
        raise BrokerOptionError(
            _TOKEN, f"{BROKER_ENV}AUTH_KEYS or option {_TOKEN}: {err}"
        ) from None
    return settings
