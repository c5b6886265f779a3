"""Compiling the stores' native helpers (the RocksDB scanner, the SQLite VFS) at set-up."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["build_command", "compile_c", "find_compiler"]


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
