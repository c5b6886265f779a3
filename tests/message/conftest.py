"""A real broker for the message-layer tests, topics of journals on it, and test messages."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gazette.broker.client import JournalClient, apply_journals, list_all_journals
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.selector import parse_label_selector
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.conftest import session_broker
from tests.kit import specs
from tests.message.notes import JSON, Note

__all__ = ["JSON", "Note", "MakeTopic", "Topic"]

_names = itertools.count()


@pytest.fixture(scope="session")
def message_broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    yield from session_broker(etcd_server, tmp_path_factory, "message")


@pytest.fixture
async def client(message_broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(message_broker.endpoint) as c:
        yield c


def topic_spec(name: str, store: str, topic: str, content_type: str) -> pb.JournalSpec:
    labels = {"content-type": content_type, "topic": topic}
    return specs.journal_spec(name, store, length=1 << 24, labels=labels)


@dataclass
class Topic:
    name: str
    selector: pb.LabelSelector
    journals: list[pb.ListResponse.Journal]

    @property
    def names(self) -> list[str]:
        return [j.spec.name for j in self.journals]

    def partitions(self) -> list[pb.ListResponse.Journal]:
        return self.journals


MakeTopic = Callable[..., Awaitable[Topic]]


@pytest.fixture
def make_topic(client: JournalClient, tmp_path: Path) -> MakeTopic:
    """Apply `count` journals labelled ``topic=<unique>`` and return them as listed."""

    async def make(count: int = 1, content_type: str = JSON) -> Topic:
        topic = f"t{next(_names)}-{os.getpid()}"
        (tmp_path / "store").mkdir(exist_ok=True)
        changes = [
            pb.ApplyRequest.Change(
                upsert=topic_spec(
                    f"msg/{topic}/part-{i:03d}", f"file://{tmp_path}/store/", topic, content_type
                )
            )
            for i in range(count)
        ]
        await apply_journals(client, pb.ApplyRequest(changes=changes))
        selector = parse_label_selector(f"topic={topic}")
        journals = await list_all_journals(client, selector)
        assert len(journals) == count
        return Topic(topic, selector, journals)

    return make
