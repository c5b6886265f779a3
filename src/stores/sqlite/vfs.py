"""A VFS which records SQLite's files into a recovery log (see docs/sqlite-store.md).

The VFS's I/O is in C (`stores.sqlite._recvfs`, built by ``python -m gazette.stores.sqlite.native
build``): every file is read, written, locked and mapped by SQLite's default VFS on local
disk without Python. `RecordingVFS` is told only of what is recorded, which depends on the
file:

- Main databases (``SQLITE_OPEN_MAIN_DB``): every write and truncation is recorded into the
  database's `PageStore`, never as a file, except while the store's own WAL checkpoint runs
  (`RecordingVFS.backfilling`): those writes copy WAL frames, which the WAL already recorded.
- Rollback journals, super-journals and WALs: recorded as files, their contiguous writes
  gathered in C into one. When SQLite resets one for reuse (truncation to zero, the zeroed
  header of ``journal_mode=PERSIST``, the header of a restarted WAL) it becomes a new Fnode,
  so the old content turns into dead log; a WAL whose checkpoint copies were not recorded is
  renamed to a WAL generation of the page store instead (`PageStore.keep_wal`), also when
  SQLite deletes it.
- Temporary files, sub-journals and anything outside the store directory: not recorded.

``xSync`` is the flush signal: it hands every queued operation to the Recorder and (with
`sync_waits`, the default) returns once they are committed to the log. Local files are never
fsync'd: durability comes from the log. The store must run with ``PRAGMA synchronous=FULL``:
a lower setting skips the syncs which commit transactions.
"""

from __future__ import annotations

import importlib
import os
import posixpath
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType

import apsw

from gazette.recoverylog.recorder import RecordingFailed
from gazette.stores.sqlite.bridge import RecorderBridge
from gazette.stores.sqlite.pagestore import WAL_FRAME_HEADER, PageStore

__all__ = ["LOG_FILE_FLAGS", "TRUNCATE_FACTOR", "RecordingVFS", "native_vfs"]

LOG_FILE_FLAGS = (
    apsw.SQLITE_OPEN_MAIN_JOURNAL | apsw.SQLITE_OPEN_SUPER_JOURNAL | apsw.SQLITE_OPEN_WAL
)
"""Open flags of the files recorded directly, as files."""

WAL_NAME_SUFFIX = "-wal"
"""SQLite names the WAL of database ``x`` ``x-wal``."""

_native_lock = threading.Lock()


_NOT_BUILT = (
    "the SQLite store's VFS ({what}) {why}. The package build compiles it, given a C compiler, "
    "Python's headers and SQLite's sqlite3ext.h (Debian: build-essential python3-dev "
    "libsqlite3-dev): with those installed, reinstall the package with its [sqlite] extra, "
    "pip install --force-reinstall --no-cache-dir 'gazette-py[sqlite]' (or '.[sqlite]' in its "
    "source tree); in a development checkout, `make deps` (or "
    "`python -m gazette.stores.sqlite.native build`) builds it in place"
)


def native_vfs() -> ModuleType:
    """The C half of the VFS (`stores.sqlite._recvfs`), loaded into APSW's SQLite.

    Raises ImportError, saying how to build it, if it was not built (the package build
    skips it without a C compiler) or cannot be loaded."""
    try:
        _recvfs = importlib.import_module("gazette.stores.sqlite._recvfs")
    except ModuleNotFoundError as err:
        what = "gazette/stores/sqlite/_recvfs.so"
        raise ImportError(_NOT_BUILT.format(what=what, why="was not built")) from err
    except ImportError as err:
        why = f"cannot be loaded ({err})"
        raise ImportError(_NOT_BUILT.format(what=err.path or "_recvfs", why=why)) from err
    with _native_lock:
        if not _recvfs.loaded():
            # Loading it as an SQLite extension hands it the API of APSW's own SQLite.
            conn = apsw.Connection(":memory:")
            try:
                conn.enable_load_extension(True)
                conn.load_extension(str(_recvfs.__file__), "sqlite3_recvfs_init")
            finally:
                conn.close()
    return _recvfs


def _read(path: str, offset: int, n: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, n, offset)
    finally:
        os.close(fd)


TRUNCATE_FACTOR = 4
"""A WAL file larger than this many times the store's checkpoint threshold when it is
checkpointed is also truncated (`RecordingVFS.wal_hook`)."""


class RecordingVFS:
    """A VFS named `name` whose files under `directory` are recorded through `bridge`.

    `recorded` are the paths (relative to `directory`) already recorded as files, and
    `page_files` the (generation, size, is a WAL generation) of each database's live page
    files (after playback). SQLite must use the VFS from one thread at a time (one
    connection). `unregister` it once no connection uses it.

    The VFS calls its methods `open` and `delete`, and those of the hooks `open` returns,
    from the thread running SQLite.
    """

    def __init__(
        self,
        name: str,
        directory: Path,
        bridge: RecorderBridge,
        *,
        recorded: set[str],
        page_files: Mapping[str, Sequence[tuple[int, int, bool]]],
        sync_waits: bool = True,
        sequential: bool = False,
        compaction_factor: float = 1.5,
        min_compaction_bytes: int = 1 << 20,
    ) -> None:
        self.name = name
        self.directory = posixpath.normpath(os.path.abspath(directory))
        self.bridge = bridge
        self.recorded = recorded
        self.sync_waits = sync_waits
        self.sequential = sequential
        """Whether the main databases report ``SQLITE_IOCAP_SEQUENTIAL`` (in WAL mode: see
        `MainDBFile`)."""
        self._page_files = dict(page_files)
        self._compaction = (compaction_factor, min_compaction_bytes)
        self.page_stores: dict[str, PageStore] = {}
        self._native = native_vfs()
        self._native.register(name, self)
        self._registered = True

    def unregister(self) -> None:
        """Remove the VFS from SQLite. Idempotent. Raises `RuntimeError` while a connection
        still has files open through it."""
        if self._registered:
            self._native.unregister(self.name)
            self._registered = False

    @property
    def backfilling(self) -> bool:
        """Whether the store's WAL checkpoint runs (the bridge defers its syncs meanwhile):
        main-database writes then copy WAL frames, and are not recorded
        (`PageStore.note_backfill`)."""
        return self.bridge.deferring

    def _set_backfilling(self, on: bool) -> None:
        self.bridge.deferring = on
        self._native.set_backfilling(self.name, on)

    def wal_hook(self, checkpoint_pages: int) -> Callable[[apsw.Connection, str, int], int]:
        """A WAL hook (``Connection.set_wal_hook``) which checkpoints a database's WAL once
        it holds `checkpoint_pages` pages, its copies not recorded (`backfilling`). It
        replaces SQLite's auto-checkpoint, whose copies would be.

        The checkpoint is PASSIVE, as SQLite's own: the next commit starts the WAL over at
        its header (`LogFile.write` records the reset there) and rewrites the file's blocks
        in place. A TRUNCATE checkpoint made every commit grow the file anew, which cost
        ~50% more CPU per commit (docs/sqlite-store.md). A WAL file larger than
        `TRUNCATE_FACTOR` times `checkpoint_pages` pages (grown by a large transaction, even
        one rolled back) is truncated instead, so that its disk space is given back."""

        def hook(conn: apsw.Connection, dbname: str, pages: int) -> int:
            if pages >= checkpoint_pages:
                schema = dbname.replace('"', '""')
                (page_size,) = conn.execute(f'PRAGMA "{schema}".page_size').fetchall()[0]
                assert isinstance(page_size, int)
                try:
                    wal_bytes = os.stat(conn.db_filename(dbname) + "-wal").st_size
                except OSError:
                    wal_bytes = 0  # (It exists while SQLite uses it: a checkpoint as always.)
                large = wal_bytes > TRUNCATE_FACTOR * checkpoint_pages * (
                    page_size + WAL_FRAME_HEADER
                )
                mode = apsw.SQLITE_CHECKPOINT_TRUNCATE if large else apsw.SQLITE_CHECKPOINT_PASSIVE
                self._set_backfilling(True)
                try:
                    conn.wal_checkpoint(dbname, mode)
                finally:
                    self._set_backfilling(False)
                # The commit was synced before the hook ran, and no commit depends on the
                # checkpoint's operations (a compaction of the page store; after a
                # truncation, the WAL's reset too): they go with the next commit's barrier
                # rather than wait for one of their own.
                self.bridge.defer()
            return apsw.SQLITE_OK

        return hook

    def relative(self, filename: str) -> str | None:
        """`filename` relative to the store directory, or None if it is outside."""
        path = posixpath.normpath(os.path.abspath(filename))
        rel = posixpath.relpath(path, self.directory)
        if rel == "." or rel == ".." or rel.startswith("../"):
            return None
        return rel

    def page_store(self, db: str) -> PageStore:
        store = self.page_stores.get(db)
        if store is None:
            factor, minimum = self._compaction
            live = self._page_files.get(db, ())
            store = PageStore(
                self.bridge,
                db,
                [(gen, size) for gen, size, _ in live],
                wal_generations=[gen for gen, _, wal in live if wal],
                compaction_factor=factor,
                min_compaction_bytes=minimum,
            )
            self.page_stores[db] = store
        return store

    def wal_page_store(self, rel: str) -> PageStore | None:
        """The page store of the database whose WAL is `rel`, if it is one's."""
        if not rel.endswith(WAL_NAME_SUFFIX):
            return None
        return self.page_stores.get(rel[: -len(WAL_NAME_SUFFIX)])

    # -- Called by the VFS, in SQLite's thread ------------------------------------------------

    def open(self, filename: str, flags: int) -> MainDBFile | LogFile | None:
        """File `filename` was opened with `flags` (not a temporary file): its hook, or None
        if it is not recorded."""
        rel = self.relative(filename)
        if flags & apsw.SQLITE_OPEN_MAIN_DB:
            if rel is None:
                raise apsw.CantOpenError(f"database {filename} is outside {self.directory}")
            return MainDBFile(self, filename, rel)
        if flags & LOG_FILE_FLAGS and rel is not None:
            return LogFile(self, filename, rel, wal=bool(flags & apsw.SQLITE_OPEN_WAL))
        return None

    def delete(self, filename: str, size: int) -> None:
        """File `filename` of `size` bytes was deleted."""
        rel = self.relative(filename)
        if rel is None or rel not in self.recorded:
            return
        self.recorded.discard(rel)
        try:
            pages = self.wal_page_store(rel)
            if pages is not None and pages.wal_size:
                # The recorded size: a WAL started over in place keeps stale frames beyond it.
                size = min(size, pages.wal_size)
            if pages is None or not pages.keep_wal(rel, max(size, 0)):
                self.bridge.unlink(rel)
            if pages is not None:
                pages.wal_size = 0
            # Deleting a rollback journal commits its transaction (journal_mode=DELETE), and
            # SQLite syncs nothing after it: this is that transaction's flush signal.
            self.bridge.sync(self.sync_waits)
        except RecordingFailed as err:
            raise apsw.IOError(str(err)) from err


class MainDBFile:
    """A main database's hook: writes recorded as page records."""

    buffered = False
    main = True

    def __init__(self, vfs: RecordingVFS, filename: str, rel: str) -> None:
        self._vfs = vfs
        self._bridge = vfs.bridge
        self._pages = vfs.page_store(rel)
        # The recorded files are written in order: a crash plays back a prefix of the log's
        # operations, never a later write without an earlier one. In WAL mode SQLite then
        # skips the sync that only orders a restarted WAL's header before its frames. Not
        # claimed for rollback journals: there it also changes how the pager syncs its
        # journal, which was not analysed.
        self.device_flags = apsw.SQLITE_IOCAP_SEQUENTIAL if vfs.sequential else 0
        self._fd = os.open(filename, os.O_RDONLY)
        size = self._size()
        if not self._pages.has_base and size > 0:
            # A database which was never recorded: its current content is the first base.
            self._pages.compact(size, self._read)

    def _read(self, offset: int, n: int) -> bytes:
        return os.pread(self._fd, n, offset)

    def _size(self) -> int:
        return os.fstat(self._fd).st_size

    def write(self, offset: int, data: bytes) -> None:
        self._pages.write(offset, data)

    def note_backfill(self) -> None:
        """Called instead of `write` for the writes of the store's checkpoint (the VFS skips
        them in C while `backfilling`), once a checkpoint and after each sync."""
        self._pages.note_backfill()

    def truncate(self, size: int) -> None:
        if self._vfs.backfilling:
            self._pages.note_backfill()
        else:
            self._pages.truncate(size)

    def sync(self, flags: int) -> None:
        if self._bridge.discarded:
            return  # The store is being dropped: no compaction for a log nobody records to.
        try:
            compacted = self._pages.synced(self._size(), self._read)
            if self._vfs.backfilling and not compacted:
                return  # Nothing was recorded: the WAL's commits were synced already.
            self._bridge.sync(self._vfs.sync_waits)  # Deferred while checkpointing.
        except RecordingFailed as err:
            raise apsw.IOError(str(err)) from err

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class LogFile:
    """A rollback journal's, super-journal's or WAL's hook: recorded as a file, a new Fnode
    per reset."""

    buffered = True
    main = False
    device_flags = 0

    def __init__(self, vfs: RecordingVFS, filename: str, rel: str, *, wal: bool) -> None:
        self._vfs = vfs
        self._bridge = vfs.bridge
        self._filename = filename
        self._rel = rel
        self._wal = wal
        self._pages = vfs.wal_page_store(rel) if wal else None
        size = os.stat(filename).st_size
        self._size = size
        if rel not in vfs.recorded:
            vfs.recorded.add(rel)
            self._bridge.create(rel)
            if size:  # A file left unrecorded (not by this VFS): record its content.
                self._bridge.write(rel, 0, _read(filename, 0, size))

    @property
    def _size(self) -> int:
        """The recorded size, which may lag the local one after a reset (a WAL's is also
        its page store's `wal_size`)."""
        return self._recorded_size

    @_size.setter
    def _size(self, size: int) -> None:
        self._recorded_size = size
        if self._pages is not None:
            self._pages.wal_size = size

    def _is_reset(self, data: bytes) -> bool:
        if self._wal:
            return True  # SQLite writes a WAL's header only when it (re)starts the WAL.
        return data.count(0) == len(data)  # PERSIST mode's zeroed journal header.

    def write(self, offset: int, data: bytes) -> None:
        """`data` was written at `offset`: one write of SQLite's at offset 0, else the
        contiguous writes gathered since."""
        size = self._recorded_size
        if offset == 0 and size > 0 and self._is_reset(data):
            self._reset()
            size = 0
        self._bridge.write(self._rel, offset, data)
        end = offset + len(data)
        if end > size:  # (Not for a rewrite within the recorded size.)
            self._size = end

    def truncate(self, newsize: int) -> None:
        if newsize >= self._size:
            if newsize > self._size and not self._wal:
                self._bridge.write(self._rel, self._size, bytes(newsize - self._size))
                self._size = newsize
            # A WAL's bytes past its recorded size hold no frame SQLite will read (stale
            # frames of a WAL started over in place, cut by `journal_size_limit`): nothing
            # to record, and the played WAL may be shorter than the local one.
            return
        if newsize == 0:
            self._reset()
        else:
            # The log cannot shrink a file: record a new Fnode holding the kept prefix.
            self._bridge.truncate(self._rel)
            self._bridge.write(self._rel, 0, _read(self._filename, 0, newsize))
        self._size = newsize

    def _reset(self) -> None:
        """SQLite starts the file over: record a new Fnode at its path. The old one dies,
        unless it is a WAL the page store keeps (renamed to a WAL generation)."""
        if self._pages is not None and self._pages.keep_wal(self._rel, self._size):
            self._bridge.create(self._rel)
        else:
            self._bridge.truncate(self._rel)
        self._size = 0

    def sync(self, flags: int) -> None:
        try:
            self._bridge.sync(self._vfs.sync_waits)  # Deferred while checkpointing.
        except RecordingFailed as err:
            raise apsw.IOError(str(err)) from err

    def close(self) -> None:
        pass
