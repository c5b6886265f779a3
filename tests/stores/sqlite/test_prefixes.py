"""Every prefix of what the recording VFS records rebuilds a database that passes SQLite's
integrity check and holds a committed state at least as new as the last commit recorded
whole: the crash-consistency argument of docs/sqlite-store.md, checked exhaustively (up to a
stride) rather than at random kill points. The VFS records into a fake bridge that keeps the
operations; a model of the recovery log's links and files applies any prefix of them, as a
Player would leave it; `rebuild_played` rebuilds the database from that, as after a crash.

Workloads mix what moves the page store: WAL checkpoints of the store's (copies not recorded,
WALs kept as WAL generations), compactions, VACUUM (a shrinking commit), SQLite's own
checkpoints (PASSIVE, at close), switches between WAL and rollback-journal modes, and
transactions larger than the page cache (frames written, and overwritten, before their
commit). One case then recovers from a cut, goes on recording, and checks the new prefixes.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import apsw
import pytest

from gazette.stores.sqlite.pagestore import PAGES_SUFFIX, is_wal_generation
from gazette.stores.sqlite.store import rebuild_played
from gazette.stores.sqlite.vfs import RecordingVFS
from tests.stores.sqlite.support import Op, OpLog

_names = itertools.count()


@dataclass
class Files:
    """The recorded files a Player would leave: links (path -> file) and file contents."""

    links: dict[str, int] = field(default_factory=dict)
    data: dict[int, bytearray] = field(default_factory=dict)
    next_file: int = 0

    def copy(self) -> Files:
        return Files(
            dict(self.links), {k: bytearray(v) for k, v in self.data.items()}, self.next_file
        )

    def apply(self, op: Op) -> None:
        kind, path = op[0], op[1]
        if kind in ("create", "truncate"):
            assert (path in self.links) == (kind == "truncate"), op
            self.next_file += 1
            self.links[path] = self.next_file
            self.data[self.next_file] = bytearray()
        elif kind == "unlink":
            del self.links[path]
        elif kind == "rename":
            assert op[2] not in self.links, op
            self.links[op[2]] = self.links.pop(path)
        else:
            offset, data = op[2], op[3]
            content = self.data[self.links[path]]
            if len(content) < offset:
                content.extend(bytes(offset - len(content)))
            content[offset : offset + len(data)] = data

    def materialize(self, directory: Path) -> dict[str, int]:
        """Write the files into `directory` (emptied); return the links as a played FSM's."""
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        for path, node in self.links.items():
            (directory / path).parent.mkdir(parents=True, exist_ok=True)
            (directory / path).write_bytes(self.data[node])
        return {"/" + path: node for path, node in self.links.items()}


def _table(conn: apsw.Connection) -> str:
    try:
        rows = conn.execute("SELECT k, v FROM t ORDER BY k").fetchall()
    except apsw.SQLError:
        return "no table"
    return hashlib.sha1(repr(rows).encode()).hexdigest()


class Writer:
    """A connection through a RecordingVFS recording into `oplog`; `states` holds, after
    each commit, (operations recorded by then, the table's digest)."""

    def __init__(
        self,
        directory: Path,
        oplog: OpLog,
        *,
        recorded: set[str] | None = None,
        page_files: dict[str, list[tuple[int, int, bool]]] | None = None,
        checkpoint_pages: int = 20,
    ) -> None:
        self.oplog = oplog
        directory.mkdir(parents=True, exist_ok=True)
        self.vfs = RecordingVFS(
            f"prefixes-{next(_names)}",
            directory,
            oplog,  # type: ignore[arg-type]
            recorded=recorded if recorded is not None else set(),
            page_files=page_files or {},
            min_compaction_bytes=64 << 10,
        )
        self.conn = apsw.Connection(
            str(directory / "primary.db"),
            flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE,
            vfs=self.vfs.name,
        )
        self.conn.execute("PRAGMA cache_size=8").fetchall()  # Large transactions spill.
        self.conn.execute("PRAGMA synchronous=FULL").fetchall()
        assert self.conn.execute("PRAGMA journal_mode=WAL").fetchall() == [("wal",)]
        self.conn.set_wal_hook(self.vfs.wal_hook(checkpoint_pages))  # As SQLiteStore does.
        # (Before the table: a prefix may end between the switch to WAL and its creation.)
        self.states: list[tuple[int, str]] = [(len(oplog.ops), _table(self.conn))]
        self.conn.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB)")
        self.states.append((len(oplog.ops), _table(self.conn)))

    def run(self, rnd: random.Random, steps: int, features: set[str]) -> None:
        conn = self.conn
        for _ in range(steps):
            r = rnd.random()
            if "vacuum" in features and r < 0.04:
                conn.execute("VACUUM").fetchall()
            elif "sqlite-checkpoints" in features and r < 0.08:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            elif "mode-switches" in features and r < 0.12:
                mode = conn.execute("PRAGMA journal_mode").fetchall()[0][0]
                new = "delete" if mode == "wal" else "wal"
                assert conn.execute(f"PRAGMA journal_mode={new}").fetchall() == [(new,)]
            else:
                large = r > 0.92
                with conn:
                    for _ in range(rnd.randrange(150, 400) if large else rnd.randrange(1, 15)):
                        k = rnd.randrange(300)
                        if rnd.random() < 0.15:
                            conn.execute("DELETE FROM t WHERE k = ?", (k,))
                        else:
                            v = rnd.randbytes(rnd.randrange(10, 1500))
                            conn.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (k, v))
                    if large:  # Pages written again within the transaction.
                        conn.execute("UPDATE t SET v = randomblob(200) WHERE k < 40")
            self.states.append((len(self.oplog.ops), _table(conn)))

    def close(self) -> None:
        self.conn.close()
        self.states.append((len(self.oplog.ops), self.states[-1][1]))
        self.vfs.unregister()


def _played(files: Files, directory: Path) -> tuple[dict[str, int], str] | None:
    """Rebuild the database from `files` into `directory`: (links, table digest), or None if
    nothing of the database was recorded yet. Asserts SQLite's integrity check."""
    links = files.materialize(directory)
    if "primary.db" not in files.links and not any(PAGES_SUFFIX in p for p in links):
        return None
    rebuild_played(directory, links)
    conn = apsw.Connection(str(directory / "primary.db"))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return links, _table(conn)
    finally:
        conn.close()


def _check_prefixes(
    start: Files, ops: list[Op], states: list[tuple[int, str]], work: Path, cuts: int
) -> tuple[int, int]:
    """Check about `cuts` prefixes of `ops` applied over `start` (each ends after a distinct
    operation, the last included). Returns (prefixes checked, of which with WAL
    generations)."""
    stride = max(1, len(ops) // cuts)
    points = sorted({*range(0, len(ops) + 1, stride), len(ops)})
    files, applied, checked, with_wal = start.copy(), 0, 0, 0
    for point in points:
        while applied < point:
            files.apply(ops[applied])
            applied += 1
        played = _played(files, work / "cut")
        if played is None:
            continue
        links, digest = played
        # The newest commit recorded whole by `point`, or one after it (a commit's last
        # operations, such as its checkpoint, follow the write that commits it).
        newest = max((i for i, (n, _) in enumerate(states) if n <= point), default=0)
        allowed = {d for _, d in states[newest:]}
        assert digest in allowed, (
            f"prefix of {point} of {len(ops)} operations (last {ops[point - 1][:3]}): the "
            f"table is no commit at or after #{newest}"
        )
        checked += 1
        with_wal += any(is_wal_generation(p) for p in links)
    return checked, with_wal


@pytest.mark.parametrize(
    "features",
    [
        set(),
        {"vacuum", "sqlite-checkpoints"},
        {"vacuum", "sqlite-checkpoints", "mode-switches"},
    ],
    ids=["store-checkpoints", "vacuum+sqlite-checkpoints", "mode-switches"],
)
def test_every_prefix_rebuilds_a_committed_state(tmp_path: Path, features: set[str]) -> None:
    oplog = OpLog()
    writer = Writer(tmp_path / "live", oplog)
    writer.run(random.Random(len(features)), 120, features)
    writer.close()
    checked, with_wal = _check_prefixes(Files(), oplog.ops, writer.states, tmp_path, cuts=400)
    print(
        f"{len(oplog.ops)} operations, {checked} prefixes checked, {with_wal} with WAL generations"
    )
    assert checked >= 300
    assert with_wal > 0, "no prefix had a WAL generation: the case tests nothing new"


def test_prefixes_after_a_recovery_from_a_cut(tmp_path: Path) -> None:
    """A crash at a cut with WAL generations live, a recovery from what was recorded (the
    page store learns its generations from playback), more transactions: every prefix of
    the new operations rebuilds a committed state too."""
    oplog = OpLog()
    writer = Writer(tmp_path / "live", oplog)
    writer.run(random.Random(11), 80, {"vacuum"})
    writer.close()
    files, cut = Files(), None
    for i, op in enumerate(oplog.ops):
        files.apply(op)
        if i > len(oplog.ops) // 2 and any(is_wal_generation(p) for p in files.links):
            cut = i + 1
            break
    assert cut is not None, "no WAL generation was kept in the first half"

    # Recover: what a Player leaves, rebuilt as SQLiteStore.open does; record onwards.
    recovered = tmp_path / "recovered"
    links = files.materialize(recovered)
    page_files = rebuild_played(recovered, links)
    recorded = {p.lstrip("/") for p in links if PAGES_SUFFIX not in p}
    start = files.copy()
    second = OpLog()
    writer = Writer(
        recovered, second, recorded=recorded, page_files=dict(page_files), checkpoint_pages=20
    )
    writer.run(random.Random(12), 60, {"vacuum", "sqlite-checkpoints"})
    writer.close()
    checked, with_wal = _check_prefixes(start, second.ops, writer.states, tmp_path, cuts=300)
    print(f"{len(second.ops)} operations after recovery, {checked} checked, {with_wal} with WAL")
    assert checked >= 200
