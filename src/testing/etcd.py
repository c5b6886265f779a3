"""Run a real etcd server (Debian `etcd-server`) on loopback with a temporary data directory."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


class EtcdUnavailable(RuntimeError):
    """etcd could not be found or did not become ready."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _etcd_binary() -> str:
    for candidate in (shutil.which("etcd"), "/usr/bin/etcd"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise EtcdUnavailable("etcd not found: install Debian package etcd-server (`make deps`)")


@dataclass
class EtcdServer:
    """A running etcd process. Use as a context manager, or call `start()` and `stop()`."""

    data_dir: Path | None = None
    client_port: int = 0
    peer_port: int = 0
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        """The client URL, e.g. ``http://127.0.0.1:23790``."""
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def host_port(self) -> tuple[str, int]:
        return "127.0.0.1", self.client_port

    def start(self, timeout: float = 20.0) -> EtcdServer:
        if self.data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="etcd-")
            self.data_dir = Path(self._tmp.name)
        self.client_port = self.client_port or free_port()
        self.peer_port = self.peer_port or free_port()
        log = open(self.data_dir / "etcd.log", "ab")
        self._proc = subprocess.Popen(
            [
                _etcd_binary(),
                "--name=test",
                f"--data-dir={self.data_dir / 'data'}",
                f"--listen-client-urls=http://127.0.0.1:{self.client_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.client_port}",
                f"--listen-peer-urls=http://127.0.0.1:{self.peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{self.peer_port}",
                f"--initial-cluster=test=http://127.0.0.1:{self.peer_port}",
                "--log-level=error",
                "--logger=zap",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EtcdUnavailable(
                    f"etcd exited with {self._proc.returncode}; see {self.data_dir / 'etcd.log'}"
                )
            try:
                with socket.create_connection(self.host_port, timeout=0.2):
                    pass
                if self._healthy():
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise EtcdUnavailable(f"etcd did not become ready within {timeout}s")

    def _healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1) as resp:
                return b'"true"' in resp.read()
        except OSError:
            return False

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
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
