"""RecordedFS: file operations of plain Python code on a directory, recorded by a Recorder.

Each operation is first made on the local files (under `Recorder.directory`), and recorded
once it succeeded, so the log describes what the files became. A file object buffers
contiguous writes (up to `WRITE_BUFFER_SIZE` bytes), and writes and records them as one op on
`flush`, before a write elsewhere in the file, a read, `truncate` and `close`.

Durability: `await fs.fsync(f)` / `await fs.sync()` flush and then wait on a Recorder
barrier, so they return once everything written before them is committed to the recovery
log. The local files are scratch space (a Player rebuilds them from the log), so they are
not fsync'ed to the local disk.

What the recovery log can express, and so what is supported:

- Binary modes ``rb`` (not recorded), ``wb``/``w+b`` (create or truncate), ``xb``/``x+b``
  (exclusive create), ``ab``/``a+b`` (append) and ``r+b`` (update).
- ``truncate(n)``: to zero, or below the current size, the file is recorded afresh (unlink
  and create, then a write of the kept prefix read back from disk), as a log has no
  truncate op; growing records a write of zeros. Only for a file with one link, still at the
  path it was opened with.
- `rename` of files (replacing a file at the target) and of directories (each file under it
  is renamed), `remove`, `link`. Directories themselves are not recorded: a Player creates
  the parents of the files it restores.

Files open while their path is removed, renamed over or truncated (by ``truncate``, or by an
``O_TRUNC`` open) behave as on POSIX: their buffered writes are flushed and recorded first;
afterwards the handles of a truncated file write its new Fnode, and writes to a file which is
no longer linked anywhere are made on disk but not recorded (nothing can reach them). In
append mode, each flush records its bytes where O_APPEND put them: at the end of the file as
of that flush, whichever handles appended before.

A file that exists on disk but was never recorded (it predates the Recorder) raises
`NotRecorded` before any change when opened for append/update, removed, linked or renamed.
Like the Recorder, a RecordedFS is used from the thread of the Recorder's running event loop.
"""

from __future__ import annotations

import io
import os
import weakref
from pathlib import Path
from types import TracebackType

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog.recorder import Recorder, RecorderError

__all__ = ["NotRecorded", "RecordedFS", "RecordedFile", "WRITE_BUFFER_SIZE"]

WRITE_BUFFER_SIZE = 256 << 10
"""Contiguous written bytes a `RecordedFile` buffers before writing and recording them."""

_READ_CHUNK = 1 << 20


class NotRecorded(RecorderError, FileNotFoundError):
    """The file exists on disk but is not a recorded file; nothing was changed."""


def _parse_mode(mode: str) -> tuple[int, bool, bool]:
    """(os.open flags, readable, writable) of binary `mode`."""
    chars = set(mode)
    if "b" not in chars or not chars <= set("rwxab+") or len(chars) != len(mode):
        raise ValueError(f"unsupported mode {mode!r}: use a binary mode (rb, r+b, wb, xb, ab)")
    bases = chars & set("rwxa")
    if len(bases) != 1:
        raise ValueError(f"invalid mode {mode!r}")
    base = bases.pop()
    plus = "+" in chars
    access = os.O_RDWR if plus else (os.O_RDONLY if base == "r" else os.O_WRONLY)
    extra = {
        "r": 0,
        "w": os.O_CREAT | os.O_TRUNC,
        "x": os.O_CREAT | os.O_EXCL,
        "a": os.O_CREAT | os.O_APPEND,
    }[base]
    return access | extra | getattr(os, "O_CLOEXEC", 0), base == "r" or plus, base != "r" or plus


class RecordedFile:
    """A file opened through `RecordedFS.open`: writes are made locally and recorded.

    Supports ``write``, ``read``, ``seek``, ``tell``, ``truncate``, ``flush``, ``close`` and
    use as a context manager. `fnode` is the recorded file (None for a read-only file).
    Errors of the Recorder (`RecorderBroken`, ...) surface from the call which records.
    """

    def __init__(
        self, fs: RecordedFS, path: str, fd: int, mode: str, fnode: int | None, append: bool
    ) -> None:
        self._fs = fs
        self._path = path  # As recorded.
        self._fd = fd
        self.mode = mode
        self.fnode = fnode
        self._append = append
        self._pos = 0
        self._buf = bytearray()
        self._buf_off = 0
        self._closed = False

    @property
    def name(self) -> str:
        """The file's path on disk."""
        return str(self._fs._local(self._path))

    @property
    def closed(self) -> bool:
        return self._closed

    def fileno(self) -> int:
        return self._fd

    def readable(self) -> bool:
        return "r" in self.mode or "+" in self.mode

    def writable(self) -> bool:
        return self.fnode is not None

    def seekable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Buffer `data` at the position (at the end, in append mode); return its length.

        In append mode the bytes land, as O_APPEND writes, at the end of the file as of when
        the buffer is flushed (other handles may have appended meanwhile), and are recorded
        there.
        """
        self._check_writable()
        n = len(data)
        if not n:
            return 0
        if self._append:  # Always contiguous: the offset is the file's end at the flush.
            off = self._buf_off + len(self._buf) if self._buf else self._disk_size()
        else:
            off = self._pos
            if self._buf and off != self._buf_off + len(self._buf):
                self._flush_buffer()
        if not self._buf:
            self._buf_off = off
        self._buf += data
        self._pos = off + n
        if len(self._buf) >= WRITE_BUFFER_SIZE:
            self._flush_buffer()
        return n

    def read(self, size: int = -1) -> bytes:
        """Read up to `size` bytes (all, if negative) from the position."""
        self._check_open()
        self._flush_buffer()
        if size < 0:
            size = max(self._disk_size() - self._pos, 0)
        data = os.pread(self._fd, size, self._pos)
        self._pos += len(data)
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._check_open()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            self._flush_buffer()
            pos = self._disk_size() + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def tell(self) -> int:
        self._check_open()
        return self._pos

    def truncate(self, size: int | None = None) -> int:
        """Resize the file to `size` bytes (default: the position); return the new size.

        Recorded as described in the module docs. Raises `io.UnsupportedOperation` (before
        any change) if the file has other links or was renamed since it was opened.
        """
        self._check_writable()
        fnode = self.fnode
        assert fnode is not None
        # Every handle's buffered writes (this one's included) happened before the truncation.
        self._fs._flush_files(fnode)
        if size is None:
            size = self._pos
        if size < 0:
            raise ValueError(f"negative size {size}")
        rec = self._fs.recorder
        old = self._disk_size()
        if fnode not in rec.fsm.live_nodes:  # Removed: the content is unreachable.
            os.ftruncate(self._fd, size)
            return size
        if size < old and rec.links(fnode) != {self._path}:
            raise io.UnsupportedOperation(
                f"truncate of {self._path!r}: the file has other links, or was renamed"
            )
        os.ftruncate(self._fd, size)
        if size > old:
            zeros = bytes(min(size - old, _READ_CHUNK))
            for off in range(old, size, len(zeros)):
                rec.record_write(fnode, off, zeros[: size - off])
        elif size < old:
            new = rec.record_truncate(self._fs._local(self._path))
            self._fs._renumber(fnode, new)  # The same file on disk, for every handle.
            if size:  # Record the kept prefix, read back (the fd may be write-only).
                with open(self._fs._local(self._path), "rb") as src:
                    for off in range(0, size, _READ_CHUNK):
                        rec.record_write(new, off, src.read(min(_READ_CHUNK, size - off)))
        return size

    def flush(self) -> None:
        """Write buffered bytes to disk and record them."""
        if not self._closed:
            self._flush_buffer()

    def close(self) -> None:
        """Flush and close. The file is closed even if recording fails (which raises)."""
        if self._closed:
            return
        try:
            self._flush_buffer()
        finally:
            self._closed = True
            os.close(self._fd)
            self._fs._files.discard(self)

    def __enter__(self) -> RecordedFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RecordedFile {self._path!r} mode={self.mode!r} fnode={self.fnode}>"

    def _disk_size(self) -> int:
        return os.fstat(self._fd).st_size

    def _flush_buffer(self) -> None:
        if not self._buf:
            return
        buf, off = self._buf, self._buf_off
        self._buf = bytearray()
        with memoryview(buf) as view:
            done = 0
            while done < len(buf):  # Writes may write less than asked.
                if self._append:  # O_APPEND: at the end of the file, whatever the offset.
                    done += os.write(self._fd, view[done:])
                else:
                    done += os.pwrite(self._fd, view[done:], off + done)
        if self._append:
            # Where the bytes landed: the end of the file, which other handles may have
            # moved since the buffer began (this thread is the only writer).
            off = self._disk_size() - len(buf)
            self._pos = off + len(buf)
        fnode = self.fnode
        assert fnode is not None
        rec = self._fs.recorder
        if fnode not in rec.fsm.live_nodes:
            # The file was removed (or replaced) while open: as on POSIX, what is written to
            # it is unreachable, so nothing is recorded.
            rec.check()
            return
        rec.record_write(fnode, off, buf)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("I/O operation on closed file")

    def _check_writable(self) -> None:
        self._check_open()
        if self.fnode is None:
            raise io.UnsupportedOperation("file not open for writing")
        self._fs.recorder.check()


class RecordedFS:
    """Files under `recorder.directory`, whose changes are recorded by `recorder`.

    Paths are relative to the directory (or absolute within it); see the module docs.
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.root = recorder.directory
        self._files: weakref.WeakSet[RecordedFile] = weakref.WeakSet()

    def disk_path(self, path: str | os.PathLike[str]) -> Path:
        """The local path of `path`. Raises `InvalidPath` if it's outside the directory.

        (Recorder methods take local paths: a recorded path like ``/a`` would be taken for
        an absolute one.)
        """
        return self.root / self.recorder.recorded_path(path)[1:]

    def open(self, path: str | os.PathLike[str], mode: str = "rb") -> RecordedFile:
        """Open `path` in binary `mode`, recording the create or truncation it implies."""
        flags, _, writable = _parse_mode(mode)
        rel = self.recorder.recorded_path(path)
        disk = self.root / rel[1:]
        if not writable:
            return RecordedFile(self, rel, os.open(disk, flags), mode, None, False)

        rec = self.recorder
        rec.check()
        known = rec.fnode(disk)
        if known is None and not flags & os.O_TRUNC and disk.exists():
            raise NotRecorded(f"{rel!r} exists but was not recorded")
        if known is not None and flags & os.O_TRUNC:
            self._flush_files(known)  # Writes buffered by open handles precede the truncation.
        fd = os.open(disk, flags, 0o666)
        try:
            fnode = rec.record_open(
                disk,
                create=bool(flags & os.O_CREAT),
                truncate=bool(flags & os.O_TRUNC),
                exclusive=bool(flags & os.O_EXCL),
            )
        except BaseException:
            os.close(fd)
            raise
        if known is not None and known != fnode:
            # Truncated (recorded as a new Fnode): handles open on it write the same file.
            self._renumber(known, fnode)
        f = RecordedFile(self, rel, fd, mode, fnode, bool(flags & os.O_APPEND))
        self._files.add(f)
        return f

    def rename(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """Rename file or directory `src` to `dst` (replacing a file there), as os.replace."""
        rec = self.recorder
        s, d = rec.recorded_path(src), rec.recorded_path(dst)
        rec.check()
        disk_src = self.root / s[1:]
        if disk_src.is_dir() and not disk_src.is_symlink():
            moved = sorted(p for p in rec.fsm.links if p.startswith(s + "/"))
            os.replace(disk_src, self.root / d[1:])
            for p in moved:
                rec.record_rename(self._local(p), self._local(d + p[len(s) :]))
            return
        self._require_recorded(src)
        replaced = rec.fnode(self.root / d[1:])
        if replaced is not None:
            self._flush_files(replaced)  # Writes buffered by its open handles came first.
        os.replace(disk_src, self.root / d[1:])
        rec.record_rename(disk_src, self.root / d[1:])

    replace = rename

    def remove(self, path: str | os.PathLike[str]) -> None:
        """Remove file `path`."""
        p = self._require_recorded(path)
        fnode = self.recorder.fnode(self.root / p[1:])
        assert fnode is not None
        self._flush_files(fnode)  # Writes buffered by its open handles came first.
        os.remove(self.root / p[1:])
        self.recorder.record_unlink(self.root / p[1:])

    unlink = remove

    def link(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """Hard-link file `src` at `dst`."""
        s = self._require_recorded(src)
        d = self.recorder.recorded_path(dst)
        os.link(self.root / s[1:], self.root / d[1:])
        fnode = self.recorder.fnode(self.root / s[1:])
        assert fnode is not None
        self.recorder.record_link(fnode, self.root / d[1:])

    def makedirs(self, path: str | os.PathLike[str], exist_ok: bool = True) -> None:
        """Create directory `path` and its parents (not recorded: see the module docs)."""
        os.makedirs(self.disk_path(path), exist_ok=exist_ok)

    def rmdir(self, path: str | os.PathLike[str]) -> None:
        """Remove empty directory `path` (not recorded)."""
        os.rmdir(self.disk_path(path))

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return self.disk_path(path).exists()

    async def fsync(self, file: RecordedFile) -> pb.AppendResponse:
        """Flush `file`, then wait until everything recorded so far is committed to the log.

        Raises `RecorderBroken`/`RecorderFenced` if it can't be.
        """
        file.flush()
        return await self.recorder.barrier()

    async def sync(self) -> pb.AppendResponse:
        """Flush every open file, then wait until everything recorded is committed."""
        for f in list(self._files):
            f.flush()
        return await self.recorder.barrier()

    def _local(self, recorded: str) -> Path:
        return self.root / recorded[1:]

    def _flush_files(self, fnode: int) -> None:
        """Flush the buffers of the open files of `fnode` (before it is unlinked, replaced
        or truncated: their writes happened first)."""
        for f in list(self._files):
            if f.fnode == fnode and not f.closed:
                f.flush()

    def _renumber(self, old: int, new: int) -> None:
        """Open files of Fnode `old` write Fnode `new` (a truncation, recorded as unlink and
        create, of the same file on disk), unless `old` is still live (other links)."""
        if old in self.recorder.fsm.live_nodes:
            return
        for f in self._files:
            if f.fnode == old:
                f.fnode = new

    def _require_recorded(self, path: str | os.PathLike[str]) -> str:
        rec = self.recorder
        p = rec.recorded_path(path)
        rec.check()
        if rec.fnode(self.root / p[1:]) is None:
            if (self.root / p[1:]).exists():
                raise NotRecorded(f"{p!r} exists but was not recorded")
            raise FileNotFoundError(2, "No such recorded file", str(self.root / p[1:]))
        return p
