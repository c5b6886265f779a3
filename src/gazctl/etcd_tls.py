"""The TLS of gazctl's etcd connection: the flags of the commands that take ``--etcd``
(``--etcd-cert-file``, ``--etcd-cert-key-file``, ``--etcd-trusted-ca-file``, with upstream's
environment variables), and the `ClientTLS` they make, checked before any connection.

As in the broker and the consumer (`mainboilerplate.flags`): any of the files dials every
etcd endpoint over TLS; without them only ``https://`` endpoints are, trusting the system's
CAs.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from gazette.auth.tls import ClientTLS, TLSConfigError
from gazette.gazctl.main import GazctlError
from gazette.mainboilerplate.etcd_endpoints import etcd_tls
from gazette.mainboilerplate.flags import ETCD_TLS_ENV

__all__ = ["add_etcd_tls_flags", "etcd_tls_of"]

_HELP = {
    "etcd-cert-file": "TLS certificate (PEM) presented to etcd, for its --client-cert-auth",
    "etcd-cert-key-file": "private key (PEM) of --etcd-cert-file",
    "etcd-trusted-ca-file": "CA certificate (PEM) etcd's certificate must be signed by, "
    "instead of the system's CAs; any of these three files dials --etcd over TLS, as an "
    "https:// endpoint is",
}


def add_etcd_tls_flags(group: Any) -> None:
    """Add the etcd TLS flags to `group` (a parser or an argument group)."""
    for flag, text in _HELP.items():
        variable = ETCD_TLS_ENV[flag]
        group.add_argument(
            f"--{flag}",
            metavar="FILE",
            default=os.environ.get(variable) or None,
            help=f"{text} (env {variable})",
        )


def etcd_tls_of(args: argparse.Namespace) -> ClientTLS | None:
    """The etcd TLS of parsed `args`, its files checked; None if no file is given. Raises
    `GazctlError` (one line naming the flag and the file) if one cannot be used."""
    tls = etcd_tls(args.etcd_cert_file, args.etcd_cert_key_file, args.etcd_trusted_ca_file)
    if tls is not None:
        try:
            tls.check()
        except TLSConfigError as err:
            raise GazctlError(str(err)) from None
    return tls
