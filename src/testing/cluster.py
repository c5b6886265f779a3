"""Run a cluster of real `gazette-broker` processes on one etcd, for tests and benchmarks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gazette.testing.broker import BrokerProcess

DEFAULT_ZONES = ("zone-a", "zone-b", "zone-a")


class BrokerCluster:
    """Brokers `broker-0`, `broker-1`, ... in `zones` (one broker per entry) under one etcd
    root, each with its spool directory under `spool_root`. A context manager: starts all,
    closes all (gracefully; with `--drain-timeout 0` by default, since at teardown there is
    nowhere to drain journals to)."""

    def __init__(
        self,
        etcd_endpoint: str,
        *,
        root: str,
        spool_root: Path,
        zones: Sequence[str] = DEFAULT_ZONES,
        extra_args: Sequence[str] = ("--drain-timeout", "0"),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.brokers = [
            BrokerProcess(
                etcd_endpoint,
                root=root,
                zone=zone,
                suffix=f"broker-{i}",
                spool_dir=spool_root / f"broker-{i}",
                extra_args=list(extra_args),
                extra_env=extra_env,
            )
            for i, zone in enumerate(zones)
        ]

    @property
    def endpoints(self) -> list[str]:
        return [b.endpoint for b in self.brokers]

    def by_suffix(self, suffix: str) -> BrokerProcess:
        """The broker whose id suffix is `suffix` (e.g. a route member's)."""
        return next(b for b in self.brokers if b.suffix == suffix)

    def describe(self) -> str:
        """Each broker's state, port and log tail (`ReadyProcess.describe`): for the report
        of a failed test."""
        return "\n".join(f"{b.suffix}: {b.describe()}" for b in self.brokers)

    def start(self) -> BrokerCluster:
        try:
            for b in self.brokers:
                b.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for b in self.brokers:
            b.close()

    def __enter__(self) -> BrokerCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
