"""Run a real `gazette-consumer` process for tests, benchmarks and the demo."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gazette.testing.etcd import free_port
from gazette.testing.process import ProcessUnavailable, ReadyProcess

__all__ = ["ConsumerProcess", "ConsumerUnavailable"]


class ConsumerUnavailable(ProcessUnavailable):
    """The consumer process exited or did not report ready in time."""


class ConsumerProcess(ReadyProcess):
    """A `gazette-consumer` subprocess of application `app` on 127.0.0.1 (restartable with
    the same ports and work directory). `lease_ttl` bounds how long a killed process keeps
    its shards. HTTP is served on `http_port` (a free port by default; 0: none)."""

    ready_marker = b"consumer ready"
    name = "consumer"
    unavailable = ConsumerUnavailable
    start_timeout = 30.0

    def __init__(
        self,
        app: str,
        etcd_endpoint: str,
        brokers: list[str],
        *,
        root: str,
        zone: str = "local",
        suffix: str = "consumer-1",
        workdir: Path | None = None,
        port: int = 0,
        lease_ttl: int = 3,
        http_port: int | None = None,
        extra_env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.app = app
        self.etcd_endpoint = etcd_endpoint
        self.brokers = brokers
        self.root = root
        self.zone = zone
        self.suffix = suffix
        self.lease_ttl = lease_ttl
        self.http_port = free_port() if http_port is None else http_port
        self.extra_args = extra_args or []
        super().__init__(workdir, port, extra_env)
        self.workdir = self.directory

    @property
    def http_endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the HTTP server (``https://`` when the consumer
        serves TLS: ``--server-cert-file`` or ``CONSUMER_SERVER_CERT_FILE``)."""
        tls = "--server-cert-file" in " ".join(self.extra_args) or (
            {**os.environ, **self.extra_env}.get("CONSUMER_SERVER_CERT_FILE")
        )
        return f"{'https' if tls else 'http'}://127.0.0.1:{self.http_port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gazette.consumer.main",
            self.app,
            "--etcd",
            self.etcd_endpoint,
            "--root",
            self.root,
            "--broker",
            ",".join(self.brokers),
            "--zone",
            self.zone,
            "--suffix",
            self.suffix,
            "--listen",
            self.endpoint,
            "--workdir",
            str(self.workdir / "shards"),
            "--lease-ttl",
            str(self.lease_ttl),
            "--http-port",
            str(self.http_port),
            *self.extra_args,
        ]
