"""Hosts as Linux network namespaces on this machine, for multi-host tests (`make cluster`).

A `Net` makes hosts ``h0``, ``h1``, ... : each a network namespace whose ``eth0`` is one end
of a veth pair, the other end a port of a bridge in the root namespace. Hosts get addresses
in a private /24 (``10.77.N.0/24``, the first N no bridge of ours uses), the bridge gets
``.1`` (so the test process reaches every host directly), hosts ``.2``, ``.3``, ... No host
has a default route, so nothing they send leaves the machine.

Processes run on a host through ``nsenter --net``: they enter its network namespace only and
share the mount namespace (a FUSE mount made on a host is seen, and unmounted, from here).

Faults, all silent drops (a sender sees timeouts, not errors, as on a real network):

- `Net.isolate` sets the host's bridge port down: nothing reaches it, nothing leaves it,
  including traffic to and from the test process.
- `Net.drop` (src -> dst only), and `Net.partition` (both ways between groups), add
  ``blackhole`` policy-routing rules to the receiving host, matching the sender's address.
- `Net.heal` undoes the faults involving one host, `Net.heal_all` every fault.

Everything a `Net` makes carries the prefix ``gzn-`` and the id of the owning process, so
`cleanup_stale` (called by every new `Net`) removes what a crashed run left behind:
namespaces, links, processes in those namespaces and mounts under the run's directories.
`Net.close` (the context manager's exit, atexit, and SIGTERM left to its default) removes
everything of a live one. Needs root, iproute2 and util-linux (``nsenter``).
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Self

PREFIX = "gzn-"
"""Every namespace, link and work directory of a Net is named ``gzn-<pid>-<seq>...``, with
the owning process's id in base 36."""

_NAME = re.compile(rf"^{PREFIX}([0-9a-z]{{1,5}})-[0-9a-z]+(-|$)")

_DROP_PREF = 100
"""Policy-rule priority of drops: before the ``local`` table, moved from 0 to `_LOCAL_PREF`
on each host so that a drop applies to packets addressed to the host itself."""
_LOCAL_PREF = 1000

_seq = itertools.count()
_open_nets: weakref.WeakSet[Net] = weakref.WeakSet()
_lock = threading.Lock()
_signal_installed = False


class NetError(RuntimeError):
    """A command setting up, changing or removing the namespaces failed."""


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def _ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def _owner_alive(name: str) -> bool:
    """Whether the process whose id `name` (``gzn-<pid>-<seq>...``) carries is alive; true
    for a name not of that form (not ours: left alone)."""
    m = _NAME.match(name)
    if m is None:
        return True
    pid = int(m.group(1), 36)
    if pid == os.getpid() or pid > _pid_max():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 1 << 22


def _namespace_pids(netns: str) -> list[int]:
    out = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in out.split()]


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _mount_points(under: Callable[[Path], bool]) -> list[str]:
    """The mount points for which `under` holds, deepest first (to be unmounted in order)."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if under(Path(point)):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def _unmount(points: Iterable[str]) -> None:
    for point in points:
        # A FUSE mount whose daemon was killed answers ENOTCONN; a lazy unmount detaches it.
        if subprocess.run(["umount", "-l", point], capture_output=True).returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True)


def _netns_names() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _link_names() -> list[str]:
    names = []
    for line in _ip("-o", "link", "show").splitlines():
        names.append(line.split(":", 2)[1].strip().split("@", 1)[0])
    return names


def cleanup_stale() -> None:
    """Remove what Nets of processes no longer running left behind: processes in their
    namespaces (SIGKILL), mounts under their work directories, the namespaces, bridges and
    veths, and their work directories under the temporary directory. An owner's id reused
    by a new process since keeps its leftovers until that process ends."""
    stale_ns = [n for n in _netns_names() if n.startswith(PREFIX) and not _owner_alive(n)]
    for ns in stale_ns:
        _signal_all(_namespace_pids(ns), signal.SIGKILL)
    stale_dirs = [
        p
        for p in Path(tempfile.gettempdir()).glob(f"{PREFIX}*")
        if p.is_dir() and not _owner_alive(p.name)
    ]
    _unmount(
        _mount_points(lambda p: any(not _owner_alive(part) for part in p.parts if part != "/"))
    )
    for ns in stale_ns:
        _ip("netns", "del", ns, check=False)
    for link in _link_names():
        if link.startswith(PREFIX) and not _owner_alive(link):
            _ip("link", "del", link, check=False)
    for d in stale_dirs:
        shutil.rmtree(d, ignore_errors=True)


def _close_open_nets() -> None:
    for net in list(_open_nets):
        net.close()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Tear down, then die of the signal as the process would have without us.
    _close_open_nets()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_teardown() -> None:
    """Close open Nets at exit, and on SIGTERM if the process leaves SIGTERM to its default
    (which would end it without running atexit)."""
    global _signal_installed
    with _lock:
        if _signal_installed:
            return
        _signal_installed = True
        atexit.register(_close_open_nets)
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)


class Host:
    """One host of a `Net`: a network namespace at `address`, with a work directory."""

    def __init__(self, net: Net, index: int, name: str, address: str) -> None:
        self.net = net
        self.index = index
        self.name = name
        self.address = address
        self.netns = f"{net.tag}-{name}"
        self.port_link = f"{net.tag}-{_base36(index)}"
        """The bridge port of this host's veth, in the root namespace."""
        self.directory = net.directory / name
        self._procs: list[subprocess.Popen[bytes]] = []

    def __repr__(self) -> str:
        return f"Host({self.name} {self.address})"

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host's network namespace (and no other namespace)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]

    def popen(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `argv` on this host in its own session, with `env` added to ours, output
        appended to `log` (discarded if None). `Net.close` kills it."""
        out: IO[bytes] | int = subprocess.DEVNULL
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            out = open(log, "ab")
        try:
            proc = subprocess.Popen(
                self.command(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):
                out.close()
        self._procs.append(proc)
        return proc

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` on this host to completion, capturing its output as text."""
        return subprocess.run(
            self.command(argv), capture_output=True, text=True, timeout=timeout, check=check
        )

    def pids(self) -> list[int]:
        """Every process in this host's namespace, whoever started it."""
        return _namespace_pids(self.netns)

    def kill(self) -> None:
        """SIGKILL every process on the host (a host crash) and reap those `popen` started."""
        _signal_all(self.pids(), signal.SIGKILL)
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self._procs.clear()

    def pause(self) -> None:
        """SIGSTOP every process on the host: it freezes until `resume`."""
        _signal_all(self.pids(), signal.SIGSTOP)

    def resume(self) -> None:
        _signal_all(self.pids(), signal.SIGCONT)


class Net:
    """`hosts` hosts (a count, named h0, h1, ..., or names) on one bridge. A context manager:
    built on entry (or by `start`), removed by `close` on exit.

    `directory` is the parent of the work directory ``gzn-<pid>-<seq>`` (default: the
    temporary directory); hosts' directories are in it. The work directory is removed on
    close unless `keep` (logs to read after a failure), and anything mounted under it is
    unmounted.
    """

    def __init__(
        self, hosts: int | Sequence[str], *, directory: Path | None = None, keep: bool = False
    ) -> None:
        names = [f"h{i}" for i in range(hosts)] if isinstance(hosts, int) else list(hosts)
        if not names or len(names) > 250:
            raise ValueError(f"a Net has 1 to 250 hosts, not {len(names)}")
        self.tag = f"{PREFIX}{_base36(os.getpid())}-{_base36(next(_seq))}"
        self.bridge = self.tag
        self.directory = (directory or Path(tempfile.gettempdir())) / self.tag
        self.keep = keep
        self._names = names
        self.hosts: list[Host] = []
        self.subnet = ""
        self._isolated: set[str] = set()
        self._drops: set[tuple[str, str]] = set()
        self._closed = False

    # -- building and removing

    def start(self) -> Self:
        cleanup_stale()
        _install_teardown()
        _open_nets.add(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _free_subnet(self) -> str:
        used = _ip("-o", "-4", "addr", "show")
        for n in range(256):
            if f" 10.77.{n}." not in used:
                return f"10.77.{n}"
        raise NetError("no free 10.77.N.0/24 subnet")

    def _build(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True)
        self.subnet = self._free_subnet()
        # Firewalls of the machine do not see (and so cannot drop) the bridged frames.
        _ip("link", "add", self.bridge, "type", "bridge", "nf_call_iptables", "0")
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self._names):
            host = Host(self, i, name, f"{self.subnet}.{i + 2}")
            self.hosts.append(host)
            host.directory.mkdir(mode=0o700)
            _ip("netns", "add", host.netns)
            ns = ("-n", host.netns)
            # The peer is made inside the namespace: its name cannot clash with the machine's.
            _ip(
                "link",
                "add",
                host.port_link,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                host.netns,
            )
            _ip(*ns, "link", "set", "lo", "up")
            _ip(*ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip(*ns, "link", "set", "eth0", "up")
            _ip(*ns, "rule", "add", "pref", str(_LOCAL_PREF), "lookup", "local")
            _ip(*ns, "rule", "del", "pref", "0")
            _ip("link", "set", host.port_link, "master", self.bridge)
            _ip("link", "set", host.port_link, "up")

    def close(self) -> None:
        """Kill every process on the hosts, unmount what is mounted under the work
        directory, delete the namespaces, veths and bridge, and remove the work directory
        (unless `keep`). Idempotent; failures to remove are ignored."""
        if self._closed:
            return
        self._closed = True
        _open_nets.discard(self)
        for host in self.hosts:
            host.kill()
        _unmount(_mount_points(lambda p: p.is_relative_to(self.directory)))
        for host in self.hosts:
            _ip("netns", "del", host.netns, check=False)
            _ip("link", "del", host.port_link, check=False)
        _ip("link", "del", self.bridge, check=False)
        if not self.keep:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- looking up

    def __getitem__(self, name: str | int) -> Host:
        if isinstance(name, int):
            return self.hosts[name]
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    # -- faults

    def isolate(self, host: Host) -> None:
        """Cut `host` off from everything (other hosts and the test process), both ways."""
        _ip("link", "set", host.port_link, "down")
        self._isolated.add(host.name)

    def drop(self, src: Host, dst: Host) -> None:
        """Drop what `src` sends to `dst` (only that way: `dst` still reaches `src`, though a
        TCP connection either way stalls, its acknowledgements being lost)."""
        if src is dst:
            raise ValueError(f"a host cannot drop its own traffic ({src.name})")
        if (src.name, dst.name) in self._drops:
            return
        _ip("-n", dst.netns, *self._drop_rule(src), check=True)
        self._drops.add((src.name, dst.name))

    def partition(self, groups: Sequence[Sequence[Host]]) -> None:
        """Drop all traffic between hosts of different `groups`, both ways. A host in no
        group keeps reaching every host."""
        for ga, gb in itertools.permutations(groups, 2):
            for a in ga:
                for b in gb:
                    self.drop(a, b)

    def heal(self, host: Host) -> None:
        """Undo the faults involving `host`: its isolation and the drops from or to it."""
        if host.name in self._isolated:
            _ip("link", "set", host.port_link, "up")
            self._isolated.discard(host.name)
        for src, dst in sorted(self._drops):
            if host.name in (src, dst):
                self._undrop(self[src], self[dst])

    def heal_all(self) -> None:
        for host in self.hosts:
            self.heal(host)

    def _drop_rule(self, src: Host, verb: str = "add") -> list[str]:
        return [
            "rule",
            verb,
            "pref",
            str(_DROP_PREF),
            "from",
            f"{src.address}/32",
            "iif",
            "eth0",
            "blackhole",
        ]

    def _undrop(self, src: Host, dst: Host) -> None:
        _ip("-n", dst.netns, *self._drop_rule(src, "del"))
        self._drops.discard((src.name, dst.name))
