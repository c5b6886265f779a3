"""Run a real, throwaway PostgreSQL server (Debian `postgresql`) for tests.

`PostgresServer` runs ``initdb`` into a temporary directory and then the ``postgres`` server
itself (not ``pg_ctl``, so that this object owns the process), listening on 127.0.0.1 on a
free port with its unix socket in the temporary directory. It never touches a cluster the
Debian package may have created. PostgreSQL refuses to run as root: as root, both run as user
``postgres`` (created by the Debian package; ``nobody`` otherwise) and the directory is
chown'ed to it. Binaries are those of the newest ``/usr/lib/postgresql/<version>/bin``, or
of ``$PG_BIN``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from gazette.testing.etcd import free_port

__all__ = ["PostgresServer", "PostgresUnavailable", "postgres_bin_dir"]


class PostgresUnavailable(RuntimeError):
    """PostgreSQL binaries are missing, or the server did not become ready."""


def postgres_bin_dir() -> Path:
    """The directory of ``initdb`` and ``postgres``. Raises `PostgresUnavailable`."""
    candidates = []
    if env := os.environ.get("PG_BIN"):
        candidates.append(Path(env))

    def version(d: str) -> tuple[int, ...]:
        name = Path(d).parent.name
        return tuple(int(p) for p in name.split(".") if p.isdigit())

    candidates += [Path(d) for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version)][
        ::-1
    ]
    for d in candidates:
        if os.access(d / "initdb", os.X_OK) and os.access(d / "postgres", os.X_OK):
            return d
    raise PostgresUnavailable(
        "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin: install Debian package "
        "postgresql (`make deps`), or set PG_BIN"
    )


def _run_as() -> tuple[int, int] | None:
    """The (uid, gid) to run PostgreSQL as, or None to run as this process's user."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        return pw.pw_uid, pw.pw_gid
    raise PostgresUnavailable("running as root, and neither user postgres nor nobody exists")


class PostgresServer:
    """A running PostgreSQL server. Use as a context manager, or `start()` and `stop()`.

    `conninfo` is a libpq connection string for database ``postgres`` as superuser
    ``postgres`` (trust authentication on loopback).
    """

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.directory: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    @property
    def log_path(self) -> Path:
        assert self.directory is not None
        return self.directory / "postgres.log"

    def start(self, timeout: float = 60.0) -> PostgresServer:
        bin_dir = postgres_bin_dir()
        owner = _run_as()
        # Not under pytest's tmp dirs: those are 0700 root, untraversable by user postgres.
        self.directory = Path(tempfile.mkdtemp(prefix="gazette-postgres-"))
        data, sock = self.directory / "data", self.directory / "sock"
        sock.mkdir()
        if owner is not None:
            for p in (self.directory, sock):
                os.chown(p, *owner)
        user_args: dict[str, Any] = {}
        if owner is not None:
            user_args = {"user": owner[0], "group": owner[1], "extra_groups": []}
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        env.pop("PGDATA", None)
        init = subprocess.run(
            [
                str(bin_dir / "initdb"),
                f"--pgdata={data}",
                "--username=postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            cwd=self.directory,
            env=env,
            capture_output=True,
            check=False,
            **user_args,
        )
        if init.returncode != 0:
            self._cleanup()
            raise PostgresUnavailable(
                f"initdb failed ({init.returncode}): {init.stderr.decode(errors='replace')}"
            )
        self.port = self.port or free_port()
        log = open(self.log_path, "ab")
        if owner is not None:
            os.chown(self.log_path, *owner)
        self._proc = subprocess.Popen(
            [
                str(bin_dir / "postgres"),
                "-D",
                str(data),
                "-p",
                str(self.port),
                "-k",
                str(sock),
                "-c",
                "listen_addresses=127.0.0.1",
                # A test database: durability of the host's disk is not what is tested.
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "shared_buffers=32MB",
                "-c",
                "max_connections=50",
            ],
            cwd=self.directory,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **user_args,
        )
        log.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        assert self._proc is not None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise PostgresUnavailable(f"postgres exited with {self._proc_rc}: {tail}")
            try:
                with psycopg.connect(self.conninfo, connect_timeout=1) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                time.sleep(0.1)
        self.stop()
        raise PostgresUnavailable(f"postgres did not become ready within {timeout}s")

    @property
    def _proc_rc(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    def stop(self) -> None:
        """Stop the server (fast shutdown: sessions are disconnected) and remove its files."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
