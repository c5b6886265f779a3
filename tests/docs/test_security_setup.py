"""docs/security.md's "Setting it up", run: its ``sh setup`` blocks make a CA, a broker's and
a client's certificates and a key with openssl (for ``localhost`` and 127.0.0.1 in place of
the page's host), a real broker serves TLS with them, asks for client certificates and
verifies tokens signed with the key, and the page's gazctl command lists its journals. Every
flag of the page's ``sh example`` command lines is one its program declares."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer

PAGE = Path(__file__).resolve().parents[2] / "docs" / "security.md"
BIN = Path(sys.executable).parent
HOSTS = {"broker-1.example.com": "localhost", "10.0.0.5": "127.0.0.1"}
PROGRAMS = {
    "gazette-broker": [sys.executable, "-m", "gazette.broker.main"],
    "gazette-consumer": [sys.executable, "-m", "gazette.consumer.main"],
    "gazctl": [str(BIN / "gazctl")],
}


def _blocks(role: str) -> list[str]:
    text = PAGE.read_text()
    return re.findall(rf"^```sh {role}\n(.*?)^```$", text, flags=re.M | re.S)


def _bash(script: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"{script}\n{run.stdout}\n{run.stderr}"
    return run.stdout


def _gazctl_example() -> str:
    (line,) = [b for b in _blocks("example") if "gazctl " in b]
    return line


def test_the_setup_serves_a_secured_broker(etcd_server: EtcdServer, tmp_path: Path) -> None:
    setup = "\n".join(_blocks("setup"))
    assert "openssl req -x509" in setup
    for name, local in HOSTS.items():
        setup = setup.replace(name, local)
    _bash(setup, tmp_path)
    key = (tmp_path / "auth-keys").read_text().strip()
    assert len(key) == 44  # 32 bytes, base64

    broker = BrokerProcess(
        etcd_server.endpoint,
        root=f"/test-security-setup/{os.getpid()}",
        spool_dir=tmp_path / "spool",
        extra_env={"BROKER_AUTH_KEYS": key},
        extra_args=[
            "--server-cert-file", str(tmp_path / "broker-1.pem"),
            "--server-cert-key-file", str(tmp_path / "broker-1-key.pem"),
            "--server-ca-file", str(tmp_path / "ca.pem"),
        ],
    )  # fmt: skip
    with broker:
        command = _gazctl_example().replace(
            "https://broker-1.example.com:8080", f"https://{broker.endpoint}"
        )
        assert f"https://{broker.endpoint}" in command
        _bash(command, tmp_path)  # No journals, and no error.

        without_cert = re.sub(r"--cert-file \S+ --cert-key-file \S+", "", command)
        run = subprocess.run(
            ["bash", "-c", without_cert],
            cwd=tmp_path,
            env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode != 0, "a client without a certificate was let in"


@pytest.mark.parametrize("block", _blocks("example"), ids=lambda b: b.split()[1])
def test_example_flags_are_the_programs_own(block: str) -> None:
    words = shlex.split(block.replace("\\\n", " "))
    (program,) = [w for w in words if w in PROGRAMS]
    argv = PROGRAMS[program] + (["journals", "list"] if program == "gazctl" else [])
    helped = subprocess.run(
        [*argv, "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    flags = {w for w in words if w.startswith("--")}
    assert flags
    missing = [f for f in sorted(flags) if not re.search(rf"{re.escape(f)}\b", helped)]
    assert not missing, f"{program} takes no {missing}"
