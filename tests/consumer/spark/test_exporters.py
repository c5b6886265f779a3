"""The Spark export reads stores only through their exporters (`gazette.consumer.export`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pyarrow as pa
import pytest

import gazette.consumer
from gazette.consumer import export
from gazette.consumer.protocol import pb
from gazette.consumer.spark.errors import ExportError, WrongStoreKind
from gazette.consumer.spark.playback import PlayedShard, check_store, store_batches
from gazette.consumer.spark.resolve import ShardPlan


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside functions (lazy imports too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_consumer_imports_no_store() -> None:
    """Stores depend on the consumer (the Store contract); nothing of the consumer, the Spark
    export included, imports a store package: the export finds exporters by kind."""
    root = Path(gazette.consumer.__file__).parent
    offending = {
        str(path.relative_to(root)): sorted(m for m in _imports(path) if "gazette.stores" in m)
        for path in root.rglob("*.py")
    }
    assert {name: mods for name, mods in offending.items() if mods} == {}


@pytest.mark.parametrize(
    ("kind", "module"),
    [
        ("rocksdb", "gazette.stores.rocksdb.export"),
        ("sqlite", "gazette.stores.sqlite.export"),
        ("json", "gazette.stores.jsonfile.export"),
    ],
)
def test_each_store_registers_its_exporter(kind: str, module: str) -> None:
    found = export.exporter(kind)
    assert found.kind == kind
    assert type(found).__module__ == module


def test_an_unknown_store_kind_names_it_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(export.UnknownStoreKind) as err:
        export.exporter("no-such-kind")
    message = str(err.value)
    assert "'no-such-kind'" in message and "gazette.store_exporters" in message
    assert "\n" not in message
    played = PlayedShard(ShardPlan("shard-x", "log", "key", b"{}"), tmp_path, {}, 0, 0.0)
    (tmp_path / "CURRENT").write_text("MANIFEST-000001\n")
    with pytest.raises(ExportError, match="no exporter of store kind 'no-such-kind'"):
        check_store(played, "no-such-kind")


class _LinesExporter:
    """A store of one text file, a line a row: an exporter registered in-process."""

    kind = "lines"
    description = "a lines file"

    def recognizes(self, names: set[str] | frozenset[str]) -> bool:
        return "lines.txt" in names

    def columns(
        self, played: export.PlayedFiles, request: export.ExportRequest
    ) -> list[tuple[str, str]]:
        return [("line", "string")]

    def rows(self, played: export.PlayedFiles, request: export.ExportRequest):  # type: ignore[no-untyped-def]
        import contextlib

        text = (played.directory / "lines.txt").read_text()
        if text.startswith("!"):
            raise export.UnreadableStore("a lines file beginning with '!'")

        class Rows:
            checkpoint = pb.Checkpoint()

            def __iter__(self):  # type: ignore[no-untyped-def]
                yield [text.splitlines()]

        return contextlib.nullcontext(Rows())


def test_a_registered_exporter_serves_its_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "_registered", {})  # Registered for this test only.
    export.register(_LinesExporter())  # type: ignore[arg-type]
    (tmp_path / "lines.txt").write_text("a\nb\n")
    played = PlayedShard(ShardPlan("shard-x", "log", "key", b"{}"), tmp_path, {}, 0, 0.0)
    schema = pa.schema([("shard", pa.string()), ("checkpoint", pa.binary()), ("line", pa.string())])
    batches = list(store_batches(played, schema, "lines", export.ExportRequest()))
    assert [r["line"] for b in batches for r in b.to_pylist()] == ["a", "b"]
    # Another kind's files are refused by name, and so is a file the exporter cannot read.
    with pytest.raises(WrongStoreKind, match="store=rocksdb but its recovery log holds a lines"):
        check_store(played, "rocksdb")
    (tmp_path / "lines.txt").write_text("!\n")
    with pytest.raises(WrongStoreKind, match="holds a lines file beginning with '!'"):
        list(store_batches(played, schema, "lines", export.ExportRequest()))
