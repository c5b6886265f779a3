"""mainboilerplate.flags: the member flags, declared once, as each process names them."""

from __future__ import annotations

import argparse

import pytest

from gazette.auth.tls import ClientTLS
from gazette.mainboilerplate.flags import (
    ETCD_TLS_ENV,
    ETCD_TLS_HELP,
    MEMBER_FLAGS,
    DefaultsHelpFormatter,
    MemberConfig,
    MemberFlags,
)
from gazette.testing.certs import Certs

FLAGS = MemberFlags(
    env={
        "root": "T_ROOT",
        "zone": "T_ZONE",
        "suffix": "T_ID",
        "http-port": "T_HTTP_PORT",
        "lease-ttl": "T_LEASE_TTL",
        "drain-timeout": "T_DRAIN",
        **ETCD_TLS_ENV,
    },
    help={"root": "the root [T_ROOT]", **ETCD_TLS_HELP},
    no_http="0: none",
    lease_ttl_error="--lease-ttl too short: {value}",
)
DEFAULTS = MemberConfig(root="/t", suffix="member-1", http_port=8000, drain_timeout=9.0)


def parse(*argv: str) -> MemberConfig:
    p = argparse.ArgumentParser(prog="t")
    FLAGS.add(p, DEFAULTS, *MEMBER_FLAGS)
    a = p.parse_args(list(argv))
    FLAGS.check(p, a)
    return MemberConfig(**FLAGS.values(a))


@pytest.mark.parametrize(
    ("argv", "env", "want"),
    [
        ((), {}, {"root": "/t", "http_port": 8000, "lease_ttl": 20, "drain_timeout": 9.0}),
        ((), {"T_ROOT": "/e/", "T_HTTP_PORT": "81"}, {"root": "/e", "http_port": 81}),
        (("--root", "/f"), {"T_ROOT": "/e"}, {"root": "/f"}),  # Flags win.
        ((), {"T_LEASE_TTL": "7", "T_DRAIN": "0"}, {"lease_ttl": 7, "drain_timeout": 0.0}),
        (("--listen", "[::1]:9"), {}, {"listen": "[::1]:9", "endpoint": "http://[::1]:9"}),
        (
            (
                "--advertise",
                "https://a:1",
            ),
            {},
            {"endpoint": "https://a:1"},
        ),
        ((), {"ETCD_ADDRESS": "http://x:1"}, {"etcd": "http://127.0.0.1:2379"}),  # No env.
        (("--etcd", "http://a:1,b:2"), {}, {"etcd": "http://a:1,b:2"}),
        (("--etcd", "https://a:1"), {}, {"etcd": "https://a:1", "etcd_tls": None}),
    ],
)
def test_flags_then_environment_then_defaults(
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    env: dict[str, str],
    want: dict[str, object],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cfg = parse(*argv)
    assert {k: getattr(cfg, k) for k in want} == want


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (("--http-port", "70000"), "--http-port must be a port number (0: none), not 70000"),
        (("--lease-ttl", "1"), "--lease-ttl too short: 1"),
        (("--suffix", "ab"), "--zone/--suffix (T_ZONE/T_ID): Suffix: invalid length"),
        (("--http-port", "eighty"), "invalid int value: 'eighty'"),
        (("--etcd", "http://a:2379,,http://b:2379"), "--etcd: an empty etcd endpoint in"),
        (("--etcd", "http://a:x"), "--etcd: etcd endpoint 'http://a:x': invalid port"),
    ],
)
def test_invalid_values_exit_with_the_process_wording(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], error: str
) -> None:
    with pytest.raises(SystemExit) as exit:
        parse(*argv)
    assert exit.value.code == 2
    assert error in capsys.readouterr().err


def test_help_texts_are_the_process_own() -> None:
    p = argparse.ArgumentParser(prog="t")
    FLAGS.add(p, DEFAULTS, "root", "zone")
    text = p.format_help()
    assert "the root [T_ROOT]" in text
    assert text.index("--root") < text.index("--zone")


def test_etcd_tls_files_from_flags_or_environment(
    monkeypatch: pytest.MonkeyPatch, certs: Certs
) -> None:
    assert parse().etcd_tls is None
    monkeypatch.setenv("ETCD_TRUSTED_CA_FILE", str(certs.ca))
    monkeypatch.setenv("ETCD_CERT_FILE", "")  # Empty: none.
    cfg = parse(
        "--etcd-cert-file", str(certs.client_cert), "--etcd-cert-key-file", str(certs.client_key)
    )
    assert cfg.etcd_tls == ClientTLS(certs.ca, certs.client_cert, certs.client_key)
    assert parse("--etcd-trusted-ca-file", str(certs.wrong_ca)).etcd_tls == ClientTLS(
        certs.wrong_ca
    )


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        ({"--etcd-trusted-ca-file": "missing.pem"}, "--etcd-trusted-ca-file missing.pem: cannot"),
        ({"--etcd-trusted-ca-file": "client_key"}, "--etcd-trusted-ca-file {client_key}: no PEM"),
        ({"--etcd-cert-file": "client_cert"}, "--etcd-cert-file is given without --etcd-cert-key"),
        (
            {"--etcd-cert-file": "client_cert", "--etcd-cert-key-file": "server_key"},
            "--etcd-cert-key-file {server_key}: not the key of --etcd-cert-file {client_cert}",
        ),
    ],
)
def test_unusable_etcd_tls_files_are_one_line_usage_errors(
    capsys: pytest.CaptureFixture[str], certs: Certs, flags: dict[str, str], error: str
) -> None:
    files = {
        name: str(getattr(certs, name)) for name in ("client_cert", "client_key", "server_key")
    }
    argv = [arg for flag, name in flags.items() for arg in (flag, files.get(name, name))]
    with pytest.raises(SystemExit) as exit:
        parse(*argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("t: error: ")
    assert error.format(**files) in err


def test_etcd_tls_flags_in_help(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETCD_CERT_KEY_FILE", "/etc/etcd/key.pem")
    p = argparse.ArgumentParser(prog="t", formatter_class=DefaultsHelpFormatter)
    FLAGS.add(p, DEFAULTS, *MEMBER_FLAGS)
    text = " ".join(p.format_help().split())
    assert "--etcd-cert-file FILE TLS certificate (PEM) presented to etcd" in text
    assert "[ETCD_TRUSTED_CA_FILE]" in text
    assert "[ETCD_CERT_KEY_FILE] (default: /etc/etcd/key.pem)" in text
    assert text.index("--etcd ") < text.index("--etcd-cert-file") < text.index("--root")
