"""Install the package as a user would, into fresh virtualenvs, and check its shape.

Usage: python tools/check_install.py  (``make check-install``; needs PyPI)

1. Builds a wheel of this checkout (the native helpers compiled into it).
2. A client-only install: the client library, messages and gazctl import; the SQLite store
   says which extra it needs; none of the extras' packages were installed.
3. ``[sqlite]``: the SQLite store's VFS, built by the package build, loads into APSW's SQLite,
   and a database opened through it commits a transaction, whose writes reach the VFS's
   bridge. The bridge is a stand-in that keeps them: a `SQLiteStore` records through a
   Recorder, which appends to a journal of a broker, and this check runs none.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = [
    "pyspark",
    "pyarrow",
    "rocksdict",
    "pyfuse3",
    "trio",
    "apsw",
    "psycopg",
    "boto3",
    "aiohttp",
]


# Run by the [sqlite] venv's Python: a WAL database through a RecordingVFS whose bridge keeps
# the operations it is handed; one committed transaction must hand it WAL writes and a sync.
VFS_COMMIT = """
import sys, tempfile
from pathlib import Path
import apsw
from gazette.stores.sqlite.vfs import RecordingVFS

class Bridge:
    discarded = deferring = False
    def __init__(self):
        self.ops = []
    def create(self, path): self.ops.append(("create", path))
    def truncate(self, path): self.ops.append(("truncate", path))
    def unlink(self, path): self.ops.append(("unlink", path))
    def rename(self, src, dst): self.ops.append(("rename", src, dst))
    def write(self, path, offset, data): self.ops.append(("write", path, len(data)))
    def sync(self, wait=True): self.ops.append(("sync",))
    def flush(self): pass
    def defer(self): pass

with tempfile.TemporaryDirectory() as tmp:
    bridge = Bridge()
    vfs = RecordingVFS("check-install", Path(tmp), bridge, recorded=set(), page_files={})
    conn = apsw.Connection(str(Path(tmp) / "db"), vfs=vfs.name)
    conn.execute("PRAGMA synchronous=FULL; PRAGMA journal_mode=WAL").fetchall()
    with conn:
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        conn.execute("INSERT INTO t VALUES (1, randomblob(100))")
    assert conn.execute("SELECT count(*) FROM t").fetchall() == [(1,)]
    conn.close()
    vfs.unregister()
    wal = [op for op in bridge.ops if op[0] == "write" and op[1] == "db-wal"]
    assert wal and ("sync",) in bridge.ops, bridge.ops
print("committed through the recording VFS:", len(bridge.ops), "operations")
"""


def run(*cmd: str | Path) -> str:
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(list(map(str, cmd)), check=True, capture_output=True, text=True).stdout


def venv(where: Path) -> Path:
    run(sys.executable, "-m", "venv", where)
    return where / "bin" / "python"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="gazette-install-") as tmp:
        wheels = Path(tmp) / "wheels"
        run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, ROOT)
        (wheel,) = wheels.glob("*.whl")

        light = venv(Path(tmp) / "light")
        run(light, "-m", "pip", "install", "-q", wheel)
        installed = run(light, "-m", "pip", "list", "--format=freeze").lower()
        extra = [p for p in HEAVY if f"\n{p}==" in f"\n{installed}"]
        assert not extra, f"a client-only install brought {extra}"
        run(light, "-c", "import gazette.broker.client, gazette.message, gazette.gazctl.main")
        out = subprocess.run(
            [light, "-c", "import gazette.stores.sqlite"], capture_output=True, text=True
        )
        assert "pip install 'gazette-py[sqlite]'" in out.stderr, out.stderr

        sqlite = venv(Path(tmp) / "sqlite")
        run(sqlite, "-m", "pip", "install", "-q", f"{wheel}[sqlite]")
        run(sqlite, "-c", "from gazette.stores.sqlite.vfs import native_vfs; native_vfs()")
        script = Path(tmp) / "vfs_commit.py"
        script.write_text(VFS_COMMIT)
        print(run(sqlite, script), end="")
    print("install check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
