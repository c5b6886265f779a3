"""Every journal and shard spec YAML of the repository is one upstream's gazctl takes.

Upstream gazctl decodes a spec file strictly (``yaml.UnmarshalStrict`` into its journal
``Node`` or shard ``Set``: only its own keys, labels as lists of ``{name, value}``, durations
as Go strings), validates a journal tree's shape (children ordered by name), pushes specs
down and validates the ApplyRequest (specs complete and valid, labels ordered, a delete with
a revision > 0 or -1: it fills in no revisions). `upstream_problems` checks what the decoding
takes; our loader, with the same order rules, and the Go-compatible validators check the
rest. The specs checked: the example files, what generates them, the demo's, the YAML in
README.md and docs/, and the test fixtures meant to be valid.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.validation import validate_journal_spec
from gazette.consumer.spec import validate_shard_spec
from gazette.gazctl.journalspace import apply_changes as journal_changes
from gazette.gazctl.journalspace import load_tree
from gazette.gazctl.shardspace import apply_changes as shard_changes
from gazette.gazctl.shardspace import load_set

ROOT = Path(__file__).resolve().parents[2]

_LABEL = {"name", "value", "prefix"}
_FRAGMENT = {
    "length",
    "compression_codec",
    "stores",
    "refresh_interval",
    "retention",
    "flush_interval",
    "path_postfix_template",
}
_SPEC = {"name", "replication", "labels", "fragment", "flags", "max_append_rate", "suspend"}
_NODE = {*_SPEC, "comment", "delete", "revision", "children"}
_SHARD_SPEC = {
    "id",
    "sources",
    "recovery_log_prefix",
    "hint_prefix",
    "hint_backups",
    "max_txn_duration",
    "min_txn_duration",
    "disable",
    "hot_standbys",
    "labels",
    "disable_wait_for_ack",
    "ring_buffer_size",
    "read_channel_size",
}
_SHARD = {*_SHARD_SPEC, "comment", "delete", "revision"}


def _keys(doc: object, allowed: set[str], where: str) -> Iterator[str]:
    if not isinstance(doc, Mapping):
        yield f"{where}: not a mapping ({doc!r:.60})"
        return
    for key in doc:
        if key not in allowed:
            yield f"{where}: key {key!r} is not upstream's"


def _labels(doc: Mapping[str, Any], where: str) -> Iterator[str]:
    labels = doc.get("labels")
    if labels is None:
        return
    if not isinstance(labels, list):
        yield f"{where}.labels: not a list of {{name, value}} (upstream has no mapping form)"
        return
    for i, label in enumerate(labels):
        yield from _keys(label, _LABEL, f"{where}.labels[{i}]")


def _durations(doc: Mapping[str, Any], keys: tuple[str, ...], where: str) -> Iterator[str]:
    for key in keys:
        if key in doc and not isinstance(doc[key], str):
            yield f"{where}.{key}: not a Go duration string ({doc[key]!r})"


def _node_problems(doc: object, where: str) -> Iterator[str]:
    yield from _keys(doc, _NODE, where)
    if not isinstance(doc, Mapping):
        return
    where = str(doc.get("name", where))
    yield from _labels(doc, where)
    fragment = doc.get("fragment")
    if fragment is not None:
        yield from _keys(fragment, _FRAGMENT, f"{where}.fragment")
        if isinstance(fragment, Mapping):
            keys = ("refresh_interval", "retention", "flush_interval")
            yield from _durations(fragment, keys, f"{where}.fragment")
            if not isinstance(fragment.get("stores", []), list):
                yield f"{where}.fragment.stores: not a list"
    for child in doc.get("children") or []:
        yield from _node_problems(child, where)


def _set_problems(doc: object) -> Iterator[str]:
    yield from _keys(doc, {"common", "shards"}, "<set>")
    if not isinstance(doc, Mapping):
        return
    entries = [("common", doc.get("common") or {}, _SHARD_SPEC - {"id"})]
    entries += [(f"shards[{i}]", s, _SHARD) for i, s in enumerate(doc.get("shards") or [])]
    for where, spec, allowed in entries:
        yield from _keys(spec, allowed, where)
        if isinstance(spec, Mapping):
            yield from _labels(spec, where)
            yield from _durations(spec, ("max_txn_duration", "min_txn_duration"), where)
            for i, src in enumerate(spec.get("sources") or []):
                yield from _keys(src, {"journal", "min_offset"}, f"{where}.sources[{i}]")


def upstream_problems(kind: str, text: str) -> list[str]:
    """Why upstream's gazctl would refuse the journal tree or shard set `text`."""
    doc = yaml.safe_load(text)
    problems = list(_node_problems(doc, "<root>") if kind == "journals" else _set_problems(doc))
    if problems:
        return problems
    # What our loader (with upstream's order rules) and the Go-compatible validators take.
    try:
        if kind == "journals":
            changes = journal_changes(load_tree(text))
            for ch in changes:
                if ch.HasField("upsert"):
                    validate_journal_spec(ch.upsert)
        else:
            changes = shard_changes(load_set(text))  # type: ignore[assignment]
            for ch in changes:
                if ch.HasField("upsert"):
                    validate_shard_spec(ch.upsert)  # type: ignore[arg-type]
    except ValidationError as err:
        return [str(err)]
    for ch in changes:
        if ch.delete and not (ch.expect_mod_revision > 0 or ch.expect_mod_revision == -1):
            problems.append(f"delete of {ch.delete} has no revision (upstream fills in none)")
    return problems


def _kind(text: str) -> str:
    doc = yaml.safe_load(text)
    return (
        "shards"
        if isinstance(doc, Mapping) and ("shards" in doc or "common" in doc)
        else ("journals")
    )


def _doc_snippets() -> Iterator[tuple[str, str]]:
    """Spec YAML in README.md and docs/: ```yaml blocks and <<'YAML' heredocs."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for m in re.finditer(r"```ya?ml\n(.*?)```", text, re.S):
            yield f"{path.name}:{text[: m.start()].count(chr(10)) + 1}", m.group(1)
        for m in re.finditer(r"<<'?YAML'?\n(.*?)\nYAML\n", text, re.S):
            yield f"{path.name}:{text[: m.start()].count(chr(10)) + 1}", m.group(1)


def _indented_snippets() -> Iterator[tuple[str, str]]:
    # A ```yaml block inside a list item is indented: dedent it.
    for where, snippet in _doc_snippets():
        lines = snippet.splitlines()
        indent = min((len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()), default=0)
        text = "\n".join(ln[indent:] for ln in lines) + "\n"
        if re.search(r"^(name|children|common|shards):", text, re.M):
            yield where, text


def _import(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _specs() -> Iterator[tuple[str, str, str]]:
    """(where, kind, text) of every spec checked."""
    for path in sorted((ROOT / "examples").glob("*/*.yaml")):
        kind = "shards" if path.name.startswith("shards") else "journals"
        yield str(path.relative_to(ROOT)), kind, path.read_text()
    wc = ROOT / "examples" / "word-count"
    sys.path.insert(0, str(wc))
    try:
        from word_count.specs import journals_yaml, shards_yaml
    finally:
        sys.path.remove(str(wc))
    for n in (1, 4, 12):
        yield f"journals_yaml({n})", "journals", journals_yaml(n, "file:///tmp/wc/", 3)
        yield f"shards_yaml({n})", "shards", shards_yaml(n)
    demo = _import("gazette_demo", ROOT / "examples" / "demo.py")
    yield "examples/demo.py", "journals", demo.journals_yaml(Path("/tmp/demo-store"))
    for where, text in _indented_snippets():
        yield where, _kind(text), text

    from tests.gazctl import spec_texts

    yield "spec_texts.spec_yaml", "journals", spec_texts.spec_yaml("gz/t/", Path("/tmp/store"))
    yield "spec_texts.JOURNALS", "journals", spec_texts.JOURNALS.replace("PREFIX", "gz/t/")
    yield "spec_texts.TEMPLATE", "shards", spec_texts.TEMPLATE.replace("PREFIX", "gz/t/")


SPECS = list(_specs())


@pytest.mark.parametrize(("where", "kind", "text"), SPECS, ids=[s[0] for s in SPECS])
def test_spec_is_valid_for_upstream_gazctl(where: str, kind: str, text: str) -> None:
    assert upstream_problems(kind, text) == [], text


def test_the_checks_catch_what_upstream_refuses() -> None:
    """The checker refuses what upstream's gazctl refuses (so that a pass above means it)."""
    base = (
        "name: ex/\nreplication: 1\n"
        "fragment: {length: 1024, compression_codec: NONE, refresh_interval: 1s}\n"
    )
    assert upstream_problems("journals", base + "children: [{name: ex/a}]") == []
    refused = [
        base + "children: [{name: ex/b}, {name: ex/a}]",
        base + "journals: [{name: ex/a}]",
        base + "children: [{name: ex/a, labels: {app: x}}]",
        base + "children: [{name: ex/a, labels: [{name: b}, {name: a}]}]",
        base + "children: [{name: ex/a, fragment: {retention: 30}}]",
        base + "children: [{name: ex/a, delete: true}]",
        "name: ex/a\nreplication: 1\n",
    ]
    for text in refused:
        assert upstream_problems("journals", text), text
    assert upstream_problems("shards", "shards:\n- id: shard-a\n  sources: [a/b]\n")
    ok = "common:\n  max_txn_duration: 1s\nshards:\n- id: shard-a\n  sources: [{journal: ab/cd}]\n"
    assert upstream_problems("shards", ok) == []
