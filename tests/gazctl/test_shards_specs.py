"""gazctl shards list / apply / edit / unassign against an in-process consumer.Shard service."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from gazette.consumer.protocol import pb
from gazette.testing.etcd import EtcdServer
from tests.consumer.shard_api_server import ShardAPIServer

from .conftest import Gazctl
from .spec_texts import JOURNALS, TEMPLATE


@pytest.fixture
def specs(gazctl: Gazctl, prefix: str) -> str:
    """The YAML of two shards, whose source journals and recovery logs exist."""
    r = gazctl("journals", "apply", stdin=JOURNALS.replace("PREFIX", prefix).encode())
    assert r.rc == 0, r.err
    return TEMPLATE.replace("PREFIX", prefix)


def listed(shards: Gazctl, *args: str) -> list[dict[str, object]]:
    r = shards("list", "-o", "json", *args)
    assert r.rc == 0, r.err
    out: list[dict[str, object]] = json.loads(r.text)
    return out


def test_apply_and_list(shards: Gazctl, specs: str, prefix: str) -> None:
    r = shards("apply", stdin=specs.encode())
    assert r.rc == 0, r.err
    assert "applied 2 change(s)" in r.err

    docs = listed(shards)
    assert [d["spec"]["id"] for d in docs] == ["shard-000", "shard-001"]  # type: ignore[index]
    spec1 = docs[1]["spec"]
    assert spec1["recovery_log_prefix"] == f"{prefix}recovery"  # type: ignore[index]
    assert spec1["hot_standbys"] == 1  # type: ignore[index]
    assert spec1["labels"]["labels"] == [  # type: ignore[index]
        {"name": "app", "value": "word-count"},
        {"name": "tier", "value": "gold"},
    ]
    assert docs[0]["route"] == {"members": [], "primary": -1, "endpoints": []}

    # Selectors: labels and the id meta-label.
    assert [d["spec"]["id"] for d in listed(shards, "-l", "tier=gold")] == ["shard-001"]  # type: ignore[index]
    assert [d["spec"]["id"] for d in listed(shards, "-l", "id=shard-000")] == ["shard-000"]  # type: ignore[index]

    table = shards("list").text.splitlines()
    assert table[0].split() == ["ID", "STATUS", "ROUTE"]
    assert table[1].split() == ["shard-000", "<none>", "<none>"]

    # The YAML listing hoists what shards share into `common`, and applies back unchanged.
    text = shards("list", "-o", "yaml").text
    doc = yaml.safe_load(text)
    assert doc["common"]["labels"] == [{"name": "app", "value": "word-count"}]
    assert doc["common"]["max_txn_duration"] == "1s"
    assert [s["id"] for s in doc["shards"]] == ["shard-000", "shard-001"]
    assert all(s["revision"] > 0 for s in doc["shards"])
    r = shards("apply", stdin=text.encode())
    assert r.rc == 0, r.err
    assert [d["spec"] for d in listed(shards)] == [d["spec"] for d in docs]


def test_list_route_and_status(shards: Gazctl, shard_api: ShardAPIServer, specs: str) -> None:
    assert shards("apply", stdin=specs.encode()).rc == 0
    shard_api.put_member("zone-a", "c1")
    shard_api.put_member("zone-b", "c2")
    shard_api.put_assignment("shard-001", "zone-b", "c2", 0, pb.ReplicaStatus.PRIMARY)
    shard_api.put_assignment(
        "shard-001", "zone-a", "c1", 1, pb.ReplicaStatus.FAILED, ("boom: at offset 12\ntrace",)
    )

    # A FAILED replica's reason is in the table (its first line), in a last column that is
    # there when a listed shard has one.
    table = shards("list", "-L", "tier").text.splitlines()
    assert table[0].split() == ["ID", "STATUS", "ROUTE", "TIER", "ERRORS"]
    assert table[1].split() == ["shard-000", "<none>", "<none>", "<none>", "-"]
    assert table[2].split(maxsplit=4) == [
        "shard-001",
        "PRIMARY",
        "zone-a#c1:FAILED,zone-b#c2*:PRIMARY",
        "gold",
        "zone-a#c1: boom: at offset 12",
    ]
    assert len(table) == 3
    assert shards("list", "-l", "id=shard-000").text.splitlines()[0].split() == [
        "ID",
        "STATUS",
        "ROUTE",
    ]
    (doc,) = listed(shards, "-l", "id=shard-001")
    assert doc["route"]["primary"] == 1  # type: ignore[index]
    assert doc["status"] == [
        {"code": "FAILED", "errors": ["boom: at offset 12\ntrace"]},
        {"code": "PRIMARY"},
    ]


def test_list_lag(
    shards: Gazctl, gazctl: Gazctl, shard_api: ShardAPIServer, prefix: str, specs: str
) -> None:
    assert (
        gazctl("journals", "append", "--journal", f"{prefix}words/part-000", stdin=b"x" * 100).rc
        == 0
    )
    assert (
        gazctl("journals", "append", "--journal", f"{prefix}words/part-001", stdin=b"y" * 50).rc
        == 0
    )
    assert shards("apply", stdin=specs.encode()).rc == 0
    shard_api.read_through["shard-000"] = {f"{prefix}words/part-000": 30}
    shard_api.read_through["shard-001"] = {f"{prefix}words/part-001": 50}

    table = shards("list", "--lag").text.splitlines()
    assert table[0].split() == ["ID", "STATUS", "ROUTE", "LAG"]
    assert table[1].endswith(f"{prefix}words/part-000:70")
    assert table[2].endswith(f"{prefix}words/part-001:0")
    docs = listed(shards, "--lag")
    assert docs[0]["lag"] == {f"{prefix}words/part-000": 70}

    # A shard reading a journal the brokers do not know is reported, not skipped.
    shard_api.read_through["shard-000"] = {f"{prefix}missing": 0}
    r = shards("list", "--lag", "-l", "id=shard-000")
    assert r.rc == 1 and "JOURNAL_NOT_FOUND" in r.err


def test_apply_checks_referenced_journals(
    shards: Gazctl, gazctl: Gazctl, specs: str, prefix: str
) -> None:
    missing = specs.replace("words/part-001", "words/part-999")
    r = shards("apply", stdin=missing.encode())
    assert r.rc == 1
    assert f"shard shard-001: journal {prefix}words/part-999 does not exist" in r.err

    # A recovery log must carry the recovery-log content type; sources a framed one.
    plain = JOURNALS.replace("PREFIXrecovery", "PREFIXplain").replace(
        "application/x-gazette-recoverylog", "application/x-ndjson"
    )
    assert gazctl("journals", "apply", stdin=plain.replace("PREFIX", prefix).encode()).rc == 0
    wrong_log = specs.replace(f"{prefix}recovery", f"{prefix}plain")
    r = shards("apply", stdin=wrong_log.encode())
    assert r.rc == 1
    assert (
        f"shard shard-000: recovery log {prefix}plain/shard-000 has content-type "
        "'application/x-ndjson', expected 'application/x-gazette-recoverylog'"
    ) in r.err
    wrong_source = specs.replace("words/part-000", "recovery/shard-001")
    r = shards("apply", stdin=wrong_source.encode())
    assert r.rc == 1
    assert f"shard shard-000: source {prefix}recovery/shard-001: no framing" in r.err
    assert listed(shards) == []

    r = shards("apply", "--skip-journal-check", stdin=missing.encode())
    assert r.rc == 0, r.err
    assert len(listed(shards)) == 2


def test_apply_dry_run_and_guards(shards: Gazctl, specs: str) -> None:
    r = shards("apply", "--dry-run", stdin=specs.encode())
    assert r.rc == 0, r.err
    assert "# create shard-000 (expect revision 0)" in r.text
    assert 'id: "shard-001"' in r.text
    assert listed(shards) == []

    assert shards("apply", stdin=specs.encode()).rc == 0
    (rev,) = {d["mod_revision"] for d in listed(shards)}

    # Omitted revisions update what exists; a stale explicit revision fails the whole apply.
    stale = specs.replace("  hot_standbys: 1\n", "  hot_standbys: 2\n  revision: 1\n")
    r = shards("apply", stdin=stale.encode())
    assert r.rc == 1
    assert "ETCD_TRANSACTION_FAILED" in r.err and "changed since" in r.err
    assert [d["mod_revision"] for d in listed(shards)] == [rev, rev]

    # Revision -1 applies regardless.
    forced = specs.replace("  hot_standbys: 1\n", "  hot_standbys: 2\n  revision: -1\n")
    assert shards("apply", stdin=forced.encode()).rc == 0
    assert listed(shards)[1]["spec"]["hot_standbys"] == 2  # type: ignore[index]

    # Deletion.
    delete = "shards:\n- id: shard-000\n  delete: true\n"
    r = shards("apply", stdin=delete.encode())
    assert r.rc == 0, r.err
    assert [d["spec"]["id"] for d in listed(shards)] == ["shard-001"]  # type: ignore[index]
    r = shards("apply", stdin=delete.encode())
    assert r.rc == 1 and "cannot delete 'shard-000': no such shard" in r.err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("shards: [\n", "invalid YAML"),
        ("", "empty shard specification document"),
        ("- id: shard-000\n", "expected a mapping with 'common' and 'shards'"),
        ("shards:\n- sources: []\n", "shards[0]: expected an 'id'"),
        ("shards:\n- id: shard-000\n  colour: red\n", "shards[shard-000]: unknown field 'colour'"),
        ("common:\n  id: x\n", "common: unknown field 'id'"),
        (
            "shards:\n- id: shard-000\n  max_txn_duration: soon\n",
            "shards[shard-000].max_txn_duration: invalid duration ('soon'",
        ),
        (
            "shards:\n- id: shard-000\n  hot_standbys: -1\n",
            "shards[shard-000].hot_standbys: expected an integer from 0 to 4294967295 (-1)",
        ),
        (
            "shards:\n- id: shard-000\n- id: shard-000\n",
            "shard shard-000 appears more than once",
        ),
        # Parsed, but invalid specs: refused before anything is sent.
        (
            "shards:\n- id: shard-000\n",
            "shard shard-000: max_txn_duration: invalid value (0s; expected > 0s)",
        ),
        (
            "common:\n  max_txn_duration: 1s\nshards:\n- id: sh#rd\n",
            "shard sh#rd: id: not a valid token",
        ),
        (
            "common:\n  max_txn_duration: 1s\n  labels: [{name: id, value: x}]\n"
            "shards:\n- id: shard-000\n",
            "shard shard-000: labels",
        ),
        (
            "common:\n  max_txn_duration: 1s\n"
            "shards:\n- id: shard-000\n  sources: [{journal: bb/cc}, {journal: aa/bb}]\n",
            "shard shard-000: sources[1].journal",
        ),
        (
            "common:\n  max_txn_duration: 1s\n  recovery_log_prefix: recovery\n"
            "shards:\n- id: shard-000\n",
            "shard shard-000: hint_prefix: not an absolute, clean, non-directory path",
        ),
        (
            "common:\n  max_txn_duration: 1s\n  min_txn_duration: 1m\nshards:\n- id: shard-000\n",
            "shard shard-000: min_txn_duration: invalid value (1m0s; expected <= "
            "max_txn_duration 1s",
        ),
    ],
)
def test_apply_bad_input(shards: Gazctl, text: str, message: str) -> None:
    """Errors name the YAML keys a user wrote (and the shard), not upstream's Go fields."""
    r = shards("apply", stdin=text.encode())
    assert r.rc == 1
    assert r.err.startswith("gazctl: error:"), r.err
    assert message in r.err, r.err
    assert "Traceback" not in r.err


def test_apply_file_and_unreachable_consumer(gazctl: Gazctl, tmp_path: Path, specs: str) -> None:
    path = tmp_path / "shards.yaml"
    path.write_text(specs)
    r = gazctl("shards", "apply", "--specs", str(path), "--consumer", "127.0.0.1:1")
    assert r.rc == 1
    assert "consumer 127.0.0.1:1 is unavailable" in r.err


def test_edit(shards: Gazctl, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, specs: str) -> None:
    assert shards("apply", stdin=specs.encode()).rc == 0
    script = tmp_path / "editor.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, yaml
            path = sys.argv[1]
            doc = yaml.safe_load(open(path))
            for shard in doc["shards"]:
                shard["hot_standbys"] = 3
            open(path, "w").write(yaml.safe_dump(doc))
            """
        )
    )
    monkeypatch.setenv("EDITOR", f"{sys.executable} {script}")
    monkeypatch.delenv("VISUAL", raising=False)
    r = shards("edit", "-l", "app=word-count")
    assert r.rc == 0, r.err
    assert [d["spec"]["hot_standbys"] for d in listed(shards)] == [3, 3]  # type: ignore[index]

    monkeypatch.setenv("EDITOR", "true")
    r = shards("edit", "-l", "app=word-count")
    assert r.rc == 0 and "no changes" in r.err

    monkeypatch.setenv("EDITOR", "false")
    r = shards("edit", "-l", "app=word-count")
    assert r.rc == 1 and "nothing applied" in r.err

    # An edit that cannot be applied is kept in a file the error names, not lost.
    script.write_text(
        textwrap.dedent(
            """
            import sys, yaml
            path = sys.argv[1]
            doc = yaml.safe_load(open(path))
            doc["shards"][0]["max_txn_duration"] = "soon"
            open(path, "w").write(yaml.safe_dump(doc))
            """
        )
    )
    monkeypatch.setenv("EDITOR", f"{sys.executable} {script}")
    r = shards("edit", "-l", "app=word-count")
    assert r.rc == 1 and "invalid duration ('soon'" in r.err and r.err.count("\n") == 1, r.err
    kept = Path(r.err.split("the edit is kept in ")[1].split(":")[0])
    assert "max_txn_duration: soon" in kept.read_text()
    assert f"`gazctl shards apply --specs {kept}`" in r.err
    kept.unlink()

    r = shards("edit", "-l", "app=none")
    assert r.rc == 1 and "no shards match" in r.err


def test_unassign(shards: Gazctl, shard_api: ShardAPIServer, specs: str) -> None:
    assert shards("apply", stdin=specs.encode()).rc == 0
    shard_api.put_member("zone-a", "c1")
    shard_api.put_member("zone-b", "c2")
    shard_api.put_assignment("shard-000", "zone-a", "c1", 0, pb.ReplicaStatus.PRIMARY)
    shard_api.put_assignment("shard-001", "zone-b", "c2", 0, pb.ReplicaStatus.PRIMARY)
    shard_api.put_assignment("shard-001", "zone-a", "c1", 1, pb.ReplicaStatus.FAILED, ("boom",))

    def routes() -> dict[str, str]:
        lines = shards("list").text.splitlines()[1:]
        return {ln.split()[0]: ln.split()[2] for ln in lines}

    before = routes()
    r = shards("unassign", "-l", "app=word-count", "--failed", "--dry-run")
    assert r.rc == 0, r.err
    assert r.text.splitlines() == [
        "would unassign shard-001 (was zone-a#c1:FAILED,zone-b#c2*:PRIMARY)"
    ]
    assert routes() == before

    r = shards("unassign", "-l", "app=word-count", "--failed")
    assert r.rc == 0, r.err
    assert routes() == {"shard-000": "zone-a#c1*:PRIMARY", "shard-001": "zone-b#c2*:PRIMARY"}

    r = shards("unassign", "-l", "id=shard-000")
    assert r.rc == 0, r.err
    assert r.text.startswith("unassigned shard-000")
    assert routes() == {"shard-000": "<none>", "shard-001": "zone-b#c2*:PRIMARY"}

    with pytest.raises(SystemExit):  # -l is required (an argparse usage error)
        shards("unassign")


def test_apply_too_large_for_one_transaction(shards: Gazctl) -> None:
    """As ``journals apply``: a shard apply etcd refuses for its size names --max-txn-size."""
    entries = "".join(
        f"- id: shard-{i:03d}\n  sources: [{{journal: a/journal}}]\n" for i in range(200)
    )
    specs = f"common:\n  max_txn_duration: 1s\nshards:\n{entries}".encode()
    r = shards("apply", "--skip-journal-check", stdin=specs)
    assert r.rc == 1 and r.err.count("\n") == 1, r.err
    assert r.err.startswith("gazctl: error: the apply is too large for one etcd transaction")
    assert "--max-txn-size" in r.err
    r = shards("apply", "--skip-journal-check", "--max-txn-size", "50", stdin=specs)
    assert r.rc == 0 and "applied 200 change(s)" in r.err, r.err


def test_apply_fails_over_between_batches(
    gazctl: Gazctl, shard_api: ShardAPIServer, etcd_server: EtcdServer
) -> None:
    """A batched apply whose consumer goes away after a batch goes on at the next consumer
    with the next batch: the batches before stay applied once (re-applying them would fail
    their revision checks)."""
    entries = "".join(
        f"- id: shard-{i:03d}\n  sources: [{{journal: a/journal}}]\n" for i in range(6)
    )
    specs = f"common:\n  max_txn_duration: 1s\nshards:\n{entries}".encode()
    first = ShardAPIServer(etcd_server.endpoint, root=shard_api.root, max_applies=1)
    with first:
        r = gazctl(
            "shards", "apply", "--skip-journal-check", "--max-txn-size", "2",
            "--consumer", f"{first.endpoint},{shard_api.endpoint}", stdin=specs,
        )  # fmt: skip
    assert r.rc == 0, r.err
    assert f"consumer {first.endpoint} is unavailable (consumer is draining)" in r.err
    assert "applied 6 change(s)" in r.err
    ids = [[ch.upsert.id for ch in req.changes] for req in (*first.applied, *shard_api.applied)]
    assert ids == [
        ["shard-000", "shard-001"],
        ["shard-002", "shard-003"],
        ["shard-004", "shard-005"],
    ]
