"""Claims, tokens and keys (gazette.auth): upstream's JSON shape byte for byte, RFC 7515's
HS256 example, every refusal with its reason, and key rotation."""

from __future__ import annotations

import base64
import json
import time

import pytest

from gazette.auth.claims import (
    ALL,
    APPEND,
    APPLY,
    LIST,
    READ,
    REPLICATE,
    Claims,
    capability_names,
    decode_claims,
    encode_claims,
    name_selector,
)
from gazette.auth.jwt import TokenError, sign, verify
from gazette.auth.keys import AuthError, BearerAuth, KeyedAuth, NoAuth, parse_keys
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.labels import label_set

SECRET = base64.b64encode(b"secret").decode()  # "c2VjcmV0", upstream's test default
OTHER = base64.b64encode(b"other key").decode()


def test_capabilities_are_upstreams_bits() -> None:
    assert (LIST, APPLY, READ, APPEND, REPLICATE) == (2, 4, 8, 16, 32)
    assert capability_names(READ | APPEND | (1 << 16)) == "READ|APPEND|1<<16"
    assert capability_names(ALL) == "ALL" and capability_names(0) == "none"


def test_claims_json_is_what_upstreams_go_structs_encode() -> None:
    claims = Claims(APPEND | READ, name_selector("name", "a/b<c>"), 1700000000, 1700003600)
    # Go: fields in struct order (cap, sel, then RegisteredClaims' exp, iat), a nil label
    # slice as null, HTML characters escaped.
    assert encode_claims(claims) == (
        b'{"cap":24,"sel":{"include":{"labels":[{"name":"name","value":"a/b\\u003cc\\u003e"}]},'
        b'"exclude":{"labels":null}},"exp":1700003600,"iat":1700000000}'
    )
    back = decode_claims(encode_claims(claims))
    assert back == claims
    prefix = pb.LabelSelector(
        exclude=pb.LabelSet(labels=[pb.Label(name="name", value="x/", prefix=True)])
    )
    wire = encode_claims(Claims(LIST, prefix))
    assert wire == (
        b'{"cap":2,"sel":{"include":{"labels":null},'
        b'"exclude":{"labels":[{"name":"name","value":"x/","prefix":true}]}}}'
    )
    assert decode_claims(wire).selector == prefix
    # What upstream omits or leaves null decodes too.
    assert decode_claims(b'{"cap":8,"exp":5}') == Claims(READ, pb.LabelSelector(), None, 5)


@pytest.mark.parametrize(
    "payload,error",
    [
        (b"[1]", "not a JSON object"),
        (b'{"cap":-1}', "32-bit capability mask"),
        (b'{"cap":true}', "32-bit capability mask"),
        (b'{"cap":1,"sel":{"include":{"labels":[{"name":1}]}}}', "malformed label"),
        (b'{"cap":1,"exp":"soon"}', "exp is not a number"),
    ],
)
def test_malformed_claims_are_refused(payload: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        decode_claims(payload)


def test_rfc7515_hs256_example_verifies() -> None:
    key = base64.urlsafe_b64decode(
        "AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow=="
    )
    token = (
        "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9"
        ".eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ"
        ".dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    )
    claims = verify(token, [key], now=1300819370)
    assert claims.expires_at == 1300819380 and claims.registered["iss"] == "joe"
    with pytest.raises(TokenError, match="expired"):
        verify(token, [key], now=1300819380 + 6)
    with pytest.raises(TokenError, match="signature is invalid"):
        verify(token, [b"another"], now=1300819370)


def test_signed_token_layout_and_refusals() -> None:
    now = int(time.time())
    token = sign(Claims(READ, pb.LabelSelector(), now, now + 60), b"secret")
    head, body, _ = token.split(".")
    assert json.loads(base64.urlsafe_b64decode(head + "==")) == {"alg": "HS256", "typ": "JWT"}
    assert verify(token, [b"k2", b"secret"]).capability == READ

    cases = [
        ("a.b", "three dot-separated parts"),
        (
            token.replace(head, base64.urlsafe_b64encode(b'{"alg":"none"}').decode().rstrip("=")),
            "'none'",
        ),
        (sign(Claims(READ, pb.LabelSelector(), now), b"secret"), "no expiry"),
        (
            sign(Claims(READ, pb.LabelSelector(), now + 60, now + 120), b"secret"),
            "issued in the future",
        ),
        (
            sign(Claims(READ, pb.LabelSelector(), now, now + 60, {"nbf": now + 30}), b"secret"),
            "not valid yet",
        ),
        (token.replace(head, base64.urlsafe_b64encode(b"{no").decode().rstrip("=")), "not JSON"),
    ]
    for bad, error in cases:
        with pytest.raises(TokenError, match=error):
            verify(bad, [b"secret"])
    # Within the leeway, an expired token still passes (clocks differ by a few seconds).
    assert verify(sign(Claims(READ, pb.LabelSelector(), now - 60, now - 3), b"secret"), [b"secret"])


def test_keys_parse_rotate_and_allow_missing_during_rollout() -> None:
    assert parse_keys(f"{SECRET}, {OTHER}\n") == ([b"secret", b"other key"], False)
    assert parse_keys(f"{SECRET} AA==") == ([b"secret"], True)
    for bad, error in (
        ("AA==", "at least one"),
        ("", "at least one"),
        (f"{SECRET} ***", "index 1"),
    ):
        with pytest.raises(ValueError, match=error):
            parse_keys(bad)

    # Rotation: the new key is added second everywhere, then moved first, then the old goes.
    old, both, new = (
        KeyedAuth(SECRET),
        KeyedAuth(f"{SECRET} {OTHER}"),
        KeyedAuth(f"{OTHER} {SECRET}"),
    )
    value = old.authorization(Claims(READ | LIST, name_selector("name", "a/b")), 60)
    assert new.verify(value, READ).covers(label_set(("name", "a/b")))
    assert not new.verify(value, READ).covers(label_set(("name", "a/c")))
    assert both.verify(new.authorization(Claims(READ), 60), READ).capability == READ
    with pytest.raises(AuthError, match="signature is invalid"):
        KeyedAuth(OTHER).verify(value, READ)

    with pytest.raises(AuthError, match="missing required APPEND capability"):
        old.verify(value, APPEND)
    with pytest.raises(
        AuthError, match=r"missing required capability \(have LIST\|READ, but require 1<<16\)"
    ):
        old.verify(value, 1 << 16)
    with pytest.raises(AuthError, match="missing or empty"):
        old.verify(None, READ)
    with pytest.raises(AuthError, match="expected 'Bearer'"):
        old.verify("Basic xyz", READ)
    rollout = KeyedAuth(f"{SECRET},AA==")
    assert rollout.verify(None, APPEND).capability == APPEND
    with pytest.raises(AuthError, match="signature is invalid"):  # a token given is still checked
        rollout.verify(KeyedAuth(OTHER).authorization(Claims(READ), 60), READ)


def test_tokens_are_reused_until_half_their_life() -> None:
    auth = KeyedAuth(SECRET)
    claims = Claims(READ, name_selector("name", "a"))
    first = auth.authorization(claims, 60)
    assert auth.authorization(claims, 60) == first
    assert auth.authorization(Claims(READ, name_selector("name", "b")), 60) != first
    assert auth.authorization(claims, 0.001) != first  # another lifetime, another token


def test_verified_tokens_are_kept_and_still_checked_at_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A token verified once is not decoded nor its signature computed again; its expiry and
    the capability a call needs are still checked at every call; another key's token, or a
    token altered, is verified (and refused) afresh."""
    from gazette.auth import keys

    signed: list[str] = []
    real = keys.verify_signature

    def counting(token: str, ks: list[bytes]) -> Claims:
        signed.append(token)
        return real(token, ks)

    monkeypatch.setattr(keys, "verify_signature", counting)
    verifier = KeyedAuth(SECRET)
    now = int(time.time())
    token = sign(Claims(READ, name_selector("name", "a"), now, now + 60), b"secret")
    for _ in range(3):
        assert verifier.verify(f"Bearer {token}", READ).capability == READ
    assert len(signed) == 1
    with pytest.raises(AuthError, match="missing required APPEND capability"):
        verifier.verify(f"Bearer {token}", APPEND)
    altered = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")
    with pytest.raises(AuthError, match="signature is invalid"):
        verifier.verify(f"Bearer {altered}", READ)
    with pytest.raises(AuthError, match="signature is invalid"):
        verifier.verify(KeyedAuth(OTHER).authorization(Claims(READ), 60), READ)
    assert len(signed) == 3

    later = now + 60 + 6  # past the expiry and its leeway
    monkeypatch.setattr(keys.time, "time", lambda: float(later))
    with pytest.raises(AuthError, match="token is expired"):
        verifier.verify(f"Bearer {token}", READ)
    assert len(signed) == 3


def test_bearer_and_no_auth() -> None:
    assert BearerAuth(" tok ").authorization(Claims(READ), 60) == "Bearer tok"
    with pytest.raises(ValueError, match="empty"):
        BearerAuth(" ")
    assert NoAuth().authorization(Claims(READ), 60) is None
    assert NoAuth().verify(None, APPEND).capability == ALL
