"""ShardSpec and ConsumerSpec: validation, derived values, and the consumer's etcd layout.

Validation follows upstream's ``consumer/protocol`` extensions, so that a spec accepted here is
accepted by Go consumers and gazctl, and vice versa but for two checks of ours (see
`validate_shard_spec`). Problems raise the broker protocol's `ValidationError`, naming the
field path as the YAML of ``gazctl shards`` spells it (``sources[1].journal: ...``).

The etcd layout of a consumer application under its root R (as upstream lays it out):

- ``{R}/items/{shard id}``: the ShardSpec (binary proto);
- ``{R}/members/{zone}#{suffix}``: a consumer process's ConsumerSpec, under its lease;
- ``{R}/assign/{shard}#{zone}#{suffix}#{slot}``: a ReplicaStatus, under the member's lease
  (slot 0 is the primary).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gazette.allocator.model import (
    assignments_prefix,
    items_prefix,
    members_prefix,
    parse_assignment_key,
)
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.broker.protocol.errors import ValidationError, context
from gazette.broker.protocol.labels import add_label, union
from gazette.broker.protocol.validation import (
    TOKEN_SYMBOLS,
    validate_header,
    validate_journal_name,
    validate_label_selector,
    validate_label_set,
    validate_process_spec,
    validate_token,
)
from gazette.consumer.protocol import pb
from gazette.recoverylog.hints import validate_hints
from gazette.recoverylog.segments import InvalidHints, live_log_segments

__all__ = [
    "DEFAULT_READ_CHANNEL_SIZE",
    "DEFAULT_RING_BUFFER_SIZE",
    "MAX_DURATION_NANOS",
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


_NANOS = 1_000_000_000
MAX_DURATION_NANOS = (1 << 63) - 1
"""The longest duration a ShardSpec may state (about 292 years): upstream's consumers and
gazctl read its durations into Go's `time.Duration`, which holds no more."""
_MAX_PROTO_DURATION_SECONDS = 315_576_000_000  # google.protobuf.Duration's range: 10,000 years


def _fmt_duration(nanos: int) -> str:
    # Go's notation, as the YAML of `gazctl shards` writes durations: 1h30m0s, 0.25s, 0s.
    sign, nanos = ("-", -nanos) if nanos < 0 else ("", nanos)
    hours, rest = divmod(nanos, 3600 * _NANOS)
    minutes, rest = divmod(rest, 60 * _NANOS)
    seconds, frac = divmod(rest, _NANOS)
    text = f"{seconds}" + (f".{frac:09d}".rstrip("0") if frac else "") + "s"
    if hours:
        text = f"{hours}h{minutes}m{text}"
    elif minutes:
        text = f"{minutes}m{text}"
    return sign + text


def _txn_duration(d: Any, key: str) -> int:
    """The nanoseconds of the ShardSpec duration `key`, if it is a valid protobuf Duration
    that Go's time.Duration holds (ValidationError naming `key` otherwise)."""
    seconds, nanos = int(d.seconds), int(d.nanos)
    if (
        abs(seconds) > _MAX_PROTO_DURATION_SECONDS
        or abs(nanos) >= _NANOS
        or (seconds > 0 > nanos)
        or (seconds < 0 < nanos)
    ):
        raise ValidationError(
            f"not a valid duration (seconds {seconds}, nanos {nanos}; protobuf's Duration "
            f"holds at most {_MAX_PROTO_DURATION_SECONDS} seconds and nanos of the same sign)",
            [key],
        )
    total = seconds * _NANOS + nanos
    if abs(total) > MAX_DURATION_NANOS:
        raise ValidationError(
            f"invalid value ({_fmt_duration(total)}; expected at most "
            f"{_fmt_duration(MAX_DURATION_NANOS)}, the longest duration Go's consumers and "
            "gazctl can read)",
            [key],
        )
    return total


def validate_shard_spec(spec: pb.ShardSpec) -> None:
    """Check a ShardSpec as upstream does; errors name the fields as the YAML of `gazctl
    shards` spells them (``max_txn_duration``, ``sources[1].journal``).

    - id: a valid shard id;
    - recovery_log_prefix: if set, ``{prefix}/{id}`` is a valid journal name;
    - hint_prefix: empty without a recovery log, else an absolute, clean path (``/app/hints``);
    - hint_backups, min_txn_duration >= 0; max_txn_duration > 0;
    - labels: a valid LabelSet, single-value labels with one value, and no ``id`` label
      (it is the meta-label of the shard's id);
    - sources: each journal a valid name and min_offset >= 0, journals unique and sorted.

    Two checks are ours, for values upstream cannot hold or no transaction can honour:
    durations must fit Go's time.Duration (about 292 years; upstream fails to read a longer
    one), and min_txn_duration may not exceed max_txn_duration (upstream lets min win;
    which was meant is the user's to say).

    As upstream, sources may be empty (a MessageProducer application's shards read none),
    and hot_standbys is not bounded (replicas are bounded by the consumer processes there are).
    """
    with context("id"):
        validate_shard_id(spec.id)
    log = recovery_log_of(spec)
    if log:
        with context("recovery_log_prefix"):
            validate_journal_name(log)
    elif spec.hint_prefix:
        raise ValidationError(
            f"set without a recovery_log_prefix ({spec.hint_prefix!r}; expected none, as "
            "hints are of the recovery log)",
            ["hint_prefix"],
        )
    if log and not _is_absolute_clean_path(spec.hint_prefix):
        raise ValidationError(
            f"not an absolute, clean, non-directory path ({spec.hint_prefix!r}; expected e.g. "
            "'/gazette/hints', which a shard with a recovery_log_prefix requires)",
            ["hint_prefix"],
        )
    if spec.hint_backups < 0:
        raise ValidationError(
            f"invalid value ({spec.hint_backups}; expected >= 0)", ["hint_backups"]
        )
    min_txn = _txn_duration(spec.min_txn_duration, "min_txn_duration")
    max_txn = _txn_duration(spec.max_txn_duration, "max_txn_duration")
    if min_txn < 0:
        raise ValidationError(
            f"invalid value ({_fmt_duration(min_txn)}; expected >= 0s)", ["min_txn_duration"]
        )
    if max_txn <= 0:
        raise ValidationError(
            f"invalid value ({_fmt_duration(max_txn)}; expected > 0s)", ["max_txn_duration"]
        )
    if min_txn > max_txn:
        raise ValidationError(
            f"invalid value ({_fmt_duration(min_txn)}; expected <= max_txn_duration "
            f"{_fmt_duration(max_txn)}: a transaction cannot be held open longer than it may "
            "last)",
            ["min_txn_duration"],
        )
    with context("labels"):
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
        raise ValidationError(
            f'cannot include label "{ID_LABEL}" (the meta-label of the shard\'s id)', ["labels"]
        )
    for i, src in enumerate(spec.sources):
        with context(f"sources[{i}]"):
            with context("journal"):
                validate_journal_name(src.journal)
                if i and src.journal <= spec.sources[i - 1].journal:
                    raise ValidationError(
                        f"not in unique, sorted order ({src.journal!r} follows "
                        f"{spec.sources[i - 1].journal!r})"
                    )
            if src.min_offset < 0:
                raise ValidationError(
                    f"invalid value ({src.min_offset}; expected >= 0)", ["min_offset"]
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


def desired_replication(spec: pb.ShardSpec, max_hot_standbys: int | None = None) -> int:
    """How many replicas the allocator gives the shard: a primary plus its hot standbys (at
    most `max_hot_standbys` of them, if given), or none while the shard is disabled."""
    if spec.disable:
        return 0
    standbys = int(spec.hot_standbys)
    if max_hot_standbys is not None:
        standbys = min(standbys, max_hot_standbys)
    return 1 + standbys


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
