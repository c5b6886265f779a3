"""FuseMount: starts and controls a fusefs process from an asyncio program.

    mount = await FuseMount.start(endpoint, log, fsm, author, backing, mountpoint)
    ...  # use files under mountpoint; fsync = committed to the log
    await mount.barrier()  # everything recorded so far is committed
    await mount.stop()     # commits, unmounts, returns the final FSM

The FSM to record onwards from (a Player's result after `inject_handoff(author)`, or a new
FSM with ``fence_log=True``) is handed to the process in a pickle file; the backing directory
must hold exactly the files of that FSM (what the Player left there).

Starting a fusefs process costs about 0.35 s before it can mount (the interpreter and its
imports). A `ServerPool` keeps processes started ahead of need (`PrestartedServer`: imports
done, waiting for a mount's configuration on their control pipe), so that a hot standby
promoted to primary mounts at once; `FuseMount.start(..., prestarted=...)` uses one. A
pre-started process exits when its control pipe closes.

No stale mount is left if either process dies: the fusefs process stops and unmounts when
its control pipe closes or on SIGTERM (its parent-death signal); if the fusefs process dies,
`stop`/`kill`/`close` (and `FuseMount.start` on failure) detach the mount with
``fusermount3 -u -z``. `FuseMount.exited` says whether the process is gone (an owner that did
not end it learns so: its recording is lost).

The event loop must collect a process's exit and pipes before it closes: left to the loop's
teardown, they fail to close ("Event loop is closed"). `stop` and `kill` do; an owner that
kills the process synchronously (`RocksDBStore.destroy`) hands the rest to
`FuseMount.collect_later`, and the program awaits `collect_killed` before its loop ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gazette._extras import require
from gazette.fusefs._config import MountConfig, dump_fsm, load_fsm
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.hints import hints_from_json

__all__ = [
    "FuseMount",
    "MountFailed",
    "MountStopped",
    "PrestartedServer",
    "ServerPool",
    "collect_killed",
    "force_unmount",
    "is_mounted",
    "mounts_under",
    "play_for_mount",
]

log = logging.getLogger(__name__)


class MountFailed(Exception):
    """The fusefs process failed to mount, or a command to it failed."""


class MountStopped(MountFailed):
    """The fusefs process is gone (stopped, killed or crashed)."""


def is_mounted(mountpoint: str | os.PathLike[str]) -> bool:
    """Whether `mountpoint` appears in /proc/mounts (a live or a dead FUSE mount)."""
    target = os.path.abspath(os.fspath(mountpoint))
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 1 and fields[1].replace("\\040", " ") == target:
                return True
    return False


def mounts_under(root: str | os.PathLike[str]) -> list[str]:
    """Mountpoints in /proc/mounts at or beneath `root` (live or dead FUSE mounts)."""
    prefix = os.path.realpath(os.fspath(root))
    with open("/proc/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f if len(line.split()) > 1]
    return [p for p in points if p == prefix or p.startswith(prefix + os.sep)]


def force_unmount(mountpoint: str | os.PathLike[str]) -> None:
    """Lazily detach `mountpoint` if it is mounted (a dead fusefs process leaves it so)."""
    mp = os.path.abspath(os.fspath(mountpoint))
    if not is_mounted(mp):
        return
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u", "-z", mp] if tool else ["umount", "-l", mp]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0 and is_mounted(mp):
        subprocess.run(["umount", "-l", mp], capture_output=True, check=False)
    log.info("detached mount mountpoint=%s", mp)


class FuseMount:
    """A running fusefs process (module docs). Create with `start`."""

    def __init__(self, proc: asyncio.subprocess.Process, cfg: MountConfig, tmp: Path) -> None:
        self.proc = proc
        self.config = cfg
        self.mountpoint = Path(cfg.mountpoint)
        self.write_head = 0
        self._tmp = tmp
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._gone = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def exited(self) -> bool:
        """Whether the fusefs process has exited (or is a zombie), whoever ended it. Exact at
        the call, before the event loop has noticed the exit."""
        return self.proc.returncode is not None or not _running(self.proc.pid)

    @classmethod
    async def start(
        cls,
        endpoint: str,
        log_name: str,
        fsm: FSM,
        author: int,
        backing: str | os.PathLike[str],
        mountpoint: str | os.PathLike[str],
        *,
        fence_log: bool | None = None,
        writeback: bool = True,
        direct_writes: Sequence[str] = (),
        timeout: float = 30.0,
        log_level: str | None = None,
        prestarted: PrestartedServer | None = None,
    ) -> FuseMount:
        """Start a fusefs process recording `backing` (mounted at `mountpoint`) into
        `log_name` as `author`, onwards from `fsm`; return once it is mounted. With
        `prestarted` (still running, of the same `log_level`), that process mounts instead
        of a new one (a new one is started if it cannot be used).

        `writeback`: whether the kernel's write-back cache is on. `direct_writes`: file-name
        suffixes (e.g. ``(".log",)``) of files whose opens for writing bypass the page cache,
        so that each write reaches fusefs as one request: for files written in appends and
        seldom read back, like a database's write-ahead log, written by one open at a time
        (docs/fusefs.md).

        Raises `MountFailed` if the process exits or fails to mount within `timeout`, and
        ValueError for a `direct_writes` that is a string or holds anything but non-empty
        strings.
        """
        if isinstance(direct_writes, str) or not all(
            isinstance(s, str) and s for s in direct_writes
        ):
            raise ValueError(
                f"direct_writes must be non-empty file-name suffixes, such as ('.log',), "
                f"not {direct_writes!r}"
            )
        t0 = time.monotonic()
        backing, mountpoint = Path(backing).resolve(), Path(mountpoint).resolve()
        try:
            mountpoint.mkdir(parents=True, exist_ok=True)
            force_unmount(mountpoint)  # A stale mount of an earlier, dead process.
            tmp = Path(tempfile.mkdtemp(prefix="fusefs-"))
            try:
                cfg = MountConfig(
                    endpoint=endpoint,
                    log=log_name,
                    author=author,
                    backing=str(backing),
                    mountpoint=str(mountpoint),
                    fsm_in=str(tmp / "fsm.in"),
                    fsm_out=str(tmp / "fsm.out"),
                    fence_log=fence_log,
                    writeback=writeback,
                    direct_writes=tuple(direct_writes),
                    parent_pid=os.getpid(),
                    hand_over_dir=str(tmp),
                )
                with open(cfg.fsm_in, "wb") as f:
                    f.write(dump_fsm(fsm, 0))
                (tmp / "config.json").write_text(cfg.dumps())
                proc = None
                if prestarted is not None and prestarted.log_level == log_level:
                    proc = await prestarted.hand(tmp / "config.json")
                if proc is None:
                    proc = await _spawn(str(tmp / "config.json"), log_level)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            if prestarted is not None:
                await prestarted.close()  # Unless it was handed the mount.
        self = cls(proc, cfg, tmp)
        self._reader = asyncio.get_running_loop().create_task(self._read_replies())
        try:
            async with asyncio.timeout(timeout):
                ready = await self._ready
        except BaseException:
            await self.kill()
            raise
        self.write_head = int(ready.get("write_head", 0))
        log.info(
            "fusefs ready pid=%d mountpoint=%s log=%s prestarted=%s seconds=%.3f",
            proc.pid,
            mountpoint,
            log_name,
            prestarted is not None and proc is prestarted.proc,
            time.monotonic() - t0,
        )
        return self

    async def _read_replies(self) -> None:
        assert self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    log.warning("fusefs pid=%d wrote a non-JSON line: %r", self.proc.pid, line)
                    continue
                if msg.get("ready"):
                    if not self._ready.done():
                        self._ready.set_result(msg)
                    continue
                fut = self._replies.pop(msg.get("id", -1), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        finally:
            self._gone = True
            err = MountStopped(f"fusefs process {self.proc.pid} exited")
            if not self._ready.done():
                self._ready.set_exception(err)
            for fut in self._replies.values():
                if not fut.done():
                    fut.set_exception(err)
            self._replies.clear()

    async def _command(self, cmd: str) -> dict[str, Any]:
        if self._gone or self.proc.stdin is None:
            raise MountStopped(f"fusefs process {self.proc.pid} is gone")
        ident = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[ident] = fut
        try:
            self.proc.stdin.write((json.dumps({"cmd": cmd, "id": ident}) + "\n").encode())
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError) as err:
            self._replies.pop(ident, None)
            raise MountStopped(f"fusefs process {self.proc.pid} is gone") from err
        return await fut

    async def barrier(self) -> int:
        """Wait until every operation recorded so far is committed to the log; return the
        log's write head. Raises `MountFailed` if recording failed (e.g. fenced), or
        `MountStopped`. Writes still in the kernel's cache are not covered: fsync them."""
        reply = await self._command("barrier")
        if not reply.get("ok"):
            raise MountFailed(reply.get("error", "barrier failed"))
        self.write_head = int(reply["write_head"])
        return self.write_head

    async def build_hints(self) -> rpb.FSMHints:
        """FSMHints of everything recorded so far, returned once committed (for a Player to
        read only live segments). Raises `MountFailed` if recording failed."""
        reply = await self._command("hints")
        if not reply.get("ok"):
            raise MountFailed(reply.get("error", "hints failed"))
        return hints_from_json(reply["hints"])

    async def stats(self) -> dict[str, Any]:
        reply = await self._command("stats")
        return dict(reply["stats"])

    async def stop(self, timeout: float = 60.0) -> tuple[FSM, int] | None:
        """Commit what is recorded, unmount, and wait for the process to exit. Returns the
        final (FSM, write head) if everything recorded was committed, else None (recording
        had failed). Close files under the mount first (it is detached lazily otherwise)."""
        result: tuple[FSM, int] | None = None
        try:
            if not self._gone:
                with contextlib.suppress(MountStopped):
                    async with asyncio.timeout(timeout):
                        reply = await self._command("stop")
                        await self.proc.wait()
                    if not reply.get("ok"):
                        log.warning("fusefs stop: %s", reply.get("error"))
                    elif os.path.exists(self.config.fsm_out):
                        with open(self.config.fsm_out, "rb") as f:
                            result = load_fsm(f.read())
        finally:
            await self.kill()
        return result

    async def kill(self) -> None:
        """Kill the process if it still runs and detach the mount; idempotent."""
        if not self.exited:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self._collect()
        force_unmount(self.mountpoint)
        self.remove_hand_over()

    async def _collect(self) -> None:
        """Wait for the ended process's exit and the end of both its pipes: the loop then has
        closed everything of it (module docs)."""
        stdin = self.proc.stdin
        if stdin is not None:
            stdin.close()
            with contextlib.suppress(Exception):  # A pipe broken by the process's death.
                await stdin.wait_closed()
        await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                await self._reader

    def collect_later(self) -> None:
        """For an owner that killed the process itself and cannot wait (`RocksDBStore.destroy`
        runs outside the loop's awaits): collect its exit and pipes on the loop in the
        background; `collect_killed` waits for every such collection."""
        task = asyncio.get_running_loop().create_task(self._collect())
        _collecting.add(task)
        task.add_done_callback(_collecting.discard)

    def remove_hand_over(self) -> None:
        """Remove the files handed to the process (its configuration and FSMs), as `kill`
        does, for an owner which ended the process itself."""
        shutil.rmtree(self._tmp, ignore_errors=True)

    async def __aenter__(self) -> FuseMount:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


_collecting: set[asyncio.Task[None]] = set()
"""Collections started by `FuseMount.collect_later`, until done."""


async def collect_killed() -> None:
    """Wait until every process handed to `FuseMount.collect_later` is collected. A program
    that destroys RocksDB stores calls it before its event loop ends (module docs)."""
    while _collecting:
        await asyncio.wait(set(_collecting))


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is neither a zombie nor dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


async def _spawn(config: str, log_level: str | None) -> asyncio.subprocess.Process:
    """A fusefs process of `config` (a file's path, or "-": read it from the control pipe)."""
    require("the fusefs process", "rocksdb", "pyfuse3", "trio")
    env = dict(os.environ)
    if log_level is not None:
        env["FUSEFS_LOG_LEVEL"] = log_level
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gazette.fusefs.server",
        config,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )


class PrestartedServer:
    """A fusefs process started ahead of need, waiting for a mount's configuration (module
    docs). `FuseMount.start` takes it; `close` ends it if it was not taken."""

    def __init__(self, proc: asyncio.subprocess.Process, log_level: str | None) -> None:
        self.proc = proc
        self.log_level = log_level
        self.taken = False

    @classmethod
    async def start(cls, log_level: str | None = None) -> PrestartedServer:
        return cls(await _spawn("-", log_level), log_level)

    @property
    def usable(self) -> bool:
        """Not taken, and still running."""
        return not self.taken and self.proc.returncode is None

    async def hand(self, config: Path) -> asyncio.subprocess.Process | None:
        """Give the process the configuration file `config` (it then mounts as one started
        with it); None if it is not usable (then nothing was handed)."""
        if not self.usable or self.proc.stdin is None:
            return None
        self.taken = True
        try:
            self.proc.stdin.write(os.fsencode(config) + b"\n")
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError):
            await self._end()
            return None
        return self.proc

    async def close(self) -> None:
        """End the process if it was not taken (closing its control pipe; killing it if it
        does not exit at once)."""
        if not self.taken:
            self.taken = True
            await self._end()

    async def _end(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            async with asyncio.timeout(5.0):
                await self.proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


REFILL_DELAY = 1.0
"""Seconds a `ServerPool` waits after a `take` before starting the replacement: the store
that took a server mounts, opens its database and commits its first transaction meanwhile,
without a new interpreter's imports (~0.45 s of CPU) competing with it for the cores."""


class ServerPool:
    """Up to `size` `PrestartedServer`s kept ready. Idle until `reserve` is first called
    (a process with no fusefs stores starts none); `take` returns one if ready, and starts
    another in the background, `refill_delay` seconds later (`REFILL_DELAY`)."""

    def __init__(
        self, size: int = 1, log_level: str | None = None, refill_delay: float = REFILL_DELAY
    ) -> None:
        self.size = size
        self.log_level = log_level
        self.refill_delay = refill_delay
        self._ready: list[PrestartedServer] = []
        self._starting: asyncio.Task[None] | None = None
        self._delaying = False  # `_starting` waits out the refill delay (it spawned nothing).
        self._wanted = False
        self._closed = False

    def reserve(self) -> None:
        """Have servers ready from now on (started in the background)."""
        self._wanted = True
        self._refill()

    def take(self, log_level: str | None = None) -> PrestartedServer | None:
        """A ready server (of `log_level`), or None (a store then starts its own)."""
        if log_level != self.log_level:
            return None
        self._ready = [s for s in self._ready if s.usable]
        out = self._ready.pop(0) if self._ready else None
        self._refill(self.refill_delay if out is not None else 0.0)
        return out

    def _refill(self, delay: float = 0.0) -> None:
        if self._closed or not self._wanted or self._starting is not None:
            return
        if len(self._ready) < self.size:
            self._delaying = delay > 0
            self._starting = asyncio.get_running_loop().create_task(self._start_one(delay))

    async def _start_one(self, delay: float = 0.0) -> None:
        try:
            if delay:
                await asyncio.sleep(delay)
                self._delaying = False
            server = await PrestartedServer.start(self.log_level)
        except Exception as err:  # noqa: BLE001 - a store then starts its own
            log.warning("cannot start a fusefs process ahead: %r", err)
            return
        finally:
            self._starting = None
        if self._closed:
            await server.close()
            return
        self._ready.append(server)
        self._refill()

    async def close(self) -> None:
        """End every server not taken."""
        self._closed = True
        if self._starting is not None:
            if self._delaying:
                self._starting.cancel()
            await asyncio.wait([self._starting])  # It ends what it started.
        for server in self._ready:
            await server.close()
        self._ready.clear()


async def play_for_mount(
    client: Any, log_name: str, backing: str | os.PathLike[str], author: int, hints: Any = None
) -> FSM:
    """Play `log_name` into `backing` (wiped first) and hand the log off to `author`: the
    returned FSM is what `FuseMount.start` records onwards from (with the default
    ``fence_log``). `client` is a `JournalClient`; `hints` optional `FSMHints`."""
    from gazette.recoverylog.player import TAIL, Player

    player = Player(client, log_name, hints, Path(backing))
    player.inject_handoff(author)
    return await player.play(TAIL)
