"""The pytest plugin's own contract: loading it costs no client import, a test's journals
keep their data to themselves, read_committed sees what a read-committed reader sees, and
flags are spelled as the consumer's command line wants them."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from gazette.broker.client import JournalClient
from gazette.broker.client.list import get_journal
from gazette.message import CONTENT_TYPE_JSON_LINES, JSONMessage
from gazette.testing.pytest_plugin import GazetteCluster, _flag_args

SPECS = f"""\
name: plugin/
replication: 1
fragment:
  length: 1048576
  compression_codec: NONE
  stores: ["file:///tmp/gazette-plugin-shared/"]
  refresh_interval: 1m0s
labels:
  - {{name: content-type, value: {CONTENT_TYPE_JSON_LINES}}}
children:
  - name: plugin/events
"""


@dataclass
class Event(JSONMessage):
    n: int = 0


def test_loading_the_plugin_imports_no_client_code() -> None:
    code = (
        "import sys, gazette.testing.pytest_plugin; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google') "
        "or m.startswith(('gazette.broker', 'gazette.message', 'gazette.consumer'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("flags", "args"),
    [
        ({"hint_interval": 1}, ["--hint-interval", "1"]),
        ({"app.top-n": 5}, ["--app.top-n", "5"]),
        ({"verbose": True, "quiet": False, "root": None}, ["--verbose"]),
    ],
    ids=["value", "app-setting", "booleans"],
)
def test_flags(flags: dict[str, object], args: list[str]) -> None:
    assert _flag_args(flags) == args


async def test_journals_stay_in_the_test_and_read_committed_skips_the_uncommitted(
    gazette: GazetteCluster,
) -> None:
    assert gazette.journals(SPECS) == ["plugin/events"]
    async with JournalClient(gazette.brokers().endpoints) as client:
        spec = await get_journal(client, "plugin/events")
    assert list(spec.fragment.stores) == [
        f"file://{gazette.directory}/fragments/tmp/gazette-plugin-shared/"
    ]

    await gazette.publish("plugin/events", [Event(1), Event(2)])
    await gazette.publish("plugin/events", [Event(3)], committed=False)
    await gazette.publish("plugin/events", [Event(4)])
    got = await gazette.read_committed("plugin/events", Event)
    assert [e.n for e in got] == [1, 2, 4]
    assert [e.n for e in await gazette.read_committed("plugin/events", Event, until=2)] == [1, 2]
    with pytest.raises(AssertionError, match=r"read 3 message\(s\)"):
        await gazette.read_committed("plugin/events", Event, until=4, timeout=1)
