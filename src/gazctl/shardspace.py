"""The YAML form of ShardSpecs that ``gazctl shards`` reads and writes (upstream's shardspace).

A document has a ``common`` ShardSpec and a list of ``shards``; a shard's spec may be partial,
and each field it leaves zero takes the common value ("push down"). Listing goes the other
way: what every listed shard shares is "hoisted" into ``common``::

    common:
      recovery_log_prefix: recovery/word-count
      hint_prefix: /gazette/hints
      max_txn_duration: 1s
      labels:
      - name: app
        value: word-count
    shards:
    - id: shard-000
      sources:
      - journal: examples/words/part-000
      revision: 1234      # the shard's etcd mod revision: apply fails if it changed since
    - id: shard-001
      delete: true

Field names are snake_case as in Gazette; durations are Go's (``1s``, ``1m30s``). Each shard
may also carry ``revision`` (0: create; -1: apply whatever the current revision), ``delete``
and ``comment`` (ignored). Problems raise `ValidationError` naming the shard and field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gazette.broker.protocol.errors import ValidationError, context
from gazette.broker.protocol.labels import intersect, subtract, union
from gazette.consumer.protocol import pb
from gazette.gazctl.specyaml import (
    INT32,
    UINT32,
    format_duration,
    labels_from_yaml,
    parse_duration,
    yaml_int,
)

__all__ = [
    "SHARD_KEYS",
    "ShardEntry",
    "ShardSet",
    "apply_changes",
    "dump_set",
    "load_set",
    "set_from_list",
    "spec_from_yaml",
    "spec_to_yaml",
]

SHARD_KEYS = (
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
)
"""ShardSpec fields of the YAML form, in the order they are written."""

_ENTRY_KEYS = ("comment", "delete", *SHARD_KEYS, "revision")
_SCALARS = (
    "recovery_log_prefix",
    "hint_prefix",
    "hint_backups",
    "disable",
    "hot_standbys",
    "disable_wait_for_ack",
    "ring_buffer_size",
    "read_channel_size",
)
_DURATIONS = ("max_txn_duration", "min_txn_duration")


# --- one spec ---------------------------------------------------------------------------


def _check_keys(doc: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in doc:
        if key not in allowed:
            raise ValidationError(f"unknown field {key!r} (expected one of {', '.join(allowed)})")


def _str(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"expected a string ({value!r})", [name])
    return value


def _bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValidationError(f"expected true or false ({value!r})", [name])
    return value


def _sources_from_yaml(value: object, out: pb.ShardSpec) -> None:
    if value is None:
        value = []
    if not isinstance(value, list):
        raise ValidationError(
            f"expected a list of {{journal, min_offset}} ({value!r})", ["sources"]
        )
    del out.sources[:]
    for i, src in enumerate(value):
        with context(f"sources[{i}]"):
            if isinstance(src, str):
                src = {"journal": src}
            if not isinstance(src, Mapping):
                raise ValidationError(f"expected a {{journal, min_offset}} mapping ({src!r})")
            _check_keys(src, ("journal", "min_offset"))
            out.sources.add(
                journal=_str(src.get("journal"), "journal"),
                min_offset=yaml_int(src.get("min_offset", 0) or 0, "min_offset"),
            )


def spec_from_yaml(doc: Mapping[str, Any], out: pb.ShardSpec) -> None:
    """Set the fields of `out` present in `doc` (keys of `SHARD_KEYS`; others are the
    caller's). Raises ValidationError for malformed values."""
    if "id" in doc:
        out.id = _str(doc["id"], "id")
    if "sources" in doc:
        _sources_from_yaml(doc["sources"], out)
    for key in _SCALARS:
        if key not in doc or doc[key] is None:
            continue
        value = doc[key]
        if key in ("recovery_log_prefix", "hint_prefix"):
            setattr(out, key, _str(value, key))
        elif key in ("disable", "disable_wait_for_ack"):
            setattr(out, key, _bool(value, key))
        else:
            # hint_backups is an int32, which validation refuses negative; the others are
            # uint32s.
            bounds = INT32 if key == "hint_backups" else UINT32
            setattr(out, key, yaml_int(value, key, bounds))
    for key in _DURATIONS:
        if key in doc and doc[key] is not None:
            with context(key):
                getattr(out, key).CopyFrom(parse_duration(doc[key]))
    if "labels" in doc:
        labels_from_yaml(doc["labels"], out.labels)


def spec_to_yaml(spec: pb.ShardSpec) -> dict[str, Any]:
    """The YAML mapping of `spec`, omitting zero-valued fields."""
    out: dict[str, Any] = {}
    if spec.id:
        out["id"] = spec.id
    if spec.sources:
        out["sources"] = [
            {"journal": s.journal, **({"min_offset": s.min_offset} if s.min_offset else {})}
            for s in spec.sources
        ]
    for key in SHARD_KEYS:
        if key in _SCALARS and getattr(spec, key):
            out[key] = getattr(spec, key)
        elif key in _DURATIONS:
            d = getattr(spec, key)
            if d.seconds or d.nanos:
                out[key] = format_duration(d)
        elif key == "labels" and spec.labels.labels:
            out["labels"] = [{"name": lb.name, "value": lb.value} for lb in spec.labels.labels]
    return {k: out[k] for k in SHARD_KEYS if k in out}


# --- union / intersection / difference of specs (as upstream's ShardSpec helpers) --------


def _fields_equal(a: pb.ShardSpec, b: pb.ShardSpec, key: str) -> bool:
    if key == "sources":
        return list(a.sources) == list(b.sources)
    if key == "labels":
        return a.labels == b.labels
    return bool(getattr(a, key) == getattr(b, key))


def _is_zero(spec: pb.ShardSpec, key: str) -> bool:
    if key == "sources":
        return not spec.sources
    if key in _DURATIONS:
        return bool(getattr(spec, key).ToNanoseconds() == 0)
    return not getattr(spec, key)


def _copy_field(dst: pb.ShardSpec, src: pb.ShardSpec, key: str) -> None:
    if key == "sources":
        del dst.sources[:]
        dst.sources.extend(src.sources)
    elif key in _DURATIONS:
        getattr(dst, key).CopyFrom(getattr(src, key))
    else:
        setattr(dst, key, getattr(src, key))


def _clear_field(spec: pb.ShardSpec, key: str) -> None:
    if key == "sources":
        del spec.sources[:]
    else:
        spec.ClearField(key)  # type: ignore[arg-type]


_MERGED = tuple(k for k in SHARD_KEYS if k not in ("id", "labels"))


def union_specs(a: pb.ShardSpec, b: pb.ShardSpec) -> pb.ShardSpec:
    """`a`, with each of its zero-valued fields taken from `b`; labels are united (where
    both have a label name, `a`'s values win)."""
    out = pb.ShardSpec()
    out.CopyFrom(a)
    for key in _MERGED:
        if _is_zero(out, key):
            _copy_field(out, b, key)
    out.labels.CopyFrom(union(a.labels, b.labels))
    return out


def intersect_specs(a: pb.ShardSpec, b: pb.ShardSpec) -> pb.ShardSpec:
    """The fields (and label names) on which `a` and `b` agree; others zero."""
    out = pb.ShardSpec()
    out.CopyFrom(a)
    for key in _MERGED:
        if not _fields_equal(a, b, key):
            _clear_field(out, key)
    out.labels.CopyFrom(intersect(a.labels, b.labels))
    return out


def subtract_specs(a: pb.ShardSpec, b: pb.ShardSpec) -> pb.ShardSpec:
    """`a`, less the fields (and label names) it shares with `b`."""
    out = pb.ShardSpec()
    out.CopyFrom(a)
    for key in _MERGED:
        if _fields_equal(a, b, key):
            _clear_field(out, key)
    out.labels.CopyFrom(subtract(a.labels, b.labels))
    return out


# --- sets of shards ---------------------------------------------------------------------


@dataclass
class ShardEntry:
    """A shard of a set: its (possibly partial) spec and what to do with it."""

    spec: pb.ShardSpec
    revision: int = 0
    delete: bool = False
    comment: str = ""


@dataclass
class ShardSet:
    """Shards sharing a `common` spec (see the module docs)."""

    common: pb.ShardSpec = field(default_factory=pb.ShardSpec)
    shards: list[ShardEntry] = field(default_factory=list)

    def hoist(self) -> None:
        """Move what every shard shares into `common`."""
        common: pb.ShardSpec | None = None
        for entry in self.shards:
            common = entry.spec if common is None else intersect_specs(common, entry.spec)
        self.common = pb.ShardSpec()
        if common is not None:
            self.common.CopyFrom(common)
            self.common.id = ""
        for entry in self.shards:
            entry.spec = subtract_specs(entry.spec, self.common)

    def push_down(self) -> None:
        """Fill each shard's zero fields from `common`, then clear `common`."""
        for entry in self.shards:
            entry.spec = union_specs(entry.spec, self.common)
        self.common = pb.ShardSpec()

    def to_yaml(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        common = spec_to_yaml(self.common)
        if common:
            out["common"] = common
        shards = []
        for entry in self.shards:
            doc: dict[str, Any] = {}
            if entry.comment:
                doc["comment"] = entry.comment
            if entry.delete:
                doc["delete"] = True
            doc.update(spec_to_yaml(entry.spec))
            if entry.revision:
                doc["revision"] = entry.revision
            shards.append(doc)
        out["shards"] = shards
        return out


def set_from_list(shards: list[pb.ListResponse.Shard]) -> ShardSet:
    """The hoisted set of listed shards, each with its current revision."""
    out = ShardSet(shards=[ShardEntry(s.spec, s.mod_revision) for s in shards])
    out.hoist()
    return out


def parse_set(doc: object) -> ShardSet:
    """A set from a parsed YAML document. Raises ValidationError."""
    if not isinstance(doc, Mapping):
        raise ValidationError(f"expected a mapping with 'common' and 'shards' ({doc!r:.80})")
    _check_keys(doc, ("common", "shards"))
    out = ShardSet()
    common = doc.get("common") or {}
    with context("common"):
        if not isinstance(common, Mapping):
            raise ValidationError(f"expected a mapping ({common!r:.80})")
        _check_keys(common, tuple(k for k in SHARD_KEYS if k != "id"))
        spec_from_yaml(common, out.common)
    shards = doc.get("shards") or []
    if not isinstance(shards, list):
        raise ValidationError(f"expected a list of shards ({shards!r:.80})", ["shards"])
    seen: set[str] = set()
    for i, item in enumerate(shards):
        name = f"shards[{i}]"
        if isinstance(item, Mapping) and isinstance(item.get("id"), str):
            name = f"shards[{item['id']}]"
        with context(name):
            if not isinstance(item, Mapping):
                raise ValidationError(f"expected a shard mapping ({item!r:.80})")
            _check_keys(item, _ENTRY_KEYS)
            if not item.get("id"):
                raise ValidationError("expected an 'id'")
            entry = ShardEntry(pb.ShardSpec())
            spec_from_yaml(item, entry.spec)
            if item.get("revision") is not None:
                entry.revision = yaml_int(item["revision"], "revision", minimum=-1)
            if item.get("delete") is not None:
                entry.delete = _bool(item["delete"], "delete")
            if item.get("comment"):
                entry.comment = str(item["comment"])
            if entry.spec.id in seen:
                raise ValidationError(f"shard {entry.spec.id} appears more than once")
            seen.add(entry.spec.id)
            out.shards.append(entry)
    return out


def load_set(text: str) -> ShardSet:
    """Parse a YAML shard set. Raises ValidationError (also for YAML syntax errors)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValidationError(f"invalid YAML: {err}") from err
    if doc is None:
        raise ValidationError("empty shard specification document")
    return parse_set(doc)


def dump_set(shard_set: ShardSet) -> str:
    """The YAML text of a set."""
    return yaml.safe_dump(shard_set.to_yaml(), sort_keys=False, allow_unicode=True, width=100)


def apply_changes(
    shard_set: ShardSet, current: Mapping[str, int] | None = None
) -> list[pb.ApplyRequest.Change]:
    """The ApplyRequest changes of a set (which is pushed down in place).

    A shard's expected mod revision is its `revision` when given; otherwise, if `current`
    (shard id -> mod revision of the existing shard) is given, the current revision (so
    applying updates existing shards and creates new ones, as ``journals apply``); else 0
    (create). Raises ValidationError if a delete names a shard that `current` says does not
    exist.
    """
    shard_set.push_down()
    changes: list[pb.ApplyRequest.Change] = []
    for entry in shard_set.shards:
        rev = entry.revision
        if rev == 0 and current is not None:
            rev = current.get(entry.spec.id, 0)
        if entry.delete:
            if current is not None and entry.spec.id not in current and entry.revision == 0:
                raise ValidationError(f"cannot delete {entry.spec.id!r}: no such shard")
            changes.append(pb.ApplyRequest.Change(delete=entry.spec.id, expect_mod_revision=rev))
        else:
            changes.append(pb.ApplyRequest.Change(upsert=entry.spec, expect_mod_revision=rev))
    return changes
