"""Session-wide real components: an etcd server on loopback.

`hypothesis` is imported here, at collection: otherwise its pytest plugin imports it only at
the terminal summary, and on CPython 3.11.7 that import's ``ast.parse`` (pytest's assertion
rewriting) failed with "SystemError: AST constructor recursion depth mismatch" after some
runs of the RocksDB store tests (a commit failing through its ``wait_for``), turning a passing
run of a subset into an INTERNALERROR."""

from __future__ import annotations

import os
from collections.abc import Iterator

import hypothesis  # noqa: F401 - imported first, see below
import pytest

from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        yield server


def session_broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[BrokerProcess]:
    """A real broker for one test package, under its own etcd root (so listings of different
    packages never see each other's journals). Use from a session-scoped fixture."""
    proc = BrokerProcess(
        etcd_server.endpoint,
        root=f"/test-{name}/{os.getpid()}",
        spool_dir=tmp_path_factory.mktemp(f"{name}-spool"),
    )
    with proc:
        yield proc
