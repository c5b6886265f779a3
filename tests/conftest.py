"""Session-wide real components: an etcd server on loopback.

`hypothesis` is imported here, at collection: otherwise its pytest plugin imports it only at
the terminal summary, and on CPython 3.11.7 that import's ``ast.parse`` (pytest's assertion
rewriting) failed with "SystemError: AST constructor recursion depth mismatch" after some
runs of the RocksDB store tests (a commit failing through its ``wait_for``), turning a passing
run of a subset into an INTERNALERROR.

gRPC's fork handlers are switched off before anything imports gRPC: the Spark tests' session
starts its JVM through a fork (`subprocess` with `preexec_fn`) of this process, which by then
holds gRPC channels of earlier tests; with the handlers on, a fork while a gRPC thread was
busy left the child's descriptors broken ("epoll_wait error: Bad file descriptor") and the
JVM gateway exited before reporting its port, failing every Spark test of the run."""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from collections.abc import Iterator  # noqa: E402 - after the environment is set

import hypothesis  # noqa: F401,E402 - imported first, see below
import pytest  # noqa: E402

from gazette.testing.broker import BrokerProcess  # noqa: E402
from gazette.testing.certs import Certs, write_certs  # noqa: E402
from gazette.testing.etcd import EtcdServer  # noqa: E402


@pytest.fixture(scope="session")
def etcd_server(gazette_etcd: EtcdServer) -> EtcdServer:
    """The session's etcd: the package's pytest plugin's (gazette.testing.pytest_plugin), so
    tests using the plugin's fixtures and those using ours share one server."""
    return gazette_etcd


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


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """Certificates for TLS tests (gazette.testing.certs): a CA, a server certificate for
    127.0.0.1/localhost, a client certificate, and a wrong CA."""
    return write_certs(tmp_path_factory.mktemp("certs"))
