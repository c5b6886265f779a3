"""RecordingOperations: a pass-through pyfuse3 filesystem over a backing directory whose
mutations are recorded through a `RecordingLink` (see docs/fusefs.md).

FUSE inodes are the backing files' inode numbers (the backing root's swapped with
`pyfuse3.ROOT_INODE`); the filesystem keeps each inode's current paths (relative to the
backing root), learnt from lookups, creations, readdir and renames. Every mutating handler
first checks that the operation can be recorded faithfully (otherwise it fails with an errno
and a log line, before touching the backing files), then performs it, then queues it to the
link, without awaiting in between, so that the log receives operations in the order they
happened. Reads and attributes are served from the backing files; the kernel caches them
(long entry/attribute timeouts, ``keep_cache``), since nothing but this mount writes them.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
from collections.abc import Sequence
from typing import Any, cast

import pyfuse3
from pyfuse3 import FUSEError

from gazette.fusefs._recording import RecordingLink
from gazette.recoverylog.recorder import PROPERTY_PATHS, RecordingFailed

__all__ = ["RecordingOperations"]

log = logging.getLogger(__name__)

TIMEOUT = 3600.0  # Entry/attribute cache timeouts: this mount is the only writer.


def _fuse_error(err: OSError) -> FUSEError:
    return FUSEError(err.errno or errno.EIO)


def _backing_flags(flags: int) -> int:
    """Flags to open a backing file with for the kernel's open `flags`: O_APPEND dropped
    (the kernel passes each write's offset), and write-only made read-write, since the
    kernel's page cache reads partial pages through any handle of the file."""
    flags &= ~os.O_APPEND
    if flags & os.O_ACCMODE == os.O_WRONLY:
        flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
    return flags | os.O_CLOEXEC


def _set_metadata(target: str | int, attr: Any, fields: Any) -> None:
    """Apply setattr's mode, owner and times (not its size) to the backing file `target`, a
    path or an open descriptor (raises OSError). Not recorded: the log holds content only."""
    if fields.update_mode:
        os.chmod(target, stat.S_IMODE(attr.st_mode))
    if fields.update_uid or fields.update_gid:
        os.chown(
            target,
            attr.st_uid if fields.update_uid else -1,
            attr.st_gid if fields.update_gid else -1,
        )
    if fields.update_atime or fields.update_mtime:
        st = os.fstat(target) if isinstance(target, int) else os.lstat(target)
        os.utime(
            target,
            ns=(
                attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns,
            ),
        )


class RecordingOperations(pyfuse3.Operations):
    def __init__(
        self,
        backing: str,
        link: RecordingLink,
        *,
        writeback: bool,
        direct_writes: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.enable_writeback_cache = writeback
        self._direct_writes = direct_writes
        self._root = os.path.abspath(backing)
        self._root_ino = os.lstat(self._root).st_ino
        self._link = link
        self._fuse_of: dict[int, int] = {self._root_ino: int(pyfuse3.ROOT_INODE)}
        self._next_ino = int(pyfuse3.ROOT_INODE) + 1
        self._paths: dict[int, set[str]] = {int(pyfuse3.ROOT_INODE): {""}}
        self._fds: dict[int, tuple[int, int]] = {}  # fh -> (fd, inode)
        self._next_fh = 1
        self.reads = 0
        self.writes = 0
        self.refused = 0

    # -- Inodes and paths -----------------------------------------------------------------

    def _ino(self, st_ino: int) -> int:
        """The FUSE inode of backing inode `st_ino`. FUSE inodes are never reused: the backing
        file system reuses the number of a removed file at once, and the kernel would then
        take the new file for the old one (serving its cached pages and attributes)."""
        ino = self._fuse_of.get(st_ino)
        if ino is None:
            ino = self._fuse_of[st_ino] = self._next_ino
            self._next_ino += 1
        return ino

    def _path(self, inode: int) -> str:
        paths = self._paths.get(int(inode))
        if not paths:
            raise FUSEError(errno.ENOENT)
        return next(iter(paths))

    def _child(self, parent: int, name: bytes) -> str:
        base = self._path(parent)
        n = os.fsdecode(name)
        return f"{base}/{n}" if base else n

    def _full(self, rel: str) -> str:
        return os.path.join(self._root, rel) if rel else self._root

    def _attr(self, st: os.stat_result, ino: int = 0) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = cast(Any, ino or self._ino(st.st_ino))
        e.generation = 0
        e.entry_timeout = TIMEOUT
        e.attr_timeout = TIMEOUT
        e.st_mode = cast(Any, st.st_mode)
        e.st_nlink = st.st_nlink
        e.st_uid = st.st_uid
        e.st_gid = st.st_gid
        e.st_rdev = st.st_rdev
        e.st_size = st.st_size
        e.st_blksize = st.st_blksize
        e.st_blocks = st.st_blocks
        e.st_atime_ns = st.st_atime_ns
        e.st_ctime_ns = st.st_ctime_ns
        e.st_mtime_ns = st.st_mtime_ns
        return e

    def _learn(self, rel: str) -> pyfuse3.EntryAttributes:
        try:
            st = os.lstat(self._full(rel))
        except OSError as err:
            raise _fuse_error(err) from None
        self._paths.setdefault(self._ino(st.st_ino), set()).add(rel)
        return self._attr(st)

    def _forget_path(self, rel: str, st: os.stat_result, *, last: bool) -> None:
        """`rel` no longer names the file `st`; if it was its `last` link, the backing inode
        number may be reused: it will get a new FUSE inode."""
        ino = self._ino(st.st_ino)
        paths = self._paths.get(ino)
        if paths is not None:
            paths.discard(rel)
            if not paths:
                del self._paths[ino]
        if last:
            del self._fuse_of[st.st_ino]

    def _refuse(self, what: str, path: str, code: int) -> FUSEError:
        self.refused += 1
        log.error("refused unrecordable op=%s path=%s errno=%s", what, path, errno.errorcode[code])
        return FUSEError(code)

    def _check(self) -> None:
        try:
            self._link.check()
        except RecordingFailed as err:
            # Fenced, the refusal is expected (a newer primary owns the log; logged once).
            log.log(
                logging.INFO if self._link.fenced else logging.ERROR, "mutation refused: %s", err
            )
            raise FUSEError(errno.EIO) from None

    @staticmethod
    def _prop(rel: str) -> bool:
        return "/" + rel in PROPERTY_PATHS

    # -- Lookups and attributes -----------------------------------------------------------

    async def lookup(
        self, parent_inode: Any, name: Any, ctx: Any = None
    ) -> pyfuse3.EntryAttributes:
        if name == b".":
            return self._learn(self._path(parent_inode))
        if name == b"..":
            p = os.path.dirname(self._path(parent_inode))
            return self._learn(p)
        return self._learn(self._child(parent_inode, name))

    async def forget(self, inode_list: Sequence[tuple[Any, int]]) -> None:
        pass  # Paths are dropped on unlink/rename; an inode's entry is small.

    async def getattr(self, inode: Any, ctx: Any = None) -> pyfuse3.EntryAttributes:
        try:
            if int(inode) in self._paths:
                st = os.lstat(self._full(self._path(inode)))
            else:  # Removed while open.
                return self._attr(os.fstat(self._removed_fd(inode)), int(inode))
        except OSError as err:
            raise _fuse_error(err) from None
        return self._attr(st)

    def _removed_fd(self, inode: Any, writable: bool = False) -> int:
        """A backing fd of `inode`, a file removed while open (ENOENT if none is open); a
        writable one if `writable` and there is one."""
        fds = [fd for fd, ino in self._fds.values() if ino == inode]
        if not fds:
            raise FUSEError(errno.ENOENT)
        if writable:
            for fd in fds:
                if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY:
                    return fd
        return fds[0]

    async def setattr(
        self, inode: Any, attr: Any, fields: Any, fh: Any, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        if int(inode) not in self._paths:
            return self._setattr_removed(inode, attr, fields, fh)
        rel = self._path(inode)
        full = self._full(rel)
        try:
            if fields.update_size:
                self._check()
                self._truncate(rel, full, attr.st_size, fh)
            _set_metadata(full, attr, fields)
            return self._attr(os.lstat(full))
        except OSError as err:
            raise _fuse_error(err) from None

    def _setattr_removed(
        self, inode: Any, attr: Any, fields: Any, fh: Any
    ) -> pyfuse3.EntryAttributes:
        """setattr of a file removed while still open (e.g. the kernel writing back its times
        when the last descriptor closes): applied to its backing file and not recorded, as its
        content is dead. Through the caller's descriptor when there is one (an ftruncate
        needs a writable one)."""
        opened = self._fds.get(fh) if fh is not None else None
        if opened is not None and opened[1] == inode:
            fd = opened[0]
        else:
            fd = self._removed_fd(inode, writable=bool(fields.update_size))
        try:
            if fields.update_size:
                os.ftruncate(fd, attr.st_size)
            _set_metadata(fd, attr, fields)
            return self._attr(os.fstat(fd), int(inode))
        except OSError as err:
            raise _fuse_error(err) from None

    def _truncate(self, rel: str, full: str, size: int, fh: Any) -> None:
        st = os.lstat(full)
        if not stat.S_ISREG(st.st_mode):
            raise FUSEError(errno.EINVAL)
        if size == st.st_size:
            return
        if self._prop(rel):
            raise self._refuse("truncate", rel, errno.EPERM)
        others = self._other_links(rel, st, "truncate")
        if size > st.st_size:
            os.truncate(full, size)
            self._link.write(rel, st.st_size, bytes(size - st.st_size))
            return
        kept = b""
        if size:
            with open(full, "rb") as f:
                kept = f.read(size)
        os.truncate(full, size)
        self._record_truncate(rel, others)
        self._link.write(rel, 0, kept)

    def _other_links(self, rel: str, st: os.stat_result, what: str) -> list[str]:
        """The other paths of the file at `rel`; refuses the op if some are unknown."""
        paths = self._paths.get(self._ino(st.st_ino), set())
        if st.st_nlink > 1 and (len(paths) != st.st_nlink or rel not in paths):
            raise self._refuse(f"{what} of a file with unknown links", rel, errno.EOPNOTSUPP)
        return sorted(paths - {rel}) if st.st_nlink > 1 else []

    def _record_truncate(self, rel: str, others: list[str]) -> None:
        # The log records a truncation as a new Fnode at `rel`; the file's other links
        # share it on disk, so they are moved onto the new Fnode too.
        self._link.truncate(rel)
        for other in others:
            self._link.unlink(other)
            self._link.link(rel, other)

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        s = os.statvfs(self._root)
        out = pyfuse3.StatvfsData()
        for a in (
            "f_bsize",
            "f_frsize",
            "f_blocks",
            "f_bfree",
            "f_bavail",
            "f_files",
            "f_ffree",
            "f_favail",
            "f_namemax",
        ):
            setattr(out, a, getattr(s, a))
        return out

    async def readlink(self, inode: Any, ctx: Any) -> Any:
        try:
            return os.fsencode(os.readlink(self._full(self._path(inode))))
        except OSError as err:
            raise _fuse_error(err) from None

    # -- Directories ------------------------------------------------------------------------

    async def opendir(self, inode: Any, ctx: Any) -> Any:
        self._path(inode)
        return inode

    async def readdir(self, fh: Any, start_id: int, token: Any) -> None:
        base = self._path(fh)
        try:
            names = sorted(os.listdir(self._full(base)))
        except OSError as err:
            raise _fuse_error(err) from None
        for i, name in enumerate(names[start_id:], start_id + 1):
            rel = f"{base}/{name}" if base else name
            try:
                attr = self._learn(rel)
            except FUSEError:
                continue
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attr, i):
                break

    async def releasedir(self, fh: Any) -> None:
        pass

    async def fsyncdir(self, fh: Any, datasync: bool) -> None:
        await self._barrier()

    async def mkdir(self, parent_inode: Any, name: Any, mode: Any, ctx: Any) -> Any:
        # Directories are not recorded: a Player creates the parents of every file it links.
        rel = self._child(parent_inode, name)
        self._check()
        try:
            os.mkdir(self._full(rel), mode)
        except OSError as err:
            raise _fuse_error(err) from None
        return self._learn(rel)

    async def rmdir(self, parent_inode: Any, name: Any, ctx: Any) -> None:
        rel = self._child(parent_inode, name)
        self._check()
        full = self._full(rel)
        try:
            st = os.lstat(full)
            os.rmdir(full)
        except OSError as err:
            raise _fuse_error(err) from None
        self._forget_path(rel, st, last=True)

    # -- Unrecordable ---------------------------------------------------------------------

    async def symlink(self, parent_inode: Any, name: Any, target: Any, ctx: Any) -> Any:
        raise self._refuse("symlink", self._child(parent_inode, name), errno.EPERM)

    async def mknod(self, parent_inode: Any, name: Any, mode: Any, rdev: int, ctx: Any) -> Any:
        raise self._refuse("mknod", self._child(parent_inode, name), errno.EPERM)

    async def setxattr(self, inode: Any, name: Any, value: Any, ctx: Any) -> None:
        raise self._refuse("setxattr", self._path(inode), errno.ENOTSUP)

    async def removexattr(self, inode: Any, name: Any, ctx: Any) -> None:
        raise self._refuse("removexattr", self._path(inode), errno.ENOTSUP)

    # -- Names ------------------------------------------------------------------------------

    async def unlink(self, parent_inode: Any, name: Any, ctx: Any) -> None:
        rel = self._child(parent_inode, name)
        self._check()
        full = self._full(rel)
        if self._prop(rel):
            raise self._refuse("unlink", rel, errno.EPERM)
        try:
            st = os.lstat(full)
            os.unlink(full)
        except OSError as err:
            raise _fuse_error(err) from None
        self._link.unlink(rel)
        self._forget_path(rel, st, last=st.st_nlink <= 1)

    async def rename(
        self,
        parent_inode_old: Any,
        name_old: Any,
        parent_inode_new: Any,
        name_new: Any,
        flags: Any,
        ctx: Any,
    ) -> None:
        src = self._child(parent_inode_old, name_old)
        dst = self._child(parent_inode_new, name_new)
        self._check()
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise self._refuse("rename(RENAME_EXCHANGE)", src, errno.EINVAL)
        fsrc, fdst = self._full(src), self._full(dst)
        try:
            st = os.lstat(fsrc)
            try:
                dst_st: os.stat_result | None = os.lstat(fdst)
            except FileNotFoundError:
                dst_st = None
            if dst_st is not None and flags & pyfuse3.RENAME_NOREPLACE:
                raise FUSEError(errno.EEXIST)
            if stat.S_ISDIR(st.st_mode):
                if os.listdir(fsrc):
                    raise self._refuse("rename of a non-empty directory", src, errno.EXDEV)
                os.rename(fsrc, fdst)
            else:
                if not stat.S_ISREG(st.st_mode):
                    raise self._refuse("rename of a special file", src, errno.EPERM)
                if self._prop(src):
                    raise self._refuse("rename", src, errno.EPERM)
                if dst_st is not None and dst_st.st_ino == st.st_ino:
                    # Links of one file: POSIX leaves both in place.
                    return
                os.rename(fsrc, fdst)
                self._link.rename(src, dst)
        except OSError as err:
            raise _fuse_error(err) from None
        if dst_st is not None:
            self._forget_path(dst, dst_st, last=dst_st.st_nlink <= 1)
        self._forget_path(src, st, last=False)
        self._paths.setdefault(self._ino(st.st_ino), set()).add(dst)

    async def link(self, inode: Any, new_parent_inode: Any, new_name: Any, ctx: Any) -> Any:
        src = self._path(inode)
        dst = self._child(new_parent_inode, new_name)
        self._check()
        if self._prop(src) or self._prop(dst):
            raise self._refuse("link", dst, errno.EPERM)
        try:
            os.link(self._full(src), self._full(dst))
        except OSError as err:
            raise _fuse_error(err) from None
        self._link.link(src, dst)
        return self._learn(dst)

    # -- Files ------------------------------------------------------------------------------

    def _new_fh(self, fd: int, inode: int) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._fds[fh] = (fd, inode)
        return fh

    async def open(self, inode: Any, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        rel = self._path(inode)
        full = self._full(rel)
        writing = flags & (os.O_WRONLY | os.O_RDWR)
        trunc = bool(flags & os.O_TRUNC)
        if writing or trunc:
            self._check()
            if self._prop(rel):
                raise self._refuse("open for writing", rel, errno.EPERM)
        try:
            others: list[str] = []
            if trunc:
                st = os.lstat(full)
                if st.st_size:
                    others = self._other_links(rel, st, "O_TRUNC")
            fd = os.open(full, _backing_flags(flags) & ~(os.O_CREAT | os.O_EXCL))
        except OSError as err:
            raise _fuse_error(err) from None
        if trunc and st.st_size:
            self._record_truncate(rel, others)
        fh = self._new_fh(fd, int(inode))
        return self._file_info(fh, rel, flags)

    async def create(
        self, parent_inode: Any, name: Any, mode: Any, flags: int, ctx: Any
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        rel = self._child(parent_inode, name)
        full = self._full(rel)
        self._check()
        if self._prop(rel):
            raise self._refuse("create", rel, errno.EPERM)
        try:
            existed = os.path.lexists(full)
            if existed and flags & os.O_EXCL:
                raise FUSEError(errno.EEXIST)
            st = os.lstat(full) if existed else None
            others: list[str] = []
            if st is not None and flags & os.O_TRUNC and st.st_size:
                others = self._other_links(rel, st, "O_TRUNC")
            fd = os.open(full, _backing_flags(flags) | os.O_CREAT, mode)
        except OSError as err:
            raise _fuse_error(err) from None
        if not existed:
            self._link.create(rel)
        elif flags & os.O_TRUNC and st is not None and st.st_size:
            self._record_truncate(rel, others)
        attr = self._learn(rel)
        fh = self._new_fh(fd, int(attr.st_ino))
        return self._file_info(fh, rel, flags), attr

    def _file_info(self, fh: int, rel: str, flags: int) -> pyfuse3.FileInfo:
        """An open file's FileInfo. Its cached pages are kept (nothing else writes the backing
        files), unless it is opened for writing and named with one of the `direct_writes`
        suffixes: it then bypasses the page cache (FOPEN_DIRECT_IO), so that each of its
        writes reaches us as one request. A cached write beginning inside a page the kernel
        does not hold whole comes as two (the kernel ends a request at that page), as every
        RocksDB WAL write after the first does. On this kernel (6.18) a direct write drops the
        pages it covers from the cache of the file's other opens, so that a reader which
        cached them reads the new bytes (docs/fusefs.md says what is not covered)."""
        writing = flags & (os.O_WRONLY | os.O_RDWR)
        direct = bool(writing) and rel.endswith(self._direct_writes)  # False for ().
        return pyfuse3.FileInfo(fh=cast(Any, fh), keep_cache=True, direct_io=direct)

    async def read(self, fh: Any, off: int, size: int) -> bytes:
        self.reads += 1
        try:
            return os.pread(self._fds[fh][0], size, off)
        except OSError as err:
            raise _fuse_error(err) from None

    async def write(self, fh: Any, off: int, buf: bytes) -> int:
        self._check()
        fd, inode = self._fds[fh]
        try:
            n = os.pwrite(fd, buf, off)
        except OSError as err:
            raise _fuse_error(err) from None
        self.writes += 1
        paths = self._paths.get(inode)
        if paths:  # Else the file was unlinked while open: its content is dead.
            self._link.write(next(iter(paths)), off, buf[:n] if n < len(buf) else buf)
            if self._link.must_throttle:
                await self._barrier()
        return n

    async def flush(self, fh: Any) -> None:
        pass

    async def release(self, fh: Any) -> None:
        fd, _ = self._fds.pop(fh)
        os.close(fd)

    async def fsync(self, fh: Any, datasync: bool) -> None:
        await self._barrier()

    async def _barrier(self) -> None:
        try:
            await self._link.barrier(confirm=False)  # A file sync: no fence check needed.
        except RecordingFailed as err:
            log.log(logging.INFO if self._link.fenced else logging.ERROR, "fsync failed: %s", err)
            raise FUSEError(errno.EIO) from None
