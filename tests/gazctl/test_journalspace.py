"""Table tests of the hierarchical journal YAML: durations, inheritance, errors, round trips."""

from __future__ import annotations

import pytest
import yaml
from google.protobuf.duration_pb2 import Duration

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError
from gazette.gazctl.journalspace import (
    Node,
    apply_changes,
    dump_tree,
    load_tree,
    parse_tree,
    tree_from_journals,
)
from gazette.gazctl.specyaml import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "nanos", "formatted"),
    [
        ("10s", 10 * 10**9, "10s"),
        ("1m0s", 60 * 10**9, "1m0s"),
        ("1m", 60 * 10**9, "1m0s"),
        ("90s", 90 * 10**9, "1m30s"),
        ("1h", 3600 * 10**9, "1h0m0s"),
        ("2h45m30.5s", (2 * 3600 + 45 * 60 + 30) * 10**9 + 5 * 10**8, "2h45m30.5s"),
        ("1.5h", 5400 * 10**9, "1h30m0s"),
        ("250ms", 250 * 10**6, "250ms"),
        ("1.5ms", 1_500_000, "1.5ms"),
        ("0", 0, "0s"),
        ("-5s", -5 * 10**9, "-5s"),
        (30, 30 * 10**9, "30s"),
    ],
)
def test_durations(text: object, nanos: int, formatted: str) -> None:
    d = parse_duration(text)
    assert d.ToNanoseconds() == nanos
    assert format_duration(d) == formatted


@pytest.mark.parametrize("bad", ["", "10", "1x", "s", "1h 2m", "ten seconds", True, None])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValidationError):
        parse_duration(bad)


def _flat(text: str, current: dict[str, int] | None = None) -> list[pb.ApplyRequest.Change]:
    return apply_changes(load_tree(text), current)


BASE = """
name: acme/
replication: 2
labels:
- {name: team, value: data}
fragment:
  length: 1048576
  compression_codec: snappy
  stores: [file:///tmp/store/]
  refresh_interval: 10s
  retention: 24h
"""


def test_children_inherit_and_override() -> None:
    changes = _flat(
        BASE
        + """
children:
- name: acme/clicks/
  labels: [{name: content-type, value: application/x-ndjson}]
  children:
  - name: acme/clicks/eu
  - name: acme/clicks/us
    replication: 3
    labels: [{name: team, value: web}]
- name: acme/orders
  fragment: {compression_codec: ZSTANDARD, flush_interval: 5m}
  max_append_rate: 1000
"""
    )
    by_name = {c.upsert.name: c.upsert for c in changes}
    assert list(by_name) == ["acme/clicks/eu", "acme/clicks/us", "acme/orders"]
    eu, us, orders = by_name.values()
    assert eu.replication == 2 and us.replication == 3
    assert [(lb.name, lb.value) for lb in eu.labels.labels] == [
        ("content-type", "application/x-ndjson"),
        ("team", "data"),
    ]
    # A child's value of a label replaces the inherited one.
    assert [(lb.name, lb.value) for lb in us.labels.labels] == [
        ("content-type", "application/x-ndjson"),
        ("team", "web"),
    ]
    assert eu.fragment.compression_codec == pb.SNAPPY and list(eu.fragment.stores) == [
        "file:///tmp/store/"
    ]
    assert eu.fragment.retention == Duration(seconds=86400)
    assert orders.fragment.compression_codec == pb.ZSTANDARD
    assert orders.fragment.flush_interval == Duration(seconds=300)
    assert orders.fragment.length == 1048576 and orders.max_append_rate == 1000
    assert all(c.expect_mod_revision == 0 for c in changes)


def test_journals_alias_list_document_and_delete_cascade() -> None:
    changes = _flat(
        """
journals:
- name: a/
  delete: true
  children:
  - name: a/one
  - name: a/two
    delete: false
    replication: 1
- name: b/journal
  replication: 1
  revision: 7
""",
        current={"a/one": 3, "a/two": 4, "b/journal": 9},
    )
    assert [(c.delete, c.upsert.name, c.expect_mod_revision) for c in changes] == [
        ("a/one", "", 3),
        ("", "a/two", 4),
        ("", "b/journal", 7),  # An explicit revision wins over the current one.
    ]
    assert [c.upsert.name for c in apply_changes(parse_tree([{"name": "x/yy"}]))] == ["x/yy"]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("name: aa/\nreplicas: 3\nchildren: [{name: aa/bb}]", "unknown field 'replicas'"),
        ("name: aa/\nreplication: 1", "needs children"),
        ("name: aa/\nchildren: [{name: bb/cc}]", "must be named under its parent"),
        ("name: aa/\nchildren: [{name: aa/bb}, {name: aa/bb}]", "duplicate node"),
        ("name: aa/bb\nchildren: [{name: aa/bbb/cc}]", "cannot have children"),
        ("name: aa/\nrevision: 3\nchildren: [{name: aa/bb}]", "cannot have a revision"),
        ("name: aa/bb\nfragment: {refresh_interval: soon}", "invalid duration"),
        ("name: aa/bb\nfragment: {compression_codec: lz4}", "invalid compression codec"),
        ("name: aa/bb\nflags: O_APPEND", "invalid flags"),
        ("name: aa/bb\nreplication: three", "expected an integer"),
        ("name: aa/bb\nlabels: [{name: x, val: y}]", "unknown field 'val'"),
        ("name: aa/bb\nchildren: {name: aa/cc}", "expected a list of nodes"),
        ("[unclosed", "invalid YAML"),
        ("", "empty journal specification"),
        ("name: aa/\nchildren: [{name: 'aa/ bb'}]", "aa/ bb"),
    ],
)
def test_tree_errors(doc: str, message: str) -> None:
    with pytest.raises(ValidationError) as exc:
        load_tree(doc)
    assert message in str(exc.value)


def test_delete_of_missing_journal_is_rejected() -> None:
    with pytest.raises(ValidationError, match="no such journal"):
        _flat("name: gone/journal\ndelete: true", current={})


UPSTREAM_FIXTURE = """\
name: foo/
replication: 3
labels:
- name: a-name
  value: a-val
fragment:
  length: 1234
  compression_codec: SNAPPY
  stores:
  - s3://a-bucket/
  - gcs://another-bucket/
  refresh_interval: 1m0s
  retention: 1h0m0s
  flush_interval: 2m0s
  path_postfix_template: foo={{ .Spool.Begin }}
flags: O_RDWR
max_append_rate: 11223344
children:
- delete: true
  name: foo/bar
- name: foo/baz/1
- name: foo/baz/2
  labels:
  - name: other-name
    value: ''
  revision: 1234
"""


def test_push_down_then_hoist_round_trips() -> None:
    tree = load_tree(UPSTREAM_FIXTURE)
    changes = apply_changes(tree)
    assert [c.delete or c.upsert.name for c in changes] == ["foo/bar", "foo/baz/1", "foo/baz/2"]
    assert changes[1].upsert.flags == pb.JournalSpec.O_RDWR
    assert changes[2].expect_mod_revision == 1234
    tree.hoist()
    assert dump_tree(tree) == UPSTREAM_FIXTURE


def _journal(name: str, rev: int, **labels: str) -> pb.ListResponse.Journal:
    spec = pb.JournalSpec(name=name, replication=1)
    spec.fragment.length = 1 << 20
    spec.fragment.compression_codec = pb.NONE
    spec.fragment.stores.append("file:///s/")
    spec.fragment.refresh_interval.FromSeconds(10)
    for k, v in sorted(labels.items()):
        spec.labels.labels.add(name=k, value=v)
    return pb.ListResponse.Journal(spec=spec, mod_revision=rev)


def test_tree_from_listing_hoists_common_values_and_flattens_back() -> None:
    listing = [
        _journal("root/aaa/111/foo/i", 1, app="x"),
        _journal("root/aaa/111/foo/j", 2, app="x"),
        _journal("root/aaa/222", 3, app="x", extra="1"),
        _journal("root/bbb/333/a/x", 4, app="x"),
        _journal("root/bbb/444", 5, app="x"),
        _journal("solo", 6, app="y"),
    ]
    tree = tree_from_journals(listing)

    def shape(n: Node) -> object:
        return n.name if not n.children else {n.name: [shape(c) for c in n.children]}

    assert shape(tree) == {
        "": [
            {
                "root/": [
                    {
                        "root/aaa/": [
                            {"root/aaa/111/foo/": ["root/aaa/111/foo/i", "root/aaa/111/foo/j"]},
                            "root/aaa/222",
                        ]
                    },
                    {"root/bbb/": ["root/bbb/333/a/x", "root/bbb/444"]},
                ]
            },
            "solo",
        ]
    }
    doc = yaml.safe_load(dump_tree(tree))
    assert doc["children"][0]["labels"] == [{"name": "app", "value": "x"}]
    assert doc["fragment"]["refresh_interval"] == "10s"
    # Flattening the dumped tree reproduces each listed spec and revision exactly.
    changes = apply_changes(load_tree(dump_tree(tree)))
    assert [(c.upsert, c.expect_mod_revision) for c in changes] == [
        (j.spec, j.mod_revision) for j in listing
    ]


# --- upstream's rules: ordered children and labels, integers and durations in range ------


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            # examples/word-count/journals.yaml had its children so, which upstream refuses.
            "name: ex/\nchildren: [{name: ex/deltas/, children: [{name: ex/deltas/p0}]}, "
            "{name: ex/counts}]",
            "children of 'ex/' must be in name order, as upstream gazctl requires: "
            "'ex/counts' (children[1]) goes before 'ex/deltas/'",
        ),
        (
            "name: ex/\nchildren: [{name: ex/d/, children: [{name: ex/d/2}, {name: ex/d/1}]}]",
            "children of 'ex/d/' must be in name order",
        ),
        ("name: aa/\nchildren: [{name: aa/bb}, {name: aa/bb}]", "duplicate node 'aa/bb'"),
        (
            "name: aa/bb\nlabels: [{name: zz}, {name: aa}]",
            "aa/bb.labels[1]: labels must be in (name, value) order without duplicates, as "
            "upstream requires: aa='' goes before zz=''",
        ),
        (
            "name: aa/bb\nlabels: [{name: aa, value: '2'}, {name: aa, value: '1'}]",
            "aa/bb.labels[1]: labels must be in (name, value) order",
        ),
        ("name: aa/bb\nlabels: [{name: aa}, {name: aa}]", "aa/bb.labels[1]: duplicate label aa=''"),
    ],
)
def test_upstream_order_rules(doc: str, message: str) -> None:
    """Children and labels are in the order upstream's gazctl requires (it refuses a tree
    whose children are not ordered, and a spec whose labels are not), so that a tree this
    gazctl takes is one upstream's takes too."""
    with pytest.raises(ValidationError) as exc:
        load_tree(doc)
    assert message in str(exc.value)


def test_label_mappings_are_sorted() -> None:
    """Labels given as a mapping (this gazctl's shorthand) have no order to keep."""
    (change,) = _flat("name: aa/bb\nlabels: {zz: '1', aa: '2'}")
    assert [(lb.name, lb.value) for lb in change.upsert.labels.labels] == [
        ("aa", "2"),
        ("zz", "1"),
    ]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            "name: aa/bb\nfragment: {length: 99999999999999999999999}",
            "aa/bb.fragment.length: expected an integer from -9223372036854775808 to "
            "9223372036854775807 (99999999999999999999999)",
        ),
        (
            "name: aa/bb\nreplication: 2147483648",
            "aa/bb.replication: expected an integer from -2147483648 to 2147483647",
        ),
        ("name: aa/bb\nmax_append_rate: 9223372036854775808", "aa/bb.max_append_rate: expected"),
        ("name: aa/bb\nsuspend: {offset: -9223372036854775809}", "aa/bb.suspend.offset: expected"),
        ("name: aa/bb\nrevision: 9223372036854775808", "aa/bb.revision: expected an integer"),
        ("name: aa/bb\nflags: 4294967296", "aa/bb.flags: invalid flags (4294967296"),
        (
            "name: aa/bb\nfragment: {retention: 9999999h}",
            "aa/bb.fragment.retention: invalid duration ('9999999h'; beyond Go's "
            "time.Duration range of ±2562047h47m16.854775807s)",
        ),
        (
            "name: aa/bb\nfragment: {retention: 1.0e+30}",
            "aa/bb.fragment.retention: invalid duration",
        ),
        ("name: aa/bb\nfragment: {retention: .nan}", "aa/bb.fragment.retention: invalid duration"),
    ],
)
def test_out_of_range_numbers_name_their_key(doc: str, message: str) -> None:
    """Numbers past what the spec's field (or Go's time.Duration) holds are refused naming
    the YAML key, rather than ending in a traceback."""
    with pytest.raises(ValidationError) as exc:
        load_tree(doc)
    assert message in str(exc.value)
