"""The layers contract (pyproject.toml, checked by ``lint-imports`` in ``make test``) covers
every package, and every module of the broker server, so that new code cannot slip past it."""

from __future__ import annotations

import tomllib
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _contracts() -> dict[str, dict[str, object]]:
    config = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["root_package"] == "gazette"
    return {c["type"] + ":" + c["name"]: c for c in config["contracts"]}


def _layered() -> set[str]:
    (layers,) = [c for k, c in _contracts().items() if k.startswith("layers:")]
    names: set[str] = set()
    for layer in layers["layers"]:  # type: ignore[attr-defined]
        for part in str(layer).replace("|", ":").split(":"):
            names.add(part.strip())
    return names


def test_every_package_is_in_a_layer_or_independent() -> None:
    layered = _layered()
    independent = {"gazette.testing"}  # Its own contract: it imports nothing of the package.
    split = {"gazette.broker"}  # Its server modules and subpackages are layers of their own.
    packages = {f"gazette.{p.parent.name}" for p in SRC.glob("*/__init__.py")}
    modules = {f"gazette.{p.stem}" for p in SRC.glob("_*.py") if p.stem != "__init__"}
    uncovered = (packages | modules) - layered - independent - split
    assert not uncovered, f"add these to the layers contract in pyproject.toml: {uncovered}"


def test_every_broker_module_and_subpackage_is_in_a_layer() -> None:
    layered = _layered()
    server = {f"gazette.broker.{p.stem}" for p in (SRC / "broker").glob("*.py")}
    server.discard("gazette.broker.__init__")
    server |= {f"gazette.broker.{p.parent.name}" for p in (SRC / "broker").glob("*/__init__.py")}
    assert not server - layered, f"add to the broker server's layer: {server - layered}"


def test_the_test_harnesses_import_nothing_of_the_package() -> None:
    (harness,) = [
        c
        for c in _contracts().values()
        if c["type"] == "forbidden" and "harnesses" in str(c["name"])
    ]
    assert "ignore_imports" not in harness, "the harnesses' contract lists no exceptions"
    modules = {f"gazette.testing.{p.stem}" for p in (SRC / "testing").glob("*.py")}
    modules -= {"gazette.testing.__init__", "gazette.testing.pytest_plugin"}
    assert set(harness["source_modules"]) == modules  # type: ignore[arg-type]
    packages = {f"gazette.{p.parent.name}" for p in SRC.glob("*/__init__.py")}
    assert set(harness["forbidden_modules"]) == packages - {"gazette.testing"}  # type: ignore[arg-type]
    # The plugin is the package's client: the top layer, which nothing imports.
    (layers,) = [c for k, c in _contracts().items() if k.startswith("layers:")]
    assert layers["layers"][0] == "gazette.testing.pytest_plugin"  # type: ignore[index]


def test_no_contract_lists_exceptions() -> None:
    for name, contract in _contracts().items():
        assert not contract.get("ignore_imports"), f"{name} lists exceptions"
