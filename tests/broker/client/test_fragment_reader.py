"""Fetching a fragment directly from its store: verified content, and the progress counter
the Spark sources' stall watchdog reads while a large fragment downloads."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

from gazette.broker.client.fragment_reader import fetch_verified_fragment
from gazette.broker.client.metrics import CLIENT
from gazette.broker.fragment.store import FragmentCorrupted
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.sha1sum import sha1sum_from_digest


def _fragment(tmp_path: Path, content: bytes, stored: bytes) -> tuple[pb.Fragment, str]:
    path = tmp_path / "fragment.gz"
    path.write_bytes(stored)
    fragment = pb.Fragment(
        journal="a/b",
        begin=100,
        end=100 + len(content),
        sum=sha1sum_from_digest(hashlib.sha1(content).digest()),
        compression_codec=pb.GZIP,
    )
    return fragment, f"file://{path}"


def test_fetched_bytes_count_the_download_as_it_comes(tmp_path: Path) -> None:
    content = b"".join(b"line %06d\n" % i for i in range(50_000))  # 550 kB
    fragment, url = _fragment(tmp_path, content, gzip.compress(content))
    before = CLIENT.fetched_bytes
    verified = fetch_verified_fragment(fragment, url, 150)
    try:
        assert CLIENT.fetched_bytes - before == len(content)
        assert verified.read(10) == content[50:60]
    finally:
        verified.close()


def test_a_corrupt_fragment_is_refused(tmp_path: Path) -> None:
    content = b"x" * 1000
    fragment, url = _fragment(tmp_path, content, gzip.compress(b"y" * 1000))
    with pytest.raises(FragmentCorrupted):
        fetch_verified_fragment(fragment, url, 100)
