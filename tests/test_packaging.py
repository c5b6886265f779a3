"""The install's shape: a light client-only core, extras for servers, stores and features, a
one-line error naming the extra that is missing, and native helpers that never fail an install.

Imports run in a child interpreter whose import system refuses the extras' modules, as a
client-only install would lack them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gazette.stores import cbuild

ROOT = Path(__file__).resolve().parents[1]

EXTRAS_MODULES = (
    "aiohttp", "boto3", "rocksdict", "pyfuse3", "trio", "apsw", "psycopg", "pyspark", "pyarrow",
)  # fmt: skip
"""Every dependency an extra brings (each distribution installs a module of its name)."""


BLOCKER = """
import sys
BLOCKED = set(sys.argv[1].split(","))
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
sys.argv[1:] = sys.argv[2:]
"""


def run_light(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`code` in a child interpreter without any extra's modules."""
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code, ",".join(EXTRAS_MODULES), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _names(requirements: list[str]) -> set[str]:
    return {r.split("[")[0].split(">")[0].split("=")[0].strip().lower() for r in requirements}


def test_the_core_install_brings_no_extra_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _names(project["dependencies"])
    assert not core & set(EXTRAS_MODULES), core
    extras = {k: _names(v) for k, v in project["optional-dependencies"].items()}
    assert extras["rocksdb"] >= {"rocksdict", "pyfuse3", "trio"}
    assert extras["sqlite"] >= {"apsw"}
    assert extras["spark"] >= {"pyspark", "pyarrow"}
    assert extras["s3"] >= {"boto3"}
    assert extras["sqlstore"] >= {"psycopg"}
    assert extras["broker"] >= {"aiohttp"} and extras["consumer"] >= {"aiohttp"}
    every = {"broker", "consumer", "s3", "rocksdb", "sqlite", "sqlstore", "spark"}
    assert project["optional-dependencies"]["all"] == [f"gazette-py[{','.join(sorted(every))}]"]


def test_the_client_message_recoverylog_and_gazctl_import_without_extras() -> None:
    out = run_light(
        "import gazette.broker.client, gazette.message, gazette.recoverylog.player\n"
        "import gazette.gazctl.main, gazette.keyspace, gazette.allocator.allocator\n"
        "from gazette.message import JSONMessage, Publisher\n"
        "print('ok')\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "ok\n"


@pytest.mark.parametrize(
    ("module", "extra", "missing"),
    [
        ("gazette.stores.sqlite", "sqlite", "apsw"),
        ("gazette.stores.rocksdb", "rocksdb", "rocksdict, pyfuse3, trio"),
        ("gazette.consumer.spark", "spark", "pyspark, pyarrow"),
        ("gazette.broker.main", "broker", "aiohttp"),
        ("gazette.consumer.main", "consumer", "aiohttp"),
        ("gazette.broker.fragment.store_s3", "s3", "boto3"),
    ],
)
def test_a_missing_extra_is_named(module: str, extra: str, missing: str) -> None:
    out = run_light(
        "import importlib\n"
        "from gazette._extras import MissingExtra\n"
        "try:\n"
        "    importlib.import_module(sys.argv[1])\n"
        "except MissingExtra as err:\n"
        "    print(err.extra); print(err)\n",
        module,
    )
    assert out.returncode == 0, out.stderr
    got_extra, message = out.stdout.splitlines()
    assert got_extra == extra
    assert f"needs the '{extra}' extra (missing: {missing}): " in message
    assert message.endswith(f"pip install 'gazette-py[{extra}]'")


@pytest.mark.parametrize(
    ("entry", "prog", "extra"),
    [
        ("broker_main", "gazette-broker", "broker"),
        ("consumer_main", "gazette-consumer", "consumer"),
    ],
)
def test_a_command_without_its_extra_says_so_in_one_line(entry: str, prog: str, extra: str) -> None:
    out = run_light(f"from gazette._extras import {entry}\n{entry}()\n")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"{prog}: ")
    assert f"pip install 'gazette-py[{extra}]'" in out.stderr


def test_native_helpers_that_cannot_build_are_reported_and_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "false")  # A compiler that always fails.
    warnings: list[str] = []
    assert cbuild.build_natives(tmp_path, warnings.append) == []
    assert len(warnings) == 2
    assert "the SQLite VFS" in warnings[0] and "the RocksDB scanner" in warnings[1]
    assert not any(tmp_path.rglob("*.so")) and not (tmp_path / "rocksdb/rocksdb-scan").exists()


def test_native_helpers_build_into_the_package(tmp_path: Path) -> None:
    warnings: list[str] = []
    built = cbuild.build_natives(tmp_path, warnings.append)
    assert warnings == []
    assert built == [tmp_path / "sqlite/_recvfs.so", tmp_path / "rocksdb/rocksdb-scan"]
    scanner = subprocess.run([str(built[1])], capture_output=True, timeout=30)
    assert scanner.returncode != 0 and scanner.stderr  # Usage, not a crash: it runs.
