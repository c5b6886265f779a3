"""``gazctl shards`` against real consumer processes (the counter application) and against
addresses that are no consumer: `shards stat`, a FAILED shard's reason in `shards list`,
several ``--consumer`` addresses of which one is down, and a broker given as the consumer.
Also: every option's default in ``--help``."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.protocol import pb
from gazette.gazctl.main import build_parser
from gazette.message import CONTENT_TYPE_JSON_LINES
from gazette.message.publisher import Publisher
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer, free_port
from tests.consumer.counter_app import POISON, Add
from tests.consumer.shard_api_server import ShardAPIServer
from tests.consumer.support import Setup, apply_shards, shard_stubs, until_ready, write_head
from tests.kit.eventually import eventually

from .conftest import Gazctl


@dataclass
class Counter:
    """A counter consumer whose shard-000 summed Adds read from in-0, and whose shard-001
    FAILED on a poison Add."""

    setup: Setup
    endpoint: str
    input_head: int
    """Write head of in-0 after the Adds."""


async def _feed(s: Setup, endpoint: str) -> int:
    async with JournalClient(s.broker.endpoint) as client:
        await s.create_journals(client)
        async with shard_stubs(s.consumers) as stubs:
            stub = stubs["consumer-0"]
            specs = s.shard_specs(hot_standbys=0)
            for spec in specs:
                spec.labels.labels.add(name="app", value=s.prefix)
            await apply_shards(stub, specs)
            await until_ready(stub, [pb.ReplicaStatus.PRIMARY], "shard-000 primary")
            async with AppendService(client) as svc:
                pub = Publisher(svc)
                for i in range(10):
                    pub.publish_committed(
                        lambda _m: (s.inputs[0], CONTENT_TYPE_JSON_LINES), Add(f"k{i % 2}", i)
                    )
                pub.publish_committed(
                    lambda _m: (s.inputs[1], CONTENT_TYPE_JSON_LINES), Add(POISON, 1)
                )
                await pub.barrier()

            async def failed() -> bool:
                resp = await stub.List(pb.ListRequest())
                codes = {sh.spec.id: [st.code for st in sh.status] for sh in resp.shards}
                return codes.get("shard-001") == [pb.ReplicaStatus.FAILED]

            await eventually(failed, what="shard-001 FAILED", timeout=60, interval=0.1)
        return await write_head(client, s.inputs[0])


@pytest.fixture(scope="module")
def counter(
    etcd_server: EtcdServer, gazctl_broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Counter]:
    s = Setup(etcd_server, gazctl_broker, tmp_path_factory.mktemp("counter"), shards=2)
    try:
        (proc,) = s.start(1).values()
        head = asyncio.run(_feed(s, proc.endpoint))
        yield Counter(s, proc.endpoint, head)
    finally:
        s.close()


def test_stat(gazctl: Gazctl, counter: Counter) -> None:
    s = counter.setup
    consumer = ("--consumer", counter.endpoint)
    # Waits until the shard read its input through the offset given, then reports.
    r = gazctl(
        "shards", "stat", "-l", "id=shard-000", *consumer,
        "--read-through", f"{s.inputs[0]}={counter.input_head}", "-o", "json",
    )  # fmt: skip
    assert r.rc == 0, r.err
    (doc,) = json.loads(r.text)
    assert doc["id"] == "shard-000" and doc["status"] == "OK"
    assert doc["primary"] == "z0#consumer-0"
    assert doc["read_through"][s.inputs[0]] >= counter.input_head
    assert doc["publish_at"][s.output] > 0  # Its totals and their ACK were published.

    r = gazctl("shards", "stat", "-l", "id=shard-000", *consumer)
    assert r.rc == 0, r.err
    header, row = r.text.splitlines()
    assert header.split() == ["ID", "STATUS", "PRIMARY", "READ_THROUGH", "PUBLISH_AT"]
    assert row.split()[:3] == ["shard-000", "OK", "z0#consumer-0"]
    assert f"{s.inputs[0]}:{doc['read_through'][s.inputs[0]]}" in row

    # An offset not reached within --timeout; a journal no selected shard reads.
    r = gazctl(
        "shards", "stat", "-l", "id=shard-000", *consumer,
        "--read-through", f"{s.inputs[0]}={counter.input_head + 10**6}", "--timeout", "1",
    )  # fmt: skip
    assert r.rc == 1 and r.err.count("\n") == 1, r.err
    assert "gazctl: error: shard shard-000: no answer within 1s (--timeout)" in r.err
    r = gazctl(
        "shards", "stat", "-l", "id=shard-000", *consumer, "--read-through", f"{s.inputs[1]}=5"
    )
    assert r.rc == 1 and f"no selected shard reads {s.inputs[1]}" in r.err, r.err
    r = gazctl("shards", "stat", "-l", "id=nope", *consumer)
    assert r.rc == 1 and "no shards match selector 'id=nope'" in r.err, r.err


def test_list_shows_why_a_shard_failed(gazctl: Gazctl, counter: Counter) -> None:
    r = gazctl(
        "shards", "list", "-l", f"app={counter.setup.prefix}", "--consumer", counter.endpoint
    )
    assert r.rc == 0, r.err
    header, ok, failed = r.text.splitlines()
    assert header.split() == ["ID", "STATUS", "ROUTE", "ERRORS"]
    assert ok.split() == ["shard-000", "PRIMARY", "z0#consumer-0*:PRIMARY", "-"]
    assert failed.split()[:3] == ["shard-001", "FAILED", "z0#consumer-0*:FAILED"]
    assert (
        f"z0#consumer-0: PoisonMessage: consumed an Add of key {POISON!r} (it fails the shard)"
        in failed
    )


def test_list_passes_over_a_consumer_that_is_down(gazctl: Gazctl, counter: Counter) -> None:
    down = f"127.0.0.1:{free_port()}"
    selector = ("-l", f"app={counter.setup.prefix}")
    r = gazctl("shards", "list", *selector, "--consumer", f"{down},{counter.endpoint}")
    assert r.rc == 0, r.err
    assert [ln.split()[0] for ln in r.text.splitlines()] == ["ID", "shard-000", "shard-001"]
    assert r.err.startswith(f"gazctl: consumer {down} is unavailable (")
    assert r.err.rstrip("\n").endswith(f"; trying {counter.endpoint}")
    # Every call of the command goes to the one that answered (--lag Stats each shard).
    r = gazctl(
        "shards", "list", "-l", "id=shard-000", "--lag", "--consumer",
        f"{down},{counter.endpoint}",
    )  # fmt: skip
    assert r.rc == 0 and r.err.count("\n") == 1, r.err

    other = f"127.0.0.1:{free_port()}"
    r = gazctl("shards", "list", *selector, "--consumer", f"{down},{other}")
    assert r.rc == 1
    assert r.err.splitlines()[-1].startswith(
        f"gazctl: error: no consumer of {down}, {other} is available (the last: "
    ), r.err
    r = gazctl("shards", "list", "--consumer", " , ")
    assert r.rc == 1 and "expected one or more comma-separated addresses" in r.err


def test_a_broker_given_as_the_consumer(
    gazctl: Gazctl, gazctl_broker: BrokerProcess, etcd_server: EtcdServer
) -> None:
    for argv in (("list",), ("unassign", "-l", "app=x"), ("stat", "-l", "app=x")):
        r = gazctl("shards", *argv, "--consumer", gazctl_broker.endpoint)
        assert r.rc == 1 and r.err.count("\n") == 1, r.err
        assert r.err == (
            f"gazctl: error: {gazctl_broker.endpoint} serves no consumer Shard service "
            "(UNIMPLEMENTED: Method not found!); it is a Gazette broker. --consumer (env "
            "CONSUMER_ADDRESS) takes the gRPC address of a gazette-consumer process (its "
            "--listen, default 127.0.0.1:8090)\n"
        )
    # A consumer without a runtime (Stat not served) is a consumer: said as it is.
    spec = pb.ShardSpec(id="shard-s1", max_txn_duration=Duration(seconds=1))
    spec.sources.add(journal="a/journal")
    with ShardAPIServer(etcd_server.endpoint, with_stat=False) as api:
        api.put(api.keys.item("shard-s1"), spec.SerializeToString())
        r = gazctl("shards", "stat", "-l", "id=shard-s1", "--consumer", api.endpoint)
    assert r.rc == 1
    assert "RPC failed (UNIMPLEMENTED): Stat is not served by this process" in r.err, r.err


def _parsers(
    p: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_help_shows_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONSUMER_ADDRESS", raising=False)
    monkeypatch.delenv("BROKER_ADDRESS", raising=False)
    missing = []
    for path, parser in _parsers(build_parser(), "gazctl"):
        text = parser.format_help()
        for action in parser._actions:
            default = action.default
            if not action.option_strings or default in (None, "", False, argparse.SUPPRESS):
                continue
            if default == [] or action.help == argparse.SUPPRESS:
                continue
            helped = parser._get_formatter()._expand_help(action) if action.help else ""
            if "default" not in helped:
                missing.append(f"{path} {action.option_strings[-1]} (default {default!r})")
        assert "usage: " + path in text
    assert missing == []
    shards_list = dict(_parsers(build_parser(), "gazctl"))["gazctl shards list"]
    help_text = " ".join(shards_list.format_help().split())
    # Not 8081: the README quickstart's brokers listen on 8080-8082.
    assert "(env CONSUMER_ADDRESS; default 127.0.0.1:8090)" in help_text


def test_read_committed_output_of_a_consumer(gazctl: Gazctl, counter: Counter) -> None:
    """What a user checking an exactly-once application reads: each key's totals, rising to
    its sum; the raw journal also holds the acknowledgements, as records without a key."""
    s = counter.setup
    r = gazctl(
        "shards", "stat", "-l", "id=shard-000", "--consumer", counter.endpoint,
        "--read-through", f"{s.inputs[0]}={counter.input_head}",
    )  # fmt: skip
    assert r.rc == 0, r.err
    r = gazctl("journals", "read", "-l", f"name={s.output}", "--committed")
    assert r.rc == 0, r.err
    totals = [json.loads(line) for line in r.text.splitlines()]
    final: dict[str, int] = {}
    for t in totals:
        assert t["total"] > final.get(t["key"], -1), totals
        final[t["key"]] = t["total"]
    assert final == {"k0": 0 + 2 + 4 + 6 + 8, "k1": 1 + 3 + 5 + 7 + 9}

    raw = gazctl("journals", "read", "-l", f"name={s.output}")
    assert raw.rc == 0, raw.err
    docs = [json.loads(line) for line in raw.text.splitlines()]
    assert [d for d in docs if d.get("key")] == totals
    assert any(not d.get("key") for d in docs)  # The ACKs.
