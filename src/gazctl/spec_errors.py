"""Spec validation errors in the words of the YAML a user wrote.

The validators of journal and shard specs follow upstream's, whose errors name Go fields
(``Fragment.CompressionCodec``, ``RefreshInterval``, ``Labels[0].Name``). gazctl users write
YAML keys (``fragment.compression_codec``): `in_yaml_terms` rewrites an error's field path
and the field names in its message to those keys. Quoted values in a message are left as
they are.
"""

from __future__ import annotations

import re

from google.protobuf.descriptor import Descriptor

from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.broker.protocol.errors import ValidationError
from gazette.consumer.protocol import pb as cpb

__all__ = ["in_yaml_terms"]


def _go_name(field: str) -> str:
    return "".join(part.capitalize() for part in field.split("_"))


def _names(*descriptors: Descriptor) -> dict[str, str]:
    out = {_go_name(f.name): f.name for d in descriptors for f in d.fields}
    out["LabelSet"] = "labels"  # Upstream's context for a shard's (embedded) labels.
    return out


_YAML_KEYS = _names(
    bpb.JournalSpec.DESCRIPTOR,
    bpb.JournalSpec.Fragment.DESCRIPTOR,
    bpb.JournalSpec.Suspend.DESCRIPTOR,
    bpb.LabelSet.DESCRIPTOR,
    bpb.Label.DESCRIPTOR,
    cpb.ShardSpec.DESCRIPTOR,
    cpb.ShardSpec.Source.DESCRIPTOR,
)
"""Go field name -> YAML key, of the fields of journal and shard specs."""

# A quoted value (left alone), or a capitalised word that may be a Go field name.
_WORD = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\b[A-Z][A-Za-z]*\b""")
_INDEXED = re.compile(r"^([A-Za-z_]+)(\[.*\])?$")


def _key(component: str) -> tuple[str, str]:
    """(base, index suffix) of a path component, the base as a YAML key if it is a field."""
    m = _INDEXED.match(component)
    if m is None:
        return component, ""
    return _YAML_KEYS.get(m.group(1), m.group(1)), m.group(2) or ""


def _path(context: list[str]) -> str:
    parts = [_key(c) for c in context]
    out = []
    for i, (base, index) in enumerate(parts):
        # ``Labels.Labels[0]`` (a LabelSet's field within the spec's) reads ``labels[0]``.
        if not index and i + 1 < len(parts) and parts[i + 1][0] == base and parts[i + 1][1]:
            continue
        out.append(base + index)
    return ".".join(out)


def _message(message: str) -> str:
    def word(m: re.Match[str]) -> str:
        text = m.group(0)
        return text if text[0] in "'\"" else _YAML_KEYS.get(text, text)

    return _WORD.sub(word, message)


def in_yaml_terms(err: ValidationError, subject: str) -> ValidationError:
    """`err`, from validating the spec of `subject` (e.g. ``journal a/b``), with YAML keys
    for Go field names: ``journal a/b: fragment.length: invalid value (...)``."""
    path = _path(err.context)
    message = _message(err.message)
    return ValidationError(f"{path}: {message}" if path else message, [subject])
