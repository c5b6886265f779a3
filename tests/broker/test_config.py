"""Process identity defaults of the broker's and consumer's configuration."""

from __future__ import annotations

import socket

import pytest

from gazette.broker.config import default_suffix
from gazette.broker.config import parse_args as broker_args
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.validation import validate_process_id
from gazette.consumer.config import parse_args as consumer_args


@pytest.mark.parametrize(
    ("hostname", "want"),
    [
        ("worker-12.example.com", "worker-12.example.com"),
        ("vm", "vm-host"),  # Too short for a suffix (4..128): padded, not refused.
        ("abc", "abc-host"),
        ("", "host"),
        ("h\u00e9te l", "h-te-l"),  # Characters outside the token symbols become '-'.
        ("x" * 200, "x" * 128),
    ],
)
def test_default_suffix_is_the_host_name_made_valid(hostname: str, want: str) -> None:
    assert default_suffix(hostname) == want
    validate_process_id(pb.ProcessSpec.ID(zone="local", suffix=want))


def test_a_short_host_name_starts_both_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Upstream refuses to start on such a host unless --suffix is given; we don't.
    monkeypatch.setattr(socket, "gethostname", lambda: "vm")
    monkeypatch.delenv("BROKER_ID", raising=False)
    monkeypatch.delenv("CONSUMER_ID", raising=False)
    assert broker_args([]).suffix == "vm-host"
    assert consumer_args(["mod:App"]).suffix == "vm-host"


def test_an_explicit_suffix_is_validated_not_changed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert broker_args(["--suffix", "my-broker"]).suffix == "my-broker"
    monkeypatch.setenv("CONSUMER_ID", "c1")
    with pytest.raises(SystemExit) as exit:
        consumer_args(["mod:App"])
    assert exit.value.code == 2
    assert "Suffix" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        broker_args(["--suffix", "ab"])
    assert "Suffix" in capsys.readouterr().err


def test_direct_port_defaults_to_a_free_port_and_is_checked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert broker_args([]).direct_port == 0
    assert broker_args(["--direct-port", "-1"]).direct_port == -1
    monkeypatch.setenv("BROKER_DIRECT_PORT", "9123")
    assert broker_args([]).direct_port == 9123
    with pytest.raises(SystemExit):
        broker_args(["--direct-port", "70000"])
    assert "--direct-port must be a port number" in capsys.readouterr().err


def test_hole_wait_defaults_and_is_checked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert broker_args([]).hole_wait == 30.0
    assert broker_args(["--hole-wait", "0"]).hole_wait == 0.0
    monkeypatch.setenv("BROKER_HOLE_WAIT", "5")
    assert broker_args([]).hole_wait == 5.0
    with pytest.raises(SystemExit):
        broker_args(["--hole-wait", "-1"])
    assert "--hole-wait must be >= 0" in capsys.readouterr().err
