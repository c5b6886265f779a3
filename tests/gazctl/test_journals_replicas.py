"""``gazctl journals list --primary --replicas`` against a real cluster of three brokers.

The shown primary and replicas must be the journal's route as the brokers advertise it, from
whichever broker gazctl asks, and must follow the route when the primary dies.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.gazctl.journals import _journal_json, _replicas
from gazette.gazctl.main import Streams, run
from gazette.testing.broker import BrokerProcess
from gazette.testing.cluster import BrokerCluster
from gazette.testing.etcd import EtcdServer
from tests.kit.eventually import eventually_blocking

from .conftest import Result

_names = itertools.count()
ZONES = ["zone-a", "zone-b", "zone-a"]


def _route(primary: int, *members: str) -> pb.Route:
    ids = [pb.ProcessSpec.ID(zone=m.split("#")[0], suffix=m.split("#")[1]) for m in members]
    endpoints = [f"http://127.0.0.1:{8080 + i}" for i in range(len(members))]
    return pb.Route(members=ids, primary=primary, endpoints=endpoints)


@pytest.mark.parametrize(
    ("route", "replicas", "json_primary"),
    [
        (None, "<none>", -1),
        (pb.Route(primary=-1), "<none>", -1),
        (_route(0, "a#b0"), "a#b0*", 0),
        (_route(0, "a#b0", "b#b1", "a#b2"), "a#b0*,b#b1,a#b2", 0),
        (_route(2, "a#b0", "b#b1", "a#b2"), "a#b0,b#b1,a#b2*", 2),
        (_route(-1, "a#b0", "b#b1"), "a#b0,b#b1", -1),  # assigned, no primary yet
    ],
)
def test_route_rendering(route: pb.Route | None, replicas: str, json_primary: int) -> None:
    j = pb.ListResponse.Journal(spec=pb.JournalSpec(name="a/j"))
    if route is not None:
        j.route.CopyFrom(route)
    assert _replicas(j) == replicas
    doc = _journal_json(j)
    # The route is always spelled out, primary 0 included (proto3 JSON would drop it).
    assert doc["route"]["primary"] == json_primary
    assert len(doc["route"]["members"]) == len(doc["route"]["endpoints"]) == len(j.route.members)


@pytest.fixture(scope="module")
def brokers(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[BrokerProcess]]:
    with BrokerCluster(
        etcd_server.endpoint,
        root=f"/test-gazctl-replicas/{os.getpid()}",
        spool_root=tmp_path_factory.mktemp("gazctl-replicas"),
        zones=ZONES,
    ) as cluster:
        yield cluster.brokers


def gazctl(broker: BrokerProcess, *argv: str, stdin: bytes = b"") -> Result:
    streams = Streams(stdin=io.BytesIO(stdin), stdout=io.BytesIO(), stderr=io.StringIO())
    rc = run([*argv, "--broker", broker.endpoint], streams)
    assert isinstance(streams.stdout, io.BytesIO) and isinstance(streams.stderr, io.StringIO)
    return Result(rc, streams.stdout.getvalue(), streams.stderr.getvalue())


def apply(broker: BrokerProcess, prefix: str, store: Path) -> None:
    store.mkdir(parents=True, exist_ok=True)
    specs = textwrap.dedent(
        f"""\
        name: {prefix}
        fragment:
          length: 65536
          compression_codec: NONE
          stores: ["file://{store}/"]
          refresh_interval: 10s
        children:
          - name: {prefix}r2
            replication: 2
          - name: {prefix}r3
            replication: 3
        """
    )
    r = gazctl(broker, "journals", "apply", stdin=specs.encode())
    assert r.rc == 0, r.err


def listed(broker: BrokerProcess, prefix: str) -> dict[str, dict[str, Any]]:
    r = gazctl(broker, "journals", "list", "-l", f"name:prefix={prefix}", "-o", "json")
    assert r.rc == 0, r.err
    return {j["spec"]["name"]: j for j in json.loads(r.text)}


def wait_routes(
    broker: BrokerProcess,
    prefix: str,
    sizes: dict[str, int],
    *,
    without: str = "",
    timeout: float = 30.0,
) -> dict[str, dict[str, Any]]:
    """Wait for each journal's route to have its size and a primary (and not name `without`)."""

    def converged() -> dict[str, dict[str, Any]]:
        journals = listed(broker, prefix)
        assert all(
            len(journals[name]["route"]["members"]) == size
            and journals[name]["route"]["primary"] >= 0
            and all(m["suffix"] != without for m in journals[name]["route"]["members"])
            for name, size in sizes.items()
        ), f"routes did not converge: {journals}"
        return journals

    return eventually_blocking(converged, what="the routes", timeout=timeout, interval=0.1)


def expected_columns(route: dict[str, Any]) -> tuple[str, str, str]:
    """PRIMARY, ENDPOINT and REPLICAS as gazctl should show `route` (from the JSON listing)."""
    members, p = route["members"], route["primary"]
    primary = f"{members[p]['zone']}/{members[p]['suffix']}"
    replicas = ",".join(
        f"{m['zone']}#{m['suffix']}" + ("*" if i == p else "") for i, m in enumerate(members)
    )
    return primary, route["endpoints"][p], replicas


def table_rows(broker: BrokerProcess, prefix: str, *flags: str) -> list[list[str]]:
    r = gazctl(broker, "journals", "list", "-l", f"name:prefix={prefix}", *flags)
    assert r.rc == 0, r.err
    return [line.split() for line in r.text.splitlines()]


@pytest.fixture
def prefix() -> str:
    return f"gz/replicas{next(_names)}/"


def test_list_shows_primary_and_replicas_of_the_route(
    brokers: list[BrokerProcess], prefix: str, tmp_path: Path
) -> None:
    apply(brokers[0], prefix, tmp_path / "store")
    sizes = {f"{prefix}r2": 2, f"{prefix}r3": 3}
    journals = wait_routes(brokers[0], prefix, sizes)
    for name, size in sizes.items():
        route = journals[name]["route"]
        assert len(route["endpoints"]) == size
        assert {b.endpoint for b in brokers} >= {
            ep.removeprefix("http://") for ep in route["endpoints"]
        }
    # The r3 journal spans both zones.
    assert {m["zone"] for m in journals[f"{prefix}r3"]["route"]["members"]} == set(ZONES)

    # Every broker shows the same route.
    for b in brokers:
        rows = table_rows(b, prefix, "--primary", "--replicas")
        assert rows[0] == ["NAME", "LABELS", "PRIMARY", "ENDPOINT", "REPLICAS"]
        assert [row[0] for row in rows[1:]] == sorted(sizes)
        for row in rows[1:]:
            # No labels: the LABELS cell is empty, so the row has one cell fewer.
            assert row[1:] == list(expected_columns(journals[row[0]]["route"]))
            assert row[-1].count("*") == 1
            assert len(row[-1].split(",")) == sizes[row[0]]

    # --replicas alone, and the short flag.
    rows = table_rows(brokers[1], prefix, "-R")
    assert rows[0] == ["NAME", "LABELS", "REPLICAS"]
    assert [row[1] for row in rows[1:]] == [
        expected_columns(journals[name]["route"])[2] for name in sorted(sizes)
    ]

    # YAML stays an applicable tree; the route rides in each journal's comment.
    out = gazctl(brokers[2], "journals", "list", "-l", f"name:prefix={prefix}", "-o", "yaml", "-R")
    tree = yaml.safe_load(out.text)
    comments = {c["name"]: c["comment"] for c in tree["children"]}
    assert comments == {
        name: f"route: {expected_columns(journals[name]['route'])[2]}" for name in sizes
    }
    reapplied = gazctl(brokers[2], "journals", "apply", "--dry-run", stdin=out.out)
    assert reapplied.rc == 0, reapplied.err
    plain = gazctl(brokers[2], "journals", "list", "-l", f"name:prefix={prefix}", "-o", "yaml")
    assert "comment" not in plain.text


def test_list_follows_a_new_primary(
    brokers: list[BrokerProcess], prefix: str, tmp_path: Path
) -> None:
    apply(brokers[0], prefix, tmp_path / "store")
    name = f"{prefix}r2"
    route = wait_routes(brokers[0], prefix, {name: 2})[name]["route"]
    killed = route["members"][route["primary"]]["suffix"]
    victim = next(b for b in brokers if b.suffix == killed)
    survivor = next(b for b in brokers if b.suffix != killed)
    victim.kill()
    try:
        # After the victim's lease expires, the allocator assigns the two survivors.
        journals = wait_routes(survivor, prefix, {name: 2}, without=killed, timeout=60)
        new_route = journals[name]["route"]
        [row] = [r for r in table_rows(survivor, prefix, "-p", "-R")[1:] if r[0] == name]
        assert row[1:] == list(expected_columns(new_route))
        assert killed not in row[-1]
    finally:
        victim.start()
