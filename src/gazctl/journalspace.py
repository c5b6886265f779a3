"""Hierarchical journal specs: the YAML trees ``gazctl journals apply/list/edit`` speak.

Journal names are paths, and journals under a common prefix usually share most of their
configuration. A tree of `Node`s states each shared value once: a *directory* node (name empty
or ending in ``/``) holds the part of the spec common to its children, and each child states
only what differs. A child inherits every field it leaves zero from its parent; labels are
merged, the child's values winning for a label name both set. `delete: true` on a directory
applies to every child listed under it.

    name: examples/
    replication: 1
    fragment: {length: 1048576, compression_codec: SNAPPY, stores: ["file:///"],
               refresh_interval: 1m0s}
    children:
      - name: examples/a
      - name: examples/b
        labels: [{name: content-type, value: application/x-ndjson}]

Children are listed in name order and labels in (name, value) order, without duplicates:
upstream's gazctl refuses a tree otherwise, and so does this one, naming the first node or
label out of place (a tree valid here stays valid for upstream's tools). `journals:` is
accepted as a synonym of `children:`, and labels as a mapping of name to value. A node's
`revision` is the etcd mod revision the change expects (0: create; -1: whatever the current
one is).

`push_down` makes every terminal node's spec explicit; `hoist` is its inverse, moving values
shared by all children up into their parent; `tree_from_journals` builds the tree of a
listing. Malformed trees raise `broker.protocol.errors.ValidationError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gazette.broker.protocol import labels as label_ops
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError, context
from gazette.broker.protocol.validation import validate_journal_name
from gazette.gazctl.specyaml import SPEC_KEYS, spec_from_yaml, spec_to_yaml, yaml_int

__all__ = [
    "Node",
    "parse_tree",
    "load_tree",
    "dump_tree",
    "tree_from_journals",
    "union_specs",
    "intersect_specs",
    "subtract_specs",
    "apply_changes",
    "check_required",
]

_NODE_KEYS = (*SPEC_KEYS, "comment", "delete", "revision", "children", "journals")


@dataclass
class Node:
    """One node of a journal tree. `spec` may be partial; `delete` is None when unset."""

    spec: pb.JournalSpec = field(default_factory=pb.JournalSpec)
    delete: bool | None = None
    revision: int = 0
    comment: str = ""
    children: list[Node] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_dir(self) -> bool:
        return self.spec.name == "" or self.spec.name.endswith("/")

    def terminals(self) -> Iterator[Node]:
        """The terminal (journal) nodes under this one, in name order."""
        if not self.is_dir:
            yield self
            return
        for child in self.children:
            yield from child.terminals()

    def validate(self) -> None:
        """Check the shape of the tree (not the specs, which may be partial)."""
        if self.is_dir:
            if self.revision != 0:
                raise ValidationError(
                    f"directory node {self.name!r} cannot have a revision ({self.revision})"
                )
            if not self.children:
                raise ValidationError(f"directory node {self.name!r} needs children")
            for i, child in enumerate(self.children):
                if not child.name.startswith(self.name) or child.name == self.name:
                    raise ValidationError(
                        f"child {child.name!r} must be named under its parent {self.name!r}"
                    )
                prev = self.children[i - 1].name if i else None
                if prev == child.name:
                    raise ValidationError(f"duplicate node {child.name!r}")
                if prev is not None and prev > child.name:
                    # Upstream's Node.Validate: "expected Children to be ordered".
                    raise ValidationError(
                        f"children of {self.name!r} must be in name order, as upstream gazctl "
                        f"requires: {child.name!r} (children[{i}]) goes before {prev!r}"
                    )
                child.validate()
            return
        with context(self.name):
            validate_journal_name(self.name)
        if self.children:
            raise ValidationError(
                f"journal {self.name!r} cannot have children (end its name with '/' to make "
                "it a directory)"
            )

    def push_down(self) -> None:
        """Make each terminal node's spec explicit: children take the parent's values for
        the fields they leave zero (and its `delete`); directory specs are then cleared."""
        for child in self.children:
            if child.delete is None:
                child.delete = self.delete
            child.spec = union_specs(child.spec, self.spec)
            child.push_down()
        if self.is_dir:
            self.delete = None
            self.spec = pb.JournalSpec(name=self.spec.name)

    def hoist(self) -> None:
        """Move spec values shared by all children of each directory into the directory."""
        if not self.is_dir:
            return
        for child in self.children:
            child.hoist()
        name = self.spec.name
        common: pb.JournalSpec | None = None
        delete: bool | None = None
        for i, child in enumerate(self.children):
            if i == 0:
                common, delete = _copy(child.spec), child.delete
            else:
                assert common is not None
                common = intersect_specs(common, child.spec)
                if delete != child.delete:
                    delete = None
        self.spec = common if common is not None else pb.JournalSpec()
        self.spec.name = name
        self.delete = delete
        for child in self.children:
            if delete is not None:
                child.delete = None
            child_name = child.spec.name
            child.spec = subtract_specs(child.spec, self.spec)
            child.spec.name = child_name

    def to_yaml(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        if self.comment:
            doc["comment"] = self.comment
        if self.delete is not None:
            doc["delete"] = self.delete
        doc.update(spec_to_yaml(self.spec))
        if "name" not in doc and (self.children or self.is_dir):
            doc = {"name": "", **doc}
        if self.revision:
            doc["revision"] = self.revision
        if self.children:
            doc["children"] = [c.to_yaml() for c in self.children]
        return doc


def _copy(spec: pb.JournalSpec) -> pb.JournalSpec:
    out = pb.JournalSpec()
    out.CopyFrom(spec)
    return out


def parse_tree(doc: object) -> Node:
    """The tree of a decoded YAML document (a node mapping, or a list of nodes).

    Raises ValidationError naming the node and field at fault.
    """
    if isinstance(doc, list):
        doc = {"children": doc}
    if not isinstance(doc, Mapping):
        raise ValidationError(f"expected a mapping describing a journal tree, not {doc!r}")
    root = _parse_node(doc)
    root.validate()
    return root


def _parse_node(doc: Mapping[str, Any]) -> Node:
    where = str(doc.get("name", "")) or "<root>"
    with context(where):
        for key in doc:
            if key not in _NODE_KEYS:
                raise ValidationError(
                    f"unknown field {key!r} (expected one of {', '.join(_NODE_KEYS)})"
                )
        node = Node()
        spec_from_yaml(doc, node.spec)
        if "delete" in doc and doc["delete"] is not None:
            if not isinstance(doc["delete"], bool):
                raise ValidationError(f"expected true or false ({doc['delete']!r})", ["delete"])
            node.delete = doc["delete"]
        if "revision" in doc and doc["revision"] is not None:
            node.revision = yaml_int(doc["revision"], "revision")
        if doc.get("comment"):
            node.comment = str(doc["comment"])
        if "children" in doc and "journals" in doc:
            raise ValidationError("use one of 'children' and 'journals', not both")
        children = doc.get("children", doc.get("journals")) or []
        if not isinstance(children, list):
            raise ValidationError(f"expected a list of nodes ({children!r})", ["children"])
        for child in children:
            if not isinstance(child, Mapping):
                raise ValidationError(f"expected a node mapping ({child!r})", ["children"])
            node.children.append(_parse_node(child))
    return node


def load_tree(text: str) -> Node:
    """Parse a YAML journal tree. Raises ValidationError (also for YAML syntax errors)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValidationError(f"invalid YAML: {err}") from err
    if doc is None:
        raise ValidationError("empty journal specification document")
    return parse_tree(doc)


def dump_tree(node: Node) -> str:
    """The YAML text of a tree."""
    return yaml.safe_dump(node.to_yaml(), sort_keys=False, allow_unicode=True, width=100)


def _group(nodes: list[Node], prefix: str) -> list[Node]:
    """Nest `nodes` (all named under `prefix`) into directory nodes by path component.

    A directory node is made only where two or more journals share it, and chains of
    directories with a single child collapse into the deepest one.
    """
    buckets: dict[str, list[Node]] = {}
    for node in nodes:
        rest = node.name[len(prefix) :]
        slash = rest.find("/")
        key = node.name if slash < 0 else prefix + rest[: slash + 1]
        buckets.setdefault(key, []).append(node)
    out: list[Node] = []
    for key, members in buckets.items():
        if len(members) == 1:
            out.append(members[0])
            continue
        children = _group(members, key)
        if len(children) == 1:
            out.append(children[0])
        else:
            out.append(Node(spec=pb.JournalSpec(name=key), children=children))
    out.sort(key=lambda n: n.name)
    return out


def tree_from_journals(journals: Iterable[pb.ListResponse.Journal]) -> Node:
    """The hoisted tree of a listing, with each journal's mod revision."""
    nodes = sorted(
        (Node(spec=_copy(j.spec), revision=j.mod_revision) for j in journals),
        key=lambda n: n.name,
    )
    top = _group(nodes, "")
    root = top[0] if len(top) == 1 else Node(children=top)
    root.hoist()
    return root


# --- Spec arithmetic ----------------------------------------------------------------------

_SCALARS = ("replication", "flags", "max_append_rate")
_FRAGMENT_SCALARS = ("length", "compression_codec", "path_postfix_template")
_FRAGMENT_DURATIONS = ("refresh_interval", "retention", "flush_interval")


def _combine(
    a: pb.JournalSpec,
    b: pb.JournalSpec,
    pick: Callable[[Any, Any], Any],
    labels: Callable[[pb.LabelSet, pb.LabelSet], pb.LabelSet],
) -> pb.JournalSpec:
    out = pb.JournalSpec(name=a.name)
    for f in _SCALARS:
        setattr(out, f, pick(getattr(a, f), getattr(b, f)))
    out.labels.CopyFrom(labels(a.labels, b.labels))
    fa, fb, fo = a.fragment, b.fragment, out.fragment
    for f in _FRAGMENT_SCALARS:
        setattr(fo, f, pick(getattr(fa, f), getattr(fb, f)))
    for f in _FRAGMENT_DURATIONS:
        d = pick(getattr(fa, f), getattr(fb, f))
        if not _is_zero(d):  # Leave zero messages unset, as Gazette does.
            getattr(fo, f).CopyFrom(d)
    fo.stores.extend(pick(list(fa.stores), list(fb.stores)))
    suspend = pick(a.suspend, b.suspend)
    if not _is_zero(suspend):
        out.suspend.CopyFrom(suspend)
    return out


def _is_zero(v: Any) -> bool:
    if isinstance(v, pb.JournalSpec.Suspend):
        return v.level == 0 and v.offset == 0
    if hasattr(v, "ToNanoseconds"):
        return bool(v.ToNanoseconds() == 0)
    return not v


def union_specs(child: pb.JournalSpec, parent: pb.JournalSpec) -> pb.JournalSpec:
    """`child` with every zero field taken from `parent`; labels merged (child wins)."""
    return _combine(child, parent, lambda a, b: b if _is_zero(a) else a, label_ops.union)


def intersect_specs(a: pb.JournalSpec, b: pb.JournalSpec) -> pb.JournalSpec:
    """The fields equal in `a` and `b` (others zero); labels both have with equal values."""
    return _combine(a, b, lambda x, y: x if x == y else type(x)(), label_ops.intersect)


def subtract_specs(a: pb.JournalSpec, b: pb.JournalSpec) -> pb.JournalSpec:
    """`a` with the fields equal to `b`'s zeroed; labels of `b` removed from `a`."""
    return _combine(a, b, lambda x, y: type(x)() if x == y else x, label_ops.subtract)


def apply_changes(
    tree: Node, current: Mapping[str, int] | None = None
) -> list[pb.ApplyRequest.Change]:
    """The ApplyRequest changes of a tree (which is pushed down in place).

    A journal's expected mod revision is its node's `revision` when given; otherwise, if
    `current` (journal name -> mod revision of the existing journal) is given, the current
    revision (so applying updates existing journals and creates new ones); else 0 (create).
    Raises ValidationError if a delete names a journal that `current` says does not exist.
    """
    tree.push_down()
    changes: list[pb.ApplyRequest.Change] = []
    for node in tree.terminals():
        rev = node.revision
        if rev == 0 and current is not None:
            rev = current.get(node.name, 0)
        if node.delete:
            if current is not None and node.name not in current and node.revision == 0:
                raise ValidationError(f"cannot delete {node.name!r}: no such journal")
            changes.append(pb.ApplyRequest.Change(delete=node.name, expect_mod_revision=rev))
        else:
            changes.append(pb.ApplyRequest.Change(upsert=node.spec, expect_mod_revision=rev))
    return changes


REQUIRED = {
    "replication": "replication (brokers per journal, 1 to 5)",
    "fragment.length": "fragment.length (bytes per fragment, e.g. 536870912)",
    "fragment.compression_codec": "fragment.compression_codec (NONE, GZIP, SNAPPY or ZSTANDARD)",
    "fragment.refresh_interval": (
        "fragment.refresh_interval (how often fragment stores are listed, 1s to 24h, e.g. 5m0s)"
    ),
}
"""The fields a journal's spec must set (upstream has no defaults for them), with hints."""


def _missing(spec: pb.JournalSpec) -> tuple[str, ...]:
    f = spec.fragment
    unset = {
        "replication": spec.replication == 0,
        "fragment.length": f.length == 0,
        "fragment.compression_codec": f.compression_codec == pb.INVALID,
        "fragment.refresh_interval": f.refresh_interval.ToNanoseconds() == 0,
    }
    return tuple(key for key in REQUIRED if unset[key])


def check_required(changes: Iterable[pb.ApplyRequest.Change]) -> None:
    """Raise one ValidationError naming every required field that the upserted (pushed
    down) specs leave unset, and the journals lacking each, so that a user fixes them all at
    once rather than one per try."""
    lacking: dict[tuple[str, ...], list[str]] = {}
    for ch in changes:
        if ch.HasField("upsert") and (missing := _missing(ch.upsert)):
            lacking.setdefault(missing, []).append(ch.upsert.name)
    if not lacking:
        return
    groups = []
    for missing, names in lacking.items():
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        subject = f"journals {shown} lack" if len(names) > 1 else f"journal {shown} lacks"
        fields = ", ".join(REQUIRED[key] for key in missing)
        groups.append(f"{subject} required fields: {fields}")
    raise ValidationError(
        "; ".join(groups) + ". Set them on each journal, or once on a directory node above "
        "them (its children inherit what they leave unset)"
    )
