"""The layers contract (pyproject.toml, checked by ``lint-imports`` in ``make test``) covers
every package, and every module of the broker server, so that new code cannot slip past it."""

from __future__ import annotations

import ast
import gc
import tomllib
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
TESTS = SRC.parent / "tests"


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


def _parse(path: Path) -> ast.Module:
    """`ast.parse` of the file, with the garbage collector held off. In CPython 3.11 a
    finalizer run during the parser's conversion to Python objects (here, a subprocess
    transport an earlier test left to the collector) that fails has its traceback formatted
    with the ast module again, which upsets the conversion's recursion-depth check: the
    parse fails with "SystemError: AST constructor recursion depth mismatch"."""
    source = path.read_text()
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, str(path))
    finally:
        if enabled:
            gc.enable()


def _imports(path: Path, root: Path) -> list[tuple[int, set[str]]]:
    """Each import statement of a file under `root`: its line and the dotted names it may
    import, relative imports resolved against the file's package, and `from M import n`
    counted as both M and M.n (n may be a module)."""
    package = [root.name, *path.relative_to(root).parent.parts]
    statements = []
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Import):
            statements.append((node.lineno, {alias.name for alias in node.names}))
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names = {module} | {f"{module}.{alias.name}" for alias in node.names}
            statements.append((node.lineno, names))
    return statements


def _test_module_imports(root: Path) -> list[str]:
    """`file:line` of each import, in a file under `root`, of a test module of `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for line, names in _imports(path, root):
            if any(
                n.split(".")[0] == root.name
                and any(p.startswith("test_") for p in n.split(".")[1:])
                for n in names
            ):
                found.append(f"{path.relative_to(root.parent)}:{line}")
    return found


def test_no_test_module_imports_another(tmp_path: Path) -> None:
    """docs/testing.md: shared helpers live in support modules, so that a test file can
    move, split or be deleted on its own."""
    found = _test_module_imports(TESTS)
    assert not found, f"import these from a support module instead: {found}"
    # The check sees every spelling of such an import.
    root = tmp_path / "tests"
    (root / "a").mkdir(parents=True)
    spellings = [
        "from .test_x import f",
        "from . import test_x",
        "from tests.a.test_x import f",
        "from tests.a import test_x",
        "import tests.a.test_x",
        "from ..a.test_x import f",
    ]
    for i, line in enumerate(spellings):
        (root / "a" / f"m{i}.py").write_text(line + "\n")
    (root / "a" / "ok.py").write_text(
        "from aiohttp.test_utils import make_mocked_request\nfrom .support import f\n"
    )
    assert len(_test_module_imports(root)) == len(spellings)
