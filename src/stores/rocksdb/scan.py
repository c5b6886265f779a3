"""The native RocksDB scanner: a read-only RocksDB range streamed as Arrow binary arrays.

rocksdict crosses into Rust and builds two Python ``bytes`` per key (0.4 us a key here);
building Arrow arrays from them costs as much again. The scanner (``_scan.c``, built with
``python -m stores.rocksdb.scan build`` against Debian's librocksdb) iterates in C in its
own process and writes each batch in Arrow's binary layout, which becomes two
``pa.BinaryArray`` without copying: about 0.15 us a key.

Debian's librocksdb (7.8) reads tables of ``format_version`` <= 5, so `recorded_options`
writes format 5; a database it cannot open makes `scan` raise `ScanUnavailable` before any
batch, and callers fall back to rocksdict. See docs/spark.md, "The native RocksDB scanner".
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

SOURCE = Path(__file__).with_name("_scan.c")
BINARY = Path(__file__).with_name("rocksdb-scan")
"""Where `build` puts the scanner by default, and where `find` looks first."""
ENV_PATH = "GAZETTE_ROCKSDB_SCAN"
"""Environment variable naming the scanner binary (overrides `BINARY`)."""

_HEADER = struct.Struct("<III")
_LIBS = ["-lstdc++", "-lsnappy", "-lz", "-lbz2", "-llz4", "-lzstd", "-lpthread", "-lm"]


class ScanError(RuntimeError):
    """The scanner failed while reading (after batches may have been yielded)."""


class ScanUnavailable(ScanError):
    """The scanner is not built, or cannot open this database: nothing was yielded."""


def find() -> Path | None:
    """The scanner binary: ``$GAZETTE_ROCKSDB_SCAN`` if set, else `BINARY` if built."""
    named = os.environ.get(ENV_PATH)
    if named:
        return Path(named) if os.access(named, os.X_OK) else None
    return BINARY if os.access(BINARY, os.X_OK) else None


def scan(
    directory: str | os.PathLike[str],
    start: bytes = b"",
    stop: bytes | None = None,
    *,
    batch_rows: int = 65536,
    batch_bytes: int = 64 << 20,
    binary: Path | None = None,
) -> Iterator[tuple[pa.Array, pa.Array]]:
    """(keys, values) batches of the keys in [`start`, `stop`) of the RocksDB at
    `directory`, opened read-only, in key order.

    Raises `ScanUnavailable` (before yielding) if there is no scanner or it cannot open the
    database, and `ScanError` if it fails or stops early while reading."""
    program = binary if binary is not None else find()
    if program is None:
        raise ScanUnavailable(
            "the native RocksDB scanner is not built (python -m stores.rocksdb.scan build)"
        )
    args = [str(program), os.fspath(directory), start.hex(), "-" if stop is None else stop.hex()]
    args += [str(batch_rows), str(batch_bytes)]
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, bufsize=0)
        assert proc.stdout is not None
        out = proc.stdout
        yielded = False
        try:
            while True:
                header = _read_exactly(out, _HEADER.size)
                if header is None:
                    break
                rows, key_bytes, value_bytes = _HEADER.unpack(header)
                if rows == 0:
                    if proc.wait() != 0:
                        raise ScanError(_failure(proc, stderr, directory))
                    return
                offsets = 4 * (rows + 1)
                body = _read_exactly(out, 2 * offsets + key_bytes + value_bytes)
                if body is None:
                    break
                data = pa.py_buffer(body)
                keys = pa.Array.from_buffers(
                    pa.binary(),
                    rows,
                    [None, data.slice(0, offsets), data.slice(offsets, key_bytes)],
                )
                at = offsets + key_bytes
                values = pa.Array.from_buffers(
                    pa.binary(),
                    rows,
                    [None, data.slice(at, offsets), data.slice(at + offsets, value_bytes)],
                )
                yielded = True
                yield keys, values
            # The stream ended without its end frame: the scanner failed or was killed.
            proc.wait()
            message = _failure(proc, stderr, directory)
            raise ScanError(message) if yielded else ScanUnavailable(message)
        finally:
            out.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _read_exactly(stream: object, size: int) -> bytearray | None:
    """`size` bytes of `stream`, or None if it ends first."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    readinto = stream.readinto  # type: ignore[attr-defined]
    while got < size:
        n = readinto(view[got:])
        if not n:
            return None
        got += n
    return buf


def _failure(proc: subprocess.Popen[bytes], stderr: object, directory: object) -> str:
    stderr.seek(0)  # type: ignore[attr-defined]
    text = stderr.read().decode(errors="replace").strip()  # type: ignore[attr-defined]
    status = proc.returncode
    how = f"exit status {status}" if status >= 0 else f"signal {-status}"
    return f"native RocksDB scan of {directory} failed ({how}): {text or 'no message'}"


def build(output: Path = BINARY, compiler: str | None = None) -> Path:
    """Compiles the scanner into `output` (atomically), linking librocksdb statically when
    its archive is installed (Debian: ``librocksdb-dev``). Raises `RuntimeError` with the
    compiler's message if it cannot."""
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH; install build-essential")
    archives = sorted(glob.glob("/usr/lib/*/librocksdb.a"))
    archives += glob.glob("/usr/local/lib/librocksdb.a")
    link = [archives[0]] if archives else ["-lrocksdb"]
    tmp = output.with_name(f".{output.name}.{os.getpid()}")
    cmd = [cc, "-O2", "-o", str(tmp), str(SOURCE), *link, *_LIBS]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(
            f"building the RocksDB scanner failed ({' '.join(cmd)}):\n{done.stderr.strip()}"
        )
    os.replace(tmp, output)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stores.rocksdb.scan", description="The native RocksDB scanner."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile the scanner (needs cc and librocksdb-dev)")
    b.add_argument("--output", type=Path, default=BINARY)
    sub.add_parser("where", help="print the scanner's path (exit 1 if it is not built)")
    args = parser.parse_args(argv)
    if args.command == "build":
        try:
            print(build(args.output))
        except RuntimeError as err:
            print(err, file=sys.stderr)
            return 1
        return 0
    found = find()
    if found is None:
        print("the RocksDB scanner is not built", file=sys.stderr)
        return 1
    print(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
