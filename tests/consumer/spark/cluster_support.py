"""A Spark standalone cluster on the hosts of a `gazette.testing.netns.Net`, started from the
pyspark package's own ``spark-class`` (a master and its workers, each a JVM on its host's
address), and consumer processes on hosts.

Hosts share this machine's file systems, so a worker could read files only the driver has.
`start_worker` starts each worker in a mount namespace of its own whose ``/tmp`` is an empty
tmpfs: its executors, their Python workers and everything they play or spill see nothing
the driver (or a consumer) put in ``/tmp``, as on another machine. What a worker's
executors wrote stays readable from here through ``/proc/<worker pid>/root`` (`executor_logs`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyspark

from gazette.testing.consumer import ConsumerProcess
from gazette.testing.netns import Host
from tests.testing.hosts_support import HostBroker

SPARK_MASTER_PORT = 7077
SPARK_MASTER_UI_PORT = 8088
SPARK_WORKER_PORT = 7078
SPARK_WORKER_UI_PORT = 8089
CONSUMER_PORT = 8090

SPARK_CLASS = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
WORKER_DIR = "/tmp/spark-work"
"""A worker's work directory (its executors' logs and files), in its private ``/tmp``."""


def master_url(host: Host) -> str:
    return f"spark://{host.address}:{SPARK_MASTER_PORT}"


def _spark_env(host: Host) -> dict[str, str]:
    # The host's own address (never a loopback SPARK_LOCAL_IP inherited from this process),
    # and small daemons: the master and workers only schedule.
    return {
        "SPARK_LOCAL_IP": host.address,
        "SPARK_DAEMON_MEMORY": "256m",
        "PYSPARK_PYTHON": sys.executable,
    }


def _wait_for(
    log: Path, marker: bytes, proc: subprocess.Popen[bytes], what: str, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while marker not in (log.read_bytes() if log.exists() else b""):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"{what} not up (rc {proc.poll()}):\n{tail}")
        time.sleep(0.2)


def start_master(host: Host) -> subprocess.Popen[bytes]:
    """Start a standalone master on `host` (its URL: `master_url`)."""
    return host.popen(
        [SPARK_CLASS, "org.apache.spark.deploy.master.Master",
         "--host", host.address, "--port", str(SPARK_MASTER_PORT),
         "--webui-port", str(SPARK_MASTER_UI_PORT)],
        env=_spark_env(host),
        log=host.directory / "spark-master.log",
    )  # fmt: skip


def start_worker(
    host: Host, master: str, *, cores: int = 1, memory: str = "1g"
) -> subprocess.Popen[bytes]:
    """Start a worker on `host` offering `cores` and `memory` to executors, in a mount
    namespace whose ``/tmp`` is private (module docs)."""
    script = 'mount -t tmpfs -o mode=1777,size=2g gzn-worker-tmp /tmp && exec "$@"'
    return host.popen(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
         SPARK_CLASS, "org.apache.spark.deploy.worker.Worker",
         "--host", host.address, "--port", str(SPARK_WORKER_PORT),
         "--webui-port", str(SPARK_WORKER_UI_PORT), "--cores", str(cores), "--memory", memory,
         "--work-dir", WORKER_DIR, master],
        env=_spark_env(host),
        log=host.directory / "spark-worker.log",
    )  # fmt: skip


def wait_master(host: Host, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    _wait_for(
        host.directory / "spark-master.log", b"ALIVE", proc, f"spark master on {host}", timeout
    )


def wait_worker(host: Host, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    _wait_for(
        host.directory / "spark-worker.log",
        b"Successfully registered with master",
        proc,
        f"spark worker on {host}",
        timeout,
    )


def executor_logs(worker: subprocess.Popen[bytes], limit: int = 4000) -> str:
    """The tails of the stderr files of the executors `worker` ran (in its private /tmp)."""
    root = Path(f"/proc/{worker.pid}/root{WORKER_DIR}")
    out = []
    try:
        for f in sorted(root.glob("*/*/stderr")):
            out.append(f"--- {f.relative_to(root)}\n{f.read_text(errors='replace')[-limit:]}")
    except OSError as err:
        out.append(f"(executor logs unreadable: {err})")
    return "\n".join(out)


def private_tmp_of(worker: subprocess.Popen[bytes]) -> list[str]:
    """The names in `worker`'s ``/tmp`` (as its executors see it)."""
    return sorted(os.listdir(f"/proc/{worker.pid}/root/tmp"))


LEASE_TTL = 30
"""Seconds of the brokers' and consumers' etcd leases: the JVMs of Spark starting on a busy
2-core machine can starve a process of the CPU for longer than the harnesses' few seconds."""


class PatientBroker(HostBroker):
    """A `HostBroker` with a `LEASE_TTL` lease."""

    def command(self) -> list[str]:
        return [*super().command(), "--lease-ttl", str(LEASE_TTL)]


class HostConsumer(ConsumerProcess):
    """A `gazette-consumer` on `host`, listening on (and advertising) the host's address,
    with a `LEASE_TTL` lease."""

    def __init__(
        self,
        host: Host,
        app: str,
        etcd: str,
        brokers: list[str],
        *,
        root: str,
        env: dict[str, str],
        extra_args: list[str] | None = None,
    ) -> None:
        self.host = host
        super().__init__(
            app,
            etcd,
            brokers,
            root=root,
            zone=f"zone-{host.name}",
            suffix=f"consumer-{host.name}",
            workdir=host.directory / "consumer",
            port=CONSUMER_PORT,
            lease_ttl=LEASE_TTL,
            http_port=0,
            extra_env=env,
            extra_args=extra_args,
        )

    @property
    def endpoint(self) -> str:
        return f"{self.host.address}:{self.port}"

    def command(self) -> list[str]:
        return self.host.command(super().command())
