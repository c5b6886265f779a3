"""Run a moto S3 server (``moto[server]``) on loopback, for tests of s3:// fragment stores.

The server is a subprocess, so it never shares the caller's event loop or GIL. Nothing global is
set here: clients need credentials and a region, any values will do. Callers put `env()` into
their environment (e.g. with pytest's ``monkeypatch.setenv``) before constructing S3 stores,
and point stores at the server with ``s3://bucket/prefix/?endpoint=<endpoint>``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gazette.testing.etcd import free_port

DEFAULT_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Never consult instance metadata or the host's AWS config for test clients.
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}


class MotoUnavailable(RuntimeError):
    """The moto server could not be started or did not become ready."""


@dataclass
class MotoS3Server:
    """A running ``python -m moto.server``. Use as a context manager, or `start()`/`stop()`."""

    port: int = 0
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: Path | None = field(default=None, repr=False)
    _client: Any = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        """The server URL, e.g. ``http://127.0.0.1:45123``."""
        return f"http://127.0.0.1:{self.port}"

    @staticmethod
    def env() -> dict[str, str]:
        """Environment variables S3 clients of this server need (dummy credentials, region)."""
        return dict(DEFAULT_ENV)

    def start(self, timeout: float = 30.0) -> MotoS3Server:
        self.port = self.port or free_port()
        fd, log_name = tempfile.mkstemp(prefix="moto-", suffix=".log")
        self._log = Path(log_name)
        with open(fd, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise MotoUnavailable(
                    f"moto server exited with {self._proc.returncode}; see {self._log}"
                )
            if self._ready():
                return self
            time.sleep(0.05)
        self.stop()
        raise MotoUnavailable(f"moto server did not become ready within {timeout}s")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1) as resp:
                return int(resp.status) == 200
        except urllib.error.HTTPError:
            return True  # Answering at all means it is up.
        except OSError:
            return False

    def client(self) -> Any:
        """A boto3 S3 client of this server (using `env()` credentials), made once."""
        import boto3

        if self._client is not None:
            return self._client
        env = self.env()
        self._client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_DEFAULT_REGION"],
        )
        return self._client

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def reset(self) -> None:
        """Drop all buckets and objects."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        self._client = None
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None

    def __enter__(self) -> MotoS3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
