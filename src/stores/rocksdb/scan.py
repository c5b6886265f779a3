"""The native RocksDB scanner: a read-only RocksDB range streamed as Arrow binary arrays.

rocksdict crosses into Rust and builds two Python ``bytes`` per key (0.4 us a key here);
building Arrow arrays from them costs as much again. The scanner (``_scan.c``, built with
by the package build against Debian's librocksdb, or ``python -m gazette.stores.rocksdb.scan
build``) iterates in C in its
own process and writes each batch in Arrow's binary layout, which becomes two
``pa.BinaryArray`` without copying: about 0.15 us a key.

Debian's librocksdb (7.8) reads tables of ``format_version`` <= 5, so `recorded_options`
writes format 5; a database it cannot open makes `scan` raise `ScanUnavailable` before any
batch, and callers fall back to rocksdict. See docs/spark.md, "The native RocksDB scanner".
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from gazette.stores.cbuild import SCANNER_NAME, SCANNER_SOURCE, build_command, build_scanner

SOURCE = SCANNER_SOURCE
BINARY = Path(__file__).with_name(SCANNER_NAME)
"""Where `build` puts the scanner by default, and where `find` looks first."""
ENV_PATH = "GAZETTE_ROCKSDB_SCAN"
"""Environment variable naming the scanner binary (overrides `BINARY`)."""

_HEADER = struct.Struct("<III")
MAGIC = b"GZRSCAN1"
"""What the scanner writes first: the version of its frames (``_scan.c``)."""


class ScanError(RuntimeError):
    """The scanner failed while reading (after batches may have been yielded)."""


class ScanUnavailable(ScanError):
    """The scanner is not built, or cannot open this database: nothing was yielded."""


def find() -> Path | None:
    """The scanner binary: ``$GAZETTE_ROCKSDB_SCAN`` if set, else `BINARY` if built (None if
    that is not an executable file)."""
    named = os.environ.get(ENV_PATH)
    path = Path(named) if named else BINARY
    return path if path.is_file() and os.access(path, os.X_OK) else None


def not_found_reason() -> str:
    """Why `find` found no scanner, for error messages."""
    named = os.environ.get(ENV_PATH)
    if named:
        return f"{ENV_PATH}={named} is not an executable file"
    return "the native RocksDB scanner is not built (python -m gazette.stores.rocksdb.scan build)"


class ScanStream:
    """A running scan of [`start`, `stop`) of the RocksDB at `directory`, opened read-only:
    `got` is the value of key `get` (if asked for; None if absent), read first; iterating
    yields (keys, values) batches in key order. Close it (or use it as a context manager) to
    stop the scanner early.

    Raises `ScanUnavailable` if there is no scanner or it cannot open the database (nothing
    was read); iterating raises `ScanUnavailable` if it fails before the first batch and
    `ScanError` after, or if the stream ends without its end frame."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        start: bytes = b"",
        stop: bytes | None = None,
        *,
        batch_rows: int = 65536,
        batch_bytes: int = 64 << 20,
        get: bytes | None = None,
        binary: Path | None = None,
    ) -> None:
        self.directory = os.fspath(directory)
        self.got: bytes | None = None
        program = binary if binary is not None else find()
        if program is None:
            raise ScanUnavailable(not_found_reason())
        args = [str(program), self.directory, start.hex(), "-" if stop is None else stop.hex()]
        args += [str(batch_rows), str(batch_bytes)]
        if get is not None:
            args.append(get.hex())
        try:
            self._stderr = tempfile.TemporaryFile()
        except OSError as err:
            raise ScanUnavailable(f"cannot start the native RocksDB scanner: {err}") from err
        try:
            self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._stderr)
        except BaseException as err:
            self._stderr.close()
            if not isinstance(err, OSError):
                raise
            message = f"cannot run the native RocksDB scanner {program}: {err}"
            raise ScanUnavailable(message) from err
        assert self._proc.stdout is not None
        self._out = self._proc.stdout
        self._yielded = False
        self._iterated = False
        try:
            magic = _read_exactly(self._out, len(MAGIC))
            if magic is None:
                raise self._cut()
            if magic != MAGIC:
                raise ScanUnavailable(
                    f"{program} writes another version of the scanner's frames (they begin "
                    f"{bytes(magic)!r}, not {MAGIC!r}): rebuild it (python -m "
                    "stores.rocksdb.scan build)"
                )
        except BaseException:
            self.close()
            raise
        if get is not None:
            try:
                found = _read_exactly(self._out, 8)
                if found is None:
                    raise self._cut()
                present, size = struct.unpack("<II", found)
                value = _read_exactly(self._out, size) if size else bytearray()
                if value is None:
                    raise self._cut()
                self.got = bytes(value) if present else None
            except BaseException:
                self.close()
                raise

    def __iter__(self) -> Iterator[tuple[pa.Array, pa.Array]]:
        if self._iterated or self._out.closed:
            raise RuntimeError("a ScanStream is read once, and not once closed")
        self._iterated = True
        try:
            while True:
                header = _read_exactly(self._out, _HEADER.size)
                if header is None:
                    raise self._cut()
                rows, key_bytes, value_bytes = _HEADER.unpack(header)
                if rows == 0:
                    if self._proc.wait() != 0:
                        raise ScanError(self._failure())
                    return
                offsets = 4 * (rows + 1)
                pad = -(offsets + key_bytes) % 8
                body = _read_exactly(self._out, 2 * offsets + key_bytes + pad + value_bytes)
                if body is None:
                    raise self._cut()
                data = pa.py_buffer(body)
                keys = pa.Array.from_buffers(
                    pa.binary(),
                    rows,
                    [None, data.slice(0, offsets), data.slice(offsets, key_bytes)],
                )
                at = offsets + key_bytes + pad
                values = pa.Array.from_buffers(
                    pa.binary(),
                    rows,
                    [None, data.slice(at, offsets), data.slice(at + offsets, value_bytes)],
                )
                self._yielded = True
                yield keys, values
        finally:
            self.close()

    def close(self) -> None:
        """Stops the scanner if it still runs, and reaps it."""
        self._out.close()
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._stderr.close()

    def __enter__(self) -> ScanStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _cut(self) -> ScanError:
        """The error for a stream that ended early: the scanner failed or was killed."""
        self._proc.wait()
        message = self._failure()
        return ScanError(message) if self._yielded else ScanUnavailable(message)

    def _failure(self) -> str:
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").strip()
        status = self._proc.returncode
        how = f"exit status {status}" if status >= 0 else f"signal {-status}"
        return f"native RocksDB scan of {self.directory} failed ({how}): {text or 'no message'}"


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
    `directory`, opened read-only, in key order (a `ScanStream`, raising as it does)."""
    stream = ScanStream(
        directory, start, stop, batch_rows=batch_rows, batch_bytes=batch_bytes, binary=binary
    )
    yield from stream


SPLIT_MAGIC = "GZRSPLIT1"
"""The first line of the scanner's ``--split`` output (``_scan.c``)."""


def split_points(
    directory: str | os.PathLike[str],
    start: bytes,
    stop: bytes | None,
    count: int,
    *,
    binary: Path | None = None,
) -> list[bytes]:
    """Up to `count` - 1 increasing keys within (`start`, `stop`) cutting the keys of the
    RocksDB at `directory` in [`start`, `stop`) into `count` ranges of about equal size on
    disk, as RocksDB estimates it from the SST files' indexes (keys only in the memtable are
    not counted: none if there are no SST files). The same files give the same keys.

    Raises `ScanUnavailable` if there is no scanner, it cannot open the database, or it
    predates ``--split``; `ScanError` if it fails otherwise."""
    program = binary if binary is not None else find()
    if program is None:
        raise ScanUnavailable(not_found_reason())
    args = [str(program), "--split", os.fspath(directory), start.hex()]
    args += ["-" if stop is None else stop.hex(), str(count)]
    try:
        done = subprocess.run(args, capture_output=True, check=False)
    except OSError as err:
        raise ScanUnavailable(f"cannot run the native RocksDB scanner {program}: {err}") from err
    lines = done.stdout.decode(errors="replace").split()
    understood = lines[:1] == [SPLIT_MAGIC]
    if not understood and done.returncode in (0, 2):  # 2: what it says of arguments it refuses.
        raise ScanUnavailable(
            f"{program} does not split key ranges (it predates --split): rebuild it "
            "(python -m gazette.stores.rocksdb.scan build)"
        )
    if done.returncode != 0:
        status = done.returncode
        how = f"exit status {status}" if status >= 0 else f"signal {-status}"
        text = done.stderr.decode(errors="replace").strip() or "no message"
        message = f"native RocksDB split of {os.fspath(directory)} failed ({how}): {text}"
        raise ScanUnavailable(message) if status == 3 or not understood else ScanError(message)
    points = [bytes.fromhex(line) for line in lines[1:]]
    return [p for p in points if p > start and (stop is None or p < stop)]


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


def build(output: Path = BINARY, compiler: str | None = None) -> Path:
    """Compiles the scanner into `output` (atomically), linking librocksdb statically when
    its archive is installed (Debian: ``librocksdb-dev``). Raises `RuntimeError` with the
    compiler's message if it cannot."""
    return build_scanner(output, compiler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gazette.stores.rocksdb.scan", description="The native RocksDB scanner."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile the scanner (needs cc and librocksdb-dev)")
    b.add_argument("--output", type=Path, default=BINARY)
    sub.add_parser("where", help="print the scanner's path (exit 1 if it is not built)")
    args = parser.parse_args(argv)
    if args.command == "build":
        return build_command(build, args.output)
    found = find()
    if found is None:
        print("the RocksDB scanner is not built", file=sys.stderr)
        return 1
    print(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
