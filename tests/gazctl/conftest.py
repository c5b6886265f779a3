"""A real broker for gazctl tests, and a helper running gazctl in-process."""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from gazette.gazctl.main import Streams, run
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.conftest import session_broker
from tests.consumer.shard_api_server import ShardAPIServer

_names = itertools.count()


@pytest.fixture(scope="session")
def gazctl_broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    yield from session_broker(etcd_server, tmp_path_factory, "gazctl")


@dataclass
class Result:
    rc: int
    out: bytes
    err: str

    @property
    def text(self) -> str:
        return self.out.decode()


Gazctl = Callable[..., Result]


@pytest.fixture
def gazctl(gazctl_broker: BrokerProcess) -> Gazctl:
    """Run ``gazctl ARGS...`` against the test broker; returns exit status and output."""

    def call(*argv: str, stdin: bytes = b"", broker: str | None = None) -> Result:
        streams = Streams(stdin=io.BytesIO(stdin), stdout=io.BytesIO(), stderr=io.StringIO())
        args = list(argv)
        args += ["--broker", broker or gazctl_broker.endpoint]
        rc = run(args, streams)
        assert isinstance(streams.stdout, io.BytesIO) and isinstance(streams.stderr, io.StringIO)
        return Result(rc, streams.stdout.getvalue(), streams.stderr.getvalue())

    return call


@pytest.fixture
def prefix() -> str:
    """A unique journal name prefix (ending in '/') per test."""
    return f"gz/t{next(_names)}/"


@pytest.fixture
def shard_api(etcd_server: EtcdServer) -> Iterator[ShardAPIServer]:
    """A `consumer.Shard` service over a fresh consumer root of the test etcd."""
    with ShardAPIServer(etcd_server.endpoint) as srv:
        yield srv


@pytest.fixture
def shards(gazctl: Gazctl, shard_api: ShardAPIServer) -> Gazctl:
    """Run ``gazctl shards ARGS...`` against `shard_api` (and the test broker)."""

    def call(*argv: str, stdin: bytes = b"") -> Result:
        return gazctl("shards", *argv, "--consumer", shard_api.endpoint, stdin=stdin)

    return call
