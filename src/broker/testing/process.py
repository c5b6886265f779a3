"""A server subprocess that reports readiness by printing a line: the base of the broker and
consumer test harnesses."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


class ProcessUnavailable(RuntimeError):
    """The process exited or did not report ready in time."""


class ReadyProcess:
    """Runs `command()` with output appended to `log_path`; `start` returns once the log
    shows `ready_marker`. Restartable; `stop` is SIGTERM (graceful), `kill` SIGKILL."""

    ready_marker = b"ready"
    name = "process"
    unavailable: type[ProcessUnavailable] = ProcessUnavailable

    def __init__(self, log_path: Path, extra_env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 20.0) -> ReadyProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        start_at = log.tell()
        env = {**os.environ, **self.extra_env}
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(start_at)
                if self.ready_marker in f.read():
                    return self
            if self.proc.poll() is not None:
                raise self.unavailable(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.tail_log()}"
                )
            time.sleep(0.05)
        self.kill()
        raise self.unavailable(f"{self.name} not ready within {timeout}s:\n{self.tail_log()}")

    def tail_log(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 40.0) -> None:
        """Graceful stop (SIGTERM), SIGKILL after `timeout`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: no cleanup at all (etcd leases expire after their TTL)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: the process freezes (a zombie primary, until `resume`)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
