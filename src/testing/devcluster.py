"""``gazette-dev``: a development cluster on this machine, for running your own application.

One command starts an etcd, brokers, and (given ``--app``) consumer processes of an
application, every one on a free loopback port, with its data and log under one directory;
applies journal and shard specs (``gazctl journals apply``, ``gazctl shards apply``); prints
the addresses and the environment that points ``gazctl`` at them; and runs until Ctrl-C
(SIGINT) or SIGTERM, when it stops the consumers, then the brokers, then etcd, and waits for
each: nothing is left running. A process that exits on its own stops the cluster, with the
end of its log.

    gazette-dev --journals journals.yaml --app my_app.app:MyApp --consumers 2 \\
        --shards shards.yaml --consumer-arg=--app.top-n=5

The application's module is imported by the consumers from the current directory (or the
``PYTHONPATH``). Consumers run with ``--drain-timeout 0`` (at the cluster's stop there is
nowhere to hand shards to) and ``--lease-ttl 3``; ``--consumer-arg`` adds or overrides
flags, e.g. ``--max-hot-standbys=0`` to run specs asking for standbys on one consumer.

With ``--secure``, everything runs with TLS and authorization on (docs/security.md):
certificates made for the run (`gazette.testing.certs`) under the directory, etcd serving TLS
and asking for client certificates, brokers and consumers serving TLS and verifying tokens
signed with a key made for the run. The processes take their settings from the environment,
under the names upstream gives them (`secure_environment`); a file of the clients' settings
(``secure.env``, readable by its owner only) is printed for ``gazctl``.

Like the rest of `gazette.testing` it runs the package's programs as processes and imports
none of the package; `DevCluster` is the same cluster from Python.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from gazette.testing.certs import Certs, write_certs
from gazette.testing.cluster import BrokerCluster
from gazette.testing.consumer import ConsumerProcess
from gazette.testing.etcd import EtcdServer
from gazette.testing.process import ProcessUnavailable, ReadyProcess

__all__ = ["DevCluster", "DevClusterError", "main"]

BROKER_ROOT = "/gazette/cluster"
CONSUMER_ROOT = "/gazette/consumers/app"
READY_LINE = "gazette-dev ready"
"""Printed once everything is up and the specs are applied (scripts may wait for it)."""
GAZCTL_TIMEOUT = 120.0


class DevClusterError(RuntimeError):
    """A process did not start, or a spec was not applied."""


CLIENT_VARIABLES = (
    "BROKER_TRUSTED_CA_FILE",
    "BROKER_AUTH_KEYS",
    "CONSUMER_TRUSTED_CA_FILE",
    "CONSUMER_AUTH_KEYS",
    "ETCD_TRUSTED_CA_FILE",
    "ETCD_CERT_FILE",
    "ETCD_CERT_KEY_FILE",
)
"""The variables of `secure_environment` that clients (gazctl, the client library's
`ClientSettings.from_environ`) read; the others configure servers."""


def secure_environment(certs: Certs, key: str) -> dict[str, str]:
    """The environment of every process of a secured cluster: brokers and consumers serve TLS
    with `certs`' server certificate and trust its CA for their peers; they verify tokens
    signed with `key` (base64), and sign their own calls with it; every etcd client presents
    the client certificate."""
    env = {}
    for side in ("BROKER", "CONSUMER"):
        env[f"{side}_SERVER_CERT_FILE"] = str(certs.server_cert)
        env[f"{side}_SERVER_CERT_KEY_FILE"] = str(certs.server_key)
        env[f"{side}_PEER_CA_FILE"] = str(certs.ca)
        env[f"{side}_TRUSTED_CA_FILE"] = str(certs.ca)
        env[f"{side}_AUTH_KEYS"] = key
    env["ETCD_TRUSTED_CA_FILE"] = str(certs.ca)
    env["ETCD_CERT_FILE"] = str(certs.client_cert)
    env["ETCD_CERT_KEY_FILE"] = str(certs.client_key)
    return env


class DevCluster:
    """etcd, `brokers` brokers and `consumers` consumers of `app` (none without it), with
    data and logs under `directory` (module docs). `start` raises `DevClusterError` after
    stopping what it started; `close` stops everything, consumers first."""

    def __init__(
        self,
        directory: Path,
        *,
        brokers: int = 1,
        app: str = "",
        consumers: int = 1,
        consumer_root: str = CONSUMER_ROOT,
        consumer_args: Sequence[str] = (),
        secure: bool = False,
    ) -> None:
        if brokers < 1:
            raise ValueError(f"a cluster needs a broker, not {brokers}")
        self.directory = directory
        self.etcd = EtcdServer(data_dir=directory / "etcd")
        self.n_brokers = brokers
        self.brokers: BrokerCluster | None = None
        self.app = app
        self.n_consumers = consumers if app else 0
        self.consumer_root = consumer_root
        self.consumer_args = list(consumer_args)
        self.consumers: list[ConsumerProcess] = []
        self.secure = secure
        self.secure_env: dict[str, str] = {}
        """With `secure`, the environment of every process (`secure_environment`)."""

    def _secure(self) -> None:
        """Certificates and a key for the run; etcd to serve TLS with them."""
        certs = write_certs(self.directory / "certs")
        key = base64.b64encode(os.urandom(32)).decode()
        self.secure_env = secure_environment(certs, key)
        self.etcd.tls = certs.etcd_tls()
        env_file = self.directory / "secure.env"
        fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"export {k}={self.secure_env[k]}\n" for k in CLIENT_VARIABLES)

    def start(self) -> DevCluster:
        """Start etcd, the brokers, then the consumers, each waited for until ready."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if self.secure:
                self._secure()
            self.etcd.start()
            zones = [("zone-a", "zone-b")[i % 2] for i in range(self.n_brokers)]
            self.brokers = BrokerCluster(
                self.etcd.endpoint,
                root=BROKER_ROOT,
                spool_root=self.directory / "brokers",
                zones=zones,
                extra_env=self.secure_env,
            )
            self.brokers.start()
            env = {"PYTHONPATH": _with_cwd(os.environ.get("PYTHONPATH", "")), **self.secure_env}
            for i in range(self.n_consumers):
                c = ConsumerProcess(
                    self.app,
                    self.etcd.endpoint,
                    self.brokers.endpoints,
                    root=self.consumer_root,
                    zone=zones[i % len(zones)],
                    suffix=f"consumer-{i}",
                    workdir=self.directory / "consumers" / f"consumer-{i}",
                    extra_env=env,
                    extra_args=["--drain-timeout", "0", *self.consumer_args],
                )
                self.consumers.append(c)
                c.start()
        except (ProcessUnavailable, OSError, RuntimeError) as err:
            self.close()
            raise DevClusterError(str(err)) from err
        return self

    def processes(self) -> list[ReadyProcess]:
        """The brokers and consumers."""
        return [*(self.brokers.brokers if self.brokers else []), *self.consumers]

    def environment(self, *, secrets: bool = False) -> dict[str, str]:
        """The variables that point ``gazctl`` (and ``gazette-consumer``) at this cluster;
        with `secrets`, and the cluster secure, the clients' TLS files and key too."""
        env = {"ETCD_ADDRESS": self.etcd.endpoint}
        if secrets:
            env.update({k: self.secure_env[k] for k in CLIENT_VARIABLES if k in self.secure_env})
        if self.brokers is not None:
            env["BROKER_ADDRESS"] = self.brokers.endpoints[0]
        if self.consumers:
            # Every consumer: gazctl passes over one that is down for the next.
            env["CONSUMER_ADDRESS"] = ",".join(c.endpoint for c in self.consumers)
        return env

    def gazctl(self, *args: str) -> str:
        """Run ``gazctl ARGS`` against the cluster; its output. Raises `DevClusterError`
        with its error output if it fails, or does not finish within `GAZCTL_TIMEOUT`."""
        argv = [sys.executable, "-m", "gazette.gazctl.main", *args]
        try:
            proc = subprocess.run(
                argv,
                env={**os.environ, **self.environment(secrets=True)},
                capture_output=True,
                text=True,
                timeout=GAZCTL_TIMEOUT,
            )
        except subprocess.TimeoutExpired as err:
            raise DevClusterError(
                f"gazctl {' '.join(args)}: no answer within {GAZCTL_TIMEOUT:.0f}s"
            ) from err
        if proc.returncode != 0:
            raise DevClusterError(f"gazctl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout + proc.stderr

    def apply_journals(self, specs: Path) -> str:
        return self.gazctl("journals", "apply", "--specs", str(specs))

    def apply_shards(self, specs: Path) -> str:
        if not self.consumers:
            raise DevClusterError(f"{specs}: shards need consumers (--app)")
        return self.gazctl("shards", "apply", "--specs", str(specs))

    def exited(self) -> ReadyProcess | None:
        """A process that exited on its own, if one did."""
        for p in [*(self.brokers.brokers if self.brokers else []), *self.consumers]:
            if p.proc is not None and p.proc.poll() is not None:
                return p
        return None

    def describe(self) -> str:
        """The addresses, log files and environment, as `main` prints them."""
        lines = [f"etcd       {self.etcd.endpoint}  (log {self.directory / 'etcd' / 'etcd.log'})"]
        for b in self.brokers.brokers if self.brokers else []:
            lines.append(f"broker     {b.endpoint}  {b.zone}#{b.suffix}  (log {b.log_path})")
        for c in self.consumers:
            lines.append(
                f"consumer   {c.endpoint}  http {c.http_endpoint}  {c.zone}#{c.suffix}  "
                f"(log {c.log_path})"
            )
        if self.consumers:
            lines.append(f"app        {self.app} under {self.consumer_root}")
        lines.append(f"data       {self.directory}")
        exports = " ".join(f"{k}={v}" for k, v in self.environment().items())
        lines.append(f"gazctl     export {exports}")
        if self.secure:
            lines.append(
                f"secure     . {self.directory / 'secure.env'}  (the clients' TLS files and "
                "auth key: TLS and authorization are on)"
            )
        return "\n".join(lines)

    def close(self) -> None:
        """Stop the consumers (SIGTERM to all, then each waited for), the brokers, etcd."""
        for c in self.consumers:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
        for c in self.consumers:
            c.close()
        if self.brokers is not None:
            for b in self.brokers.brokers:
                if b.proc is not None and b.proc.poll() is None:
                    b.proc.send_signal(signal.SIGTERM)
            self.brokers.close()
        self.etcd.stop()

    def __enter__(self) -> DevCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _with_cwd(pythonpath: str) -> str:
    """`pythonpath` with the current directory first: the application's module is found
    where the user runs the command, as ``python -m`` finds it."""
    return os.pathsep.join([os.getcwd(), *(p for p in pythonpath.split(os.pathsep) if p)])


class _HelpFormatter(argparse.HelpFormatter):
    """Help that ends each option's text with its default, as the other commands' help does,
    unless the default says nothing (None, empty, a flag off) or the text states it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default" in text
            or default is None
            or default is False
            or default in ("", [], argparse.SUPPRESS)
        ):
            return text
        return f"{text} (default: %(default)s)"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gazette-dev",
        description="Run etcd, brokers and (with --app) consumers of an application on free "
        "loopback ports until Ctrl-C, applying journal and shard specs.",
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--brokers", type=int, default=1, help="brokers to run")
    p.add_argument(
        "--journals",
        type=Path,
        action="append",
        default=[],
        help="journal specs to apply (gazctl journals apply); repeatable",
    )
    p.add_argument(
        "--app",
        default="",
        help="consumer application, package.module:Name; without it, no consumers run",
    )
    p.add_argument("--consumers", type=int, default=1, help="consumers of --app to run")
    p.add_argument("--root", default=CONSUMER_ROOT, help="etcd root of the application's consumers")
    p.add_argument(
        "--shards",
        type=Path,
        action="append",
        default=[],
        help="shard specs to apply (gazctl shards apply) once the consumers run; repeatable",
    )
    p.add_argument(
        "--consumer-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="a flag for every consumer, e.g. --consumer-arg=--app.top-n=5; repeatable",
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="directory of the processes' data and logs, kept at the stop (default: a new "
        "one under the temporary directory)",
    )
    p.add_argument(
        "--secure",
        action="store_true",
        help="TLS and authorization on everywhere, with certificates and a key made for the "
        "run (docs/security.md)",
    )
    return p


class _Interrupted(Exception):
    """A signal arrived while the cluster was starting (raised from the signal handler, so
    that a process's start or a spec's apply is abandoned where it is)."""


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    """Run the cluster until SIGINT/SIGTERM (module docs); the exit status."""
    p = _parser()
    a = p.parse_args(argv)
    if a.brokers < 1:
        p.error(f"--brokers must be at least 1, not {a.brokers}")
    if a.shards and not a.app:
        p.error("--shards needs --app: shards are served by the application's consumers")
    for spec in [*a.journals, *a.shards]:
        if not spec.is_file():
            p.error(f"{spec}: no such file")
    directory = a.dir or Path(tempfile.mkdtemp(prefix="gazette-dev-"))
    stop = threading.Event()
    starting = [True]  # until ready: a signal interrupts the start-up where it is

    def on_signal(sig: int, _frame: object) -> None:
        stop.set()
        if starting[0]:
            starting[0] = False  # a second signal does not interrupt the clean-up
            raise _Interrupted(signal.Signals(sig).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    cluster = DevCluster(
        directory.resolve(),
        brokers=a.brokers,
        app=a.app,
        consumers=a.consumers,
        consumer_root=a.root,
        consumer_args=a.consumer_arg,
        secure=a.secure,
    )
    status = 0
    try:
        consumers = f", {a.consumers} consumer(s) of {a.app}" if a.app else ""
        say(f"starting etcd, {a.brokers} broker(s){consumers} in {directory}")
        cluster.start()
        for spec in a.journals:
            say(f"applying journals {spec}")
            say(cluster.apply_journals(spec).rstrip())
        for spec in a.shards:
            say(f"applying shards {spec}")
            say(cluster.apply_shards(spec).rstrip())
        say(cluster.describe())
        starting[0] = False
        say(f"{READY_LINE}: Ctrl-C stops everything")
        while not stop.wait(0.5):
            gone = cluster.exited()
            if gone is not None:
                assert gone.proc is not None
                code = gone.proc.returncode
                say(f"{gone.name} {gone.endpoint} exited with {code}; its log ends:")
                say(gone.tail_log())
                status = 1
                break
    except DevClusterError as err:
        say(f"gazette-dev: {err}")
        status = 1
    except _Interrupted as err:
        say(f"gazette-dev: {err} during start-up")
        status = 130
    finally:
        starting[0] = False
        say("stopping")
        cluster.close()
        # A signal that interrupted a process's launch (after its fork, before the cluster
        # held it) leaves a child the cluster does not know of: stop every child still here.
        for pid in _stop_children(timeout=10.0):
            say(f"stopped child process {pid} left by the interrupted start-up")
        say(f"stopped; data and logs are in {directory}")
    return status


def _children() -> list[int]:
    """The process ids of this process's live children (from /proc)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == me and fields[0] != "Z":
            found.append(int(entry))
    return found


def _stop_children(timeout: float) -> list[int]:
    """SIGTERM this process's remaining children, SIGKILL those alive after `timeout`
    seconds, reap them all; their process ids."""
    pids = _children()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _children() and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in _children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return pids


if __name__ == "__main__":
    sys.exit(main())
