"""The authorization flags of our commands, named as upstream names them.

Servers take ``--auth-keys`` (``<PREFIX>AUTH_KEYS``): they verify calls with the keys, and sign
their own calls to peers with the first. Clients take ``--auth-keys`` to sign their calls, or
``--auth-token`` (``<PREFIX>AUTH_TOKEN``) to send a token issued elsewhere. Neither flag shows
its value in ``--help``, and a bad key is a usage error naming its index, never the key.
"""

from __future__ import annotations

import argparse
import os

from gazette.auth.keys import NO_AUTH, BearerAuth, KeyedAuth, NoAuth

__all__ = ["add_auth_flags", "auth_from_args"]


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
    keys = a.auth_keys if a.auth_keys is not None else os.environ.get(f"{prefix}AUTH_KEYS", "")
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
