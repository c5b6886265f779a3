"""gazctl journals commands against a real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gazette.testing.broker import BrokerProcess
from tests.kit.eventually import eventually_blocking

from .conftest import Gazctl, Result
from .late_listener import LateListener
from .spec_texts import spec_yaml


def apply(gazctl: Gazctl, prefix: str, store: Path, **extra: str) -> None:
    store.mkdir(parents=True, exist_ok=True)
    r = gazctl("journals", "apply", stdin=spec_yaml(prefix, store, **extra).encode())
    assert r.rc == 0, r.err
    assert "applied 2 change(s)" in r.err


def test_apply_says_what_replication_1_promises(
    gazctl: Gazctl, prefix: str, tmp_path: Path
) -> None:
    """A spec asking for replication 1 is applied with a note of what it may lose, and how
    to avoid it; other replication factors get none."""
    r = gazctl("journals", "apply", stdin=spec_yaml(prefix, tmp_path).encode())
    assert r.rc == 0, r.err
    assert (
        f"gazctl: note: replication 1 ({prefix}clicks, {prefix}orders): one broker holds" in r.err
    )
    assert "Use replication 2 or more" in r.err and "--spool-sync" in r.err
    assert "warning" not in r.err, r.err
    storeless = spec_yaml(prefix, tmp_path).replace(f'  stores: ["file://{tmp_path}/"]\n', "")
    r = gazctl("journals", "apply", "--dry-run", stdin=storeless.encode())
    assert r.rc == 0, r.err
    assert (
        f"gazctl: warning: replication 1 without fragment.stores ({prefix}clicks, "
        f"{prefix}orders)" in r.err
    )
    assert "the journal forks" in r.err
    text = spec_yaml(prefix, tmp_path).replace("replication: 1", "replication: 2")
    r = gazctl("journals", "apply", "--dry-run", stdin=text.encode())
    assert r.rc == 0 and "note" not in r.err, r.err


def test_apply_list_and_reapply(gazctl: Gazctl, prefix: str, tmp_path: Path) -> None:
    dry = gazctl("journals", "apply", "--dry-run", stdin=spec_yaml(prefix, tmp_path).encode())
    assert dry.rc == 0 and f"# create {prefix}clicks (expect revision 0)" in dry.text
    assert gazctl("journals", "list", "-l", f"name:prefix={prefix}").text.count(prefix) == 0

    apply(gazctl, prefix, tmp_path / "store")

    def routed() -> Result | None:  # Once the broker has taken the assignment.
        table = gazctl("journals", "list", "-l", f"name:prefix={prefix}", "--primary")
        return table if "<none>" not in table.text else None

    table = eventually_blocking(routed, what="the route", timeout=5)
    assert table.rc == 0
    lines = table.text.splitlines()
    assert lines[0].split() == ["NAME", "LABELS", "PRIMARY", "ENDPOINT"]
    assert lines[1].startswith(f"{prefix}clicks") and "topic=clicks" in lines[1]
    assert "local/broker-1" in lines[1]

    listed = json.loads(
        gazctl("journals", "list", "-l", f"name:prefix={prefix}", "-o", "json").text
    )
    assert [j["spec"]["name"] for j in listed] == [f"{prefix}clicks", f"{prefix}orders"]

    tree = yaml.safe_load(
        gazctl("journals", "list", "-l", f"name:prefix={prefix}", "-o", "yaml").text
    )
    assert tree["name"] == prefix and tree["fragment"]["refresh_interval"] == "10s"
    assert [c["name"] for c in tree["children"]] == [f"{prefix}clicks", f"{prefix}orders"]
    assert all(c["revision"] > 0 for c in tree["children"])

    # Re-applying (without revisions) updates the existing journals.
    apply(gazctl, prefix, tmp_path / "store", retention="1h")
    listed = json.loads(
        gazctl("journals", "list", "-l", f"name:prefix={prefix}", "-o", "json").text
    )
    assert all(j["spec"]["fragment"]["retention"] == "3600s" for j in listed)

    # A stale explicit revision fails the whole apply, with one error line.
    tree["children"][0]["revision"] = 1
    tree["children"][0]["max_append_rate"] = 5
    stale = gazctl("journals", "apply", stdin=yaml.safe_dump(tree).encode())
    assert stale.rc == 1
    assert (
        stale.err.strip().splitlines() == [stale.err.strip().splitlines()[0]]
        and "ETCD_TRANSACTION_FAILED" in stale.err
    )

    # Deleting through the tree.
    deleted = gazctl("journals", "apply", stdin=f"name: {prefix}orders\ndelete: true\n".encode())
    assert deleted.rc == 0, deleted.err
    names = [
        j["spec"]["name"]
        for j in json.loads(
            gazctl("journals", "list", "-l", f"name:prefix={prefix}", "-o", "json").text
        )
    ]
    assert names == [f"{prefix}clicks"]


def test_append_and_read_with_offsets(gazctl: Gazctl, prefix: str, tmp_path: Path) -> None:
    apply(gazctl, prefix, tmp_path / "store")
    clicks = f"{prefix}clicks"
    r = gazctl("journals", "append", "--journal", clicks, stdin=b"one\ntwo\n")
    assert r.rc == 0 and "appended 8 bytes" in r.err
    r = gazctl(
        "journals",
        "append",
        "-l",
        "topic=clicks,name:prefix=" + prefix,
        "--framing",
        "lines",
        stdin=b"three\nfour",
    )
    assert r.rc == 0 and "appended 2 line(s)" in r.err, r.err

    offsets = tmp_path / "offsets.json"
    r = gazctl("journals", "read", "-l", f"name:prefix={prefix}", "--offsets-out", str(offsets))
    assert r.rc == 0, r.err
    assert r.out == b"one\ntwo\nthree\nfour\n"
    assert json.loads(offsets.read_text()) == {clicks: 19, f"{prefix}orders": 0}

    gazctl("journals", "append", "--journal", clicks, stdin=b"five\n")
    r = gazctl(
        "journals",
        "read",
        "-l",
        f"name:prefix={prefix}",
        "--offsets",
        str(offsets),
        "--offsets-out",
        str(offsets),
    )
    assert r.out == b"five\n"
    assert json.loads(offsets.read_text())[clicks] == 24

    tail = tmp_path / "tail.json"
    r = gazctl("journals", "read", "-l", f"name={clicks}", "--tail", "--offsets-out", str(tail))
    assert r.out == b"" and json.loads(tail.read_text()) == {clicks: 24}

    # Two selectors at once are an error; so is matching several journals for append.
    r = gazctl("journals", "append", "-l", f"name:prefix={prefix}", stdin=b"x")
    assert r.rc == 1 and "must match exactly one journal" in r.err


def test_read_block_streams_until_interrupted(gazctl_broker, prefix: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "BROKER_ADDRESS": gazctl_broker.endpoint}
    store = tmp_path / "store"
    store.mkdir()
    subprocess.run(
        [sys.executable, "-m", "gazette.gazctl.main", "journals", "apply"],
        input=spec_yaml(prefix, store).encode(),
        env=env,
        check=True,
    )
    reader = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gazette.gazctl.main",
            "journals",
            "read",
            "-l",
            f"name={prefix}clicks",
            "--block",
            "--offsets-out",
            str(tmp_path / "o.json"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "gazette.gazctl.main",
                "journals",
                "append",
                "--journal",
                f"{prefix}clicks",
            ],
            input=b"streamed\n",
            env=env,
            check=True,
        )
        assert reader.stdout is not None
        line = reader.stdout.readline()
        assert line == b"streamed\n"
    finally:
        reader.send_signal(2)  # SIGINT: stops cleanly and writes offsets.
        _, err = reader.communicate(timeout=20)
    assert reader.returncode == 0, err
    assert json.loads((tmp_path / "o.json").read_text()) == {f"{prefix}clicks": 9}


def test_edit_applies_editor_changes(
    gazctl: Gazctl, prefix: str, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    apply(gazctl, prefix, tmp_path / "store")
    script = tmp_path / "editor.py"
    script.write_text(
        textwrap.dedent(
            """\
        import sys, yaml
        path = sys.argv[1]
        doc = yaml.safe_load(open(path))
        doc["max_append_rate"] = 4242
        open(path, "w").write(yaml.safe_dump(doc))
        """
        )
    )
    monkeypatch.setenv("EDITOR", f"{sys.executable} {script}")
    monkeypatch.delenv("VISUAL", raising=False)
    r = gazctl("journals", "edit", "-l", f"name:prefix={prefix}")
    assert r.rc == 0, r.err
    listed = json.loads(
        gazctl("journals", "list", "-l", f"name:prefix={prefix}", "-o", "json").text
    )
    assert [j["spec"]["max_append_rate"] for j in listed] == ["4242", "4242"]

    monkeypatch.setenv("EDITOR", "true")  # Leaves the file unchanged.
    r = gazctl("journals", "edit", "-l", f"name:prefix={prefix}")
    assert r.rc == 0 and "no changes" in r.err

    # An edit that cannot be applied (a new journal out of name order) is kept, not lost.
    script.write_text(
        textwrap.dedent(
            f"""\
        import sys, yaml
        path = sys.argv[1]
        doc = yaml.safe_load(open(path))
        doc["children"].append({{"name": "{prefix}apples"}})
        open(path, "w").write(yaml.safe_dump(doc))
        """
        )
    )
    monkeypatch.setenv("EDITOR", f"{sys.executable} {script}")
    r = gazctl("journals", "edit", "-l", f"name:prefix={prefix}")
    assert r.rc == 1 and "must be in name order" in r.err and r.err.count("\n") == 1, r.err
    kept = Path(r.err.split("the edit is kept in ")[1].split(":")[0])
    assert f"{prefix}apples" in kept.read_text()
    assert f"`gazctl journals apply --specs {kept}`" in r.err
    kept.unlink()


def test_fragments_prune_and_store_health(gazctl: Gazctl, prefix: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    text = spec_yaml(prefix, store, retention="1s").replace("length: 1048576", "length: 1024")
    assert gazctl("journals", "apply", stdin=text.encode()).rc == 0
    clicks = f"{prefix}clicks"
    for _ in range(3):
        assert gazctl("journals", "append", "--journal", clicks, stdin=b"x" * 1500).rc == 0

    # Wait for the broker to persist the rolled fragments.
    def fragments() -> list[dict[str, Any]]:
        frags = json.loads(
            gazctl("journals", "fragments", "-l", f"name={clicks}", "-o", "json").text
        )
        persisted = [f for f in frags if f.get("backing_store")]
        assert len(persisted) == 3, frags
        return frags  # type: ignore[no-any-return]

    frags = eventually_blocking(fragments, what="3 persisted fragments", timeout=30, interval=0.2)
    assert frags[0]["begin"] == 0 and frags[-1]["end"] == 4500

    table = gazctl("journals", "fragments", "-l", f"name={clicks}", "--url-ttl", "1m")
    assert table.rc == 0
    assert table.text.splitlines()[0].split() == [
        "JOURNAL",
        "BEGIN",
        "END",
        "SIZE",
        "CODEC",
        "PERSISTED",
        "STORE",
        "URL",
    ]
    assert "file://" in table.text

    # Content fragments; the empty ones are replication 1's offset reservations.
    files = lambda: sorted(p.name for p in store.rglob("*.raw") if p.stat().st_size)  # noqa: E731
    markers = sorted(p.name for p in store.rglob("*.raw") if not p.stat().st_size)
    assert len(files()) == 3
    time.sleep(2.1)  # Older than the 1s retention: the time elapsing is what is tested.
    dry = gazctl("journals", "prune", "-l", f"name={clicks}", "--dry-run")
    assert dry.rc == 0 and "would prune" in dry.text and len(files()) == 3
    pruned = gazctl("journals", "prune", "-l", f"name={clicks}")
    assert pruned.rc == 0, pruned.err
    assert pruned.text.count("pruned ") == 3
    assert files() == []
    # Prune keeps reservations: they hold no content, and a primary relies on the latest.
    assert markers and markers == sorted(
        p.name for p in store.rglob("*.raw") if not p.stat().st_size
    )

    ok = gazctl("journals", "store-health", "-l", f"name={clicks}")
    assert ok.rc == 0 and ok.text.startswith("OK")
    bad = gazctl("journals", "store-health", "--store", f"file://{tmp_path}/nope/")
    assert bad.rc == 1 and bad.text.startswith("UNHEALTHY")


def test_errors_are_one_line(gazctl: Gazctl, tmp_path: Path) -> None:
    r = gazctl("journals", "list", "-l", "bad selector ((")
    assert r.rc == 1 and r.err.startswith("gazctl: error:") and r.err.count("\n") == 1
    r = gazctl("journals", "apply", stdin=b"name: x/\nchildren: []\n")
    assert r.rc == 1 and "needs children" in r.err and r.err.count("\n") == 1
    r = gazctl("journals", "apply", "--specs", str(tmp_path / "missing.yaml"))
    assert r.rc == 1 and "No such file" in r.err
    bad_spec = b"name: gz/bad/journal\nreplication: 9\n"
    r = gazctl("journals", "apply", stdin=bad_spec)
    assert r.rc == 1 and "gz/bad/journal" in r.err and r.err.count("\n") == 1, r.err
    r = gazctl("journals", "list", broker="127.0.0.1:1")
    assert r.rc == 1 and "unavailable" in r.err and r.err.count("\n") == 1


def test_append_gives_up_on_unreachable_brokers(
    gazctl: Gazctl, capsys: pytest.CaptureFixture[str]
) -> None:
    """An append no broker takes fails after --retry-for (default 60 s) with one line naming
    the error, rather than retrying for ever."""
    t0 = time.monotonic()
    r = gazctl(
        "journals",
        "append",
        "--journal",
        "a/b",
        "--retry-for",
        "0.5",
        stdin=b"x\n",
        broker="127.0.0.1:1",
    )
    assert r.rc == 1 and time.monotonic() - t0 < 5
    assert (
        r.err.startswith("gazctl: error: append to a/b kept failing for ")
        and "UNAVAILABLE" in r.err
    )
    assert r.err.count("\n") == 1
    with pytest.raises(SystemExit) as exited:
        gazctl("journals", "append", "--journal", "a/b", "--retry-for", "-1")
    assert exited.value.code == 2
    assert "'-1' is not a number of seconds >= 0 or 'forever'" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["gazette.gazctl.main", "gazette.gazctl"])
@pytest.mark.parametrize(
    "argv, error",
    [
        (["journals", "list"], "gazctl: error: broker 127.0.0.1:1 is unavailable"),
        # A GazctlError, raised before any RPC: a class of the module `gazctl.main`, which
        # `python -m gazette.gazctl.main` runs as `__main__`.
        (
            ["journals", "append", "--mapping", "modulo"],
            "gazctl: error: 'none' --framing may only be used with 'random' --mapping",
        ),
    ],
)
def test_entry_point_module(module: str, argv: list[str], error: str) -> None:
    """``python -m gazette.gazctl.main`` (as the demos run it) and ``python -m gazette.gazctl``
    report errors as ``gazctl`` does: one line, no traceback."""
    out = subprocess.run(
        [sys.executable, "-m", module, *argv, "--broker", "127.0.0.1:1"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith(error) and out.stderr.count("\n") == 1, out.stderr


def test_list_watch_prints_snapshots(gazctl_broker, prefix: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "BROKER_ADDRESS": gazctl_broker.endpoint}
    watcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gazette.gazctl.main",
            "journals",
            "list",
            "--watch",
            "-o",
            "json",
            "-l",
            f"name:prefix={prefix}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert watcher.stdout is not None
        assert json.loads(watcher.stdout.readline()) == []
        store = tmp_path / "store"
        store.mkdir()
        subprocess.run(
            [sys.executable, "-m", "gazette.gazctl.main", "journals", "apply"],
            input=spec_yaml(prefix, store).encode(),
            env=env,
            check=True,
        )
        while not (snap := json.loads(watcher.stdout.readline())):
            pass
        assert [j["spec"]["name"] for j in snap] == [f"{prefix}clicks", f"{prefix}orders"]
    finally:
        watcher.send_signal(2)
        watcher.communicate(timeout=20)
    assert watcher.returncode == 130


def test_apply_too_large_for_one_transaction(gazctl: Gazctl, prefix: str, tmp_path: Path) -> None:
    """etcd refuses a transaction of more than --max-txn-ops (128 by default) operations:
    gazctl says the apply is too large and how to batch it, and --max-txn-size does."""
    children = "".join(f"- name: {prefix}j{i:03d}\n" for i in range(200))
    specs = (
        f"name: {prefix}\nreplication: 1\n"
        "fragment: {length: 1048576, compression_codec: NONE, refresh_interval: 10s}\n"
        f"children:\n{children}"
    ).encode()
    r = gazctl("journals", "apply", stdin=specs)
    assert r.rc == 1 and r.err.count("\n") == 1, r.err
    assert r.err.startswith("gazctl: error: the apply is too large for one etcd transaction")
    assert "all 200 changes in one" in r.err and "--max-txn-size" in r.err
    assert "unavailable" not in r.err
    r = gazctl("journals", "apply", "--max-txn-size", "100", stdin=specs)
    assert r.rc == 0 and "applied 200 change(s)" in r.err, r.err


@pytest.mark.parametrize(
    "framing, how, data, done",
    [
        ("lines", "--journal", b"one\ntwo\n", "appended 2 line(s)"),
        ("fixed", "-l", b"\x66\x33\x93\x36\x03\x00\x00\x00abc", "appended 1 record(s)"),
        ("none", "-l", b"one\ntwo\n", "appended 8 bytes"),
    ],
)
def test_append_retries_a_broker_unreachable_at_start(
    gazctl: Gazctl,
    gazctl_broker: BrokerProcess,
    prefix: str,
    tmp_path: Path,
    framing: str,
    how: str,
    data: bytes,
    done: str,
) -> None:
    """--retry-for covers the journal listing an append starts with: a broker that comes up
    within the window is appended to (it used to fail in under a second with -f lines|fixed,
    and with -l under -f none)."""
    apply(gazctl, prefix, tmp_path / "store")
    journal = f"{prefix}clicks"
    target = journal if how == "--journal" else f"name={journal}"
    with LateListener(gazctl_broker.endpoint, delay=1.5) as late:
        t0 = time.monotonic()
        r = gazctl(
            "journals",
            "append",
            how,
            target,
            "-f",
            framing,
            "--retry-for",
            "30",
            stdin=data,
            broker=late.endpoint,
        )
    assert r.rc == 0 and done in r.err, r.err
    assert time.monotonic() - t0 >= 1.5
    assert gazctl("journals", "read", "-l", f"name={journal}").out == data


def test_append_lines_gives_up_after_retry_for(gazctl: Gazctl) -> None:
    """A broker that stays unreachable fails the append once --retry-for has passed, naming
    the listing that kept failing."""
    t0 = time.monotonic()
    r = gazctl(
        "journals",
        "append",
        "--journal",
        "a/b",
        "-f",
        "lines",
        "--retry-for",
        "1.5",
        stdin=b"x\n",
        broker="127.0.0.1:1",
    )
    assert r.rc == 1 and 1.5 <= time.monotonic() - t0 < 10, r.err
    assert r.err.startswith(
        "gazctl: error: append to journals matching 'name=a/b' kept failing for "
    )
    assert "UNAVAILABLE" in r.err and r.err.count("\n") == 1, r.err


FRAGMENT = "fragment: {length: 1048576, compression_codec: NONE, refresh_interval: 10s}\n"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "name: gz/e/a\nreplication: 9\n" + FRAGMENT,
            "journal gz/e/a: replication: invalid value (9; expected 1 <= replication <= 5)",
        ),
        (
            "name: gz/e/a\nreplication: 1\n" + FRAGMENT.replace("1048576", "1"),
            "journal gz/e/a: fragment.length: invalid value (1; expected 1024 <= length <= ",
        ),
        (
            "name: gz/e/a\nreplication: 1\n" + FRAGMENT.replace("10s", "0.5s"),
            "journal gz/e/a: fragment.refresh_interval: invalid value (0.5s; expected 1s <= "
            "refresh_interval <= 86400s)",
        ),
        (
            "name: gz/e/a\nreplication: 1\n" + FRAGMENT.replace("NONE", "INVALID"),
            "journal gz/e/a lacks required fields: fragment.compression_codec (NONE, GZIP, "
            "SNAPPY or ZSTANDARD)",
        ),
        (
            "name: gz/e/a\nreplication: 1\n"
            + FRAGMENT.replace("NONE", "GZIP_OFFLOAD_DECOMPRESSION")[:-2]
            + ", stores: ['file:///x/']}\n",
            "journal gz/e/a: fragment.stores[0]: GZIP_OFFLOAD_DECOMPRESSION is incompatible",
        ),
        (
            "name: gz/e/a\nreplication: 1\nlabels: [{name: x}]\n" + FRAGMENT,
            "journal gz/e/a: labels[0].name: invalid length (1; expected 2 <= length <= 64)",
        ),
        (
            "name: gz/e/a\nreplication: 1\n" + FRAGMENT[:-2] + ", stores: [ftp://x/]}\n",
            "journal gz/e/a: fragment.stores[0]: invalid scheme",
        ),
        # Fields a spec needs are named in one message, for every journal lacking them.
        (
            "name: gz/e/\nchildren:\n- name: gz/e/a\n- name: gz/e/b\n"
            "- {name: gz/e/c, replication: 1, fragment: {length: 1024}}\n",
            "journals gz/e/a, gz/e/b lack required fields: replication (brokers per journal, 1 "
            "to 5), fragment.length (bytes per fragment, e.g. 536870912), "
            "fragment.compression_codec (NONE, GZIP, SNAPPY or ZSTANDARD), "
            "fragment.refresh_interval (how often fragment stores are listed, 1s to 24h, e.g. "
            "5m0s); journal gz/e/c lacks required fields: fragment.compression_codec (NONE, "
            "GZIP, SNAPPY or ZSTANDARD), fragment.refresh_interval (how often fragment stores "
            "are listed, 1s to 24h, e.g. 5m0s). Set them on each journal, or once on a "
            "directory node above them",
        ),
    ],
)
def test_spec_errors_name_yaml_keys(gazctl: Gazctl, spec: str, message: str) -> None:
    """Invalid specs are refused naming the YAML keys the user wrote (not upstream's Go
    field names), and all the required fields missing at once."""
    r = gazctl("journals", "apply", "--dry-run", stdin=spec.encode())
    assert r.rc == 1 and r.err.count("\n") == 1, r.err
    assert r.err.startswith("gazctl: error: " + message), r.err
