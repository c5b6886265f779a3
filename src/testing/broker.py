"""Run a real `gazette-broker` process for tests, benchmarks and the demo."""

from __future__ import annotations

import sys
from pathlib import Path

from gazette.testing.process import ProcessUnavailable, ReadyProcess


class BrokerUnavailable(ProcessUnavailable):
    """The broker process exited or did not report ready in time."""


class BrokerProcess(ReadyProcess):
    """A `gazette-broker` subprocess on 127.0.0.1. Restartable with the same port and spool dir."""

    ready_marker = b"broker ready"
    name = "broker"
    unavailable = BrokerUnavailable

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
        self.extra_args = extra_args or []
        super().__init__(spool_dir, port, extra_env)
        self.spool_dir = self.directory

    def command(self) -> list[str]:
        # Run the installed entry point's module so coverage of the venv's interpreter is used.
        return [
            sys.executable,
            "-m",
            "gazette.broker.main",
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
        ]
