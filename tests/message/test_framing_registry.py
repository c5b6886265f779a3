"""Looking framings up by content type, and by a journal's labels."""

from __future__ import annotations

import pytest

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.message import (
    CSV_FRAMING,
    JSON_FRAMING,
    PROTO_FIXED_FRAMING,
    FrameDecoder,
    Framing,
    UnknownFramingError,
    framing_for,
    framing_for_spec,
    known_content_types,
    register_framing,
)
from gazette.message import framing as framing_module


def test_builtins_registered() -> None:
    assert framing_for("application/x-ndjson") is JSON_FRAMING
    assert framing_for("text/csv") is CSV_FRAMING
    assert framing_for("application/x-protobuf-fixed") is PROTO_FIXED_FRAMING
    for f in (JSON_FRAMING, CSV_FRAMING, PROTO_FIXED_FRAMING):
        assert isinstance(f, Framing)
    assert {"application/x-ndjson", "text/csv", "application/x-protobuf-fixed"} <= set(
        known_content_types()
    )


def test_unknown_content_type_names_it_and_the_known_ones() -> None:
    with pytest.raises(UnknownFramingError) as info:
        framing_for("application/x-nope")
    text = str(info.value)
    assert "'application/x-nope'" in text
    assert "application/x-ndjson" in text and "text/csv" in text
    assert isinstance(info.value, LookupError)


def _spec(*labels: tuple[str, str]) -> pb.JournalSpec:
    return pb.JournalSpec(
        name="a/journal",
        labels=pb.LabelSet(labels=[pb.Label(name=n, value=v) for n, v in sorted(labels)]),
    )


def test_framing_for_spec() -> None:
    spec = _spec(("app", "x"), ("content-type", "text/csv"))
    assert framing_for_spec(spec) is CSV_FRAMING
    with pytest.raises(UnknownFramingError, match="'a/journal' has no 'content-type' label"):
        framing_for_spec(_spec(("app", "x")))
    with pytest.raises(UnknownFramingError, match="a/journal.*'text/nope'"):
        framing_for_spec(_spec(("content-type", "text/nope")))


class _Custom:
    content_type = "application/x-custom"

    def marshal(self, msg: object) -> bytes:
        return b""

    def unmarshal(self, payload: bytes, msg: object) -> None:
        pass

    def decoder(self, offset: int = 0) -> FrameDecoder:
        return JSON_FRAMING.decoder(offset)


def test_register_and_replace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(framing_module, "_registry", dict(framing_module._registry))
    custom = _Custom()
    register_framing(custom)
    assert framing_for("application/x-custom") is custom

    class Replacement(_Custom):
        content_type = "text/csv"

    replacement = Replacement()
    register_framing(replacement)
    assert framing_for("text/csv") is replacement
