"""Install the package as a user would, into fresh virtualenvs, and check its shape.

Usage: python tools/check_install.py  (``make check-install``; needs PyPI)

1. Builds a wheel of this checkout (the native helpers compiled into it).
2. A client-only install: the client library, messages and gazctl import; the SQLite store
   says which extra it needs; none of the extras' packages were installed.
3. ``[sqlite]``: the SQLite store's VFS, built by the package build, loads into APSW's SQLite.
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
    print("install check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
