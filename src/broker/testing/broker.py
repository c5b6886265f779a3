"""Run a real `gazette-broker` process for tests, benchmarks and the demo."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from broker.testing.etcd import free_port


class BrokerUnavailable(RuntimeError):
    """The broker process exited or did not report ready in time."""


class BrokerProcess:
    """A `gazette-broker` subprocess on 127.0.0.1. Restartable with the same port and spool dir."""

    def __init__(
        self,
        etcd_endpoint: str,
        *,
        root: str = "/gazette/cluster",
        zone: str = "local",
        suffix: str = "broker-1",
        spool_dir: Path | None = None,
        port: int = 0,
        extra_env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.etcd_endpoint = etcd_endpoint
        self.root = root
        self.zone = zone
        self.suffix = suffix
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if spool_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="broker-")
            spool_dir = Path(self._tmp.name)
        self.spool_dir = spool_dir
        self.port = port or free_port()
        self.extra_env = extra_env or {}
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.spool_dir / "broker.log"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        start_at = log.tell()
        env = {**os.environ, **self.extra_env}
        # Run the installed entry point's module so coverage of the venv's interpreter is used.
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broker.main",
                "--etcd",
                self.etcd_endpoint,
                "--root",
                self.root,
                "--zone",
                self.zone,
                "--suffix",
                self.suffix,
                "--listen",
                self.endpoint,
                "--spool-dir",
                str(self.spool_dir),
                "--lease-ttl",
                "4",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(start_at)
                if b"broker ready" in f.read():
                    return self
            if self.proc.poll() is not None:
                raise BrokerUnavailable(
                    f"broker exited with {self.proc.returncode}:\n{self.tail_log()}"
                )
            time.sleep(0.05)
        self.kill()
        raise BrokerUnavailable(f"broker not ready within {timeout}s:\n{self.tail_log()}")

    def tail_log(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 40.0) -> None:
        """Graceful stop (SIGTERM): the broker persists its spools and releases its lease."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: no cleanup at all. Its etcd lease expires after the TTL (4 s here)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
