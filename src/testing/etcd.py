"""Run real etcd servers (Debian `etcd-server`): one on loopback with a temporary data directory
(`EtcdServer`), or a cluster of several members (`EtcdCluster`) whose members can be killed and
restarted one at a time.

A member is configured by its name, the host it listens on and advertises, its client and peer
ports, its data directory and the initial cluster it joins, so the same code can place members
on different hosts (network namespaces) as well as on one loopback interface.

A member may serve its clients over TLS (`EtcdTLS`: etcd's ``--cert-file``, ``--key-file``,
and with client-certificate authentication ``--client-cert-auth --trusted-ca-file``); its
endpoint is then ``https://``, and this module's own checks use the same files. Peers talk
plaintext among themselves.

Temporary data directories are made in memory (/dev/shm) when it has room: etcd syncs its
write-ahead log on every write, and on a disk shared with a busy test run a sync can stall
for seconds. A stalled etcd 3.4 leader may then miss lease renewals and revoke leases, so a
short-TTL process under test would be fenced for a reason that is not the code under test.
Tests that need etcd on a disk pass their own `data_dir` / `directory`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class EtcdUnavailable(RuntimeError):
    """etcd could not be found or did not become ready."""


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out to outgoing connections and to binds of port 0."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_given: set[int] = set()
_rng = random.SystemRandom()  # Not the `random` module's state, which tests may seed.


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that is free right now, below the kernel's ephemeral range.

    Harnesses restart a process on the same port. A port of the ephemeral range (what a bind
    of port 0 picks) can be taken meanwhile by any outgoing connection's source port, or by
    another process's bind of port 0, and the restart then fails "Address already in use".
    Below that range only explicit binds take ports; this process never hands out the same
    one twice. Falls back to the kernel's choice if none is free there."""
    floor = _ephemeral_floor()
    low = max(1024, floor - 12_000)
    for _ in range(200):
        port = _rng.randrange(low, floor)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _given.add(port)
        return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


_MEMORY_DIR = Path("/dev/shm")
_MEMORY_ROOM = 1 << 30  # etcd preallocates 64 MiB log segments; several members run at once


def scratch_dir() -> str | None:
    """Where temporary etcd data directories go: /dev/shm if it is writable and has room,
    else None (the system's temporary directory)."""
    try:
        st = os.statvfs(_MEMORY_DIR)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize < _MEMORY_ROOM or not os.access(_MEMORY_DIR, os.W_OK):
        return None
    return str(_MEMORY_DIR)


def _etcd_binary() -> str:
    for candidate in (shutil.which("etcd"), "/usr/bin/etcd"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise EtcdUnavailable("etcd not found: install Debian package etcd-server (`make deps`)")


def _stopped(stat: Path) -> bool:
    """Whether the thread of /proc `stat` is stopped (state T), or gone."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return True


@dataclass(frozen=True)
class EtcdTLS:
    """TLS of a member's client URL, as PEM files.

    `cert_file` and `key_file` are the member's (``--cert-file``, ``--key-file``); `ca_file`
    signed `cert_file`, and this module's readiness and status checks trust it. With
    `client_cert_auth`, etcd refuses clients without a certificate `ca_file` signed
    (``--client-cert-auth --trusted-ca-file``), and the checks present `client_cert_file`
    and `client_key_file`, which are then required."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    client_cert_auth: bool = False
    client_cert_file: Path | None = None
    client_key_file: Path | None = None

    def __post_init__(self) -> None:
        if self.client_cert_auth and (
            self.client_cert_file is None or self.client_key_file is None
        ):
            raise ValueError("client_cert_auth needs client_cert_file and client_key_file")

    def flags(self) -> list[str]:
        """etcd's flags serving clients over TLS."""
        flags = [f"--cert-file={self.cert_file}", f"--key-file={self.key_file}"]
        if self.client_cert_auth:
            flags += ["--client-cert-auth", f"--trusted-ca-file={self.ca_file}"]
        return flags

    def ssl_context(self) -> ssl.SSLContext:
        """The context of this module's own HTTPS requests to the member."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if self.client_cert_file is not None and self.client_key_file is not None:
            ctx.load_cert_chain(self.client_cert_file, self.client_key_file)
        return ctx


def loopback_members(
    size: int, directory: Path, host: str = "127.0.0.1", tls: EtcdTLS | None = None
) -> list[EtcdServer]:
    """`size` members of a new cluster on `host`, on free ports, with data under `directory`,
    serving clients over `tls` if given."""
    ports: set[int] = set()
    while len(ports) < 2 * size:
        ports.add(free_port(host))
    client_ports, peer_ports = sorted(ports)[:size], sorted(ports)[size:]
    members = [
        EtcdServer(
            data_dir=directory / f"m{i}",
            client_port=client_ports[i],
            peer_port=peer_ports[i],
            name=f"m{i}",
            host=host,
            tls=tls,
        )
        for i in range(size)
    ]
    initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
    for m in members:
        m.initial_cluster = initial
    return members


@dataclass
class EtcdServer:
    """A running etcd process. Use as a context manager, or call `start()` and `stop()`.

    Alone (the defaults), it is a one-member cluster on loopback in a temporary directory.
    As a member of a larger cluster it is given its `name`, `host`, ports, `data_dir` and the
    `initial_cluster` (``name=http://host:peer_port,...``) it joins; `EtcdCluster` does that.
    With `tls`, it serves its clients over TLS only, at an ``https://`` endpoint.
    """

    data_dir: Path | None = None
    client_port: int = 0
    peer_port: int = 0
    name: str = "test"
    host: str = "127.0.0.1"
    """The address the member listens on and advertises to clients and peers."""
    initial_cluster: str = ""
    """Every member's peer URL, ``name=http://host:port,...``; empty: this member alone."""
    cluster_token: str = "etcd-cluster"
    tls: EtcdTLS | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        """The client URL, e.g. ``http://127.0.0.1:23790`` (``https://`` with TLS)."""
        return f"{'http' if self.tls is None else 'https'}://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def host_port(self) -> tuple[str, int]:
        return self.host, self.client_port

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 20.0) -> EtcdServer:
        """Launch the member and return once it reports healthy (which needs a quorum of its
        cluster to be up). Raises `EtcdUnavailable` if it exits or is not healthy in time."""
        self.launch()
        self.wait_ready(timeout)
        return self

    def launch(self) -> None:
        """Start the etcd process without waiting for it: members of a new cluster are all
        launched before any of them can become healthy. A restarted member keeps its data."""
        if self.running:
            return
        if self.data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="etcd-", dir=scratch_dir())
            self.data_dir = Path(self._tmp.name)
        self.client_port = self.client_port or free_port(self.host)
        self.peer_port = self.peer_port or free_port(self.host)
        initial_cluster = self.initial_cluster or f"{self.name}={self.peer_url}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "etcd.log", "ab")
        self._proc = subprocess.Popen(
            [
                _etcd_binary(),
                f"--name={self.name}",
                f"--data-dir={self.data_dir / 'data'}",
                f"--listen-client-urls={self.endpoint}",
                f"--advertise-client-urls={self.endpoint}",
                f"--listen-peer-urls={self.peer_url}",
                f"--initial-advertise-peer-urls={self.peer_url}",
                f"--initial-cluster={initial_cluster}",
                f"--initial-cluster-token={self.cluster_token}",
                "--initial-cluster-state=new",
                "--log-level=error",
                "--logger=zap",
                *(self.tls.flags() if self.tls is not None else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            # etcd reads ETCD_* variables as its own flags: the client settings our processes
            # take under those names (ETCD_CERT_FILE ...) must not configure the server.
            env={k: v for k, v in os.environ.items() if not k.startswith("ETCD_")},
            start_new_session=True,
        )
        log.close()

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Return once the member reports healthy; raises `EtcdUnavailable` (and stops it) if
        it exits or is not healthy within `timeout` seconds."""
        assert self._proc is not None and self.data_dir is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = (self.data_dir / "etcd.log").read_bytes()[-600:].decode(errors="replace")
                raise EtcdUnavailable(
                    f"etcd {self.name} exited with {self._proc.returncode}; "
                    f"{self.data_dir / 'etcd.log'} ends: {tail}"
                )
            try:
                with socket.create_connection(self.host_port, timeout=0.2):
                    pass
                if self._healthy():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise EtcdUnavailable(f"etcd {self.name} did not become ready within {timeout}s")

    def _healthy(self) -> bool:
        try:
            with self._urlopen(f"{self.endpoint}/health", timeout=1) as resp:
                return b'"true"' in resp.read()
        except OSError:
            return False

    def status(self, timeout: float = 1.0) -> tuple[int, int]:
        """(this member's id, the id of the leader it knows; 0: none), from the member's
        gRPC gateway. Raises OSError if the member does not answer."""
        req = urllib.request.Request(f"{self.endpoint}/v3/maintenance/status", data=b"{}")
        with self._urlopen(req, timeout=timeout) as resp:
            status = json.loads(resp.read())
        return int(status["header"]["member_id"]), int(status.get("leader", 0))

    def _urlopen(self, req: str | urllib.request.Request, timeout: float) -> Any:
        """`urllib.request.urlopen`, over the member's TLS if it has some."""
        context = self.tls.ssl_context() if self.tls is not None else None
        return urllib.request.urlopen(req, timeout=timeout, context=context)

    def kill(self) -> None:
        """SIGKILL the member, as a crash: its data directory stays, for a restart."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
        self._proc = None

    def pause(self) -> None:
        """SIGSTOP the member: its connections stay open and nothing answers on them, as
        behind a network partition; `resume` continues it."""
        assert self._proc is not None, "not running"
        self._proc.send_signal(signal.SIGSTOP)
        # Delivered asynchronously: return only once every thread has stopped.
        tasks = Path(f"/proc/{self._proc.pid}/task")
        deadline = time.monotonic() + 5
        while not all(_stopped(task / "stat") for task in tasks.iterdir()):
            if time.monotonic() > deadline:
                raise EtcdUnavailable(f"etcd {self.name} did not stop at SIGSTOP")
            time.sleep(0.001)

    def resume(self) -> None:
        assert self._proc is not None, "not running"
        self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM the member and remove its temporary data directory (if it made one)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)  # a paused member cannot exit
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self.data_dir = None

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class EtcdCluster:
    """A cluster of etcd members (three by default, on loopback, in one temporary directory).
    A context manager: every member is started, then stopped and the directory removed.

    `kill(i)` crashes member `i` (SIGKILL) and `start(i)` restarts it with its data, rejoining
    the cluster; `pause(i)` and `resume(i)` freeze and thaw it; `leader()` is the index of
    the current leader. Give `members` to place them elsewhere (their hosts, ports, data
    directories and a shared `initial_cluster`, as `loopback_members` makes them), or `tls`
    to have the members it makes serve their clients over TLS.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        host: str = "127.0.0.1",
        members: Sequence[EtcdServer] | None = None,
        directory: Path | None = None,
        tls: EtcdTLS | None = None,
    ) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._own_ports = members is None
        if members is None:
            if directory is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="etcd-cluster-", dir=scratch_dir())
                directory = Path(self._tmp.name)
            members = loopback_members(size, directory, host, tls)
        self.members = list(members)
        self._directory = directory
        self._host = host
        self._tls = tls

    @property
    def endpoints(self) -> list[str]:
        """Every member's client URL, in member order."""
        return [m.endpoint for m in self.members]

    @property
    def endpoints_flag(self) -> str:
        """The endpoints as the ``--etcd`` flag takes them (comma-separated)."""
        return ",".join(self.endpoints)

    def start_all(self, timeout: float = 30.0) -> EtcdCluster:
        """Launch every member, and return once all are healthy. Members whose ports this
        cluster chose are given fresh ones (and fresh data) if one exits at its first start
        (another process took a port meanwhile), up to three times."""
        for attempt in range(3):
            for m in self.members:
                m.launch()
            try:
                for m in self.members:
                    m.wait_ready(timeout)
                return self
            except EtcdUnavailable:
                if not self._own_ports or self._directory is None or attempt == 2:
                    raise
                for m in self.members:
                    m.kill()
                    if m.data_dir is not None:
                        shutil.rmtree(m.data_dir, ignore_errors=True)
                self.members = loopback_members(
                    len(self.members), self._directory, self._host, self._tls
                )
        raise AssertionError("unreachable")

    def start(self, i: int, timeout: float = 30.0) -> None:
        """(Re)start member `i` and wait until it is healthy again."""
        self.members[i].start(timeout)

    def kill(self, i: int) -> None:
        """Crash member `i` (SIGKILL)."""
        self.members[i].kill()

    def pause(self, i: int) -> None:
        """Freeze member `i` (SIGSTOP), as if cut off by a partition; `resume(i)` ends it."""
        self.members[i].pause()

    def resume(self, i: int) -> None:
        self.members[i].resume()

    def leader(self, timeout: float = 10.0) -> int:
        """The index of the member that leads, once the running members agree on one. Raises
        `EtcdUnavailable` if they do not within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            ids: dict[int, int] = {}
            leaders: set[int] = set()
            for i, m in enumerate(self.members):
                if not m.running:
                    continue
                try:
                    member_id, leader = m.status()
                except OSError:
                    continue
                ids[member_id] = i
                leaders.add(leader)
            if len(leaders) == 1 and (leader := leaders.pop()) in ids:
                return ids[leader]
            if time.monotonic() > deadline:
                raise EtcdUnavailable(f"etcd members do not agree on a leader within {timeout}s")
            time.sleep(0.05)

    def stop(self) -> None:
        for m in self.members:
            m.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EtcdCluster:
        try:
            return self.start_all()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
