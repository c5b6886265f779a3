"""HMAC-signed JSON Web Tokens (RFC 7519, compact JWS of RFC 7515), as upstream Gazette signs
and verifies them: HS256 to sign, HS256 or HS384 accepted, ``exp`` required, ``iat`` and ``nbf``
checked, five seconds of leeway for clocks that differ.

Only what Gazette's authorization needs is here, with the standard library: no ``none``
algorithm, no asymmetric keys. Rejected: PyJWT, a dependency for about sixty lines, whose
error texts we would translate anyway.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Sequence

from gazette.auth.claims import Claims, ClaimsError, decode_claims, encode_claims

__all__ = ["LEEWAY", "TokenError", "check_times", "sign", "verify", "verify_signature"]

LEEWAY = 5
"""Seconds by which ``exp``, ``iat`` and ``nbf`` may be off (clock skew)."""

_HEADER = b'{"alg":"HS256","typ":"JWT"}'
_DIGESTS = {"HS256": hashlib.sha256, "HS384": hashlib.sha384}


class TokenError(Exception):
    """A token is malformed, wrongly signed, expired, or not yet valid; the message says
    which (never the token or a key)."""


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def _unb64(part: str, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise TokenError(f"token is malformed: its {what} is not base64url") from None


def sign(claims: Claims, key: bytes) -> str:
    """The HS256 token of `claims` signed with `key`."""
    signing_input = _b64(_HEADER) + b"." + _b64(encode_claims(claims))
    mac = hmac.new(key, signing_input, hashlib.sha256).digest()
    return (signing_input + b"." + _b64(mac)).decode()


def verify(token: str, keys: Sequence[bytes], now: float | None = None) -> Claims:
    """The claims of `token` if one of `keys` signed it and it is valid at `now` (default:
    the current time). Raises TokenError saying what is wrong."""
    claims = verify_signature(token, keys)
    check_times(claims, time.time() if now is None else now)
    return claims


def verify_signature(token: str, keys: Sequence[bytes]) -> Claims:
    """The claims of `token` if one of `keys` signed it, whenever it is valid (`verify`
    checks that too). Raises TokenError saying what is wrong."""
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenError("token is malformed: it is not three dot-separated parts")
    try:
        header = json.loads(_unb64(parts[0], "header"))
    except ValueError:
        raise TokenError("token is malformed: its header is not JSON") from None
    alg = header.get("alg") if isinstance(header, dict) else None
    digest = _DIGESTS.get(alg) if isinstance(alg, str) else None
    if digest is None:
        raise TokenError(f"token is signed with {alg!r}: only HS256 and HS384 are accepted")
    signing_input = f"{parts[0]}.{parts[1]}".encode()
    mac = _unb64(parts[2], "signature")
    if not any(hmac.compare_digest(hmac.new(k, signing_input, digest).digest(), mac) for k in keys):
        raise TokenError("token signature is invalid (signed with a key not configured here)")
    try:
        return decode_claims(_unb64(parts[1], "claims"))
    except ClaimsError as err:
        raise TokenError(f"token is malformed: {err}") from None


def check_times(claims: Claims, t: float) -> None:
    """Raise TokenError if `claims` are not valid at `t` (expired, issued in the future, not
    valid yet), or have no expiry."""
    if claims.expires_at is None:
        raise TokenError("token has no expiry (exp), which is required")
    if t > claims.expires_at + LEEWAY:
        raise TokenError(f"token is expired (for {int(t - claims.expires_at)}s)")
    if claims.issued_at is not None and claims.issued_at > t + LEEWAY:
        raise TokenError("token is issued in the future (iat): check the clocks")
    nbf = claims.registered.get("nbf")
    if nbf is not None and nbf > t + LEEWAY:
        raise TokenError("token is not valid yet (nbf)")
