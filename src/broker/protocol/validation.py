"""Validators of broker protocol messages.

Each `validate_*` function inspects one message (or value) for syntactic and
semantic problems, and raises `ValidationError` naming the field path and the
bad value of the first problem found; it returns None if the message is
well-formed. Validators never mutate their argument.

Bounds and rules follow Gazette's `broker/protocol` package so that a message
accepted here is accepted by Go brokers and clients, and vice versa. Lengths of
names and tokens are counted in UTF-8 bytes, as Go does.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult, urlsplit

from google.protobuf import duration_pb2
from google.protobuf.message import Message

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError, context

__all__ = [
    "MAX_FRAGMENT_LENGTH",
    "MAX_JOURNAL_NAME_LENGTH",
    "MAX_REPLICATION",
    "MIN_FRAGMENT_LENGTH",
    "MIN_JOURNAL_NAME_LENGTH",
    "PATH_SYMBOLS",
    "TOKEN_SYMBOLS",
    "split_journal_meta",
    "validate",
    "validate_append_request",
    "validate_append_response",
    "validate_apply_request",
    "validate_apply_response",
    "validate_broker_spec",
    "validate_codec",
    "validate_endpoint",
    "validate_fragment",
    "validate_fragment_spec",
    "validate_fragment_store",
    "validate_fragment_store_health_request",
    "validate_fragment_store_health_response",
    "validate_fragments_request",
    "validate_fragments_response",
    "validate_first_append_request",
    "validate_header",
    "validate_journal_name",
    "validate_journal_spec",
    "validate_label",
    "validate_label_selector",
    "validate_label_set",
    "validate_later_append_request",
    "validate_list_request",
    "validate_list_response",
    "validate_path_component",
    "validate_process_id",
    "validate_process_spec",
    "validate_read_request",
    "validate_read_response",
    "validate_replicate_request",
    "validate_replicate_response",
    "validate_route",
    "validate_status",
    "validate_token",
]

# Symbols allowed in tokens (label names, zones, suffixes), beyond Unicode
# letters and numbers. Every rune at or below '#' is excluded because '#' is the
# separator of allocator keys in etcd.
TOKEN_SYMBOLS = "-_+/."
# Symbols allowed in path components (journal names, label values).
PATH_SYMBOLS = TOKEN_SYMBOLS + "=%"

MIN_JOURNAL_NAME_LENGTH, MAX_JOURNAL_NAME_LENGTH = 4, 512
MAX_REPLICATION = 5
MIN_FRAGMENT_LENGTH, MAX_FRAGMENT_LENGTH = 1 << 10, 1 << 34
MIN_LABEL_NAME_LENGTH, MAX_LABEL_NAME_LENGTH = 2, 64
MAX_LABEL_VALUE_LENGTH = 1024
MIN_ZONE_LENGTH, MAX_ZONE_LENGTH = 1, 32
MIN_SUFFIX_LENGTH, MAX_SUFFIX_LENGTH = 4, 128
MAX_BROKER_JOURNAL_LIMIT = 1 << 17
MAX_PAGE_LIMIT = 10000

_SECOND = 10**9
MIN_REFRESH_INTERVAL, MAX_REFRESH_INTERVAL = _SECOND, 24 * 3600 * _SECOND
MIN_FLUSH_INTERVAL = 60 * _SECOND
_APPEND_SUSPEND_VALUES = frozenset(pb.AppendRequest.Suspend.values())

# Labels with a meaning to Gazette (see upstream package `labels`).
_CONTENT_TYPE = "content-type"
_MESSAGE_TYPE = "app.gazette.dev/message-type"
_MESSAGE_SUB_TYPE = "app.gazette.dev/message-subtype"
_SINGLE_VALUE_LABELS = frozenset(
    {
        _CONTENT_TYPE,
        "app.gazette.dev/instance",
        "app.gazette.dev/managed-by",
        _MESSAGE_SUB_TYPE,
        _MESSAGE_TYPE,
        "app.gazette.dev/region",
    }
)
# Label names reserved for meta-labels computed by the broker.
_RESERVED_JOURNAL_LABELS = ("name", "prefix")

_VALID_FLAGS = frozenset(
    {
        pb.JournalSpec.NOT_SPECIFIED,
        pb.JournalSpec.O_RDONLY,
        pb.JournalSpec.O_WRONLY,
        pb.JournalSpec.O_RDWR,
    }
)


# ---------------------------------------------------------------------------
# Tokens, paths and names.


def _byte_len(value: str) -> int:
    # surrogatepass: a lone surrogate must yield a "not a valid token" error,
    # rather than an encoding exception.
    return len(value.encode("utf-8", "surrogatepass"))


def _quote(value: str) -> str:
    # Quote a possibly huge value for an error message.
    if len(value) > 80:
        return repr(value[:80]) + "..."
    return repr(value)


def _is_letter_or_number(ch: str) -> bool:
    return unicodedata.category(ch)[0] in "LN"


def validate_token(value: str, symbols: str, min_len: int, max_len: int) -> None:
    """Check that `value` is [min_len, max_len] UTF-8 bytes long, and consists
    only of Unicode letters, numbers, and runes of `symbols`."""
    n = _byte_len(value)
    if n < min_len or n > max_len:
        raise ValidationError(
            f"invalid length ({n}; expected {min_len} <= length <= {max_len}): {_quote(value)}"
        )
    for ch in value:
        if not _is_letter_or_number(ch) and ch not in symbols:
            raise ValidationError(f"not a valid token ({_quote(value)}; invalid rune {ch!r})")


def _check_clean_path(value: str) -> None:
    if value.startswith("/"):
        raise ValidationError(f"cannot begin with '/' ({value!r})")
    for part in value.split("/"):
        if part in ("", ".", ".."):
            raise ValidationError(
                f"must be a clean path ({value!r}; no '//', trailing '/', '.' or '..')"
            )


def validate_path_component(value: str, min_len: int, max_len: int) -> None:
    """Check that `value` is a token of PATH_SYMBOLS having [min_len, max_len]
    bytes, and if non-empty is a clean relative path: no leading or trailing
    '/', no empty, '.' or '..' components."""
    validate_token(value, PATH_SYMBOLS, min_len, max_len)
    if value:
        _check_clean_path(value)


def split_journal_meta(name: str) -> tuple[str, str]:
    """Split a journal name at its first ';' into the name and its metadata
    suffix (including the leading ';'), or ``""`` if there is none."""
    ind = name.find(";")
    if ind == -1:
        return name, ""
    return name[:ind], name[ind:]


def validate_journal_name(name: str) -> None:
    """Check a journal name: a clean path of 4..512 bytes drawn from letters,
    numbers and PATH_SYMBOLS, optionally followed by a ``;meta`` suffix which is
    itself a non-empty clean path."""
    base, meta = split_journal_meta(name)
    validate_path_component(base, MIN_JOURNAL_NAME_LENGTH, MAX_JOURNAL_NAME_LENGTH)
    if meta:
        with context("Meta"):
            validate_path_component(meta[1:], 1, MAX_JOURNAL_NAME_LENGTH)


# ---------------------------------------------------------------------------
# Labels and selectors.


def _validate_label(label: pb.Label, allow_prefix: bool) -> None:
    with context("Name"):
        validate_token(label.name, TOKEN_SYMBOLS, MIN_LABEL_NAME_LENGTH, MAX_LABEL_NAME_LENGTH)
    with context("Value"):
        validate_token(label.value, PATH_SYMBOLS, 0, MAX_LABEL_VALUE_LENGTH)
    if label.prefix and not allow_prefix:
        raise ValidationError(
            f"may not be set outside of a LabelSelector (label {label.name}={label.value!r})",
            ["Prefix"],
        )


def validate_label(label: pb.Label) -> None:
    """Check a label of a LabelSet: name is a token of 2..64 bytes, value a
    token of 0..1024 bytes which may also use '=' and '%'. `prefix` is not allowed."""
    _validate_label(label, allow_prefix=False)


def _validate_label_set(ls: pb.LabelSet, allow_prefix: bool) -> None:
    labels = ls.labels
    for i, cur in enumerate(labels):
        with context(f"Labels[{i}]"):
            _validate_label(cur, allow_prefix)
            if i == 0:
                continue
            prev = labels[i - 1]
            if prev.name > cur.name or (prev.name == cur.name and prev.value >= cur.value):
                raise ValidationError(
                    f"not in unique, sorted order ({cur.name}={cur.value!r} follows "
                    f"{prev.name}={prev.value!r})"
                )
            if prev.name == cur.name and prev.value == "":
                raise ValidationError(
                    f"label {cur.name} has both empty and non-empty values ({cur.value!r})"
                )


def validate_label_set(ls: pb.LabelSet, *, allow_prefix: bool = False) -> None:
    """Check a LabelSet: each label valid, labels sorted on (name, value) and
    unique, and a name having an empty value has no other values. Labels may set
    `prefix` only if `allow_prefix` (as in the sets of a LabelSelector)."""
    _validate_label_set(ls, allow_prefix)


def validate_label_selector(sel: pb.LabelSelector) -> None:
    """Check a LabelSelector: Include and Exclude are valid LabelSets, except that
    their labels may set `prefix`."""
    with context("Include"):
        _validate_label_set(sel.include, allow_prefix=True)
    with context("Exclude"):
        _validate_label_set(sel.exclude, allow_prefix=True)


def _values_of(ls: pb.LabelSet, name: str) -> list[str]:
    return [label.value for label in ls.labels if label.name == name]


_MIME_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_MIME_RE = re.compile(
    rf"^\s*{_MIME_TOKEN}(?:/{_MIME_TOKEN})?\s*"
    rf"(?:;\s*{_MIME_TOKEN}\s*=\s*(?:{_MIME_TOKEN}|\"(?:[^\"\\]|\\.)*\")\s*)*;?\s*$"
)


def _validate_journal_label_constraints(ls: pb.LabelSet) -> None:
    labels = ls.labels
    for i in range(1, len(labels)):
        if labels[i].name == labels[i - 1].name and labels[i].name in _SINGLE_VALUE_LABELS:
            raise ValidationError(
                f"single-value label {labels[i].name} has multiple values "
                f"({labels[i - 1].value!r}, {labels[i].value!r})",
                [f"Labels[{i}]"],
            )
    content_type = _values_of(ls, _CONTENT_TYPE)
    if content_type and not _MIME_RE.match(content_type[0]):
        raise ValidationError(f"{_CONTENT_TYPE} is not a media type ({content_type[0]!r})")
    if _values_of(ls, _MESSAGE_TYPE):
        if not content_type:
            raise ValidationError(f"expected {_CONTENT_TYPE} label alongside {_MESSAGE_TYPE}")
    elif _values_of(ls, _MESSAGE_SUB_TYPE):
        raise ValidationError(f"expected {_MESSAGE_TYPE} label alongside {_MESSAGE_SUB_TYPE}")


# ---------------------------------------------------------------------------
# Journal specs and fragments.


def _nanos(d: duration_pb2.Duration) -> int:
    return int(d.seconds) * _SECOND + int(d.nanos)


def _fmt_nanos(n: int) -> str:
    if n % _SECOND == 0:
        return f"{n // _SECOND}s"
    return f"{n / _SECOND:.9f}".rstrip("0") + "s"


def validate_codec(codec: int) -> None:
    """Check a CompressionCodec: a known value other than INVALID."""
    if codec == pb.INVALID:
        raise ValidationError("invalid value (0 INVALID)")
    if codec not in pb.CompressionCodec.values():
        raise ValidationError(f"invalid value ({codec})")


def _store_host(parts: SplitResult) -> str:
    return parts.netloc.rpartition("@")[2]


def validate_fragment_store(store: str) -> None:
    """Check a fragment store URL: an absolute URL of scheme s3, gs or azure
    (with a bucket), azure-ad (tenant, account and container), or file (no host),
    whose path ends in '/'."""
    try:
        parts = urlsplit(store)
    except ValueError as err:
        raise ValidationError(f"not a URL ({store!r}: {err})") from None
    scheme = parts.scheme
    if not scheme:
        raise ValidationError(f"not absolute ({store!r})")
    if scheme in ("s3", "gs", "azure"):
        if not _store_host(parts):
            raise ValidationError(f"missing bucket ({store!r})")
    elif scheme == "azure-ad":
        segments = parts.path[1:].split("/")
        if not _store_host(parts):
            raise ValidationError(f"missing tenant ID ({store!r})")
        if not segments[0]:
            raise ValidationError(f"missing storage account ({store!r})")
        if len(segments) < 2 or not segments[1]:
            raise ValidationError(f"missing storage container ({store!r})")
    elif scheme == "file":
        if _store_host(parts):
            raise ValidationError(f"file scheme cannot have a host ({store!r})")
    else:
        raise ValidationError(f"invalid scheme ({scheme!r} of {store!r})")
    if not parts.path.endswith("/"):
        raise ValidationError(f"path doesn't end in '/' ({parts.path!r} of {store!r})")


def _validate_postfix_template(template: str) -> None:
    # Go's text/template cannot be run here; catch the common structural
    # mistakes: unterminated and empty actions.
    pos = 0
    while (start := template.find("{{", pos)) != -1:
        end = template.find("}}", start + 2)
        if end == -1:
            raise ValidationError(f"unclosed action at position {start} ({template!r})")
        action = template[start + 2 : end].strip("-").strip()
        if not action:
            raise ValidationError(f"empty action at position {start} ({template!r})")
        pos = end + 2


def validate_fragment_spec(spec: pb.JournalSpec.Fragment) -> None:
    """Check the fragment configuration of a JournalSpec: Length in 1 KiB..16 GiB,
    a valid CompressionCodec, valid Stores (and no GZIP_OFFLOAD_DECOMPRESSION with
    a file:// primary store), RefreshInterval in 1s..24h, FlushInterval zero or at
    least 1m. Any Retention is allowed."""
    if not MIN_FRAGMENT_LENGTH <= spec.length <= MAX_FRAGMENT_LENGTH:
        raise ValidationError(
            f"invalid value ({spec.length}; expected {MIN_FRAGMENT_LENGTH} <= Length <= "
            f"{MAX_FRAGMENT_LENGTH})",
            ["Length"],
        )
    with context("CompressionCodec"):
        validate_codec(spec.compression_codec)
    for i, store in enumerate(spec.stores):
        with context(f"Stores[{i}]"):
            validate_fragment_store(store)
            if (
                i == 0
                and spec.compression_codec == pb.GZIP_OFFLOAD_DECOMPRESSION
                and urlsplit(store).scheme == "file"
            ):
                raise ValidationError(
                    f"GZIP_OFFLOAD_DECOMPRESSION is incompatible with file:// stores ({store!r})"
                )
    refresh = _nanos(spec.refresh_interval)
    if not MIN_REFRESH_INTERVAL <= refresh <= MAX_REFRESH_INTERVAL:
        raise ValidationError(
            f"invalid value ({_fmt_nanos(refresh)}; expected "
            f"{_fmt_nanos(MIN_REFRESH_INTERVAL)} <= RefreshInterval <= "
            f"{_fmt_nanos(MAX_REFRESH_INTERVAL)})",
            ["RefreshInterval"],
        )
    flush = _nanos(spec.flush_interval)
    if flush != 0 and flush < MIN_FLUSH_INTERVAL:
        raise ValidationError(
            f"invalid value ({_fmt_nanos(flush)}; expected 0s or >= "
            f"{_fmt_nanos(MIN_FLUSH_INTERVAL)})",
            ["FlushInterval"],
        )
    with context("PathPostfixTemplate"):
        _validate_postfix_template(spec.path_postfix_template)


def validate_journal_spec(spec: pb.JournalSpec) -> None:
    """Check a JournalSpec: a journal Name without ``;meta``, Replication in 1..5,
    valid Labels which don't use the reserved names ``name`` and ``prefix``, a
    valid Fragment spec, Flags of a valid combination, MaxAppendRate >= 0, and a
    valid Suspend."""
    with context("Name"):
        validate_journal_name(spec.name)
        _, meta = split_journal_meta(spec.name)
        if meta:
            raise ValidationError(f"cannot have a metadata path segment ({meta!r})")
    if not 1 <= spec.replication <= MAX_REPLICATION:
        raise ValidationError(
            f"invalid value ({spec.replication}; expected 1 <= Replication <= {MAX_REPLICATION})",
            ["Replication"],
        )
    with context("Labels"):
        validate_label_set(spec.labels)
        for reserved in _RESERVED_JOURNAL_LABELS:
            if _values_of(spec.labels, reserved):
                raise ValidationError(f"cannot include reserved label {reserved!r}")
        _validate_journal_label_constraints(spec.labels)
    with context("Fragment"):
        validate_fragment_spec(spec.fragment)
    if spec.flags not in _VALID_FLAGS:
        raise ValidationError(f"invalid combination ({spec.flags:#x})", ["Flags"])
    if spec.max_append_rate < 0:
        raise ValidationError(
            f"invalid value ({spec.max_append_rate}; expected >= 0)", ["MaxAppendRate"]
        )
    if spec.suspend.level not in pb.JournalSpec.Suspend.Level.values():
        raise ValidationError(f"invalid variant ({spec.suspend.level})", ["Suspend", "Level"])
    if spec.suspend.offset < 0:
        raise ValidationError(
            f"invalid value ({spec.suspend.offset}; expected >= 0)", ["Suspend", "Offset"]
        )


def validate_fragment(fragment: pb.Fragment) -> None:
    """Check a Fragment: a valid Journal, 0 <= Begin <= End, a valid
    CompressionCodec, and a PathPostfix which is empty or a clean path."""
    with context("Journal"):
        validate_journal_name(fragment.journal)
    if fragment.begin < 0:
        raise ValidationError(f"invalid value ({fragment.begin}; expected >= 0)", ["Begin"])
    if fragment.begin > fragment.end:
        raise ValidationError(
            f"expected Begin <= End (have {fragment.begin}, {fragment.end})", ["End"]
        )
    with context("CompressionCodec"):
        validate_codec(fragment.compression_codec)
    with context("PathPostfix"):
        validate_path_component(fragment.path_postfix, 0, MAX_JOURNAL_NAME_LENGTH)


# ---------------------------------------------------------------------------
# Processes, routes and headers.


def validate_process_id(pid: pb.ProcessSpec.ID) -> None:
    """Check a ProcessSpec.ID: Zone is a token of 1..32 bytes, Suffix of 4..128."""
    with context("Zone"):
        validate_token(pid.zone, TOKEN_SYMBOLS, MIN_ZONE_LENGTH, MAX_ZONE_LENGTH)
    with context("Suffix"):
        validate_token(pid.suffix, TOKEN_SYMBOLS, MIN_SUFFIX_LENGTH, MAX_SUFFIX_LENGTH)


def validate_endpoint(endpoint: str) -> None:
    """Check an Endpoint: an absolute URL having a host, e.g.
    ``http://host:8080`` or ``unix://host/path/to/socket``."""
    try:
        parts = urlsplit(endpoint)
    except ValueError as err:
        raise ValidationError(f"not a URL ({endpoint!r}: {err})") from None
    if not parts.scheme:
        raise ValidationError(f"not absolute ({endpoint!r})")
    if not _store_host(parts):
        raise ValidationError(f"missing host ({endpoint!r})")


def validate_process_spec(spec: pb.ProcessSpec) -> None:
    """Check a ProcessSpec: a valid Id and Endpoint."""
    with context("Id"):
        validate_process_id(spec.id)
    with context("Endpoint"):
        validate_endpoint(spec.endpoint)


def validate_broker_spec(spec: pb.BrokerSpec) -> None:
    """Check a BrokerSpec: a valid ProcessSpec and JournalLimit <= 2^17."""
    with context("ProcessSpec"):
        validate_process_spec(spec.process_spec)
    if spec.journal_limit > MAX_BROKER_JOURNAL_LIMIT:
        raise ValidationError(
            f"invalid value ({spec.journal_limit}; expected 0 <= JournalLimit <= "
            f"{MAX_BROKER_JOURNAL_LIMIT})",
            ["JournalLimit"],
        )


def validate_route(route: pb.Route) -> None:
    """Check a Route: valid Members, sorted on (zone, suffix) and unique; Primary
    in -1..len(Members)-1; Endpoints empty or one per member (each empty or valid)."""
    members = route.members
    for i, member in enumerate(members):
        with context(f"Members[{i}]"):
            validate_process_id(member)
            if i != 0:
                prev = members[i - 1]
                if (prev.zone, prev.suffix) >= (member.zone, member.suffix):
                    raise ValidationError(
                        f"not in unique, sorted order ({member.zone}/{member.suffix} follows "
                        f"{prev.zone}/{prev.suffix})"
                    )
    if not -1 <= route.primary < len(members):
        raise ValidationError(
            f"invalid value ({route.primary}; expected -1 <= Primary < {len(members)})",
            ["Primary"],
        )
    if route.endpoints and len(route.endpoints) != len(members):
        raise ValidationError(
            f"expected none or one per member (have {len(route.endpoints)} for "
            f"{len(members)} members)",
            ["Endpoints"],
        )
    for i, endpoint in enumerate(route.endpoints):
        if endpoint:
            with context(f"Endpoints[{i}]"):
                validate_endpoint(endpoint)


def _validate_etcd(etcd: pb.Header.Etcd) -> None:
    if etcd.cluster_id == 0:
        raise ValidationError("invalid value (0; expected != 0)", ["ClusterId"])
    if etcd.member_id == 0:
        raise ValidationError("invalid value (0; expected != 0)", ["MemberId"])
    if etcd.revision <= 0:
        raise ValidationError(f"invalid value ({etcd.revision}; expected > 0)", ["Revision"])
    if etcd.raft_term == 0:
        raise ValidationError("invalid value (0; expected != 0)", ["RaftTerm"])


def validate_header(header: pb.Header) -> None:
    """Check a Header: ProcessId (if set) valid, Route valid, and Etcd having
    non-zero ClusterId, MemberId, RaftTerm and a positive Revision."""
    if header.process_id.zone or header.process_id.suffix:
        with context("ProcessId"):
            validate_process_id(header.process_id)
    with context("Route"):
        validate_route(header.route)
    with context("Etcd"):
        _validate_etcd(header.etcd)


def validate_status(status: int) -> None:
    """Check a Status: a known value."""
    if status not in pb.Status.values():
        raise ValidationError(f"invalid value ({status})")


def _validate_optional_header(msg: Any) -> None:
    if msg.HasField("header"):
        with context("Header"):
            validate_header(msg.header)


def _validate_status_and_header(msg: Any) -> None:
    with context("Status"):
        validate_status(msg.status)
    with context("Header"):
        validate_header(msg.header)


def _validate_url(url: str) -> None:
    try:
        urlsplit(url)
    except ValueError as err:
        raise ValidationError(f"not a URL ({url!r}: {err})") from None


# ---------------------------------------------------------------------------
# RPC requests and responses.


def validate_read_request(req: pb.ReadRequest) -> None:
    """Check a ReadRequest: valid Header (if set) and Journal, Offset >= -1,
    EndOffset zero or >= Offset."""
    _validate_optional_header(req)
    with context("Journal"):
        validate_journal_name(req.journal)
    if req.offset < -1:
        raise ValidationError(f"invalid value ({req.offset}; expected >= -1)", ["Offset"])
    if req.end_offset < 0 or (req.end_offset != 0 and req.end_offset < req.offset):
        raise ValidationError(
            f"invalid value ({req.end_offset}; expected 0 or >= Offset {req.offset})",
            ["EndOffset"],
        )


def validate_read_response(resp: pb.ReadResponse) -> None:
    """Check a ReadResponse: either a content chunk (Content and nothing else), or
    metadata with a Fragment covering Offset and not beyond WriteHead."""
    with context("Status"):
        validate_status(resp.status)
    if resp.content:
        for field, present in (
            ("Status", resp.status != pb.OK),
            ("Header", resp.HasField("header")),
            ("WriteHead", resp.write_head != 0),
            ("Fragment", resp.HasField("fragment")),
            ("FragmentUrl", resp.fragment_url != ""),
        ):
            if present:
                raise ValidationError("unexpected alongside Content", [field])
        return
    _validate_optional_header(resp)
    if resp.write_head < 0:
        raise ValidationError(f"invalid value ({resp.write_head}; expected >= 0)", ["WriteHead"])
    if resp.HasField("fragment"):
        frag = resp.fragment
        with context("Fragment"):
            validate_fragment(frag)
        if not frag.begin <= resp.offset < frag.end:
            raise ValidationError(
                f"invalid value ({resp.offset}; expected {frag.begin} <= Offset < {frag.end})",
                ["Offset"],
            )
        if resp.write_head < frag.end:
            raise ValidationError(
                f"invalid value ({resp.write_head}; expected >= Fragment.End {frag.end})",
                ["WriteHead"],
            )
        if resp.fragment_url:
            with context("FragmentUrl"):
                _validate_url(resp.fragment_url)
    elif resp.status == pb.OK and resp.offset != 0:
        raise ValidationError(f"unexpected without Fragment or Content ({resp.offset})", ["Offset"])
    elif resp.fragment_url:
        raise ValidationError(
            f"unexpected without Fragment ({resp.fragment_url!r})", ["FragmentUrl"]
        )


def validate_append_request(req: pb.AppendRequest) -> None:
    """Check an AppendRequest, as Gazette does: a message naming a Journal is
    checked as the first message of an Append RPC, any other as a later one
    (see `validate_first_append_request`, `validate_later_append_request`).
    A server knows which message of the stream it holds, and should use those.
    """
    if req.journal:
        validate_first_append_request(req)
    else:
        validate_later_append_request(req)


def validate_first_append_request(req: pb.AppendRequest) -> None:
    """Check the first message of an Append RPC: it names the Journal and
    carries the parameters: valid Header (if set), Offset >= 0, no Content,
    valid registers selector and sets, a known Suspend."""
    _validate_optional_header(req)
    with context("Journal"):
        validate_journal_name(req.journal)
    if req.offset < 0:
        raise ValidationError(f"invalid value ({req.offset}; expected >= 0)", ["Offset"])
    if req.content:
        raise ValidationError(
            f"unexpected in the first message ({len(req.content)} bytes)", ["Content"]
        )
    if req.HasField("check_registers"):
        with context("CheckRegisters"):
            validate_label_selector(req.check_registers)
    if req.HasField("union_registers"):
        with context("UnionRegisters"):
            validate_label_set(req.union_registers)
    if req.HasField("subtract_registers"):
        with context("SubtractRegisters"):
            validate_label_set(req.subtract_registers)
    if req.suspend not in _APPEND_SUSPEND_VALUES:
        raise ValidationError(f"invalid variant ({req.suspend})", ["Suspend"])


def validate_later_append_request(req: pb.AppendRequest) -> None:
    """Check a later message of an Append RPC: Content only (or nothing, to
    commit); no Journal (the stream's is the first message's) nor parameters."""
    for field, present in (
        ("Journal", req.journal != ""),
        ("Header", req.HasField("header")),
        ("DoNotProxy", req.do_not_proxy),
        ("Offset", req.offset != 0),
        ("CheckRegisters", req.HasField("check_registers")),
        ("UnionRegisters", req.HasField("union_registers")),
        ("SubtractRegisters", req.HasField("subtract_registers")),
        ("Suspend", req.suspend != pb.AppendRequest.SUSPEND_RESUME),
    ):
        if present:
            raise ValidationError(
                "unexpected in a content message (expected only Content)", [field]
            )


def validate_append_response(resp: pb.AppendResponse) -> None:
    """Check an AppendResponse: valid Status and Header; OK requires Commit; OK
    and REGISTER_MISMATCH require Registers; Commit and Registers valid if set."""
    _validate_status_and_header(resp)
    if resp.status == pb.OK and not resp.HasField("commit"):
        raise ValidationError("expected with Status OK", ["Commit"])
    if resp.status in (pb.OK, pb.REGISTER_MISMATCH) and not resp.HasField("registers"):
        raise ValidationError(f"expected with Status {pb.Status.Name(resp.status)}", ["Registers"])
    if resp.HasField("commit"):
        with context("Commit"):
            validate_fragment(resp.commit)
    if resp.HasField("registers"):
        with context("Registers"):
            validate_label_set(resp.registers)


def validate_replicate_request(req: pb.ReplicateRequest) -> None:
    """Check a ReplicateRequest: either a Proposal (with Registers, optionally
    Header and then Acknowledge, no Content), or a Content chunk alone."""
    if req.HasField("proposal"):
        if req.HasField("header"):
            with context("Header"):
                validate_header(req.header)
            if not req.acknowledge:
                raise ValidationError("expected with Header", ["Acknowledge"])
        with context("Proposal"):
            validate_fragment(req.proposal)
        # Absent Registers are taken as empty, as Go brokers do for older peers.
        with context("Registers"):
            validate_label_set(req.registers)
        if req.content:
            raise ValidationError(
                f"unexpected with Proposal ({len(req.content)} bytes)", ["Content"]
            )
        if req.content_delta != 0:
            raise ValidationError(
                f"unexpected with Proposal ({req.content_delta})", ["ContentDelta"]
            )
        if req.deprecated_journal and req.deprecated_journal != req.proposal.journal:
            raise ValidationError(
                f"mismatch with Proposal.Journal ({req.deprecated_journal!r} vs "
                f"{req.proposal.journal!r})",
                ["DeprecatedJournal"],
            )
        return
    if not req.content:
        raise ValidationError("expected Content or Proposal")
    if req.content_delta < 0:
        raise ValidationError(
            f"invalid value ({req.content_delta}; expected >= 0)", ["ContentDelta"]
        )
    for field, present in (
        ("Header", req.HasField("header")),
        ("Registers", req.HasField("registers")),
        ("Acknowledge", req.acknowledge),
        ("DeprecatedJournal", req.deprecated_journal != ""),
    ):
        if present:
            raise ValidationError("unexpected with Content", [field])


def validate_replicate_response(resp: pb.ReplicateResponse) -> None:
    """Check a ReplicateResponse: WRONG_ROUTE carries a Header, PROPOSAL_MISMATCH
    a Fragment and Registers; other statuses carry none of these."""
    with context("Status"):
        validate_status(resp.status)
    if resp.status == pb.WRONG_ROUTE:
        if not resp.HasField("header"):
            raise ValidationError("expected with Status WRONG_ROUTE", ["Header"])
        with context("Header"):
            validate_header(resp.header)
    elif resp.HasField("header"):
        raise ValidationError(f"unexpected with Status {pb.Status.Name(resp.status)}", ["Header"])
    if resp.status == pb.PROPOSAL_MISMATCH:
        if not resp.HasField("fragment"):
            raise ValidationError("expected with Status PROPOSAL_MISMATCH", ["Fragment"])
        with context("Fragment"):
            validate_fragment(resp.fragment)
        if not resp.HasField("registers"):
            raise ValidationError("expected with Status PROPOSAL_MISMATCH", ["Registers"])
        with context("Registers"):
            validate_label_set(resp.registers)
    elif resp.HasField("fragment"):
        raise ValidationError(f"unexpected with Status {pb.Status.Name(resp.status)}", ["Fragment"])
    elif resp.HasField("registers"):
        raise ValidationError(
            f"unexpected with Status {pb.Status.Name(resp.status)}", ["Registers"]
        )


def validate_list_request(req: pb.ListRequest) -> None:
    """Check a ListRequest: a valid Selector, whose ``prefix`` meta-label values
    each end in '/'. WatchResume is a header this client was sent, and is not
    checked (as in Gazette)."""
    with context("Selector"):
        validate_label_selector(req.selector)
        for part, ls in (("Include", req.selector.include), ("Exclude", req.selector.exclude)):
            for value in _values_of(ls, "prefix"):
                if not value.endswith("/"):
                    raise ValidationError(
                        f"expected a trailing '/' ({value!r})", [part, 'Labels["prefix"]']
                    )


def _validate_list_journal(journal: pb.ListResponse.Journal) -> None:
    with context("Spec"):
        validate_journal_spec(journal.spec)
    if journal.mod_revision <= 0:
        raise ValidationError(
            f"invalid value ({journal.mod_revision}; expected > 0)", ["ModRevision"]
        )
    with context("Route"):
        validate_route(journal.route)


def validate_list_response(resp: pb.ListResponse) -> None:
    """Check a ListResponse: valid Status, Header (if set: only the first response
    of a snapshot carries one) and Journals."""
    with context("Status"):
        validate_status(resp.status)
    _validate_optional_header(resp)
    for i, journal in enumerate(resp.journals):
        with context(f"Journals[{i}]"):
            _validate_list_journal(journal)


def _validate_change(change: pb.ApplyRequest.Change) -> None:
    rev = change.expect_mod_revision
    if change.HasField("upsert"):
        if change.delete:
            raise ValidationError(
                f"both Upsert and Delete ({change.delete!r}) are set (expected exactly one)"
            )
        with context("Upsert"):
            validate_journal_spec(change.upsert)
        if rev < -1:
            raise ValidationError(
                f"invalid value ({rev}; expected >= 0, or -1)", ["ExpectModRevision"]
            )
    elif change.delete:
        with context("Delete"):
            validate_journal_name(change.delete)
        if rev <= 0 and rev != -1:
            raise ValidationError(
                f"invalid value ({rev}; expected > 0, or -1)", ["ExpectModRevision"]
            )
    else:
        raise ValidationError("neither Upsert nor Delete are set (expected exactly one)")


def validate_apply_request(req: pb.ApplyRequest) -> None:
    """Check an ApplyRequest: each change has exactly one of Upsert or Delete;
    ExpectModRevision is -1 (any), 0 (create; Upsert only) or a revision."""
    for i, change in enumerate(req.changes):
        with context(f"Changes[{i}]"):
            _validate_change(change)


def validate_apply_response(resp: pb.ApplyResponse) -> None:
    """Check an ApplyResponse: valid Status and Header."""
    _validate_status_and_header(resp)


def validate_fragments_request(req: pb.FragmentsRequest) -> None:
    """Check a FragmentsRequest: valid Header (if set) and Journal, EndModTime zero
    or >= BeginModTime, NextPageToken >= 0, PageLimit in 0..10000 and a positive
    SignatureTTL if set."""
    _validate_optional_header(req)
    with context("Journal"):
        validate_journal_name(req.journal)
    if req.end_mod_time != 0 and req.end_mod_time < req.begin_mod_time:
        raise ValidationError(
            f"invalid value ({req.end_mod_time}; expected 0 or >= BeginModTime "
            f"{req.begin_mod_time})",
            ["EndModTime"],
        )
    if req.next_page_token < 0:
        raise ValidationError(
            f"invalid value ({req.next_page_token}; expected >= 0)", ["NextPageToken"]
        )
    if not 0 <= req.page_limit <= MAX_PAGE_LIMIT:
        raise ValidationError(
            f"invalid value ({req.page_limit}; expected 0 <= PageLimit <= {MAX_PAGE_LIMIT})",
            ["PageLimit"],
        )
    if req.HasField("signatureTTL") and _nanos(req.signatureTTL) <= 0:
        raise ValidationError(
            f"invalid value ({_fmt_nanos(_nanos(req.signatureTTL))}; expected > 0s)",
            ["SignatureTTL"],
        )


def validate_fragments_response(resp: pb.FragmentsResponse) -> None:
    """Check a FragmentsResponse: valid Status, Header, and Fragments."""
    _validate_status_and_header(resp)
    for i, frag in enumerate(resp.fragments):
        with context(f"Fragments[{i}]"):
            with context("Spec"):
                validate_fragment(frag.spec)
            if frag.signed_url:
                with context("SignedUrl"):
                    _validate_url(frag.signed_url)


def validate_fragment_store_health_request(req: pb.FragmentStoreHealthRequest) -> None:
    """Check a FragmentStoreHealthRequest: a valid FragmentStore."""
    with context("FragmentStore"):
        validate_fragment_store(req.fragment_store)


def validate_fragment_store_health_response(resp: pb.FragmentStoreHealthResponse) -> None:
    """Check a FragmentStoreHealthResponse: valid Status and Header."""
    _validate_status_and_header(resp)


# ---------------------------------------------------------------------------
# Dispatch.

_VALIDATORS: dict[type[Message], Callable[[Any], None]] = {
    pb.Label: validate_label,
    pb.LabelSet: validate_label_set,
    pb.LabelSelector: validate_label_selector,
    pb.JournalSpec: validate_journal_spec,
    pb.JournalSpec.Fragment: validate_fragment_spec,
    pb.ProcessSpec: validate_process_spec,
    pb.ProcessSpec.ID: validate_process_id,
    pb.BrokerSpec: validate_broker_spec,
    pb.Fragment: validate_fragment,
    pb.Route: validate_route,
    pb.Header: validate_header,
    pb.ReadRequest: validate_read_request,
    pb.ReadResponse: validate_read_response,
    pb.AppendRequest: validate_append_request,
    pb.AppendResponse: validate_append_response,
    pb.ReplicateRequest: validate_replicate_request,
    pb.ReplicateResponse: validate_replicate_response,
    pb.ListRequest: validate_list_request,
    pb.ListResponse: validate_list_response,
    pb.ApplyRequest: validate_apply_request,
    pb.ApplyResponse: validate_apply_response,
    pb.FragmentsRequest: validate_fragments_request,
    pb.FragmentsResponse: validate_fragments_response,
    pb.FragmentStoreHealthRequest: validate_fragment_store_health_request,
    pb.FragmentStoreHealthResponse: validate_fragment_store_health_response,
}


def validate(msg: Message) -> None:
    """Validate any broker protocol message with its type's validator.

    Raises TypeError for a message type that has no validator.
    """
    validator = _VALIDATORS.get(type(msg))
    if validator is None:
        raise TypeError(f"no validator for {type(msg).__name__}")
    validator(msg)
