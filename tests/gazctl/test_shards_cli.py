"""gazctl shards recover / prune against a real broker (and etcd for stored hints)."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from gazette.broker.client import AppendService, JournalClient, list_all_fragments
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.consumer.hints import rotate_backup_hints, store_primary_hints
from gazette.keyspace.etcd import Etcd
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.hints import hints_to_json
from gazette.recoverylog.recorder import Recorder
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.kit.eventually import eventually, eventually_blocking
from tests.kit.specs import RECOVERY_LOG, apply_specs, journal_spec

from .conftest import Gazctl


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


async def _record(endpoint: str, log: str, src: Path, store: Path) -> list[rpb.FSMHints]:
    """Record a compaction-like workload (most of the log dead) into a new journal of 4 KiB
    fragments; returns hints taken along the way, oldest first."""
    out = []
    async with JournalClient(endpoint) as client:
        await apply_specs(
            client, [journal_spec(log, store, length=4096, content_type=RECOVERY_LOG)]
        )
        rnd = random.Random(log)
        async with AppendService(client) as svc:
            rec = await Recorder.open(FSM(), 0xC0FFEE, src, svc, log)
            for r in range(30):
                for k in range(3):
                    data = rnd.randbytes(rnd.randrange(500, 9000))
                    (src / f"{r}-{k}.sst").write_bytes(data)
                    fnode = rec.record_create(f"{r}-{k}.sst")
                    rec.record_write(fnode, 0, data)
                if r >= 2:
                    for k in range(3):
                        (src / f"{r - 2}-{k}.sst").unlink()
                        rec.record_unlink(f"{r - 2}-{k}.sst")
                await rec.barrier()
                if r in (10, 29):
                    out.append(await rec.build_hints())
            await rec.close()

        # Wait until every spool that will be rolled is persisted: the tests compare store
        # listings taken at different times, so the store must be quiet (under load this can
        # take a while). Only a last spool shorter than the fragment length stays open; a
        # longer one is rolled by the broker's flush loop within a second.
        async def persisted() -> bool:
            frags = await list_all_fragments(client, pb.FragmentsRequest(journal=log))
            local = [f.spec for f in frags if not f.spec.backing_store]
            return not local or (len(local) == 1 and local[0].end - local[0].begin < 4096)

        await eventually(
            persisted, what=f"the rolled fragments of {log} persisted", timeout=60, interval=0.05
        )
    return out


@pytest.fixture
def recorded(
    gazctl_broker: BrokerProcess, prefix: str, tmp_path: Path
) -> tuple[str, Path, list[rpb.FSMHints]]:
    log = f"{prefix}recovery/shard-a"
    src, store = tmp_path / "src", tmp_path / "store"
    src.mkdir()
    store.mkdir()
    hints = asyncio.run(_record(gazctl_broker.endpoint, log, src, store))
    return log, src, hints


def test_recover_from_a_hints_file(
    gazctl: Gazctl, recorded: tuple[str, Path, list[rpb.FSMHints]], tmp_path: Path
) -> None:
    log, src, (_, hints) = recorded
    json_file, proto_file = tmp_path / "hints.json", tmp_path / "hints.pb"
    json_file.write_bytes(hints_to_json(hints))
    proto_file.write_bytes(hints.SerializeToString())
    for name, path in (("a", json_file), ("b", proto_file)):
        out = tmp_path / name
        r = gazctl(
            "shards", "recover", "--log", log, "--hints", str(path), "--dir", str(out),
            "--progress-interval", "0",
        )  # fmt: skip
        assert r.rc == 0, r.err
        assert tree(out) == tree(src)
        assert f"recover log={log} state=backfill read " in r.err
        assert " / " in r.err and "/s eta " in r.err
        assert f"recovered log={log} dir={out} files=6 " in r.err

    # A non-empty directory is replaced only with --force.
    r = gazctl("shards", "recover", "--log", log, "--hints", str(json_file), "--dir", str(out))
    assert (
        r.rc == 1
        and r.err == f"gazctl: error: {out} is not empty (give --force to replace its content)\n"
    )
    r = gazctl(
        "shards", "recover", "--log", log, "--hints", str(json_file), "--dir", str(out), "--force"
    )
    assert r.rc == 0 and tree(out) == tree(src)


def settled_fragments(store: Path, timeout: float = 20.0) -> list[Path]:
    """The fragment files of `store`, once the broker is not writing one (a fragment being
    persisted shows as a `.partial-` file until it is renamed into place)."""

    def settled() -> list[Path]:
        files = sorted(p for p in store.rglob("*") if p.is_file())
        assert not any(p.name.startswith(".partial-") for p in files), f"being written: {files}"
        return files

    return eventually_blocking(settled, what="the fragments written", timeout=timeout)


def test_prune_with_hints_files_then_recover(
    gazctl: Gazctl, recorded: tuple[str, Path, list[rpb.FSMHints]], tmp_path: Path
) -> None:
    log, src, (backup, primary) = recorded
    files = []
    for name, h in (("backup", backup), ("primary", primary)):
        files += ["--hints", str(tmp_path / name)]
        (tmp_path / name).write_bytes(hints_to_json(h))
    store_files = settled_fragments(tmp_path / "store")

    dry = gazctl("shards", "prune", "--log", log, *files, "--dry-run")
    assert dry.rc == 0, dry.err
    doomed = dry.text.splitlines()
    assert doomed and all(line.startswith(f"would prune {log} [") for line in doomed)
    assert f"would prune journal={log} fragments={len(doomed)} " in dry.err
    assert sorted(p for p in (tmp_path / "store").rglob("*") if p.is_file()) == store_files

    r = gazctl("shards", "prune", "--log", log, *files)
    assert r.rc == 0, r.err
    assert [line.replace("pruned", "would prune", 1) for line in r.text.splitlines()] == doomed
    remaining = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert len(remaining) == len(store_files) - len(doomed)

    for name in ("backup", "primary"):
        out = tmp_path / f"played-{name}"
        r = gazctl(
            "shards", "recover", "--log", log, "--hints", str(tmp_path / name), "--dir", str(out)
        )
        assert r.rc == 0, r.err
        assert tree(out) == tree(src)

    # Only the primary: more of the log goes.
    r = gazctl("shards", "prune", "--log", log, "--hints", str(tmp_path / "primary"))
    assert r.rc == 0 and r.text.count("pruned") > 0


def test_hints_from_etcd(
    gazctl: Gazctl,
    etcd_server: EtcdServer,
    recorded: tuple[str, Path, list[rpb.FSMHints]],
    tmp_path: Path,
) -> None:
    log, src, (backup, primary) = recorded
    hint_prefix = f"/test-gazctl-hints/{os.getpid()}/{tmp_path.name}"

    async def store() -> None:
        async with Etcd(etcd_server.endpoint) as etcd:
            await rotate_backup_hints(etcd, hint_prefix, "shard-a", backup, 2)
            await store_primary_hints(etcd, hint_prefix, "shard-a", primary)

    etcd = ("--etcd", etcd_server.endpoint, "--hint-prefix", hint_prefix)
    # No hints stored yet: pruning is refused.
    r = gazctl("shards", "prune", "--log", log, *etcd, "--shard", "shard-a")
    assert r.rc == 1
    assert r.err == "gazctl: error: shard shard-a has no hints; cannot prune its recovery log\n"

    asyncio.run(store())
    for extra, source in (((), "primary"), (("--backup", "0"), "backup.0")):
        out = tmp_path / f"out-{source}"
        r = gazctl(
            "shards", "recover", "--log", log, *etcd, "--shard", "shard-a", "--dir", str(out),
            *extra,
        )  # fmt: skip
        assert r.rc == 0, r.err
        assert f"using {source} hints of shard shard-a" in r.err
        assert tree(out) == tree(src)

    r = gazctl("shards", "prune", "--log", log, *etcd, "--shard", "shard-a", "--dry-run")
    assert r.rc == 0, r.err
    assert "hint_sets=2" in r.err and r.text.count("would prune") > 0
    # Another shard of the same log without hints: refused, nothing deleted.
    r = gazctl("shards", "prune", "--log", log, *etcd, "--shard", "shard-a", "--shard", "b")
    assert r.rc == 1 and "shard b has no hints" in r.err and r.text == ""

    r = gazctl(
        "shards", "recover", "--log", log, *etcd, "--shard", "shard-a", "--backup", "1",
        "--dir", str(tmp_path / "x"),
    )  # fmt: skip
    assert r.rc == 1 and r.err == "gazctl: error: shard shard-a has no backup.1 hints\n"


def test_errors_are_one_line(gazctl: Gazctl, tmp_path: Path) -> None:
    hints_file = tmp_path / "h.json"
    hints_file.write_bytes(hints_to_json(rpb.FSMHints(log="some/other/log")))
    cases = [
        (
            (
                "recover",
                "--log",
                "a/log",
                "--hints",
                str(tmp_path / "nope"),
                "--dir",
                str(tmp_path / "d"),
            ),
            "reading hints",
        ),
        (
            ("recover", "--log", "a/log", "--hints", str(hints_file), "--dir", str(tmp_path / "d")),
            "hints are of log 'some/other/log', not 'a/log'",
        ),
        (("recover", "--log", "a/log", "--dir", str(tmp_path / "d")), "give --hints FILE"),
        (("prune", "--log", "a/log"), "give --hints FILE"),
        (("prune", "--log", "a/log", "--shard", "s"), "--hint-prefix"),
        (
            (
                "prune",
                "--log",
                "a/log",
                "--shard",
                "s",
                "--hint-prefix",
                "/x",
                "--etcd",
                "127.0.0.1:1",
            ),
            "etcd 127.0.0.1:1",
        ),
        (
            ("prune", "--log", "a/log", "--shard", "s", "--hint-prefix", "/x", "--etcd", "a,"),
            "--etcd: an empty etcd endpoint in 'a,'",
        ),
    ]
    for argv, message in cases:
        r = gazctl("shards", *argv)
        assert r.rc == 1, argv
        assert r.err.startswith("gazctl: error: ") and r.err.count("\n") == 1, r.err
        assert message in r.err, r.err
