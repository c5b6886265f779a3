"""Spool: the local file holding the fragment a journal is currently appending to.

Content is written uncompressed at its journal offset relative to the spool's `begin`.
An append writes past the committed end and becomes visible only on `commit()`; a
rollback truncates back. Each commit appends the new end offset (8 bytes, little-endian)
to a sidecar commit log, so that after a crash of the broker process the recovered spool
holds exactly its committed bytes and never the partial tail of an interrupted append.

Spool files are not fsynced by default: like upstream Gazette (and Kafka), durability against
machine loss comes from replication; the commit log protects against process crashes. Pass
`sync=True` to fdatasync content and commit log on every commit.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from gazette.broker.metrics import COUNTERS
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.sha1sum import sha1sum_from_digest

log = logging.getLogger(__name__)

_COMMIT = struct.Struct("<q")
SPOOL_SUFFIX = ".spool"
COMMITS_SUFFIX = ".commits"


class SpoolError(Exception):
    """A spool file could not be written or recovered."""


class SpoolDiskFull(SpoolError):
    """The spool's disk is full (ENOSPC, EDQUOT): the broker frees space where it can."""


def _spool_error(message: str, err: OSError) -> SpoolError:
    full = err.errno in (errno.ENOSPC, errno.EDQUOT)
    return (SpoolDiskFull if full else SpoolError)(f"{message}: {err}")


def spool_dir_for(root: Path, journal: str) -> Path:
    """Directory holding the spools of `journal` (journal names are clean relative paths)."""
    return root / "journals" / journal


@dataclass
class SpoolFiles:
    content: Path
    commits: Path


def _files(directory: Path, begin: int) -> SpoolFiles:
    stem = f"{begin:016x}"
    return SpoolFiles(directory / (stem + SPOOL_SUFFIX), directory / (stem + COMMITS_SUFFIX))


class Spool:
    """The open spool of one journal. Not thread-safe: one appender at a time (the journal lock)."""

    def __init__(
        self,
        journal: str,
        begin: int,
        codec: pb.CompressionCodec.ValueType,
        files: SpoolFiles,
        *,
        end: int | None = None,
        sha1: hashlib._Hash | None = None,
        sync: bool = False,
    ) -> None:
        self.journal = journal
        self.begin = begin
        self.end = begin if end is None else end
        self.codec = codec
        self.files = files
        self.sync = sync
        self._sha1 = sha1 or hashlib.sha1()
        self.first_append_time: float | None = None
        self._fd = os.open(files.content, os.O_RDWR | os.O_CREAT, 0o600)
        self._commits_fd = os.open(files.commits, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    @classmethod
    def create(
        cls,
        directory: Path,
        journal: str,
        begin: int,
        codec: pb.CompressionCodec.ValueType,
        *,
        sync: bool = False,
    ) -> Spool:
        directory.mkdir(parents=True, exist_ok=True)
        files = _files(directory, begin)
        for p in (files.content, files.commits):
            if p.exists():
                p.unlink()
        return cls(journal, begin, codec, files, sync=sync)

    @property
    def content_path(self) -> Path:
        return self.files.content

    def __len__(self) -> int:
        return self.end - self.begin

    def fragment(self) -> pb.Fragment:
        """The committed content of the spool as a (local, unpersisted) Fragment."""
        return pb.Fragment(
            journal=self.journal,
            begin=self.begin,
            end=self.end,
            sum=sha1sum_from_digest(self._sha1.digest()) if self.end > self.begin else None,
            compression_codec=self.codec,
        )

    def begin_append(self) -> PendingAppend:
        return PendingAppend(self)

    def close(self) -> None:
        """Close file descriptors; the files stay for the persister (or recovery)."""
        for fd in (self._fd, self._commits_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fd = self._commits_fd = -1

    def remove(self) -> None:
        """Close and delete the spool's files (after it is persisted or found empty)."""
        self.close()
        remove_files(self.files)

    # Called by PendingAppend.
    def _commit(self, new_end: int, sha1: hashlib._Hash) -> None:
        if self.sync:
            os.fdatasync(self._fd)
        os.write(self._commits_fd, _COMMIT.pack(new_end))
        if self.sync:
            os.fdatasync(self._commits_fd)
        if self.first_append_time is None:
            self.first_append_time = time.time()
        self.end = new_end
        self._sha1 = sha1


def remove_files(files: SpoolFiles) -> None:
    for p in (files.content, files.commits):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


class PendingAppend:
    """Content of one append, written past the spool's committed end until commit/rollback."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self.begin = spool.end
        self.end = spool.end
        self._spool_sha1 = spool._sha1.copy()
        self._append_sha1 = hashlib.sha1()

    def write(self, data: bytes | memoryview) -> None:
        if not data:
            return
        view = memoryview(data)
        pos = self.end - self.spool.begin
        try:
            while view:
                n = os.pwrite(self.spool._fd, view, pos)
                view = view[n:]
                pos += n
        except OSError as err:
            # A write cut short (e.g. by ENOSPC) leaves bytes past `end` that a later rollback
            # would not know of: drop them now.
            with contextlib.suppress(OSError):
                os.ftruncate(self.spool._fd, self.end - self.spool.begin)
            raise _spool_error(
                f"writing spool {self.spool.files.content} of journal {self.spool.journal} "
                f"at offset {self.end}",
                err,
            ) from err
        self._spool_sha1.update(data)
        self._append_sha1.update(data)
        self.end += len(data)

    def __len__(self) -> int:
        return self.end - self.begin

    def proposal(self) -> pb.Fragment:
        """The spool's fragment as it will be once this append commits: what a primary
        proposes to its peers, and what a peer compares a proposal against."""
        s = self.spool
        return pb.Fragment(
            journal=s.journal,
            begin=s.begin,
            end=self.end,
            sum=sha1sum_from_digest(self._spool_sha1.digest()) if self.end > s.begin else None,
            compression_codec=s.codec,
        )

    def commit(self) -> bytes:
        """Make the append visible. Returns the SHA1 digest of the appended bytes."""
        try:
            self.spool._commit(self.end, self._spool_sha1)
        except OSError as err:
            self.rollback()
            raise _spool_error(f"committing spool of journal {self.spool.journal}", err) from err
        COUNTERS.spool_commits += 1
        COUNTERS.spool_commit_bytes += self.end - self.begin
        return self._append_sha1.digest()

    def rollback(self) -> None:
        """Discard the append's bytes."""
        if self.end != self.begin:
            COUNTERS.spool_rollbacks += 1
            COUNTERS.spool_rollback_bytes += self.end - self.begin
            try:
                os.ftruncate(self.spool._fd, self.begin - self.spool.begin)
            except OSError as err:
                log.error(
                    "spool rollback truncate failed journal=%s err=%s", self.spool.journal, err
                )
        self.end = self.begin


@dataclass
class RecoveredSpool:
    """A spool found on disk at startup: its committed content [begin, end) and digest."""

    journal: str
    begin: int
    end: int
    digest: bytes
    files: SpoolFiles

    def fragment(self, codec: pb.CompressionCodec.ValueType) -> pb.Fragment:
        return pb.Fragment(
            journal=self.journal,
            begin=self.begin,
            end=self.end,
            sum=sha1sum_from_digest(self.digest),
            compression_codec=codec,
        )


def recover_spools(directory: Path, journal: str) -> list[RecoveredSpool]:
    """Recover every spool of `journal` left in `directory`, in offset order.

    The committed end is the last complete record of the commit log (bounded by the content
    length). The uncommitted tail is truncated away. Empty spools are deleted.
    """
    found: list[RecoveredSpool] = []
    if not directory.is_dir():
        return found
    for path in sorted(directory.glob("*" + SPOOL_SUFFIX)):
        try:
            begin = int(path.name[: -len(SPOOL_SUFFIX)], 16)
        except ValueError:
            log.warning("ignoring unrecognised spool file %s", path)
            continue
        files = _files(directory, begin)
        end = begin
        try:
            raw = files.commits.read_bytes()
        except FileNotFoundError:
            raw = b""
        usable = len(raw) - len(raw) % _COMMIT.size
        if usable:
            (end,) = _COMMIT.unpack_from(raw, usable - _COMMIT.size)
        size = path.stat().st_size
        if end - begin > size:
            log.error(
                "spool %s is shorter (%d bytes) than its commit log says (%d); keeping the prefix",
                path,
                size,
                end - begin,
            )
            end = begin + size
        if end <= begin:
            remove_files(files)
            continue
        with open(path, "r+b") as f:
            f.truncate(end - begin)
            h = hashlib.sha1()
            while chunk := f.read(1 << 20):
                h.update(chunk)
        found.append(RecoveredSpool(journal, begin, end, h.digest(), files))
    return found
