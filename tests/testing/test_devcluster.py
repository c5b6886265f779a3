"""``gazette-dev``: a development cluster of real processes from one command, its addresses
printed, specs applied, and nothing left running after Ctrl-C."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from gazette.testing import devcluster
from gazette.testing.devcluster import READY_LINE

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 90.0


def journals_yaml(store: Path) -> str:
    return textwrap.dedent(f"""\
        name: dev/
        replication: 1
        fragment:
          length: 1048576
          compression_codec: NONE
          stores: ["file://{store}/"]
          refresh_interval: 1m0s
        children:
          - name: dev/in
            labels: [{{name: content-type, value: application/x-ndjson}}]
          - name: dev/out
            labels: [{{name: content-type, value: application/x-ndjson}}]
          - name: dev/recovery/
            labels: [{{name: content-type, value: application/x-gazette-recoverylog}}]
            children: [{{name: dev/recovery/shard-000}}]
        """)


SHARDS_YAML = textwrap.dedent("""\
    common:
      recovery_log_prefix: dev/recovery
      hint_prefix: /dev/hints
      max_txn_duration: 1s
      hot_standbys: 1
    shards:
      - id: shard-000
        sources: [{journal: dev/in}]
    """)


def running_under(directory: Path) -> list[str]:
    """Command lines of live processes naming `directory` (etcd's data, brokers' spools and
    consumers' work directories are all under it)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(directory) in argv and "gazette.testing.devcluster" not in argv:
            found.append(argv)
    return found


def read_until_ready(proc: subprocess.Popen[str]) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            pytest.fail("gazette-dev exited before it was ready:\n" + "".join(lines))
        lines.append(line)
        if line.startswith(READY_LINE):
            return lines
    pytest.fail("gazette-dev not ready in time:\n" + "".join(lines))


def test_a_dev_cluster_of_an_application_runs_until_ctrl_c(tmp_path: Path) -> None:
    """Two brokers, the journals and, for a settings-taking application, one consumer run
    with flags given through ``--consumer-arg`` (capped at no standby, so a spec asking for
    one runs on one process) and its shard applied: the shard is PRIMARY, the application
    got its setting, gazctl works with the printed environment; SIGINT stops it all."""
    (tmp_path / "fragments").mkdir()
    (tmp_path / "journals.yaml").write_text(journals_yaml(tmp_path / "fragments"))
    (tmp_path / "shards.yaml").write_text(SHARDS_YAML)
    directory = tmp_path / "cluster"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gazette.testing.devcluster",
            "--dir",
            str(directory),
            "--brokers",
            "2",
            "--journals",
            str(tmp_path / "journals.yaml"),
            "--app",
            "tests.consumer.settings_app:TunedCounter",
            "--shards",
            str(tmp_path / "shards.yaml"),
            "--consumer-arg=--max-hot-standbys=0",
            "--consumer-arg=--app.label=dev",
        ],
        cwd=REPO,  # The application's module is found from the working directory.
        env={**os.environ, "COUNTER_OUTPUT": "dev/out"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out = "".join(read_until_ready(proc))
        assert "applying journals" in out and "applying shards" in out
        assert sum(line.startswith("broker ") for line in out.splitlines()) == 2
        consumer_line = next(ln for ln in out.splitlines() if ln.startswith("consumer "))
        assert f"log {directory}/consumers/consumer-0/consumer.log" in consumer_line
        exports = next(ln for ln in out.splitlines() if ln.startswith("gazctl "))
        env = dict(kv.split("=", 1) for kv in exports.split("export ", 1)[1].split())
        assert set(env) == {"ETCD_ADDRESS", "BROKER_ADDRESS", "CONSUMER_ADDRESS"}

        listed = subprocess.run(
            [sys.executable, "-m", "gazette.gazctl.main", "shards", "list", "-o", "json"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        shards = json.loads(listed.stdout)
        assert [s["spec"]["id"] for s in shards] == ["shard-000"]
        deadline = time.monotonic() + 60
        while True:
            status = subprocess.run(
                [sys.executable, "-m", "gazette.gazctl.main", "shards", "list", "-o", "json"],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            codes = [st.get("code") for st in json.loads(status.stdout)[0].get("status", [])]
            if codes in (["PRIMARY"], ["FAILED"]) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert codes == ["PRIMARY"]  # One replica: the standby the spec asks for is capped.

        http = consumer_line.split(" http ", 1)[1].split()[0]
        with urllib.request.urlopen(f"{http}/settings", timeout=10) as resp:
            assert json.load(resp)["label"] == "dev"
        assert running_under(directory), "no process runs under the cluster's directory"
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, rest
    assert f"stopped; data and logs are in {directory}" in rest
    assert running_under(directory) == []
    assert (directory / "etcd" / "etcd.log").exists()


@pytest.mark.parametrize("after", ["starting etcd", "applying journals"])
def test_ctrl_c_during_start_up_stops_at_once(tmp_path: Path, after: str) -> None:
    """Ctrl-C while processes are still starting (or specs being applied) abandons the
    start-up where it is and stops what runs, rather than waiting for all to be ready."""
    (tmp_path / "fragments").mkdir()
    (tmp_path / "journals.yaml").write_text(journals_yaml(tmp_path / "fragments"))
    directory = tmp_path / "cluster"
    argv = [sys.executable, "-m", "gazette.testing.devcluster", "--dir", str(directory)]
    argv += ["--brokers", "3", "--journals", str(tmp_path / "journals.yaml")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        seen = ""
        while not seen.startswith(after):
            seen = proc.stdout.readline()
            assert seen, "gazette-dev exited before it was interrupted"
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        rest, _ = proc.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, rest
    assert "gazette-dev: SIGINT during start-up" in rest and READY_LINE not in rest
    assert took < 20, took
    assert running_under(directory) == []


def test_usage_errors_start_nothing(tmp_path: Path) -> None:
    for args, error in [
        (["--shards", "s.yaml"], "--shards needs --app"),
        (["--journals", str(tmp_path / "none.yaml")], "none.yaml: no such file"),
        (["--brokers", "0"], "--brokers must be at least 1, not 0"),
    ]:
        proc = subprocess.run(
            [sys.executable, "-m", "gazette.testing.devcluster", "--dir", str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2
        assert error in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_command_is_installed_as_gazette_dev() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["gazette-dev"].partition(":")
    assert getattr(importlib.import_module(module), attr) is devcluster.main


def test_a_secure_dev_cluster_serves_only_clients_with_its_settings(tmp_path: Path) -> None:
    """``--secure``: etcd and the brokers serve TLS and the brokers verify tokens; gazctl
    with the printed settings file works, and without them it is refused."""
    (tmp_path / "fragments").mkdir()
    (tmp_path / "journals.yaml").write_text(journals_yaml(tmp_path / "fragments"))
    directory = tmp_path / "cluster"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "gazette.testing.devcluster", "--dir", str(directory),
            "--secure", "--journals", str(tmp_path / "journals.yaml"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        out = "".join(read_until_ready(proc))
        exports = next(ln for ln in out.splitlines() if ln.startswith("gazctl "))
        env = dict(kv.split("=", 1) for kv in exports.split("export ", 1)[1].split())
        assert env["ETCD_ADDRESS"].startswith("https://")
        env_file = directory / "secure.env"
        assert f"secure     . {env_file}" in out
        assert env_file.stat().st_mode & 0o777 == 0o600
        settings = dict(
            line.removeprefix("export ").split("=", 1) for line in env_file.read_text().splitlines()
        )
        assert set(settings) >= {"BROKER_TRUSTED_CA_FILE", "BROKER_AUTH_KEYS", "ETCD_CERT_FILE"}
        assert settings["BROKER_AUTH_KEYS"] not in out  # the key is in the file only

        def gazctl(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "gazette.gazctl.main", "journals", "list"],
                env={**os.environ, **env, **extra},
                capture_output=True,
                text=True,
                timeout=60,
            )

        listed = gazctl(settings)
        assert listed.returncode == 0 and "dev/in" in listed.stdout, listed.stderr
        ca_only = gazctl({"BROKER_TRUSTED_CA_FILE": settings["BROKER_TRUSTED_CA_FILE"]})
        assert ca_only.returncode == 1 and "UNAUTHENTICATED" in ca_only.stderr
        assert gazctl({}).returncode == 1  # plaintext against TLS
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, rest
    assert running_under(directory) == []
