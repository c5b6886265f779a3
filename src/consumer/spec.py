"""ShardSpec and ConsumerSpec: validation, derived values, and the consumer's etcd layout.

Validation follows upstream's ``consumer/protocol`` extensions, so that a spec accepted here is
accepted by Go consumers and gazctl, and vice versa. Problems raise the broker protocol's
`ValidationError`, naming the field path (``Sources[1].Journal: ...``).

The etcd layout of a consumer application under its root R (reference §4):

- ``{R}/items/{shard id}``: the ShardSpec (binary proto);
- ``{R}/members/{zone}#{suffix}``: a consumer process's ConsumerSpec, under its lease;
- ``{R}/assign/{shard}#{zone}#{suffix}#{slot}``: a ReplicaStatus, under the member's lease
  (slot 0 is the primary).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from allocator.model import (
    assignments_prefix,
    items_prefix,
    members_prefix,
    parse_assignment_key,
)
from broker.protocol import protocol_pb2 as bpb
from broker.protocol.errors import ValidationError, context
from broker.protocol.labels import add_label, union
from broker.protocol.validation import (
    TOKEN_SYMBOLS,
    validate_header,
    validate_journal_name,
    validate_label_selector,
    validate_label_set,
    validate_process_spec,
    validate_token,
)
from consumer.protocol import pb
from recoverylog.hints import validate_hints
from recoverylog.segments import InvalidHints, live_log_segments

__all__ = [
    "DEFAULT_READ_CHANNEL_SIZE",
    "DEFAULT_RING_BUFFER_SIZE",
    "MAX_SHARD_ID_LENGTH",
    "MIN_SHARD_ID_LENGTH",
    "ShardKeys",
    "decode_consumer_value",
    "desired_replication",
    "read_channel_size",
    "recovery_log_of",
    "ring_buffer_size",
    "shard_labels",
    "validate_apply_request",
    "validate_consumer_spec",
    "validate_get_hints_request",
    "validate_list_request",
    "validate_replica_status",
    "validate_shard_id",
    "validate_shard_spec",
    "validate_stat_request",
    "validate_unassign_request",
]

MIN_SHARD_ID_LENGTH, MAX_SHARD_ID_LENGTH = 4, 512
DEFAULT_RING_BUFFER_SIZE = 8192
DEFAULT_READ_CHANNEL_SIZE = 8192

# The meta-label of a shard's id, which selectors may use (`id in (a, b)`); specs cannot set it.
ID_LABEL = "id"

# Labels which may carry one value only (upstream's `labels` package, as for journals).
_SINGLE_VALUE_LABELS = frozenset(
    {
        "content-type",
        "app.gazette.dev/instance",
        "app.gazette.dev/managed-by",
        "app.gazette.dev/message-subtype",
        "app.gazette.dev/message-type",
        "app.gazette.dev/region",
    }
)


# --- validation -------------------------------------------------------------------------


def validate_shard_id(shard: str) -> None:
    """A shard id is a token of letters, numbers and ``-_+/.``, 4 to 512 bytes long."""
    validate_token(shard, TOKEN_SYMBOLS, MIN_SHARD_ID_LENGTH, MAX_SHARD_ID_LENGTH)


def _is_absolute_clean_path(path: str) -> bool:
    # Go's path.IsAbs(p) && path.Clean(p) == p: no empty, '.' or '..' parts, no trailing '/'.
    if not path.startswith("/"):
        return False
    if path == "/":
        return True
    return all(part not in ("", ".", "..") for part in path[1:].split("/"))


def _nanos(d: Any) -> int:
    return int(d.seconds) * 1_000_000_000 + int(d.nanos)


def validate_shard_spec(spec: pb.ShardSpec) -> None:
    """Check a ShardSpec as upstream does.

    - Id: a valid shard id;
    - RecoveryLogPrefix: if set, ``{prefix}/{id}`` is a valid journal name;
    - HintPrefix: empty without a recovery log, else an absolute, clean path (``/app/hints``);
    - HintBackups, MinTxnDuration >= 0; MaxTxnDuration > 0;
    - Labels: a valid LabelSet, single-value labels with one value, and no ``id`` label
      (it is the meta-label of the shard's id);
    - Sources: each journal a valid name and MinOffset >= 0, journals unique and sorted.

    Sources may be empty, and MinTxnDuration may exceed MaxTxnDuration, as upstream allows.
    """
    with context("Id"):
        validate_shard_id(spec.id)
    log = recovery_log_of(spec)
    if log:
        with context("RecoveryLogPrefix"):
            validate_journal_name(log)
    elif spec.hint_prefix:
        raise ValidationError(
            f"invalid non-empty HintPrefix with empty RecoveryLogPrefix ({spec.hint_prefix!r})"
        )
    if log and not _is_absolute_clean_path(spec.hint_prefix):
        raise ValidationError(
            f"HintPrefix is not an absolute, clean, non-directory path ({spec.hint_prefix!r})"
        )
    if spec.hint_backups < 0:
        raise ValidationError(f"invalid HintBackups ({spec.hint_backups}; expected >= 0)")
    if _nanos(spec.min_txn_duration) < 0:
        raise ValidationError(
            f"invalid MinTxnDuration ({_nanos(spec.min_txn_duration)}ns; expected >= 0)"
        )
    if _nanos(spec.max_txn_duration) <= 0:
        raise ValidationError(
            f"invalid MaxTxnDuration ({_nanos(spec.max_txn_duration)}ns; expected > 0)"
        )
    with context("Labels"):
        validate_label_set(spec.labels)
        labels = spec.labels.labels
        for i in range(1, len(labels)):
            if labels[i].name == labels[i - 1].name and labels[i].name in _SINGLE_VALUE_LABELS:
                raise ValidationError(
                    f"single-value label {labels[i].name} has multiple values "
                    f"({labels[i - 1].value!r}, {labels[i].value!r})",
                    [f"Labels[{i}]"],
                )
    if any(lb.name == ID_LABEL for lb in spec.labels.labels):
        raise ValidationError(f'Labels cannot include label "{ID_LABEL}"')
    for i, src in enumerate(spec.sources):
        with context(f"Sources[{i}]"):
            with context("Journal"):
                validate_journal_name(src.journal)
            if src.min_offset < 0:
                raise ValidationError(f"invalid MinOffset ({src.min_offset}; expected >= 0)")
        if i and src.journal <= spec.sources[i - 1].journal:
            raise ValidationError(
                f"Sources.Journal not in unique, sorted order (index {i}; "
                f"{src.journal!r} <= {spec.sources[i - 1].journal!r})"
            )


def validate_consumer_spec(spec: pb.ConsumerSpec) -> None:
    """Check a ConsumerSpec: its ProcessSpec (id and endpoint). ShardLimit needs no check."""
    with context("ProcessSpec"):
        validate_process_spec(spec.process_spec)


def validate_replica_status(status: pb.ReplicaStatus) -> None:
    """Check a ReplicaStatus: a known Code, and Errors exactly when the Code is FAILED."""
    if status.code not in pb.ReplicaStatus.Code.values():
        raise ValidationError(f"invalid code ({status.code})", ["Code"])
    if not status.errors and status.code == pb.ReplicaStatus.FAILED:
        raise ValidationError("expected non-empty Errors with Code FAILED")
    if status.errors and status.code != pb.ReplicaStatus.FAILED:
        raise ValidationError("expected Code FAILED with non-empty Errors")


def _validate_hints_of(hints: Any, spec: pb.ShardSpec) -> None:
    log = recovery_log_of(spec)
    if not log:
        raise ValidationError("hints may be set only for a shard with a RecoveryLogPrefix")
    if hints.log != log:
        raise ValidationError(f"hints are of log {hints.log!r}, not the recovery log {log!r}")
    try:
        validate_hints(hints)
        live_log_segments(hints)
    except InvalidHints as err:
        raise ValidationError(str(err)) from None


def validate_apply_request(req: pb.ApplyRequest) -> None:
    """Check an ApplyRequest: each change upserts a valid spec (ExpectModRevision >= 0 or -1,
    optionally with PrimaryHints of its recovery log) or deletes a shard (ExpectModRevision > 0
    or -1), and no shard is changed twice."""
    seen: set[str] = set()
    for i, ch in enumerate(req.changes):
        with context(f"Changes[{i}]"):
            rev = ch.expect_mod_revision
            if ch.HasField("upsert"):
                if ch.delete:
                    raise ValidationError("both Upsert and Delete are set (expected exactly one)")
                with context("Upsert"):
                    validate_shard_spec(ch.upsert)
                if rev < 0 and rev != -1:
                    raise ValidationError(f"invalid ExpectModRevision ({rev}; expected >= 0 or -1)")
                if ch.HasField("primary_hints"):
                    with context("PrimaryHints"):
                        _validate_hints_of(ch.primary_hints, ch.upsert)
                shard = ch.upsert.id
            elif ch.delete:
                with context("Delete"):
                    validate_shard_id(ch.delete)
                if rev <= 0 and rev != -1:
                    raise ValidationError(f"invalid ExpectModRevision ({rev}; expected > 0 or -1)")
                if ch.HasField("primary_hints"):
                    raise ValidationError("hints may be set only with an upsert, not a delete")
                shard = ch.delete
            else:
                raise ValidationError("neither Upsert nor Delete are set (expected exactly one)")
            if shard in seen:
                raise ValidationError(f"shard {shard} is changed more than once")
            seen.add(shard)


def validate_list_request(req: pb.ListRequest) -> None:
    with context("Selector"):
        validate_label_selector(req.selector)


def validate_get_hints_request(req: pb.GetHintsRequest) -> None:
    with context("Shard"):
        validate_shard_id(req.shard)


def validate_unassign_request(req: pb.UnassignRequest) -> None:
    for i, shard in enumerate(req.shards):
        with context(f"Shards[{i}]"):
            validate_shard_id(shard)


def validate_stat_request(req: pb.StatRequest) -> None:
    if req.HasField("header"):
        with context("Header"):
            validate_header(req.header)
    with context("Shard"):
        validate_shard_id(req.shard)
    for journal, offset in sorted(req.read_through.items()):
        with context("ReadThrough"):
            validate_journal_name(journal)
            if offset < 0:
                raise ValidationError(f"invalid offset ({offset}; expected >= 0) of {journal}")


# --- derived values ---------------------------------------------------------------------


def recovery_log_of(spec: pb.ShardSpec) -> str:
    """The journal recording the shard's store: ``{recovery_log_prefix}/{id}``, or "" if the
    shard has no recovery log."""
    if not spec.recovery_log_prefix:
        return ""
    return f"{spec.recovery_log_prefix}/{spec.id}"


def desired_replication(spec: pb.ShardSpec) -> int:
    """How many replicas the allocator gives the shard: a primary plus its hot standbys, or
    none while the shard is disabled."""
    return 0 if spec.disable else 1 + int(spec.hot_standbys)


def ring_buffer_size(spec: pb.ShardSpec) -> int:
    """Messages buffered for the shard's sequencer (default 8192)."""
    return int(spec.ring_buffer_size) or DEFAULT_RING_BUFFER_SIZE


def read_channel_size(spec: pb.ShardSpec) -> int:
    """Messages read ahead of the shard's processing (default 8192)."""
    return int(spec.read_channel_size) or DEFAULT_READ_CHANNEL_SIZE


def shard_labels(spec: pb.ShardSpec) -> bpb.LabelSet:
    """The labels selectors match a shard against: its spec's labels plus the ``id``
    meta-label."""
    meta = bpb.LabelSet()
    add_label(meta, ID_LABEL, spec.id)
    return union(meta, spec.labels)


# --- etcd layout ------------------------------------------------------------------------


class ShardKeys:
    """Keys and prefixes of a consumer application rooted at `root` (no trailing '/')."""

    def __init__(self, root: str) -> None:
        if not root.startswith("/") or root.endswith("/"):
            raise ValueError(f"consumer root must be absolute, without a trailing '/': {root!r}")
        self.root = root
        self.items = items_prefix(root)
        self.members = members_prefix(root)
        self.assign = assignments_prefix(root)

    @property
    def keyspace_prefix(self) -> str:
        """The prefix a KeySpace of the application mirrors."""
        return self.root + "/"

    def item(self, shard: str) -> str:
        return f"{self.items}{shard}"

    def shard_assignments(self, shard: str) -> str:
        """The prefix of the shard's assignment keys (ids never contain '#')."""
        return f"{self.assign}{shard}#"


def decode_consumer_value(root: str) -> Callable[[str, bytes], Any]:
    """A KeySpace decoder of the layout under `root`: ShardSpecs, ConsumerSpecs and
    ReplicaStatuses (an assignment key of another shape is rejected, and so kept out of the
    mirror); other keys under the root are kept as raw bytes."""
    keys = ShardKeys(root)

    def decode(key: str, raw: bytes) -> Any:
        if key.startswith(keys.items):
            return pb.ShardSpec.FromString(raw)
        if key.startswith(keys.members):
            return pb.ConsumerSpec.FromString(raw)
        if key.startswith(keys.assign):
            parse_assignment_key(root, key)
            return pb.ReplicaStatus.FromString(raw)
        return raw

    return decode
