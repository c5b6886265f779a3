"""Builds the C half of the recording VFS (`_recvfs.c`) into ``_recvfs.so`` beside it.

The package build compiles it (`gazette.stores.cbuild`); ``python -m
gazette.stores.sqlite.native build`` rebuilds it in place. Either needs a C compiler, Python's
headers (Debian: ``build-essential python3-dev``) and SQLite's extension header
``sqlite3ext.h`` (``libsqlite3-dev``). The module links against neither library: it runs
inside the Python process, and is handed the API of APSW's own SQLite when it is loaded as an
SQLite extension (`stores.sqlite.vfs.native_vfs`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gazette.stores.cbuild import RECVFS_NAME, RECVFS_SOURCE, build_command, build_recvfs

__all__ = ["MODULE", "SOURCE", "build"]

SOURCE = RECVFS_SOURCE
MODULE = Path(__file__).with_name(RECVFS_NAME)


def build(output: Path = MODULE, compiler: str | None = None) -> Path:
    """Compiles the module into `output` (atomically). Raises `RuntimeError` with the
    compiler's message if it cannot."""
    return build_recvfs(output, compiler)


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
