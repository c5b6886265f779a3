"""Who signs and who verifies: pre-shared keys (`KeyedAuth`), a token given as it is
(`BearerAuth`), or nothing (`NO_AUTH`).

``--auth-keys`` holds base64 keys separated by whitespace or commas: the first signs, any
verifies, so a key is rotated by adding the new one second, then moving it first, then
dropping the old. The special key ``AA==`` (one zero byte) lets requests without a token
through, with every capability, for rolling authorization out on a running cluster.

An `Authorizer` makes the ``authorization`` value a call carries for some claims; a
`Verifier` turns the value a call carried into the claims it grants, or an `AuthError`.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from typing import Protocol

from gazette.auth.claims import ALL, Claims
from gazette.auth.jwt import TokenError, check_times, sign, verify_signature
from gazette.broker.protocol import protocol_pb2 as pb

__all__ = [
    "ALLOW_MISSING",
    "NO_AUTH",
    "AuthError",
    "Authorizer",
    "BearerAuth",
    "KeyedAuth",
    "NoAuth",
    "Verifier",
    "parse_keys",
]

ALLOW_MISSING = "AA=="
"""The key that lets calls without a token through (during a roll-out)."""

_BEARER = "Bearer "


class AuthError(Exception):
    """A call's authorization is refused; the message says why (never a token or a key)."""


class Authorizer(Protocol):
    """Makes the ``authorization`` metadata value of a call needing `claims`."""

    def authorization(self, claims: Claims, ttl: float) -> str | None:
        """``Bearer <token>`` granting `claims` for `ttl` seconds (or None: send none)."""
        ...


class Verifier(Protocol):
    """Checks a call's ``authorization`` value."""

    def verify(self, authorization: str | None, require: int) -> Claims:
        """The claims `authorization` grants if they include `require`; else AuthError."""
        ...


def parse_keys(text: str) -> tuple[list[bytes], bool]:
    """The keys of an ``--auth-keys`` value, and whether ``AA==`` is among them. ValueError
    (naming the key's index, not the key) if one is not base64, or if none is given."""
    keys, allow_missing = [], False
    for i, word in enumerate(re.split(r"[\s,]+", text.strip())):
        if not word:
            continue
        if word == ALLOW_MISSING:
            allow_missing = True
            continue
        try:
            keys.append(base64.b64decode(word, validate=True))
        except (binascii.Error, ValueError):
            raise ValueError(f"auth key at index {i} is not base64") from None
    if not keys:
        raise ValueError("at least one auth key must be given (besides AA==)")
    return keys, allow_missing


VERIFIED_CACHE = 1024
"""Tokens a `KeyedAuth` keeps the verified claims of (then it forgets them all)."""


class KeyedAuth:
    """Signs with the first of pre-shared `keys` and verifies with any (module docs).

    Tokens are reused while more than half of their lifetime remains, so that a busy client
    does not sign every call. So the verifier keeps the claims of the tokens it verified:
    a token seen again (each append of a stream of them, each call of a client) is not
    decoded and its signature not computed again, while its expiry and the capability the
    call needs are checked at every call, as for a new token."""

    def __init__(self, text: str) -> None:
        self.keys, self.allow_missing = parse_keys(text)
        self._cache: dict[tuple[int, bytes, float], tuple[str, float]] = {}
        self._verified: dict[str, Claims] = {}

    def authorization(self, claims: Claims, ttl: float) -> str:
        key = (claims.capability, claims.selector.SerializeToString(deterministic=True), ttl)
        now = time.time()
        hit = self._cache.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        issued = int(now)
        token = sign(
            Claims(claims.capability, claims.selector, issued, issued + max(int(ttl), 1)),
            self.keys[0],
        )
        value = _BEARER + token
        if len(self._cache) > 1024:
            self._cache.clear()
        self._cache[key] = (value, now + ttl / 2)
        return value

    def verify(self, authorization: str | None, require: int) -> Claims:
        if not authorization:
            if self.allow_missing:
                return Claims(require, pb.LabelSelector(), None, int(time.time()) + 3600)
            raise AuthError("missing or empty authorization token")
        if not authorization.startswith(_BEARER):
            raise AuthError("invalid or unsupported authorization header (expected 'Bearer')")
        token = authorization[len(_BEARER) :]
        try:
            claims = self._verified.get(token) or self._verify_signature(token)
            check_times(claims, time.time())
        except TokenError as err:
            raise AuthError(f"verifying authorization: {err}") from None
        missing = claims.lacks(require)
        if missing is not None:
            raise AuthError(missing)
        return claims

    def _verify_signature(self, token: str) -> Claims:
        claims = verify_signature(token, self.keys)
        if len(self._verified) >= VERIFIED_CACHE:
            self._verified.clear()
        self._verified[token] = claims
        return claims


class BearerAuth:
    """Sends one `token` (issued elsewhere) with every call, whatever it needs."""

    def __init__(self, token: str) -> None:
        if not token.strip():
            raise ValueError("the auth token is empty")
        self._value = _BEARER + token.strip()

    def authorization(self, claims: Claims, ttl: float) -> str:
        return self._value


class NoAuth:
    """Sends nothing and lets everything through (authorization is off)."""

    def authorization(self, claims: Claims, ttl: float) -> None:
        return None

    def verify(self, authorization: str | None, require: int) -> Claims:
        return Claims(ALL, pb.LabelSelector())


NO_AUTH = NoAuth()
"""Authorization off: the default of every server and client."""
