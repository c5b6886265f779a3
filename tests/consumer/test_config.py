"""The consumer's configuration as a user meets it: defaults shown by ``--help``, ports beside
a quickstart's brokers, the root said at start, and the cap on hot standbys."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

import pytest

from gazette.broker.client import JournalClient
from gazette.broker.config import parse_args as broker_args
from gazette.consumer.config import DEFAULT_ROOT, ConsumerConfig
from gazette.consumer.config import parse_args as consumer_args
from gazette.consumer.main import ConsumerProcess, ConsumerStartupError
from gazette.consumer.protocol import pb
from gazette.consumer.spec import desired_replication
from tests.consumer.support import Setup, apply_shards, shard_status, until_ready

QUICKSTART_BROKER_PORTS = range(8080, 8083)
"""The README's quickstart runs three brokers on 8080-8082."""


def help_of(parse: object, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit:
        parse(argv)  # type: ignore[operator]
    assert exit.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_consumer_help_shows_the_defaults(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONSUMER_ROOT", raising=False)
    text = help_of(consumer_args, ["--help"], capsys)
    for shown in (
        "give each application its own [CONSUMER_ROOT] (default: /gazette/consumers/app)",
        "[CONSUMER_LISTEN] (default: 127.0.0.1:8090)",
        "[CONSUMER_HTTP_PORT] (default: 8091)",
        "[BROKER_ADDRESS] (default: 127.0.0.1:8080)",
        "most shards assigned to this process (default: 1024)",
        "[CONSUMER_MAX_HOT_STANDBYS] (default: 3)",
        "[LOG_LEVEL] (default: INFO)",
    ):
        assert shown in text


def test_help_shows_the_default_the_environment_sets(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONSUMER_ROOT", "/apps/sums")
    assert "(default: /apps/sums)" in help_of(consumer_args, ["--help"], capsys)


def test_broker_help_shows_the_defaults(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BROKER_LISTEN", raising=False)
    text = help_of(broker_args, ["--help"], capsys)
    for shown in (
        "[BROKER_LISTEN] (default: 127.0.0.1:8080)",
        "[ETCD_PREFIX] (default: /gazette/cluster)",
        "etcd lease TTL in seconds (default: 20)",
        "most journals assigned to this broker (default: 1024)",
        "[LOG_LEVEL] (default: INFO)",
    ):
        assert shown in text
    # A text that states its default itself is not given a second one.
    assert "(default off: replication is durability) (default" not in text


def test_consumer_ports_are_not_the_quickstart_brokers(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CONSUMER_LISTEN", "CONSUMER_HTTP_PORT"):
        monkeypatch.delenv(name, raising=False)
    cfg = consumer_args(["m:A"])
    assert (cfg.listen, cfg.http_port) == ("127.0.0.1:8090", 8091)
    assert int(cfg.listen.rsplit(":", 1)[1]) not in QUICKSTART_BROKER_PORTS
    assert cfg.http_port not in QUICKSTART_BROKER_PORTS


@pytest.mark.parametrize(
    ("root", "said"),
    [
        (DEFAULT_ROOT, f"root={DEFAULT_ROOT}: the default root, which applications left at it"),
        ("/apps/sums", "starting app=m:A root=/apps/sums"),
    ],
)
async def test_the_start_names_the_root(
    caplog: pytest.LogCaptureFixture, root: str, said: str
) -> None:
    # The start fails at once, on its HTTP port in use, after saying where it would run.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = ConsumerConfig(app="m:A", root=root, listen="127.0.0.1:0", http_port=port)
        proc = ConsumerProcess(cfg, object())  # type: ignore[arg-type]
        with caplog.at_level(logging.INFO, logger="consumer"), pytest.raises(ConsumerStartupError):
            await proc.start()
        await proc.close()
    assert said in caplog.text


def test_max_hot_standbys_flag_and_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONSUMER_MAX_HOT_STANDBYS", raising=False)
    assert consumer_args(["m:A"]).max_hot_standbys == 3  # Upstream's default.
    monkeypatch.setenv("CONSUMER_MAX_HOT_STANDBYS", "1")
    assert consumer_args(["m:A"]).max_hot_standbys == 1
    assert consumer_args(["m:A", "--max-hot-standbys", "0"]).max_hot_standbys == 0
    with pytest.raises(SystemExit) as exit:
        consumer_args(["m:A", "--max-hot-standbys", "-1"])
    assert exit.value.code == 2
    assert "--max-hot-standbys must be >= 0, not -1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("hot_standbys", "disable", "cap", "want"),
    [
        (2, False, None, 3),
        (2, False, 3, 3),
        (5, False, 3, 4),  # The cap bounds what the spec asks...
        (1, False, 0, 1),  # ...down to the primary alone.
        (5, True, 3, 0),  # A disabled shard has no replicas, cap or not.
    ],
)
def test_desired_replication_is_capped(
    hot_standbys: int, disable: bool, cap: int | None, want: int
) -> None:
    spec = pb.ShardSpec(id="s", hot_standbys=hot_standbys, disable=disable)
    assert desired_replication(spec, cap) == want


async def test_processes_capped_at_no_standbys_run_a_shard_that_asks_for_one(
    new_setup: Callable[..., Setup], client: JournalClient
) -> None:
    """Two processes, both run with ``--max-hot-standbys 0``, and a shard whose spec asks for
    one hot standby: the allocator gives it its primary alone, and keeps it so."""
    s = new_setup()
    await s.create_journals(client)
    consumers = [s.consumer(i) for i in range(2)]
    for c in consumers:
        c.extra_args += ["--max-hot-standbys", "0"]
        c.start()
    async with s.stubs() as stubs:
        stub = stubs["consumer-0"]
        await apply_shards(stub, s.shard_specs(hot_standbys=1))
        await until_ready(stub, [pb.ReplicaStatus.PRIMARY], "a primary")
        await asyncio.sleep(2)  # Long enough for the allocator to add a standby, were it to.
        assert await shard_status(stub) == {"shard-000": [pb.ReplicaStatus.PRIMARY]}
