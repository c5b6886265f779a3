"""A server subprocess that reports readiness by printing a line: the base of the broker and
consumer test harnesses."""

from __future__ import annotations

import abc
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

from gazette.testing.etcd import free_port


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""A client's connection preface and an empty SETTINGS frame."""


def probe_http2(port: int, timeout: float = 2.0) -> str:
    """How 127.0.0.1:`port` answers a new HTTP/2 connection: "refused", "no SETTINGS within
    {timeout}s" (accepted, yet the server does not handshake), "HTTP/2 answers", or the
    error. Tells a process that stopped listening from one whose clients' channels are
    stuck."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(_HTTP2_PREFACE)
            head = sock.recv(9)
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return f"no SETTINGS within {timeout}s"
    except OSError as err:
        return f"error: {err}"
    if len(head) == 9 and head[3] == 4:  # The server's first frame: its SETTINGS.
        return "HTTP/2 answers"
    return f"unexpected answer {head!r}"


class ProcessUnavailable(RuntimeError):
    """The process exited or did not report ready in time."""


class ReadyProcess(abc.ABC):
    """Runs `command()` on 127.0.0.1:`port` in `directory` (a temporary one, removed by
    `close`, when None), with output appended to ``directory/{name}.log``; `start` returns
    once the log shows `ready_marker`. Restartable with the same port and directory; `stop`
    is SIGTERM (graceful), `kill` SIGKILL. A context manager: started, then closed."""

    ready_marker = b"ready"
    name = "process"
    unavailable: type[ProcessUnavailable] = ProcessUnavailable
    start_timeout = 20.0

    def __init__(
        self, directory: Path | None, port: int = 0, extra_env: dict[str, str] | None = None
    ) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"{self.name}-")
            directory = Path(self._tmp.name)
        self.directory = directory
        self.port = port or free_port()
        self.log_path = directory / f"{self.name}.log"
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The command line of the process."""

    def start(self, timeout: float | None = None) -> Self:
        timeout = self.start_timeout if timeout is None else timeout
        # Private, as the process's own files are (docs/file-modes.md).
        self.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        log = open(self.log_path, "ab", opener=_private_opener)
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

    def describe(self, lines: int = 12) -> str:
        """What a failed test wants to know of this process: whether it runs, whether its
        port answers as an HTTP/2 (gRPC) server would (`probe_http2`), and its log's last
        `lines` lines."""
        if self.proc is None:
            state = "not started (or stopped)"
        elif (code := self.proc.poll()) is not None:
            state = f"exited with {code}"
        else:
            state = f"running, pid {self.proc.pid}"
        tail = self.tail_log(20_000).splitlines()[-lines:]
        body = "\n".join(f"    {line[:240]}" for line in tail)
        return f"{self.name} {self.endpoint}: {state}; port: {probe_http2(self.port)}\n{body}"

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

    def close(self) -> None:
        """Stop gracefully and remove the temporary directory, if one was made."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
