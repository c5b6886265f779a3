"""Spool unit tests: commit, rollback, and recovery of exactly the committed bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.sha1sum import sha1sum_from_digest
from gazette.broker.spool import Spool, recover_spools


def test_commit_rollback_and_fragment(tmp_path: Path) -> None:
    s = Spool.create(tmp_path, "a/journal", 100, pb.GZIP)
    p = s.begin_append()
    p.write(b"hello ")
    p.write(b"world")
    digest = p.commit()
    assert digest == hashlib.sha1(b"hello world").digest()
    assert (s.begin, s.end) == (100, 111)

    p = s.begin_append()
    p.write(b"discarded")
    p.rollback()
    p = s.begin_append()
    p.write(b"!")
    p.commit()
    f = s.fragment()
    assert (f.begin, f.end, f.compression_codec) == (100, 112, pb.GZIP)
    assert f.sum == sha1sum_from_digest(hashlib.sha1(b"hello world!").digest())
    assert s.content_path.read_bytes() == b"hello world!"


def test_recovery_drops_uncommitted_tail(tmp_path: Path) -> None:
    s = Spool.create(tmp_path, "j/one", 0, pb.NONE)
    for chunk in (b"one,", b"two,"):
        p = s.begin_append()
        p.write(chunk)
        p.commit()
    p = s.begin_append()
    p.write(b"torn-append-never-committed")  # the process dies here
    s.close()

    (r,) = recover_spools(tmp_path, "j/one")
    assert (r.begin, r.end) == (0, 8)
    assert r.digest == hashlib.sha1(b"one,two,").digest()
    assert r.files.content.read_bytes() == b"one,two,"


def test_recovery_ignores_torn_commit_record(tmp_path: Path) -> None:
    s = Spool.create(tmp_path, "j/two", 16, pb.NONE)
    p = s.begin_append()
    p.write(b"abc")
    p.commit()
    p = s.begin_append()
    p.write(b"def")
    p.commit()
    s.close()
    with open(s.files.commits, "r+b") as f:  # a crash mid-write of the last record
        f.truncate(8 + 3)
    (r,) = recover_spools(tmp_path, "j/two")
    assert (r.begin, r.end) == (16, 19)


def test_empty_spools_are_removed(tmp_path: Path) -> None:
    s = Spool.create(tmp_path, "j/three", 0, pb.NONE)
    s.close()
    assert recover_spools(tmp_path, "j/three") == []
    assert not list(tmp_path.glob("*.spool"))
