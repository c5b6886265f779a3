"""One playback of a RocksDB shard's snapshot shared by the tasks of a host that read it.

The splits of a RocksDB shard are key ranges of one snapshot: the log played from the same
hints through the same offset. Each task playing its own copy multiplies the broker reads, the
disk and the CPU of playback by the number of splits; with `shared_played_shard`, the tasks on
one host that read the same snapshot at the same time play it once and open that one directory
read-only. (RocksDB's read-only mode writes nothing there; rocksdict rewrites its own
``rocksdict-config.json`` on each open, the same bytes each time, which it tolerates being
read half-written.)

A snapshot is named by a digest of the recovery log, the hints and the end offset. In the
user's own ``<tmpdir>/gazette-shard-export-shared-<uid>/`` (`shared_root`), ``<name>/`` holds
the played store and, once it is complete, ``<name>/played.json`` (what `PlayedShard` needs
besides the directory); ``<name>.lock`` is its lock file, locked with ``flock``:

- shared by each task from its first look until it is done reading;
- exclusively to play the snapshot, or to remove it. A task that finds no ``played.json``
  plays only if it can convert its lock to exclusive at once; else (another task looks too,
  or plays) it waits for the shared lock again, after a short random pause, and looks again.
  Waiting for the exclusive lock would deadlock with a task that holds the shared lock and
  waits for this one, and make a late task wait until every reader is done.
- On release, a task that can take the lock exclusively at once was the last reader: it
  removes the directory (renamed away first, at once: a task killed while deleting leaves no
  partly deleted snapshot that looks complete) and the lock file. The next task of that
  snapshot plays it again.
- A snapshot played before the host last booted (``tmpdir`` on a persistent disk) is not
  used: nothing was synced, so its files may be incomplete.

``flock`` converts a lock by dropping it first, so another task may come in between: every
step after a conversion looks again. A lock file is removed only by a holder of its exclusive
lock, and a task checks after each locking that its descriptor is still the file at the
lock's path (else it opens the new one), so two tasks never hold "exclusive" locks on two
files of one name. Directories left by tasks that were killed (their locks end with their
processes), and the remains of interrupted removals, are removed by the next task to acquire
any snapshot on the host, once nobody holds their lock; a partial playback (no
``played.json``) is played over.

A playback that fails leaves ``<name>.failed`` (its time, the boot and the error): every task
that was already looking for that snapshot when it failed fails at once with
`SharedPlaybackFailed`, naming the error, instead of playing it again in turn (with an
unreachable broker, each would wait ``broker_timeout`` once more). A task that comes later
plays again (Spark's task retries, a new query). Failure records older than an hour are
swept.

Rejected: keeping snapshots for a while after their last reader, for the next wave of tasks
or the next query (a played store can be as large as the shard, left on a host for nobody to
remove); one playback per executor process (Spark's Python workers are separate processes).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import random
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from gazette.auth.client_settings import ClientSettings
from gazette.consumer.spark.errors import ExportError, SharedPlaybackFailed
from gazette.consumer.spark.playback import PlayedShard, play, run_playback
from gazette.consumer.spark.resolve import ShardPlan

__all__ = ["shared_played_shard", "shared_root", "snapshot_name"]

log = logging.getLogger(__name__)

_SHARED_DIR = "gazette-shard-export-shared"
_META = "played.json"
_FAILED = ".failed"
_FAILED_KEPT = 3600.0  # Seconds a failure record is kept (`_sweep`).
_TRASH = ".trash-"
_STORE = "store"


def shared_root(tmpdir: str = "") -> Path:
    """The directory of this user's shared snapshots under `tmpdir` (or the system's temporary
    directory), created private to the user if missing. Raises `ExportError` if it exists but
    is not a directory of the user's (another user's, or a link placed there)."""
    uid = os.getuid()
    root = Path(tmpdir or tempfile.gettempdir()).resolve() / f"{_SHARED_DIR}-{uid}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise ExportError(
            f"{root} is not a directory of user {uid}: move it away, or set option tmpdir "
            "(shared playbacks are kept there)"
        )
    return root


def snapshot_name(plan: ShardPlan, end_offset: int) -> str:
    """The name of `plan`'s snapshot through `end_offset` (a hex digest)."""
    h = hashlib.sha256()
    for part in (plan.log.encode(), plan.hints_json, str(end_offset).encode()):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:40]


@contextlib.contextmanager
def shared_played_shard(
    plan: ShardPlan,
    brokers: Sequence[str],
    tmpdir: str = "",
    end_offset: int = 0,
    stall_timeout: float = 0.0,
    *,
    client_settings: ClientSettings | None = None,
) -> Iterator[PlayedShard]:
    """Like `playback.played_shard`, but the snapshot is played once for every task of the
    host that reads it at the same time (see the module docs)."""
    since = time.time()  # A playback that fails from now on fails this task too.
    root = shared_root(tmpdir)
    name = snapshot_name(plan, end_offset)
    _sweep(root, keep=name)
    lock = _LockFile(root / f"{name}.lock")
    try:
        lock.lock(fcntl.LOCK_SH)
        yield _acquire(
            lock, root / name, plan, brokers, end_offset, stall_timeout, since, client_settings
        )
    finally:
        try:
            if lock.fd >= 0:
                lock.lock(fcntl.LOCK_UN)
                if lock.try_exclusive():
                    _remove(root, name)  # The last reader.
        finally:
            lock.close()


class _LockFile:
    """A lock file's descriptor, locked with ``flock``; always the file at `path` once
    locked (a holder of the exclusive lock may remove the file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def lock(self, how: int) -> None:
        """Lock (or convert the lock to) `how`, reopening the file if it was removed or
        replaced meanwhile."""
        while True:
            if self.fd < 0:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self.fd, how)
            if how == fcntl.LOCK_UN or _is_current(self.fd, self.path):
                return
            self.close()

    def try_exclusive(self) -> bool:
        """Whether the exclusive lock was free (now held) and the file is still current."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return _is_current(self.fd, self.path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # Releases its lock.
            self.fd = -1


def _is_current(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _acquire(
    lock: _LockFile,
    directory: Path,
    plan: ShardPlan,
    brokers: Sequence[str],
    end_offset: int,
    stall_timeout: float,
    since: float,
    client_settings: ClientSettings | None = None,
) -> PlayedShard:
    """The snapshot played into `directory`, with `lock` (held shared) held shared on
    return. Raises `SharedPlaybackFailed` if a playback of it failed at or after `since`."""
    failed = directory.parent / f"{directory.name}{_FAILED}"
    while True:
        # Held shared here: the snapshot cannot be removed while we look.
        played = _load(directory, plan)
        if played is not None:
            return played
        failure = _failure(failed, since)
        if failure is not None:
            raise SharedPlaybackFailed(plan.shard, plan.log, failure)
        # Only a task that can take the lock exclusively at once plays: waiting for it would
        # deadlock with a task that holds it shared and waits for us (or make us wait until
        # every reader of the snapshot is done). Converting drops the shared lock first.
        if not lock.try_exclusive():
            time.sleep(random.uniform(0.005, 0.05))  # Another task looks too, or plays.
            lock.lock(fcntl.LOCK_SH)  # Waits while it plays.
            continue
        if _load(directory, plan) is None:
            _remove_directory(directory)  # A killed task's partial playback.
            directory.mkdir()
            try:
                played = run_playback(
                    play(
                        plan,
                        brokers,
                        directory / _STORE,
                        end_offset,
                        stall_timeout,
                        client_settings=client_settings,
                    )
                )
                meta = {"links": played.links, "write_head": played.write_head, "boot": _boot_id()}
                tmp = directory / f"{_META}.tmp"
                tmp.write_text(json.dumps(meta))
                tmp.rename(directory / _META)
            except BaseException as err:
                # Recorded before the lock is released: the tasks waiting for it see it.
                _record_failure(failed, err)
                _remove_directory(directory)
                raise
            log.info(
                "played shared shard=%s log=%s write_head=%d files=%d seconds=%.2f",
                plan.shard,
                plan.log,
                played.write_head,
                len(played.links),
                played.seconds,
            )
        lock.lock(fcntl.LOCK_SH)


def _load(directory: Path, plan: ShardPlan) -> PlayedShard | None:
    """The complete snapshot in `directory`, or None (also if it was played before the host
    last booted: nothing was synced, so its files may be incomplete)."""
    try:
        meta = json.loads((directory / _META).read_text())
    except FileNotFoundError:
        return None
    if meta.get("boot") != _boot_id():
        return None
    links = {str(k): int(v) for k, v in meta["links"].items()}
    return PlayedShard(plan, directory / _STORE, links, int(meta["write_head"]), 0.0)


def _record_failure(path: Path, err: BaseException) -> None:
    """Record in `path` that a playback failed with `err`, now (best effort: a task that
    cannot write it fails alone, and the others play again)."""
    record = {"time": time.time(), "boot": _boot_id(), "error": f"{type(err).__name__}: {err}"}
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_text(json.dumps(record))
        tmp.rename(path)
    except OSError as write_err:
        log.warning("cannot record a failed shared playback in %s: %s", path, write_err)
        with contextlib.suppress(OSError):
            tmp.unlink()


def _failure(path: Path, since: float) -> str | None:
    """The error of a playback recorded as failed in `path` at or after `since` (this boot),
    else None."""
    try:
        record = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    if record.get("boot") != _boot_id() or float(record.get("time", 0.0)) < since:
        return None
    return str(record.get("error", "unknown error"))


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _remove(root: Path, name: str) -> None:
    """Remove snapshot `name` and its lock file (the caller holds the lock exclusively).
    The directory is first renamed away at once: a task killed while deleting its files
    leaves no partly deleted snapshot that looks complete (`_sweep` removes the rest)."""
    _remove_directory(root / name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(root / f"{name}.lock")


def _remove_directory(directory: Path) -> None:
    """Rename `directory` away (at once), then delete it."""
    trash = directory.parent / f"{_TRASH}{directory.name}-{secrets.token_hex(4)}"
    try:
        os.rename(directory, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _sweep(root: Path, keep: str) -> None:
    """Remove the snapshots nobody holds (left by killed tasks), other than `keep`, and the
    remains of removals that were interrupted."""
    for trash in root.glob(f"{_TRASH}*"):
        shutil.rmtree(trash, ignore_errors=True)
    now = time.time()
    for record in root.glob(f"*{_FAILED}*"):
        with contextlib.suppress(OSError):
            if now - record.stat().st_mtime > _FAILED_KEPT:
                record.unlink()
    for path in root.glob("*.lock"):
        name = path.name[: -len(".lock")]
        if name == keep:
            continue
        lock = _LockFile(path)
        try:
            lock.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            if lock.try_exclusive():
                log.info("removing an abandoned shared playback %s", root / name)
                _remove(root, name)
        finally:
            lock.close()
