"""Servers on the hosts of a `gazette.testing.netns.Net`: etcd members, brokers and a moto S3
server, each on its host's address and a fixed port (every host has all ports to itself);
`probe` and `listen`, real sockets to test what the Net lets through; `gazctl` from here."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from gazette.testing.broker import BrokerProcess
from gazette.testing.netns import Host

ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
BROKER_PORT = 8080
S3_PORT = 5000
ECHO_PORT = 9000
UDP_PORT = 9001


def etcd_endpoint(host: Host) -> str:
    return f"http://{host.address}:{ETCD_CLIENT_PORT}"


def etcd_member_command(host: Host, members: Sequence[Host], token: str) -> list[str]:
    """The command line of `host`'s member of a new etcd cluster of `members`."""
    cluster = ",".join(f"{m.name}=http://{m.address}:{ETCD_PEER_PORT}" for m in members)
    return [
        "etcd",
        f"--name={host.name}",
        f"--data-dir={host.directory / 'etcd'}",
        f"--listen-client-urls={etcd_endpoint(host)}",
        f"--advertise-client-urls={etcd_endpoint(host)}",
        f"--listen-peer-urls=http://{host.address}:{ETCD_PEER_PORT}",
        f"--initial-advertise-peer-urls=http://{host.address}:{ETCD_PEER_PORT}",
        f"--initial-cluster={cluster}",
        "--initial-cluster-state=new",
        # A member cut off and healed must not depose the leader with the terms it raised
        # campaigning alone (etcd 3.4's default): the cluster would be leaderless for an
        # election, and brokers on other hosts see their lease keep-alives fail.
        "--pre-vote",
        f"--initial-cluster-token={token}",
        "--log-level=warn",
        "--logger=zap",
    ]


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as err:
        return bytes(err.read())
    except OSError:
        return None


def start_etcd(members: Sequence[Host], token: str, timeout: float = 30.0) -> None:
    """Start an etcd member on each of `members` and wait until every one is healthy (has a
    leader), asked from the test process."""
    procs = [
        m.popen(etcd_member_command(m, members, token), log=m.directory / "etcd.log")
        for m in members
    ]
    deadline = time.monotonic() + timeout
    for m, proc in zip(members, procs, strict=True):
        while b'"health":"true"' not in (_get(f"{etcd_endpoint(m)}/health") or b""):
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (m.directory / "etcd.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"etcd member on {m} not healthy:\n{log}")
            time.sleep(0.1)


def start_s3(host: Host, timeout: float = 30.0) -> str:
    """Start a moto S3 server on `host`; returns its endpoint URL once it answers."""
    proc = host.popen(
        [sys.executable, "-m", "moto.server", "-H", host.address, "-p", str(S3_PORT)],
        log=host.directory / "moto.log",
    )
    endpoint = f"http://{host.address}:{S3_PORT}"
    deadline = time.monotonic() + timeout
    while _get(f"{endpoint}/moto-api/") is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"moto on {host} did not answer")
        time.sleep(0.1)
    return endpoint


class HostBroker(BrokerProcess):
    """A broker on `host`, listening on (and advertising) the host's address."""

    def __init__(self, host: Host, etcd: str, *, root: str, env: dict[str, str]) -> None:
        self.host = host
        super().__init__(
            etcd,
            root=root,
            zone=f"zone-{host.name}",
            suffix=f"broker-{host.name}",
            spool_dir=host.directory / "broker",
            port=BROKER_PORT,
            extra_env=env,
            extra_args=["--drain-timeout", "0"],
        )

    @property
    def endpoint(self) -> str:
        return f"{self.host.address}:{self.port}"

    def command(self) -> list[str]:
        return self.host.command(super().command())


def gazctl(*argv: str, stdin: bytes = b"", timeout: float = 90.0) -> bytes:
    """Run the gazctl command line here (the root namespace); its stdout, or raise with its
    stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "gazette.gazctl.main", *argv],
        input=stdin,
        capture_output=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"gazctl {' '.join(argv)}: rc {proc.returncode}:\n{proc.stderr!r}")
    return proc.stdout


# -- real sockets


_LISTENER = textwrap.dedent(
    """\
    import socket, sys, threading
    addr, received = sys.argv[1], sys.argv[4]
    tcp_port, udp_port = int(sys.argv[2]), int(sys.argv[3])
    def echo(conn):
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)
    def tcp():
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, tcp_port))
        s.listen()
        while True:
            threading.Thread(target=echo, args=(s.accept()[0],), daemon=True).start()
    threading.Thread(target=tcp, daemon=True).start()
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((addr, udp_port))
    print("listening", flush=True)
    with open(received, "a") as out:
        while True:
            data, src = u.recvfrom(4096)
            out.write(f"{src[0]} {data.decode()}\\n")
            out.flush()
    """
)

_PROBE = textwrap.dedent(
    """\
    import json, socket, sys, threading
    port, timeout, targets = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
    result = {}
    def probe(addr):
        try:
            with socket.create_connection((addr, port), timeout=timeout) as c:
                c.settimeout(timeout)
                c.sendall(b"ping")
                result[addr] = c.recv(4) == b"ping"
        except OSError:
            result[addr] = False
    threads = [threading.Thread(target=probe, args=(a,)) for a in targets]
    for t in threads: t.start()
    for t in threads: t.join()
    print(json.dumps(result))
    """
)


_FUSE = textwrap.dedent(
    """\
    import sys, pyfuse3, trio
    # An empty file system: a mount and a daemon serving it are all the teardown cares about.
    pyfuse3.init(pyfuse3.Operations(), sys.argv[1], ["fsname=gzn-test"])
    print("mounted", flush=True)
    trio.run(pyfuse3.main)
    """
)


def mount_fuse(host: Host, mountpoint: Path) -> None:
    """Mount an empty FUSE file system at `mountpoint`, served by a daemon on `host`."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    log = host.directory / "fuse.log"
    proc = host.popen([sys.executable, "-c", _FUSE, str(mountpoint)], log=log)
    deadline = time.monotonic() + 10
    while b"mounted" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"FUSE mount on {host} failed: {log.read_text(errors='replace')}")
        time.sleep(0.02)


def listen(host: Host) -> Path:
    """Start a TCP echo server (ECHO_PORT) and a UDP receiver (UDP_PORT) on `host`; returns
    the file where the receiver writes ``<source address> <payload>`` per datagram."""
    received = host.directory / "udp-received"
    received.touch()
    log = host.directory / "listener.log"
    host.popen(
        [sys.executable, "-c", _LISTENER, host.address, str(ECHO_PORT), str(UDP_PORT),
         str(received)],
        log=log,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while b"listening" not in log.read_bytes():
        if time.monotonic() > deadline:
            raise RuntimeError(f"listener on {host} did not start")
        time.sleep(0.02)
    return received


def probe(src: Host, dsts: Sequence[Host], timeout: float = 1.0) -> dict[str, bool]:
    """Whether a TCP connection from `src` to each of `dsts` (by name) echoes a ping, probed
    concurrently, each given `timeout` seconds."""
    r = src.run(
        [sys.executable, "-c", _PROBE, str(ECHO_PORT), str(timeout),
         *(d.address for d in dsts)],
        check=True,
    )  # fmt: skip
    by_addr = json.loads(r.stdout)
    return {d.name: bool(by_addr[d.address]) for d in dsts}


def send_udp(src: Host, dst: Host, payload: str) -> None:
    src.run(
        [sys.executable, "-c",
         "import socket, sys; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto("
         "sys.argv[1].encode(), (sys.argv[2], int(sys.argv[3])))",
         payload, dst.address, str(UDP_PORT)],
        check=True,
    )  # fmt: skip
