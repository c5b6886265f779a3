"""The consumer's configuration as a user meets it: defaults shown by ``--help`` (the
broker's and ``gazette-dev``'s too), ports beside a quickstart's brokers, the root said at
start, the cap on hot standbys, and an application's own settings (its ``Config``) from
flags, environment and a file."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import aiohttp
import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.broker.config import parse_args as broker_args
from gazette.consumer.config import DEFAULT_ROOT, ConsumerConfig
from gazette.consumer.config import parse_args as consumer_args
from gazette.consumer.main import ConsumerProcess, ConsumerStartupError, load_application
from gazette.consumer.protocol import pb
from gazette.consumer.spec import desired_replication
from gazette.testing.devcluster import main as dev_main
from gazette.testing.pytest_plugin import GazetteCluster
from tests.consumer.settings_app import TunedCounter
from tests.consumer.support import COUNTER, json_journal, recovery_log

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


def test_dev_cluster_help_shows_the_defaults_that_say_something(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = help_of(dev_main, ["--help"], capsys)
    for shown in (
        "brokers to run (default: 1)",
        "consumers of --app to run (default: 1)",
        "etcd root of the application's consumers (default: /gazette/consumers/app)",
        "kept at the stop (default: a new one under the temporary directory)",
    ):
        assert shown in text
    # No default that says nothing: an absent --app, no --dir, repeatables given none, a
    # flag off; and --dir's text, which states its default, is not given a second one.
    for noise in ("(default: )", "(default: None)", "(default: [])", "(default: False)"):
        assert noise not in text
    assert text.count("(default") == 4


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
    gazette: GazetteCluster, tmp_path: Path
) -> None:
    """Two processes, both run with ``--max-hot-standbys 0``, and a shard whose spec asks for
    one hot standby: the allocator gives it its primary alone, and keeps it so."""
    store = tmp_path / "fragments"
    gazette.journals(
        [json_journal("capped/in", store), recovery_log("capped/recovery/shard-000", store)]
    )
    shard = pb.ShardSpec(
        id="shard-000",
        sources=[pb.ShardSpec.Source(journal="capped/in")],
        recovery_log_prefix="capped/recovery",
        hint_prefix="/hints",
        max_txn_duration=Duration(nanos=200_000_000),
        hot_standbys=1,
    )
    gazette.consumer(COUNTER, [shard], max_hot_standbys=0)
    gazette.consumer(COUNTER, max_hot_standbys=0)
    primary = await gazette.wait_primary("shard-000")
    await asyncio.sleep(2)  # Long enough for the allocator to add a standby, were it to.
    assert await gazette.shard_statuses() == {"shard-000": {primary.suffix: "PRIMARY"}}


TUNED = "tests.consumer.settings_app:TunedCounter"


@pytest.fixture
def no_app_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("APP_LABEL", "APP_TOP_N", "APP_RATIO", "APP_VERBOSE", "CONSUMER_APP_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def test_an_application_config_is_filled_and_handed_to_its_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_app_environment: None
) -> None:
    (tmp_path / "app.yaml").write_text("label: from-file\ntop_n: 5\nratio: 0.25\n")
    monkeypatch.setenv("APP_TOP_N", "6")
    argv = [TUNED, "--app-config", str(tmp_path / "app.yaml"), "--app.label", "from-flag"]
    cfg = consumer_args(argv)
    assert cfg.app_config == TunedCounter.Config(label="from-flag", top_n=6, ratio=0.25)
    app = load_application(cfg.app, cfg.app_config)
    assert isinstance(app, TunedCounter) and app.config is cfg.app_config
    # The flags may come before the application too.
    cfg = consumer_args(["--app.label", "first", "--app.verbose", "--etcd", "a:1", TUNED])
    assert (cfg.app_config.label, cfg.app_config.verbose, cfg.etcd) == ("first", True, "a:1")


def test_an_application_config_error_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], no_app_environment: None
) -> None:
    for argv, error in [
        ([TUNED], "required: --app.label (APP_LABEL, or label in the file)"),
        ([TUNED, "--app.label=x", "--app.top-n", "many"], "--app.top-n: 'many' is not an int"),
    ]:
        with pytest.raises(SystemExit) as exit:
            consumer_args(argv)
        assert exit.value.code == 2
        assert error in capsys.readouterr().err


def test_help_lists_the_application_settings(
    capsys: pytest.CaptureFixture[str], no_app_environment: None
) -> None:
    text = help_of(consumer_args, [TUNED, "--help"], capsys)
    assert "application settings (TunedCounter.Config;" in text
    assert "--app.top-n INT [APP_TOP_N] (default: 10)" in text
    assert "--app.token STR a secret [APP_TOKEN] (default: '')" in text
    assert "--app-config FILE YAML or JSON file of the settings, by field name" in text


def test_applications_without_config_are_built_as_before(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert consumer_args(["tests.consumer.counter_app:Counter"]).app_config is None
    # Settings flags are the application's: one without a Config has none.
    with pytest.raises(SystemExit):
        consumer_args(["tests.consumer.counter_app:Counter", "--app.label", "x"])
    assert "unrecognized arguments: --app.label x" in capsys.readouterr().err
    # An instance is used as it is, whatever its class declares.
    tuned = TunedCounter(TunedCounter.Config(label="made"))
    import tests.consumer.settings_app as module

    module.TUNED_INSTANCE = tuned  # type: ignore[attr-defined]
    try:
        assert load_application("tests.consumer.settings_app:TUNED_INSTANCE") is tuned
    finally:
        del module.TUNED_INSTANCE  # type: ignore[attr-defined]
    with pytest.raises(ConsumerStartupError, match="its Config has no default"):
        load_application(TUNED)


async def test_a_consumer_process_hands_its_settings_to_the_application(
    gazette: GazetteCluster, tmp_path: Path
) -> None:
    """``gazette-consumer`` of an application with a Config: a flag, a variable and a file
    each set a field; the application's handler answers the values it was built with, and
    the start logs them (the secret left out)."""
    (tmp_path / "app.yaml").write_text("label: from-file\nkeys: [a, b]\ntoken: hush\n")
    c = gazette.consumer(
        TUNED, env={"APP_RATIO": "0.75"}, app_config=tmp_path / "app.yaml", **{"app.top-n": 4}
    )
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{c.http_endpoint}/settings") as resp:
            assert resp.status == 200
            got = await resp.json()
    assert got == {
        "label": "from-file",
        "top_n": 4,
        "ratio": 0.75,
        "verbose": False,
        "keys": ["a", "b"],
        "spill_dir": "None",
        "token": "hush",
    }
    log = c.process.tail_log(20000)
    assert "application settings TunedCounter.Config(label='from-file', top_n=4" in log
    assert "hush" not in log
