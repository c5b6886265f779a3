"""mainboilerplate.flags: the member flags, declared once, as each process names them."""

from __future__ import annotations

import argparse

import pytest

from gazette.mainboilerplate.flags import MEMBER_FLAGS, MemberConfig, MemberFlags

FLAGS = MemberFlags(
    env={
        "root": "T_ROOT",
        "zone": "T_ZONE",
        "suffix": "T_ID",
        "http-port": "T_HTTP_PORT",
        "lease-ttl": "T_LEASE_TTL",
        "drain-timeout": "T_DRAIN",
    },
    help={"root": "the root [T_ROOT]"},
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
        (("--etcd", "https://a:2379"), "--etcd: etcd endpoint 'https://a:2379': TLS"),
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
