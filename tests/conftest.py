"""Session-wide real components: an etcd server on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.testing.etcd import EtcdServer


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    with EtcdServer() as server:
        yield server
