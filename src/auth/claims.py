"""What an authorization grants: a capability bit-mask over the journals (or shards) a label
selector matches, as upstream Gazette's `protocol.Claims`.

A token's claims are JSON: ``cap`` (the mask), ``sel`` (the selector as upstream's Go structs
encode it: ``{"include": {"labels": [...]}, "exclude": {"labels": null}}``), and JWT's
registered claims (``exp``, ``iat``, ``nbf`` ...). `encode_claims` writes them in upstream's
field order, so that a token we sign and one upstream signs for the same claims are the same
bytes (tests/auth pins this).

Capabilities: LIST, APPLY, READ, APPEND and REPLICATE are the brokers' and consumers'; bits from
1 << 16 are the applications' own. A selector with empty include and exclude matches
everything; a journal is matched by its labels plus its meta-labels (``name``, ``prefix``), a
shard by its labels plus ``id``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.selector import matches

__all__ = [
    "ALL",
    "APPEND",
    "APPLY",
    "LIST",
    "READ",
    "REPLICATE",
    "Claims",
    "ClaimsError",
    "capability_names",
    "decode_claims",
    "encode_claims",
    "name_selector",
]

LIST = 1 << 1
APPLY = 1 << 2
READ = 1 << 3
APPEND = 1 << 4
REPLICATE = 1 << 5
ALL = 0xFFFFFFFF
"""Every capability, the applications' included."""

_NAMES: tuple[tuple[str, int], ...] = (
    ("LIST", LIST),
    ("APPLY", APPLY),
    ("READ", READ),
    ("APPEND", APPEND),
    ("REPLICATE", REPLICATE),
)


class ClaimsError(ValueError):
    """A token's claims are not upstream's shape."""


def capability_names(mask: int) -> str:
    """`mask` in words: ``READ|APPEND``, application bits as ``1<<16``; ``ALL``; ``none``."""
    if mask == ALL:
        return "ALL"
    names = [n for n, bit in _NAMES if mask & bit]
    names += [
        f"1<<{i}" for i in range(32) if mask & (1 << i) and not any(b == 1 << i for _, b in _NAMES)
    ]
    return "|".join(names) or "none"


@dataclass(frozen=True)
class Claims:
    """A grant of `capability` over what `selector` matches, valid from `issued_at` until
    `expires_at` (seconds since the epoch; None when absent). `registered` keeps the token's
    other registered claims (``iss``, ``sub``, ``aud``, ``nbf``, ``jti``) as they were."""

    capability: int
    selector: pb.LabelSelector = field(default_factory=pb.LabelSelector)
    issued_at: int | None = None
    expires_at: int | None = None
    registered: Mapping[str, Any] = field(default_factory=dict)

    def covers(self, labels: pb.LabelSet) -> bool:
        """Whether the selector matches a resource of `labels` (with its meta-labels)."""
        return matches(self.selector, labels)

    def lacks(self, require: int) -> str | None:
        """Why these claims do not grant `require`, or None if they do."""
        if self.capability & require == require:
            return None
        for name, bit in _NAMES:
            if require & bit and not self.capability & bit:
                return f"authorization is missing required {name} capability"
        have, want = capability_names(self.capability), capability_names(require)
        return f"authorization is missing required capability (have {have}, but require {want})"


def name_selector(label: str, value: str) -> pb.LabelSelector:
    """A selector matching exactly the resource whose `label` (``name``, ``id``) is `value`."""
    return pb.LabelSelector(include=pb.LabelSet(labels=[pb.Label(name=label, value=value)]))


# Registered claims in the order golang-jwt's RegisteredClaims struct declares them.
_REGISTERED = ("iss", "sub", "aud", "exp", "nbf", "iat", "jti")


def _label_json(label: pb.Label) -> dict[str, Any]:
    out: dict[str, Any] = {"name": label.name} if label.name else {}
    if label.value:
        out["value"] = label.value
    if label.prefix:
        out["prefix"] = True
    return out


def _set_json(labels: pb.LabelSet) -> dict[str, Any]:
    return {"labels": [_label_json(lb) for lb in labels.labels] or None}


def encode_claims(claims: Claims) -> bytes:
    """The JSON payload of a token of `claims`, byte for byte as upstream encodes it."""
    body: dict[str, Any] = {
        "cap": claims.capability,
        "sel": {
            "include": _set_json(claims.selector.include),
            "exclude": _set_json(claims.selector.exclude),
        },
    }
    registered = dict(claims.registered)
    if claims.expires_at is not None:
        registered["exp"] = claims.expires_at
    if claims.issued_at is not None:
        registered["iat"] = claims.issued_at
    for name in _REGISTERED:
        if registered.get(name) is not None:
            body[name] = registered[name]
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    # Go's encoder escapes these inside strings (where alone they can occur here).
    for ch, esc in _GO_ESCAPES:
        text = text.replace(ch, esc)
    return text.encode()


_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def _labels_from(obj: Any, where: str) -> pb.LabelSet:
    if obj is None:
        return pb.LabelSet()
    if not isinstance(obj, dict):
        raise ClaimsError(f"claims field {where} is not an object")
    items = obj.get("labels") or []
    if not isinstance(items, list):
        raise ClaimsError(f"claims field {where}.labels is not a list")
    out = pb.LabelSet()
    for item in items:
        if not isinstance(item, dict):
            raise ClaimsError(f"claims field {where}.labels holds a non-object")
        name, value, prefix = item.get("name", ""), item.get("value", ""), item.get("prefix", False)
        if not isinstance(name, str) or not isinstance(value, str) or not isinstance(prefix, bool):
            raise ClaimsError(f"claims field {where}.labels holds a malformed label")
        out.labels.add(name=name, value=value, prefix=prefix)
    return out


def _time(obj: Any, name: str) -> int | None:
    if obj is None:
        return None
    if isinstance(obj, bool) or not isinstance(obj, int | float):
        raise ClaimsError(f"claims field {name} is not a number")
    return int(obj)


def decode_claims(payload: bytes) -> Claims:
    """The claims of a token's JSON `payload`; ClaimsError if it is not upstream's shape."""
    try:
        body = json.loads(payload)
    except ValueError as err:
        raise ClaimsError(f"claims are not JSON: {err}") from None
    if not isinstance(body, dict):
        raise ClaimsError("claims are not a JSON object")
    cap = body.get("cap", 0)
    if isinstance(cap, bool) or not isinstance(cap, int) or not 0 <= cap <= ALL:
        raise ClaimsError("claims field cap is not a 32-bit capability mask")
    sel = body.get("sel") or {}
    if not isinstance(sel, dict):
        raise ClaimsError("claims field sel is not an object")
    selector = pb.LabelSelector()
    for part in ("include", "exclude"):
        labels = _labels_from(sel.get(part), f"sel.{part}")
        if labels.labels:
            getattr(selector, part).CopyFrom(labels)
    registered = {k: body[k] for k in _REGISTERED if k in body and k not in ("exp", "iat")}
    _time(registered.get("nbf"), "nbf")
    return Claims(
        capability=cap,
        selector=selector,
        issued_at=_time(body.get("iat"), "iat"),
        expires_at=_time(body.get("exp"), "exp"),
        registered=registered,
    )
