"""Table tests of the protocol validators."""

from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from hypothesis import given
from hypothesis import strategies as st

from gazette.broker.protocol import (
    ValidationError,
    label_set,
    parse_label_selector,
    pb,
    sha1sum_of,
    split_journal_meta,
    validate,
    validate_append_request,
    validate_append_response,
    validate_apply_request,
    validate_broker_spec,
    validate_fragment,
    validate_fragment_store,
    validate_fragments_request,
    validate_header,
    validate_journal_name,
    validate_journal_spec,
    validate_label,
    validate_label_selector,
    validate_label_set,
    validate_list_request,
    validate_path_component,
    validate_read_request,
    validate_read_response,
    validate_replicate_request,
    validate_replicate_response,
    validate_route,
    validate_token,
)
from gazette.broker.protocol.validation import (
    validate_first_append_request,
    validate_later_append_request,
)

# Out-of-range enum values, as a newer peer might send.
BAD_ENUM: Any = 99
BAD_SUSPEND: Any = 9


def expect_error(fn: Callable[[], None], *fragments: str) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        fn()
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return info.value


# --- tokens, paths, journal names -------------------------------------------


@pytest.mark.parametrize(
    "value, symbols, lo, hi, error",
    [
        ("a-token", "-", 1, 10, None),
        ("ünï-çødé٣", "-", 1, 20, None),  # Letters and numbers of any script.
        ("", "", 0, 1, None),
        ("a b", "", 1, 10, "not a valid token ('a b'; invalid rune ' ')"),
        ("a#b", "", 1, 10, "invalid rune '#'"),
        ("abc", "", 4, 10, "invalid length (3; expected 4 <= length <= 10)"),
        ("ééé", "", 1, 5, "invalid length (6; expected 1 <= length <= 5)"),  # UTF-8 bytes.
        ("\ud800", "", 0, 10, "not a valid token"),  # Lone surrogate.
    ],
)
def test_validate_token(value: str, symbols: str, lo: int, hi: int, error: str | None) -> None:
    if error is None:
        validate_token(value, symbols, lo, hi)
    else:
        expect_error(lambda: validate_token(value, symbols, lo, hi), error)


@pytest.mark.parametrize(
    "value, error",
    [
        ("", None),
        ("a/b=c/d%20", None),
        ("a/.hidden/b", None),
        ("/a", "cannot begin with '/'"),
        ("a/", "must be a clean path"),
        ("a//b", "must be a clean path"),
        ("a/./b", "must be a clean path"),
        ("a/../b", "must be a clean path"),
        ("../a", "must be a clean path"),
        (".", "must be a clean path"),
        ("a b", "not a valid token"),
    ],
)
def test_validate_path_component(value: str, error: str | None) -> None:
    if error is None:
        validate_path_component(value, 0, 100)
    else:
        expect_error(lambda: validate_path_component(value, 0, 100), error, repr(value))


@pytest.mark.parametrize(
    "name, error",
    [
        ("a/journal", None),
        ("abcd", None),
        ("a" * 512, None),
        ("a/journal;meta", None),
        ("a/journal;some/meta=1", None),
        ("abc", "invalid length (3; expected 4 <= length <= 512)"),
        ("a" * 513, "invalid length (513;"),
        ("/a/journal", "cannot begin with '/'"),
        ("a/journal/", "must be a clean path"),
        ("a//journal", "must be a clean path"),
        ("a/./journal", "must be a clean path"),
        ("a/../journal", "must be a clean path"),
        ("a journal", "invalid rune ' '"),
        ("a/journal;", "Meta: invalid length (0; expected 1 <= length"),
        ("a/journal;/x", "Meta: cannot begin with '/'"),
        ("a/journal;x;y", "Meta: not a valid token"),
        ("a/jour\nnal", "invalid rune '\\n'"),
    ],
)
def test_validate_journal_name(name: str, error: str | None) -> None:
    if error is None:
        validate_journal_name(name)
    else:
        expect_error(lambda: validate_journal_name(name), error)


def test_split_journal_meta() -> None:
    assert split_journal_meta("a/journal") == ("a/journal", "")
    assert split_journal_meta("a/journal;meta;more") == ("a/journal", ";meta;more")


_COMPONENT = st.text(
    alphabet=st.characters(categories=["L", "N"]) | st.sampled_from("-_+.=%"),
    min_size=1,
    max_size=12,
).filter(lambda c: c not in (".", ".."))


@given(st.lists(_COMPONENT, min_size=1, max_size=8).map("/".join))
def test_random_valid_journal_names_validate(name: str) -> None:
    name = (name + "xxxx")[: max(4, len(name))]
    if len(name.encode()) > 512:
        return
    validate_journal_name(name)
    validate_journal_name(name + ";meta")


@given(st.text())
def test_random_text_validates_or_raises_validation_error(text: str) -> None:
    for fn in (
        validate_journal_name,
        lambda t: validate_label(pb.Label(name=t, value=t)),
        validate_fragment_store,
        lambda t: validate_path_component(t, 0, 1000),
    ):
        try:
            fn(text)
        except ValidationError:
            pass


# --- labels and selectors ----------------------------------------------------


@pytest.mark.parametrize(
    "name, value, prefix, error",
    [
        ("a-label", "a-value", False, None),
        ("a/label", "a%20value=x", False, None),
        ("a-label", "", False, None),
        ("a|label", "a-value", False, "Name: not a valid token ('a|label'"),
        ("a-label", "a|value", False, "Value: not a valid token ('a|value'"),
        ("a", "a-value", False, "Name: invalid length (1; expected 2 <= length <= 64)"),
        ("a" * 65, "v", False, "Name: invalid length (65; expected 2 <= length <= 64)"),
        (
            "a-label",
            "a" * 1025,
            False,
            "Value: invalid length (1025; expected 0 <= length <= 1024)",
        ),
        ("a-label:prefix", "v", False, "Name: not a valid token ('a-label:prefix'"),
        ("a-label", "v", True, "Prefix: may not be set outside of a LabelSelector"),
    ],
)
def test_validate_label(name: str, value: str, prefix: bool, error: str | None) -> None:
    label = pb.Label(name=name, value=value, prefix=prefix)
    if error is None:
        validate_label(label)
    else:
        expect_error(lambda: validate_label(label), error)


def _ls(*items: tuple[str, str] | tuple[str, str, bool]) -> pb.LabelSet:
    return pb.LabelSet(
        labels=[pb.Label(name=i[0], value=i[1], prefix=len(i) > 2 and bool(i[2])) for i in items]
    )


@pytest.mark.parametrize(
    "ls, error",
    [
        (_ls(), None),
        (_ls(("aa", "1"), ("aa", "2"), ("bb", ""), ("cc", "3")), None),
        (_ls(("bad label", "1")), "Labels[0].Name: not a valid token ('bad label'"),
        (_ls(("bb", "1"), ("aa", "1")), "Labels[1]: not in unique, sorted order (aa='1' follows"),
        (_ls(("aa", "2"), ("aa", "1")), "Labels[1]: not in unique, sorted order (aa='1'"),
        (_ls(("aa", "1"), ("aa", "1")), "Labels[1]: not in unique, sorted order"),
        (_ls(("aa", ""), ("aa", "1")), "Labels[1]: label aa has both empty and non-empty values"),
        (_ls(("aa", "1", True)), "Labels[0].Prefix: may not be set"),
    ],
)
def test_validate_label_set(ls: pb.LabelSet, error: str | None) -> None:
    if error is None:
        validate_label_set(ls)
    else:
        expect_error(lambda: validate_label_set(ls), error)


def test_validate_label_selector() -> None:
    sel = pb.LabelSelector(
        include=_ls(("include", "a-value"), ("prefix-thing", "prefix/", True)),
        exclude=_ls(("exclude", "other")),
    )
    validate_label_selector(sel)
    sel.include.labels[0].name = "bad label"
    expect_error(lambda: validate_label_selector(sel), "Include.Labels[0].Name: not a valid token")
    sel.include.labels[0].name = "include"
    sel.exclude.labels[0].name = "bad label"
    expect_error(lambda: validate_label_selector(sel), "Exclude.Labels[0].Name: not a valid token")


# --- journal specs -------------------------------------------------------------


def make_spec() -> pb.JournalSpec:
    return pb.JournalSpec(
        name="example/journal",
        replication=3,
        labels=label_set(
            ("content-type", "application/x-ndjson"),
            ("app.gazette.dev/message-type", "Msg"),
            ("tag", "one"),
            ("tag", "two"),
        ),
        fragment=pb.JournalSpec.Fragment(
            length=1 << 28,
            compression_codec=pb.SNAPPY,
            stores=["s3://bucket/path/", "gs://other/", "azure://c/p/", "file:///mnt/x/"],
            refresh_interval=Duration(seconds=300),
            retention=Duration(seconds=86400),
            flush_interval=Duration(seconds=3600),
            path_postfix_template='date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}',
        ),
        flags=pb.JournalSpec.O_RDWR,
        max_append_rate=1 << 20,
    )


def _set(path: str, value: object) -> Callable[[pb.JournalSpec], None]:
    def apply(spec: pb.JournalSpec) -> None:
        *outer, last = path.split(".")
        msg = spec
        for part in outer:
            msg = getattr(msg, part)
        if isinstance(value, Duration):
            getattr(msg, last).CopyFrom(value)
        elif isinstance(value, list):
            del getattr(msg, last)[:]
            getattr(msg, last).extend(value)
        else:
            setattr(msg, last, value)

    return apply


def _labels(*pairs: tuple[str, str]) -> Callable[[pb.JournalSpec], None]:
    def apply(spec: pb.JournalSpec) -> None:
        spec.labels.CopyFrom(_ls(*pairs))

    return apply


@pytest.mark.parametrize(
    "mutate, error",
    [
        (_set("replication", 1), None),
        (_set("replication", 5), None),
        (_set("flags", 0), None),
        (_set("flags", pb.JournalSpec.O_RDONLY), None),
        (_set("fragment.length", 1024), None),
        (_set("fragment.length", 1 << 34), None),
        (_set("fragment.flush_interval", Duration()), None),
        (_set("fragment.retention", Duration(seconds=-1)), None),
        (_set("fragment.refresh_interval", Duration(seconds=24 * 3600)), None),
        (_set("fragment.path_postfix_template", ""), None),
        (_set("fragment.stores", []), None),
        (_set("fragment.stores", ["azure-ad://tenant/account/container/p/"]), None),
        (_labels(), None),
        (_labels(("content-type", "text/csv")), None),
        (_set("name", "a/b"), "Name: invalid length (3; expected 4 <= length <= 512)"),
        (
            _set("name", "example/journal;meta"),
            "Name: cannot have a metadata path segment (';meta')",
        ),
        (_set("replication", 0), "Replication: invalid value (0; expected 1 <= Replication <= 5)"),
        (_set("replication", 6), "Replication: invalid value (6;"),
        (_labels(("name", "x")), "Labels: cannot include reserved label 'name'"),
        (_labels(("prefix", "x/")), "Labels: cannot include reserved label 'prefix'"),
        (_labels(("bad label", "x")), "Labels.Labels[0].Name: not a valid token ('bad label'"),
        (
            _labels(("content-type", "text/csv"), ("content-type", "text/plain")),
            "Labels.Labels[1]: single-value label content-type has multiple values",
        ),
        (_labels(("content-type", "not//a/type")), "Labels: content-type is not a media type"),
        (
            _labels(("app.gazette.dev/message-type", "M")),
            "Labels: expected content-type label alongside app.gazette.dev/message-type",
        ),
        (
            _labels(("app.gazette.dev/message-subtype", "S")),
            "expected app.gazette.dev/message-type label alongside app.gazette.dev/message-subtype",
        ),
        (
            _set("fragment.length", 1),
            "Fragment.Length: invalid value (1; expected 1024 <= Length <= 17179869184)",
        ),
        (_set("fragment.length", (1 << 34) + 1), "Fragment.Length: invalid value (17179869185;"),
        (
            _set("fragment.compression_codec", pb.INVALID),
            "Fragment.CompressionCodec: invalid value (0",
        ),
        (_set("fragment.compression_codec", 99), "Fragment.CompressionCodec: invalid value (99)"),
        (
            _set("fragment.stores", ["s3://b/", "s3://b/no-slash"]),
            "Fragment.Stores[1]: path doesn't end in '/'",
        ),
        (
            _set("fragment.stores", ["s3:///path/"]),
            "Fragment.Stores[0]: missing bucket ('s3:///path/')",
        ),
        (
            _set("fragment.stores", ["bucket/path/"]),
            "Fragment.Stores[0]: not absolute ('bucket/path/')",
        ),
        (_set("fragment.stores", ["http://h/p/"]), "Fragment.Stores[0]: invalid scheme ('http'"),
        (
            _set("fragment.stores", ["file://host/p/"]),
            "Fragment.Stores[0]: file scheme cannot have a host",
        ),
        (
            _set("fragment.stores", ["azure-ad://tenant/account/"]),
            "Fragment.Stores[0]: missing storage container",
        ),
        (
            _set("fragment.stores", ["azure-ad:///account/c/"]),
            "Fragment.Stores[0]: missing tenant ID",
        ),
        (
            _set("fragment.refresh_interval", Duration(nanos=999_999_999)),
            "Fragment.RefreshInterval: invalid value (0.999999999s; "
            "expected 1s <= RefreshInterval <= 86400s)",
        ),
        (
            _set("fragment.refresh_interval", Duration()),
            "Fragment.RefreshInterval: invalid value (0s;",
        ),
        (
            _set("fragment.refresh_interval", Duration(seconds=86401)),
            "Fragment.RefreshInterval: invalid value (86401s;",
        ),
        (
            _set("fragment.flush_interval", Duration(seconds=59)),
            "Fragment.FlushInterval: invalid value (59s; expected 0s or >= 60s)",
        ),
        (
            _set("fragment.path_postfix_template", "a={{ .Spool"),
            "Fragment.PathPostfixTemplate: unclosed action",
        ),
        (
            _set("fragment.path_postfix_template", "a={{ }}"),
            "Fragment.PathPostfixTemplate: empty action",
        ),
        (_set("flags", 3), "Flags: invalid combination (0x3)"),
        (_set("flags", 8), "Flags: invalid combination (0x8)"),
        (_set("max_append_rate", -1), "MaxAppendRate: invalid value (-1; expected >= 0)"),
        (_set("suspend.level", 7), "Suspend.Level: invalid variant (7)"),
        (_set("suspend.offset", -2), "Suspend.Offset: invalid value (-2; expected >= 0)"),
    ],
)
def test_validate_journal_spec(mutate: Callable[[pb.JournalSpec], None], error: str | None) -> None:
    spec = make_spec()
    validate_journal_spec(spec)
    mutate(spec)
    if error is None:
        validate_journal_spec(spec)
        validate(spec)
    else:
        expect_error(lambda: validate_journal_spec(spec), error)


def test_gzip_offload_not_with_file_primary_store() -> None:
    spec = make_spec()
    spec.fragment.compression_codec = pb.GZIP_OFFLOAD_DECOMPRESSION
    del spec.fragment.stores[:]
    spec.fragment.stores.extend(["s3://bucket/", "file:///mnt/"])
    validate_journal_spec(spec)  # Only the primary store (stores[0]) matters.
    spec.fragment.stores[0] = "file:///mnt/"
    expect_error(
        lambda: validate_journal_spec(spec),
        "Fragment.Stores[0]: GZIP_OFFLOAD_DECOMPRESSION is incompatible with file:// stores",
    )


# --- fragments, processes, routes, headers ---------------------------------------


def make_fragment() -> pb.Fragment:
    return pb.Fragment(
        journal="a/journal",
        begin=100,
        end=200,
        sum=sha1sum_of(b"x"),
        compression_codec=pb.GZIP,
        backing_store="s3://bucket/",
        mod_time=12345,
        path_postfix="date=2024-01-01",
    )


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("end", 100, None),
        ("path_postfix", "", None),
        ("journal", "bad", "Journal: invalid length (3;"),
        ("begin", 201, "End: expected Begin <= End (have 201, 200)"),
        ("begin", -1, "Begin: invalid value (-1; expected >= 0)"),
        ("compression_codec", pb.INVALID, "CompressionCodec: invalid value (0 INVALID)"),
        ("path_postfix", "a//b", "PathPostfix: must be a clean path ('a//b'"),
    ],
)
def test_validate_fragment(field: str, value: object, error: str | None) -> None:
    frag = make_fragment()
    validate_fragment(frag)
    setattr(frag, field, value)
    if error is None:
        validate_fragment(frag)
    else:
        expect_error(lambda: validate_fragment(frag), error)


def pid(zone: str, suffix: str) -> pb.ProcessSpec.ID:
    return pb.ProcessSpec.ID(zone=zone, suffix=suffix)


@pytest.mark.parametrize(
    "route, error",
    [
        (pb.Route(primary=-1), None),
        (
            pb.Route(
                members=[pid("a", "broker-1"), pid("a", "broker-2"), pid("b", "broker-1")],
                primary=2,
            ),
            None,
        ),
        (pb.Route(members=[pid("a", "broker-1")], primary=0, endpoints=["http://host:8080"]), None),
        (pb.Route(members=[pid("a", "broker-1")], primary=0, endpoints=[""]), None),
        (pb.Route(members=[pid("a", "broker-1")], endpoints=["unix://host/tmp/sock"]), None),
        (pb.Route(), "Primary: invalid value (0; expected -1 <= Primary < 0)"),
        (
            pb.Route(members=[pid("a", "broker-1")], primary=1),
            "Primary: invalid value (1; expected -1 <= Primary < 1)",
        ),
        (pb.Route(members=[pid("a", "broker-1")], primary=-2), "Primary: invalid value (-2;"),
        (
            pb.Route(members=[pid("b", "broker-1"), pid("a", "broker-2")]),
            "Members[1]: not in unique, sorted order (a/broker-2 follows b/broker-1)",
        ),
        (
            pb.Route(members=[pid("a", "broker-1"), pid("a", "broker-1")]),
            "Members[1]: not in unique, sorted order",
        ),
        (
            pb.Route(members=[pid("", "broker-1")]),
            "Members[0].Zone: invalid length (0; expected 1 <= length <= 32)",
        ),
        (
            pb.Route(members=[pid("a", "brk")]),
            "Members[0].Suffix: invalid length (3; expected 4 <= length <= 128)",
        ),
        (
            pb.Route(members=[pid("a", "broker-1")], endpoints=["http://a", "http://b"]),
            "Endpoints: expected none or one per member (have 2 for 1 members)",
        ),
        (
            pb.Route(members=[pid("a", "broker-1")], endpoints=["localhost:80"]),
            "Endpoints[0]: missing host ('localhost:80')",
        ),
        (
            pb.Route(members=[pid("a", "broker-1")], endpoints=["/a/path"]),
            "Endpoints[0]: not absolute ('/a/path')",
        ),
    ],
)
def test_validate_route(route: pb.Route, error: str | None) -> None:
    if error is None:
        validate_route(route)
    else:
        expect_error(lambda: validate_route(route), error)


def make_header() -> pb.Header:
    return pb.Header(
        process_id=pid("zone", "broker-1"),
        route=pb.Route(members=[pid("zone", "broker-1")], primary=0),
        etcd=pb.Header.Etcd(cluster_id=1, member_id=2, revision=3, raft_term=4),
    )


@pytest.mark.parametrize(
    "mutate, error",
    [
        (lambda h: h.ClearField("process_id"), None),
        (lambda h: setattr(h.process_id, "suffix", "x"), "ProcessId.Suffix: invalid length (1;"),
        (lambda h: setattr(h.route, "primary", 3), "Route.Primary: invalid value (3;"),
        (
            lambda h: setattr(h.etcd, "cluster_id", 0),
            "Etcd.ClusterId: invalid value (0; expected != 0)",
        ),
        (lambda h: setattr(h.etcd, "member_id", 0), "Etcd.MemberId: invalid value (0;"),
        (
            lambda h: setattr(h.etcd, "revision", 0),
            "Etcd.Revision: invalid value (0; expected > 0)",
        ),
        (lambda h: setattr(h.etcd, "raft_term", 0), "Etcd.RaftTerm: invalid value (0;"),
        (lambda h: h.ClearField("etcd"), "Etcd.ClusterId"),
    ],
)
def test_validate_header(mutate: Callable[[pb.Header], None], error: str | None) -> None:
    header = make_header()
    validate_header(header)
    mutate(header)
    if error is None:
        validate_header(header)
    else:
        expect_error(lambda: validate_header(header), error)


def test_validate_broker_spec() -> None:
    spec = pb.BrokerSpec(
        process_spec=pb.ProcessSpec(id=pid("zone", "broker-1"), endpoint="http://host:8080"),
        journal_limit=1 << 17,
    )
    validate_broker_spec(spec)
    spec.journal_limit = (1 << 17) + 1
    expect_error(lambda: validate_broker_spec(spec), "JournalLimit: invalid value (131073;")
    spec.journal_limit = 0
    spec.process_spec.endpoint = "no-host"
    expect_error(
        lambda: validate_broker_spec(spec), "ProcessSpec.Endpoint: not absolute ('no-host')"
    )
    spec.process_spec.endpoint = "http://host"
    spec.process_spec.id.zone = "a zone"
    expect_error(
        lambda: validate_broker_spec(spec), "ProcessSpec.Id.Zone: not a valid token ('a zone'"
    )


# --- RPC requests ----------------------------------------------------------------


@pytest.mark.parametrize(
    "req, error",
    [
        (pb.ReadRequest(journal="a/journal"), None),
        (pb.ReadRequest(journal="a/journal", offset=-1, block=True), None),
        (pb.ReadRequest(journal="a/journal", offset=10, end_offset=10), None),
        (pb.ReadRequest(journal="a/journal", header=make_header()), None),
        (pb.ReadRequest(journal="a/journal;meta", offset=1), None),
        (pb.ReadRequest(journal="bad"), "Journal: invalid length (3;"),
        (
            pb.ReadRequest(journal="a/journal", offset=-2),
            "Offset: invalid value (-2; expected >= -1)",
        ),
        (pb.ReadRequest(journal="a/journal", end_offset=-1), "EndOffset: invalid value (-1;"),
        (
            pb.ReadRequest(journal="a/journal", offset=10, end_offset=5),
            "EndOffset: invalid value (5; expected 0 or >= Offset 10)",
        ),
        (pb.ReadRequest(journal="a/journal", header=pb.Header()), "Header.Route.Primary"),
    ],
)
def test_validate_read_request(req: pb.ReadRequest, error: str | None) -> None:
    if error is None:
        validate_read_request(req)
        validate(req)
    else:
        expect_error(lambda: validate_read_request(req), error)
        expect_error(lambda: validate(req), error)


def test_validate_read_response() -> None:
    validate_read_response(pb.ReadResponse(content=b"data"))
    expect_error(
        lambda: validate_read_response(pb.ReadResponse(content=b"x", write_head=3)),
        "WriteHead: unexpected alongside Content",
    )
    frag = make_fragment()
    validate_read_response(pb.ReadResponse(offset=150, write_head=200, fragment=frag))
    validate_read_response(pb.ReadResponse(status=pb.OFFSET_NOT_YET_AVAILABLE, offset=5))
    expect_error(
        lambda: validate_read_response(pb.ReadResponse(offset=200, write_head=200, fragment=frag)),
        "Offset: invalid value (200; expected 100 <= Offset < 200)",
    )
    expect_error(
        lambda: validate_read_response(pb.ReadResponse(offset=150, write_head=199, fragment=frag)),
        "WriteHead: invalid value (199; expected >= Fragment.End 200)",
    )
    expect_error(
        lambda: validate_read_response(pb.ReadResponse(offset=5)),
        "Offset: unexpected without Fragment or Content (5)",
    )
    expect_error(
        lambda: validate_read_response(pb.ReadResponse(status=BAD_ENUM)),
        "Status: invalid value (99)",
    )


def _sel(text: str) -> pb.LabelSelector:
    return parse_label_selector(text)


@pytest.mark.parametrize(
    "req, error",
    [
        (pb.AppendRequest(journal="a/journal"), None),
        (
            pb.AppendRequest(
                journal="a/journal",
                offset=5,
                check_registers=_sel("aa=1"),
                union_registers=label_set(("bb", "2")),
                subtract_registers=label_set(("cc", "3")),
                suspend=pb.AppendRequest.SUSPEND_NOW,
            ),
            None,
        ),
        (pb.AppendRequest(content=b"chunk"), None),
        (pb.AppendRequest(), None),  # The commit message.
        (pb.AppendRequest(journal="bad"), "Journal: invalid length (3;"),
        (
            pb.AppendRequest(journal="a/journal", offset=-1),
            "Offset: invalid value (-1; expected >= 0)",
        ),
        (
            pb.AppendRequest(journal="a/journal", content=b"x"),
            "Content: unexpected in the first message (1 bytes)",
        ),
        (
            pb.AppendRequest(
                journal="a/journal", check_registers=pb.LabelSelector(include=_ls(("b", "1")))
            ),
            "CheckRegisters.Include.Labels[0].Name: invalid length (1;",
        ),
        (
            pb.AppendRequest(journal="a/journal", union_registers=_ls(("bb", "2"), ("aa", "1"))),
            "UnionRegisters.Labels[1]: not in unique, sorted order",
        ),
        (
            pb.AppendRequest(journal="a/journal", subtract_registers=_ls(("aa", "1", True))),
            "SubtractRegisters.Labels[0].Prefix: may not be set",
        ),
        (
            pb.AppendRequest(journal="a/journal", suspend=BAD_SUSPEND),
            "Suspend: invalid variant (9)",
        ),
        (pb.AppendRequest(content=b"x", offset=3), "Offset: unexpected in a content message"),
        (
            pb.AppendRequest(content=b"x", header=make_header()),
            "Header: unexpected in a content message",
        ),
        (
            pb.AppendRequest(content=b"x", union_registers=pb.LabelSet()),
            "UnionRegisters: unexpected",
        ),
        (pb.AppendRequest(suspend=pb.AppendRequest.SUSPEND_NOW), "Suspend: unexpected"),
    ],
)
def test_validate_append_request(req: pb.AppendRequest, error: str | None) -> None:
    if error is None:
        validate_append_request(req)
    else:
        expect_error(lambda: validate_append_request(req), error)


def test_first_and_later_append_messages_are_told_apart() -> None:
    # A server knows which message of the stream it holds: a first message must name a
    # journal (as a ReadRequest must), and a later one carries content only, not even a
    # journal, though the stream-agnostic validate_append_request takes both.
    expect_error(
        lambda: validate_first_append_request(pb.AppendRequest()),
        "Journal: invalid length (0; expected 4 <= length <= 512)",
    )
    expect_error(
        lambda: validate_read_request(pb.ReadRequest()),
        "Journal: invalid length (0; expected 4 <= length <= 512)",
    )
    named = pb.AppendRequest(journal="a/journal")
    validate_append_request(named)  # taken for a first message
    expect_error(
        lambda: validate_later_append_request(named), "Journal: unexpected in a content message"
    )
    expect_error(
        lambda: validate_later_append_request(pb.AppendRequest(journal="a/journal", content=b"x")),
        "Journal: unexpected in a content message",
    )
    validate_first_append_request(pb.AppendRequest(journal="a/journal", offset=5))
    validate_later_append_request(pb.AppendRequest(content=b"x"))
    validate_later_append_request(pb.AppendRequest())


def test_validate_append_response() -> None:
    ok = pb.AppendResponse(header=make_header(), commit=make_fragment(), registers=pb.LabelSet())
    validate_append_response(ok)
    validate(ok)
    missing = pb.AppendResponse(header=make_header(), registers=pb.LabelSet())
    expect_error(lambda: validate_append_response(missing), "Commit: expected with Status OK")
    mismatch = pb.AppendResponse(status=pb.REGISTER_MISMATCH, header=make_header())
    expect_error(
        lambda: validate_append_response(mismatch),
        "Registers: expected with Status REGISTER_MISMATCH",
    )


def test_validate_replicate() -> None:
    proposal = pb.ReplicateRequest(
        header=make_header(), proposal=make_fragment(), registers=pb.LabelSet(), acknowledge=True
    )
    validate_replicate_request(proposal)
    proposal.acknowledge = False
    expect_error(lambda: validate_replicate_request(proposal), "Acknowledge: expected with Header")
    validate_replicate_request(pb.ReplicateRequest(content=b"x", content_delta=10))
    expect_error(
        lambda: validate_replicate_request(pb.ReplicateRequest()), "expected Content or Proposal"
    )
    expect_error(
        lambda: validate_replicate_request(pb.ReplicateRequest(content=b"x", acknowledge=True)),
        "Acknowledge: unexpected with Content",
    )
    validate_replicate_response(pb.ReplicateResponse())
    expect_error(
        lambda: validate_replicate_response(pb.ReplicateResponse(status=pb.WRONG_ROUTE)),
        "Header: expected with Status WRONG_ROUTE",
    )
    validate_replicate_response(
        pb.ReplicateResponse(
            status=pb.PROPOSAL_MISMATCH, fragment=make_fragment(), registers=pb.LabelSet()
        )
    )


@pytest.mark.parametrize(
    "req, error",
    [
        (pb.ListRequest(), None),
        (pb.ListRequest(watch=True, watch_resume=make_header()), None),
        (pb.ListRequest(selector=_sel("prefix=a/b/,name:prefix=a/b")), None),
        (pb.ListRequest(selector=_sel("prefix!=a/b/")), None),
        (
            pb.ListRequest(selector=_sel("prefix=a/b")),
            "Selector.Include.Labels[\"prefix\"]: expected a trailing '/' ('a/b')",
        ),
        (
            pb.ListRequest(selector=_sel("prefix!=a/b")),
            'Selector.Exclude.Labels["prefix"]: expected a trailing',
        ),
        (
            pb.ListRequest(selector=pb.LabelSelector(include=_ls(("x", "1")))),
            "Selector.Include.Labels[0].Name: invalid length",
        ),
    ],
)
def test_validate_list_request(req: pb.ListRequest, error: str | None) -> None:
    if error is None:
        validate_list_request(req)
    else:
        expect_error(lambda: validate_list_request(req), error)


Change = pb.ApplyRequest.Change


@pytest.mark.parametrize(
    "changes, error",
    [
        ([], None),
        ([Change(upsert=make_spec())], None),
        ([Change(upsert=make_spec(), expect_mod_revision=-1)], None),
        ([Change(upsert=make_spec(), expect_mod_revision=10)], None),
        ([Change(delete="a/journal", expect_mod_revision=10)], None),
        ([Change(delete="a/journal", expect_mod_revision=-1)], None),
        ([Change(upsert=make_spec()), Change()], "Changes[1]: neither Upsert nor Delete are set"),
        (
            [Change(upsert=make_spec(), delete="a/journal")],
            "Changes[0]: both Upsert and Delete ('a/journal') are set",
        ),
        (
            [Change(delete="a/journal")],
            "Changes[0].ExpectModRevision: invalid value (0; expected > 0, or -1)",
        ),
        (
            [Change(delete="a/journal", expect_mod_revision=-2)],
            "Changes[0].ExpectModRevision: invalid value (-2;",
        ),
        (
            [Change(upsert=make_spec(), expect_mod_revision=-2)],
            "Changes[0].ExpectModRevision: invalid value (-2; expected >= 0, or -1)",
        ),
        ([Change(delete="bad", expect_mod_revision=1)], "Changes[0].Delete: invalid length (3;"),
        ([Change(upsert=pb.JournalSpec(name="bad"))], "Changes[0].Upsert.Name: invalid length (3;"),
    ],
)
def test_validate_apply_request(changes: list[pb.ApplyRequest.Change], error: str | None) -> None:
    req = pb.ApplyRequest(changes=changes)
    if error is None:
        validate_apply_request(req)
    else:
        expect_error(lambda: validate_apply_request(req), error)


def test_apply_request_nested_context() -> None:
    spec = make_spec()
    spec.fragment.length = 1
    err = expect_error(
        lambda: validate_apply_request(pb.ApplyRequest(changes=[Change(upsert=spec)]))
    )
    assert err.context == ["Changes[0]", "Upsert", "Fragment", "Length"]
    assert str(err).startswith("Changes[0].Upsert.Fragment.Length: invalid value (1; ")


@pytest.mark.parametrize(
    "req, error",
    [
        (pb.FragmentsRequest(journal="a/journal"), None),
        (
            pb.FragmentsRequest(
                journal="a/journal",
                begin_mod_time=10,
                end_mod_time=10,
                page_limit=10000,
                next_page_token=5,
                signatureTTL=Duration(seconds=60),
            ),
            None,
        ),
        (pb.FragmentsRequest(journal="a/journal", begin_mod_time=10), None),
        (pb.FragmentsRequest(journal="bad"), "Journal: invalid length"),
        (
            pb.FragmentsRequest(journal="a/journal", begin_mod_time=10, end_mod_time=5),
            "EndModTime: invalid value (5; expected 0 or >= BeginModTime 10)",
        ),
        (
            pb.FragmentsRequest(journal="a/journal", page_limit=10001),
            "PageLimit: invalid value (10001;",
        ),
        (pb.FragmentsRequest(journal="a/journal", page_limit=-1), "PageLimit: invalid value (-1;"),
        (
            pb.FragmentsRequest(journal="a/journal", next_page_token=-1),
            "NextPageToken: invalid value (-1;",
        ),
        (
            pb.FragmentsRequest(journal="a/journal", signatureTTL=Duration()),
            "SignatureTTL: invalid value (0s;",
        ),
    ],
)
def test_validate_fragments_request(req: pb.FragmentsRequest, error: str | None) -> None:
    if error is None:
        validate_fragments_request(req)
    else:
        expect_error(lambda: validate_fragments_request(req), error)


def test_validate_dispatch() -> None:
    validate(pb.Label(name="aa", value="b"))
    validate(pb.FragmentStoreHealthRequest(fragment_store="gs://bucket/"))
    expect_error(
        lambda: validate(pb.FragmentStoreHealthRequest(fragment_store="gs://bucket")),
        "FragmentStore: path doesn't end in '/'",
    )
    with pytest.raises(TypeError):
        validate(Duration())
