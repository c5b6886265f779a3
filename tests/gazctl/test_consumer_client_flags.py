"""gazctl's shard commands take the consumer client's flags both as ours
(``--consumer-cert-file`` ...) and as upstream gazctl spells them (``--consumer.cert-file``
...), each read into the same settings."""

from __future__ import annotations

import base64

import pytest

from gazette.gazctl.consumers import consumer_client_settings
from gazette.gazctl.main import build_parser

KEY = base64.b64encode(b"gazctl flags").decode()


@pytest.mark.parametrize("spelling", ["consumer-", "consumer."])
@pytest.mark.parametrize("command", ["list", "apply", "edit", "unassign"])
def test_consumer_client_flags_take_both_spellings(
    spelling: str, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("CONSUMER_CERT_FILE", "CONSUMER_AUTH_KEYS", "CONSUMER_AUTH_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    files = ["cert-file", "/c.pem", "cert-key-file", "/k.pem", "trusted-ca-file", "/ca.pem"]
    argv = ["shards", command]
    argv += [f"--{spelling}{w}" if i % 2 == 0 else w for i, w in enumerate(files)]
    if command in ("edit", "unassign"):
        argv += ["--selector", "id=a"]

    settings = consumer_client_settings(
        build_parser().parse_args([*argv, f"--{spelling}auth-token", "tok"])
    )
    assert (settings.cert_file, settings.cert_key_file, settings.trusted_ca_file) == (
        "/c.pem",
        "/k.pem",
        "/ca.pem",
    )
    assert settings.auth_token == "tok"

    settings = consumer_client_settings(
        build_parser().parse_args([*argv, f"--{spelling}auth-keys", KEY])
    )
    assert settings.auth_keys == KEY and not settings.auth_token


def test_help_names_both_spellings(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["shards", "list", "--help"])
    out = capsys.readouterr().out
    for name in ("cert-file", "cert-key-file", "trusted-ca-file", "auth-keys", "auth-token"):
        assert f"--consumer-{name}" in out and f"--consumer.{name}" in out
