"""Compiling the stores' native helpers: the SQLite store's VFS (`sqlite/_recvfs.c`, a Python
extension module that is also an SQLite extension) and the Spark export's RocksDB scanner
(`rocksdb/_scan.c`, a program linked against librocksdb).

The package build (setup.py) compiles both with `build_natives`, and keeps going without the
ones it cannot build (saying why): the SQLite store then refuses to open, naming what to
install; the Spark export reads RocksDB through rocksdict instead. This module imports only the
standard library, so that setup.py can load it before anything is installed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = [
    "RECVFS_SOURCE",
    "SCANNER_SOURCE",
    "build_command",
    "build_natives",
    "build_recvfs",
    "build_scanner",
    "compile_c",
    "find_compiler",
]

_HERE = Path(__file__).resolve().parent
RECVFS_SOURCE = _HERE / "sqlite" / "_recvfs.c"
SCANNER_SOURCE = _HERE / "rocksdb" / "_scan.c"
RECVFS_NAME = "_recvfs.so"
SCANNER_NAME = "rocksdb-scan"
_SCANNER_LIBS = ["-lstdc++", "-lsnappy", "-lz", "-lbz2", "-llz4", "-lzstd", "-lpthread", "-lm"]


def find_compiler(compiler: str | None = None) -> list[str]:
    """The C compiler's command: `compiler`, else ``$CC``, else ``cc`` or ``gcc`` on PATH.

    Raises `RuntimeError` if there is none."""
    named = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if named is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH; install build-essential")
    return shlex.split(named)


def compile_c(
    cc: Sequence[str],
    args: Callable[[Path], Sequence[str]],
    output: Path,
    what: str,
    hint: Callable[[str], str] = lambda stderr: "",
) -> Path:
    """Run ``cc *args(tmp)`` to build `output` under a temporary name, then move it into
    place (atomically: a reader never sees a partial file). Raises `RuntimeError` naming
    `what` with the compiler's message (and ``hint(stderr)``) if it fails."""
    tmp = output.with_name(f".{output.name}.{os.getpid()}")
    cmd = [*cc, *args(tmp)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(
            f"building {what} failed{hint(done.stderr)} ({' '.join(cmd)}):\n{done.stderr.strip()}"
        )
    os.replace(tmp, output)
    return output


def build_command(build: Callable[[Path], Path], output: Path) -> int:
    """A command line's ``build``: print the built path, or the error (exit status 1)."""
    try:
        print(build(output))
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


def build_recvfs(output: Path, compiler: str | None = None) -> Path:
    """Compiles the SQLite VFS module into `output` (atomically). It needs Python's headers
    and SQLite's ``sqlite3ext.h`` (Debian: ``python3-dev libsqlite3-dev``), and links against
    neither library: loaded as an SQLite extension, it is handed the API of APSW's SQLite.
    Raises `RuntimeError` with the compiler's message if it cannot."""
    cc = find_compiler(compiler)
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python.h in {include}; install python3-dev")
    # Warnings are shown, not fatal: another compiler version must not stop an install.
    flags = ["-O2", "-Wall", "-Wno-unused-parameter", "-shared", "-fPIC"]
    return compile_c(
        cc,
        lambda tmp: [*flags, f"-I{include}", "-o", str(tmp), str(RECVFS_SOURCE)],
        output,
        "the SQLite VFS",
        lambda stderr: (
            " (sqlite3ext.h: install libsqlite3-dev)" if "sqlite3ext.h" in stderr else ""
        ),
    )


def build_scanner(output: Path, compiler: str | None = None) -> Path:
    """Compiles the RocksDB scanner into `output` (atomically), linking librocksdb statically
    when its archive is installed (Debian: ``librocksdb-dev``). Raises `RuntimeError` with
    the compiler's message if it cannot."""
    cc = find_compiler(compiler)
    # The compiler's own search path finds the archive of its target architecture.
    found = subprocess.run([*cc, "-print-file-name=librocksdb.a"], capture_output=True, text=True)
    archive = found.stdout.strip()
    link = [archive] if found.returncode == 0 and os.path.isabs(archive) else ["-lrocksdb"]
    return compile_c(
        cc,
        lambda tmp: ["-O2", "-o", str(tmp), str(SCANNER_SOURCE), *link, *_SCANNER_LIBS],
        output,
        "the RocksDB scanner",
        lambda stderr: " (install librocksdb-dev)" if "rocksdb" in stderr else "",
    )


def build_natives(stores_dir: Path, warn: Callable[[str], None]) -> list[Path]:
    """Builds both helpers into the package directory `stores_dir` (``.../gazette/stores``),
    calling `warn` with the reason for each one it cannot build. Returns what it built."""
    built = []
    for build, sub, name in (
        (build_recvfs, "sqlite", RECVFS_NAME),
        (build_scanner, "rocksdb", SCANNER_NAME),
    ):
        target = stores_dir / sub / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            built.append(build(target))
        except RuntimeError as err:
            warn(f"not built: {err}")
    return built
