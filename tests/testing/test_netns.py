"""Hosts as network namespaces (gazette.testing.netns): reachability over the bridge, faults
cutting and restoring real TCP and UDP traffic, teardown (also of a crashed or terminated
run) leaving nothing behind, and, marked `cluster`, etcd, brokers and S3 across hosts
surviving the isolation of one."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import boto3
import grpc
import pytest

from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.testing.netns import Host, Net, cleanup_stale
from gazette.testing.s3 import MotoS3Server
from tests.broker.cluster_support import route, wait_route
from tests.kit.eventually import eventually_blocking
from tests.testing.hosts_support import (
    ECHO_PORT,
    HostBroker,
    etcd_endpoint,
    gazctl,
    listen,
    mount_fuse,
    probe,
    send_udp,
    start_etcd,
    start_s3,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter"),
    reason="network namespaces need root, iproute2 and nsenter",
)


def leftovers(tag: str) -> list[str]:
    """Namespaces, links and mounts named by `tag`, and its work directories."""
    found = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += Path("/proc/self/mountinfo").read_text()
    return [line for line in found.splitlines() if tag in line]


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    with Net(3) as n:
        for h in n.hosts:
            listen(h)
        yield n


@pytest.fixture
def hosts(net: Net) -> Iterator[tuple[Host, Host, Host]]:
    h0, h1, h2 = net.hosts
    yield h0, h1, h2
    net.heal_all()


def received(host: Host) -> str:
    return (host.directory / "udp-received").read_text()


def connect_from_here(host: Host) -> bool:
    try:
        with socket.create_connection((host.address, ECHO_PORT), timeout=1) as c:
            c.settimeout(1)
            c.sendall(b"ping")
            return c.recv(4) == b"ping"
    except OSError:
        return False


def restored(src: Host, dsts: list[Host]) -> None:
    """Wait for `src` to reach all of `dsts` again: after a heal, a first SYN or its answer
    may still be lost to a neighbour entry that failed during the fault, and TCP retries it
    a second later."""
    eventually_blocking(
        lambda: all(probe(src, dsts).values()),
        what=f"{src.name} to reach {[d.name for d in dsts]}",
        timeout=10,
    )


def test_hosts_reach_each_other_and_the_test_process_only(
    hosts: tuple[Host, Host, Host],
) -> None:
    h0, h1, h2 = hosts
    assert probe(h0, [h1, h2]) == {"h1": True, "h2": True}
    assert probe(h2, [h0, h1]) == {"h0": True, "h1": True}
    assert all(connect_from_here(h) for h in hosts)
    for h in hosts:
        routes = h.run(["ip", "route", "show", "table", "all"], check=True).stdout
        assert "default" not in routes, routes
        r = h.run(
            [sys.executable, "-c", "import socket; socket.create_connection(('1.1.1.1', 53))"]
        )
        assert "Network is unreachable" in r.stderr


def test_isolate_cuts_a_host_off_both_ways_and_heal_restores_it(
    net: Net, hosts: tuple[Host, Host, Host]
) -> None:
    h0, h1, h2 = hosts
    net.isolate(h1)
    assert probe(h0, [h1, h2]) == {"h1": False, "h2": True}
    assert probe(h1, [h0, h2]) == {"h0": False, "h2": False}
    assert not connect_from_here(h1)
    net.heal(h1)
    restored(h0, [h1, h2])
    restored(h1, [h0, h2])
    assert connect_from_here(h1)


def test_partition_cuts_between_groups_only(net: Net, hosts: tuple[Host, Host, Host]) -> None:
    h0, h1, h2 = hosts
    net.partition([[h0], [h1, h2]])
    assert probe(h0, [h1, h2]) == {"h1": False, "h2": False}
    assert probe(h1, [h0, h2]) == {"h0": False, "h2": True}
    assert all(connect_from_here(h) for h in hosts)
    net.heal_all()
    restored(h0, [h1, h2])


def test_drop_is_one_direction(net: Net, hosts: tuple[Host, Host, Host]) -> None:
    h0, h1, h2 = hosts
    net.drop(h0, h1)
    send_udp(h0, h1, "dropped")
    send_udp(h1, h0, "delivered")
    send_udp(h2, h1, "unaffected")
    eventually_blocking(lambda: "delivered" in received(h0), what="h1's datagram at h0", timeout=5)
    eventually_blocking(lambda: "unaffected" in received(h1), what="h2's datagram at h1", timeout=5)
    # TCP needs both ways: a connection from either side stalls.
    assert probe(h0, [h1]) == {"h1": False}
    assert probe(h1, [h0, h2]) == {"h0": False, "h2": True}
    assert "dropped" not in received(h1)
    net.heal(h1)
    send_udp(h0, h1, "after heal")
    eventually_blocking(lambda: "after heal" in received(h1), what="h0's datagram at h1")
    restored(h0, [h1])


def test_pause_freezes_and_kill_ends_a_hosts_processes(
    hosts: tuple[Host, Host, Host],
) -> None:
    h0, h1, _ = hosts
    h1.pause()
    try:
        # The kernel still accepts the connection: the frozen echo server never answers.
        assert probe(h0, [h1]) == {"h1": False}
    finally:
        h1.resume()
    restored(h0, [h1])
    pids = h1.pids()
    h1.kill()
    assert h1.pids() == [] and pids
    assert probe(h0, [h1]) == {"h1": False}
    listen(h1)
    restored(h0, [h1])


def test_close_leaves_no_namespace_link_process_mount_or_directory(tmp_path: Path) -> None:
    net = Net(2, directory=tmp_path).start()
    h0, h1 = net.hosts
    sleeper = h0.popen(["sleep", "600"])
    # A process started without popen (as the harnesses of gazette.testing do).
    other = subprocess.Popen(h1.command(["sleep", "600"]), start_new_session=True)
    mount = h1.directory / "mnt"
    mount.mkdir()
    h1.run(["mount", "-t", "tmpfs", "tmpfs", str(mount)], check=True)
    assert len(leftovers(net.tag)) >= 5  # 2 namespaces, a bridge, 2 veths, the mount
    net.close()
    assert leftovers(net.tag) == []
    assert sleeper.poll() is not None
    assert other.wait(timeout=5) == -signal.SIGKILL
    assert not net.directory.exists()
    net.close()  # Idempotent.


def test_close_unmounts_a_fuse_mount_whose_daemon_died_with_its_host(tmp_path: Path) -> None:
    pytest.importorskip("pyfuse3")
    net = Net(1, directory=tmp_path).start()
    mount = net.hosts[0].directory / "store"
    mount_fuse(net.hosts[0], mount)
    assert any(str(mount) in line for line in leftovers(net.tag))
    net.hosts[0].kill()  # The mount stays, answering ENOTCONN.
    net.close()
    assert leftovers(net.tag) == []


_CHILD = textwrap.dedent(
    """\
    import subprocess, sys, time
    from gazette.testing.netns import Net
    net = Net(2).start()
    net.hosts[0].popen(["sleep", "600"])
    mount = net.hosts[1].directory / "mnt"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mount)], check=True)
    print(net.tag, flush=True)
    time.sleep(600)
    """
)


def start_child() -> tuple[subprocess.Popen[str], str]:
    """A process that makes a Net and waits; and the Net's tag."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert child.stdout is not None
    tag = child.stdout.readline().strip()
    assert tag, f"child failed: rc {child.wait()}"
    return child, tag


def test_cleanup_stale_removes_what_a_killed_run_left() -> None:
    child, tag = start_child()
    child.kill()
    child.wait()
    assert len(leftovers(tag)) >= 5
    cleanup_stale()
    assert leftovers(tag) == []


def test_sigterm_tears_a_net_down() -> None:
    child, tag = start_child()
    child.terminate()
    assert child.wait(timeout=30) == -signal.SIGTERM
    assert leftovers(tag) == []


# -- etcd, brokers and S3 across hosts


SPEC = """\
name: cluster/journal
replication: 3
labels: [{{name: app, value: netns}}]
fragment:
  length: 1048576
  compression_codec: NONE
  stores: ["s3://fragments/netns/?endpoint={s3}"]
  refresh_interval: 5s
"""
JOURNAL = "cluster/journal"


def append(broker: HostBroker, line: str) -> None:
    gazctl(
        "journals", "append", "--broker", broker.endpoint, "--journal", JOURNAL,
        "--retry-for", "30", stdin=f"{line}\n".encode(),
    )  # fmt: skip


def read(broker: HostBroker) -> list[str]:
    out = gazctl("journals", "read", "--broker", broker.endpoint, "-l", f"name={JOURNAL}")
    return out.decode().splitlines()


def route_of(broker: HostBroker, members: int) -> list[str]:
    """The suffixes of the journal's route once `broker` lists `members` with a primary,
    primary first."""

    async def wait() -> list[str]:
        async with grpc.aio.insecure_channel(broker.endpoint) as ch:
            r = await wait_route(pb_grpc.JournalStub(ch), JOURNAL, members, timeout=60)
            return [r.members[r.primary].suffix] + [
                m.suffix for i, m in enumerate(r.members) if i != r.primary
            ]

    return asyncio.run(wait())


def listed_route(broker: HostBroker) -> list[str]:
    async def get() -> list[str]:
        async with grpc.aio.insecure_channel(broker.endpoint) as ch:
            r = await route(pb_grpc.JournalStub(ch), JOURNAL)
            return sorted(m.suffix for m in r.members) if r.primary >= 0 else []

    return asyncio.run(get())


@pytest.mark.cluster
def test_brokers_on_hosts_survive_the_isolation_of_one(tmp_path: Path) -> None:
    # Four hosts: with three, a replication-3 journal has no broker to move to when one is
    # cut off, and its appends stop (INSUFFICIENT_JOURNAL_BROKERS). Etcd members on h0-h2,
    # every broker given all three; the S3 server runs on h3.
    with Net(4, directory=tmp_path, keep=True) as net:
        h0, h1, h2, h3 = net.hosts
        start_etcd([h0, h1, h2], token=net.tag)
        s3 = start_s3(h3)
        env = MotoS3Server.env()
        bucket = boto3.client(
            "s3",
            endpoint_url=s3,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_DEFAULT_REGION"],
        )
        bucket.create_bucket(Bucket="fragments")
        etcd = ",".join(etcd_endpoint(h) for h in (h0, h1, h2))
        brokers = {h: HostBroker(h, etcd, root="/netns", env=env) for h in net.hosts}
        for b in brokers.values():
            b.start()

        gazctl("journals", "apply", "--broker", brokers[h0].endpoint, "--specs", "-",
               stdin=SPEC.format(s3=s3).encode())  # fmt: skip
        members = route_of(brokers[h0], 3)
        for i, b in enumerate(brokers.values()):
            append(b, f"before-{i}")
        expected = [f"before-{i}" for i in range(4)]
        for b in brokers.values():
            assert read(b) == expected

        # Isolate a member of the route on an etcd host (h0-h2: not the S3 server's; a
        # route of three of four brokers has at least two there), its primary if it can.
        candidates = [h for h in (h0, h1, h2) if brokers[h].suffix in members]
        victim = next((h for h in candidates if brokers[h].suffix == members[0]), candidates[0])
        net.isolate(victim)
        survivors = [b for h, b in brokers.items() if h is not victim]
        eventually_blocking(
            lambda: (
                brokers[victim].suffix not in listed_route(survivors[0])
                and len(listed_route(survivors[0])) == 3
            ),
            what=f"the journal reassigned away from {victim}",
            timeout=60,
            interval=0.5,
            ignoring=(grpc.RpcError,),
        )
        for i, b in enumerate(survivors):
            append(b, f"isolated-{i}")
        expected += [f"isolated-{i}" for i in range(3)]
        for b in survivors:
            assert read(b) == expected

        net.heal(victim)
        # Its lease ended while it was cut off: it exits once it reaches etcd again, and a
        # supervisor restarts it, as here.
        loser = brokers[victim]
        eventually_blocking(
            lambda: not loser.running, what=f"{loser.suffix} to exit", timeout=60, interval=0.5
        )
        assert "lease was lost" in loser.tail_log()
        loser.start(timeout=60)
        route_of(survivors[0], 3)
        for i, b in enumerate(brokers.values()):
            append(b, f"healed-{i}")
        expected += [f"healed-{i}" for i in range(4)]
        for b in brokers.values():
            eventually_blocking(
                lambda b=b: read(b) == expected,
                what=f"{b.suffix} to read everything",
                timeout=30,
                interval=0.5,
            )
        # Closed fragments (at route changes, and the rest at a graceful stop) are in S3.
        for b in brokers.values():
            b.stop()
        eventually_blocking(
            lambda: bucket.list_objects_v2(Bucket="fragments").get("KeyCount", 0) > 0,
            what="fragments persisted to S3",
            timeout=30,
            interval=1,
        )
