"""Builds the C half of the recording VFS (`_recvfs.c`) into ``_recvfs.so`` beside it.

``python -m gazette.stores.sqlite.native build`` (run by ``make deps``) needs a C compiler, Python's
headers (Debian: ``build-essential python3-dev``) and SQLite's extension header
``sqlite3ext.h`` (``libsqlite3-dev``). The module links against neither library: it runs
inside the Python process, and is handed the API of APSW's own SQLite when it is loaded as an
SQLite extension (`stores.sqlite.vfs.native_vfs`).
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
from pathlib import Path

from gazette.stores.cbuild import build_command, compile_c, find_compiler

__all__ = ["MODULE", "SOURCE", "build"]

SOURCE = Path(__file__).with_name("_recvfs.c")
MODULE = Path(__file__).with_name("_recvfs.so")


def build(output: Path = MODULE, compiler: str | None = None) -> Path:
    """Compiles the module into `output` (atomically). Raises `RuntimeError` with the
    compiler's message if it cannot."""
    cc = find_compiler(compiler)
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python.h in {include}; install python3-dev")
    # Warnings are shown, not fatal: another compiler version must not stop `make deps`.
    flags = ["-O2", "-Wall", "-Wno-unused-parameter", "-shared", "-fPIC"]
    return compile_c(
        cc,
        lambda tmp: [*flags, f"-I{include}", "-o", str(tmp), str(SOURCE)],
        output,
        "the SQLite VFS",
        lambda stderr: (
            " (sqlite3ext.h: install libsqlite3-dev)" if "sqlite3ext.h" in stderr else ""
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gazette.stores.sqlite.native", description="The recording VFS's C module."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile it (needs cc, python3-dev and libsqlite3-dev)")
    b.add_argument("--output", type=Path, default=MODULE)
    args = parser.parse_args(argv)
    return build_command(build, args.output)


if __name__ == "__main__":
    sys.exit(main())
