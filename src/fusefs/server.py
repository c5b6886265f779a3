"""The fusefs process: ``python -m gazette.fusefs.server CONFIG``.

Mounts a `RecordingOperations` filesystem (pyfuse3 on trio, main thread) over the backing
directory and records into the recovery log through a Recorder on an asyncio loop in a
second thread (see docs/fusefs.md). CONFIG is a JSON file written by `FuseMount` (`MountConfig`
fields); the recovered FSM is read from the pickle file it names.

Control protocol (one JSON object per line): commands on stdin, replies on stdout.
``{"ready": true, "write_head": N}`` once mounted; ``{"cmd": "barrier", "id": I}`` ->
``{"id": I, "ok": true, "write_head": N}`` (or ``"ok": false, "error": ...``);
``{"cmd": "stats", "id": I}``; ``{"cmd": "hints", "id": I}`` -> ``"hints"``: FSMHints
as JSON, once committed; ``{"cmd": "stop", "id": I}`` commits what is recorded,
unmounts, writes the final FSM (if ``fsm_out``) and replies before the process exits.
End of stdin (the parent died), SIGTERM (its death signal) and SIGINT also stop the mount,
without a reply; before the mount is up, the signals end the set-up and the process exits
with status 1. Logs go to stderr.

The process reaches the brokers with the TLS and authorization of its ``BROKER_*``
environment (`gazette.auth.client_settings.broker_client`), which a consumer sets from its
own settings before it spawns any; nothing secret is written to CONFIG.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import faulthandler
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pyfuse3
import trio

from gazette.fusefs._config import MountConfig, dump_fsm, load_fsm
from gazette.fusefs._ops import RecordingOperations
from gazette.fusefs._recording import RecordingLink
from gazette.recoverylog.handover import set_parent_death_signal
from gazette.recoverylog.hints import hints_to_json
from gazette.recoverylog.recorder import RecordingFailed

__all__ = ["MountConfig", "main"]

log = logging.getLogger("gazette.fusefs.server")

TICK = 0.05  # Seconds between hand-overs of queued ops to the Recorder's loop.
STOP_BARRIER_TIMEOUT = 10.0  # Longest wait for the final barrier of a stop.
STOP_DEADLINE = 30.0  # A stop taking longer detaches the mount and exits.
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


_GUARDIAN = r"""
import signal, subprocess, sys
signal.pthread_sigmask(signal.SIG_SETMASK, [])  # Not the stop signals' mask of fusefs.
mnt = sys.argv[1]
mount_id = sys.stdin.readline().strip()
sys.stdin.read()  # Returns at EOF: the fusefs process is gone, however it ended.
with open("/proc/self/mountinfo") as f:
    stale = any(ln.split()[0] == mount_id and ln.split()[4] == mnt for ln in f)
if mount_id and stale:
    subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True, check=False)
"""


def _start_guardian(mountpoint: str) -> subprocess.Popen[bytes]:
    """A small process which detaches our mount once this process is gone, however it ends
    (even SIGKILL): it waits for EOF on a pipe only this process holds. Told the mount's id,
    it never touches a later mount at the same path."""
    return subprocess.Popen(
        [sys.executable, "-c", _GUARDIAN, mountpoint],
        stdin=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )


def _mount_id(mountpoint: str) -> str:
    found = ""
    with open("/proc/self/mountinfo") as f:
        for ln in f:
            fields = ln.split()
            if fields[4] == mountpoint:
                found = fields[0]
    return found


_deadline_armed = threading.Lock()


def _arm_stop_deadline(cfg: MountConfig) -> None:
    """Past `STOP_DEADLINE` from now, detach the mount and exit, whatever hangs meanwhile
    (once per process)."""
    if _deadline_armed.acquire(blocking=False):
        threading.Thread(target=_stop_deadline, args=(cfg,), daemon=True).start()


def _stop_deadline(cfg: MountConfig) -> None:
    time.sleep(STOP_DEADLINE)
    log.error(
        "stop did not complete in %.0fs: detaching %s and exiting", STOP_DEADLINE, cfg.mountpoint
    )
    subprocess.run(["fusermount3", "-u", "-z", cfg.mountpoint], check=False)
    _remove_orphaned_hand_over(cfg)
    os._exit(3)


def _remove_orphaned_hand_over(cfg: MountConfig, wait: float = 0.0) -> None:
    """Once the parent is gone, nobody will read the final FSM or remove the files it handed
    over (this configuration among them): remove them. Waits up to `wait` seconds for it to
    be gone: the death signal comes as the parent's thread which started this process exits,
    and the kernel then hands this process to another of the parent's threads, so a quick
    stop can end before the rest of a SIGKILLed parent has (`getppid()` still names it)."""
    if not cfg.hand_over_dir or not cfg.parent_pid:
        return
    deadline = time.monotonic() + wait
    control = select.poll()  # The control pipe hangs up once the parent is gone, too.
    control.register(0, 0)  # (Hang-ups are reported anyway; nothing pending is read.)
    while os.getppid() == cfg.parent_pid:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return  # The parent lives: the files are its to remove.
        if any(ev & select.POLLHUP for _, ev in control.poll(min(remaining, 0.02) * 1000)):
            break
    shutil.rmtree(cfg.hand_over_dir, ignore_errors=True)


def _read_line(fd: int) -> str:
    """One line from `fd`, read a byte at a time (nothing after it is consumed: the control
    commands that follow are read by `_Server`); "" at the end of the input."""
    line = bytearray()
    while (b := os.read(fd, 1)) and b != b"\n":
        line += b
    return line.decode() if b else ""


class _LoopThread:
    """An asyncio loop in a daemon thread, hosting the client, AppendService and Recorder."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="recorder-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


async def _wait(cfut: concurrent.futures.Future[Any]) -> Any:
    return await trio.to_thread.run_sync(cfut.result)


class _Server:
    def __init__(self, cfg: MountConfig) -> None:
        self.cfg = cfg
        self.lt = _LoopThread()
        self.stack = contextlib.AsyncExitStack()
        self.link: RecordingLink
        self.ops: RecordingOperations
        self.stopping = trio.Event()
        self.stop_reply: int | None = None
        self.mounted = False
        # Where a stop signal goes: the set-up (cancelled), then the mount's nursery.
        self.setup: concurrent.futures.Future[Any] | None = None
        self.nursery: trio.Nursery | None = None
        self.stop_signal: int | None = None  # The first stop signal taken.
        self.parent_lost = False  # Stopped on seeing the parent gone.

    async def _setup(self) -> tuple[RecordingLink, int]:
        # Runs on the asyncio loop.
        from gazette.auth.client_settings import broker_client
        from gazette.broker.client import AppendService, JournalClient
        from gazette.recoverylog.recorder import Recorder

        with open(self.cfg.fsm_in, "rb") as f:
            fsm, _ = load_fsm(f.read())
        # The brokers' TLS and authorization are the parent's, handed down in BROKER_* (the
        # consumer exports its settings there): never in the configuration file.
        tls, auth = broker_client()
        client = await self.stack.enter_async_context(
            JournalClient(self.cfg.endpoint, tls=tls, auth=auth)
        )
        svc = await self.stack.enter_async_context(AppendService(client))
        rec = await Recorder.open(
            fsm, self.cfg.author, self.cfg.backing, svc, self.cfg.log, fence_log=self.cfg.fence_log
        )
        return RecordingLink(rec, asyncio.get_running_loop()), rec.write_head

    async def _teardown(self) -> None:
        # Runs on the asyncio loop.
        try:
            rec = self.link.recorder
            if self.link.error is None and rec.error is None:
                await rec.close()
                if self.cfg.fsm_out:
                    tmp = self.cfg.fsm_out + ".tmp"
                    with open(tmp, "wb") as f:
                        f.write(dump_fsm(rec.fsm, rec.write_head))
                    os.rename(tmp, self.cfg.fsm_out)
        finally:
            await self.stack.aclose()

    def reply(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg) + "\n").encode()
        try:
            os.write(1, data)
        except OSError:
            pass

    def stats(self) -> dict[str, Any]:
        rec = self.link.recorder
        return {
            "ops": self.link.ops,
            "bytes": self.link.bytes,
            "barriers": self.link.barriers,
            "reads": self.ops.reads,
            "writes": self.ops.writes,
            "refused": self.ops.refused,
            "write_head": rec.write_head,
            "ops_recorded": rec.ops_recorded,
            "bytes_recorded": rec.bytes_recorded,
            "error": repr(self.link.error) if self.link.error is not None else None,
            "fenced": self.link.fenced,
            "cpu_s": round(sum(os.times()[:2]), 3),
        }

    async def run(self) -> bool:
        """Mount, serve until stopped, unmount. False if stopped before the mount."""
        cfg = self.cfg
        token = trio.lowlevel.current_trio_token()
        threading.Thread(target=self._take_signals, args=(token,), daemon=True).start()
        self.setup = self.lt.submit(self._setup())
        try:
            self.link, head = await _wait(self.setup)
        except concurrent.futures.CancelledError:
            # Nothing was mounted or written (the fence's append may have landed). The client
            # is not closed: its AppendService would wait for the fence's append, which may
            # be what hangs (it dies with the process).
            log.warning("stopped before the mount (set-up cancelled)")
            self.lt.stop()
            return False
        self.ops = RecordingOperations(
            cfg.backing, self.link, writeback=cfg.writeback, direct_writes=cfg.direct_writes
        )
        options = set(pyfuse3.default_options)
        options.discard("default_permissions")
        options |= {"fsname=gazette-fusefs", "subtype=gazette"}
        guardian = _start_guardian(cfg.mountpoint)
        pyfuse3.init(self.ops, cfg.mountpoint, options)
        self.mounted = True
        assert guardian.stdin is not None
        guardian.stdin.write(_mount_id(cfg.mountpoint).encode() + b"\n")
        guardian.stdin.flush()
        log.info("mounted mountpoint=%s backing=%s log=%s", cfg.mountpoint, cfg.backing, cfg.log)
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self._control, nursery)
                nursery.start_soon(self._ticker)
                nursery.start_soon(self._fuse_main, nursery)
                self.reply({"ready": True, "write_head": head, "pid": os.getpid()})
                if self.stop_signal is not None:  # One came between the set-up and here.
                    nursery.start_soon(self._stop)
        finally:
            self.nursery = None
            pyfuse3.close(unmount=True)
            self.mounted = False
            log.info("unmounted mountpoint=%s", cfg.mountpoint)
        try:
            await _wait(self.lt.submit(self._teardown()))
            result: dict[str, Any] = {"ok": True, "stats": self.stats()}
        except BaseException as err:
            log.error("stop failed: %r", err)
            result = {"ok": False, "error": repr(err), "stats": self.stats()}
        if self.stop_reply is not None:
            self.reply({"id": self.stop_reply, **result})
        self.lt.stop()
        return True

    async def _fuse_main(self, nursery: trio.Nursery) -> None:
        await pyfuse3.main(min_tasks=4, max_tasks=64)
        nursery.cancel_scope.cancel()

    async def _stop(self) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        # Never leave the mount behind, whatever hangs below: past the deadline, detach it
        # and exit.
        _arm_stop_deadline(self.cfg)
        with trio.move_on_after(STOP_BARRIER_TIMEOUT), contextlib.suppress(RecordingFailed):
            await self.link.barrier(confirm=False)
        if self.mounted:  # (Not once closed: pyfuse3 has no session then.)
            pyfuse3.terminate()

    async def _ticker(self) -> None:
        parent = self.cfg.parent_pid
        while True:
            await trio.sleep(TICK)
            self.link.hand_over()
            if parent and os.getppid() != parent and not self.stopping.is_set():
                log.warning("stopping: parent %d is gone", parent)
                self.parent_lost = True
                await self._stop()

    def _take_signals(self, token: trio.lowlevel.TrioToken) -> None:
        # The stop signals stay blocked in every thread for the life of the process (`main`
        # blocked them before any thread began): this thread takes them. A signal delivered
        # to a thread instead would end the process at once (their default action) in the
        # moments a handler is not installed, such as while the mount is torn down.
        while True:
            sig = signal.sigwait(_STOP_SIGNALS)  # One which arrived before is taken now.
            log.warning("stopping on signal=%s", signal.Signals(sig).name)
            # Armed here, not only once trio runs the stop: pyfuse3 reads the FUSE device
            # blocking once it polled readable, and a request withdrawn in between (its
            # process killed) leaves trio's thread stuck in that read, the stop never run.
            _arm_stop_deadline(self.cfg)
            try:
                trio.from_thread.run_sync(self._on_stop_signal, sig, trio_token=token)
            except trio.RunFinishedError:
                return

    def _on_stop_signal(self, sig: int) -> None:
        # Runs in trio. Before the mount, the set-up (e.g. Recorder.open retrying an
        # unreachable broker) is cancelled; once mounted, `_stop` runs as a task of the
        # mount's nursery, as the handlers do: it ends with the mount.
        if self.stop_signal is None:
            self.stop_signal = sig
        if self.nursery is not None:
            with contextlib.suppress(RuntimeError):  # The nursery is closing: stopping already.
                self.nursery.start_soon(self._stop)
        elif self.setup is not None and not self.mounted:
            self.setup.cancel()  # (No effect once the set-up is done.)

    async def _control(self, nursery: trio.Nursery) -> None:
        stream = trio.lowlevel.FdStream(os.dup(0))
        buf = b""
        while True:
            data = await stream.receive_some(65536)
            if not data:
                log.warning("stopping: control channel closed (parent gone)")
                self.parent_lost = True
                await self._stop()
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                nursery.start_soon(self._command, json.loads(line))

    async def _command(self, msg: dict[str, Any]) -> None:
        cmd, ident = msg.get("cmd"), msg.get("id")
        if cmd == "barrier":
            try:
                head = await self.link.barrier()
                self.reply({"id": ident, "ok": True, "write_head": head})
            except RecordingFailed as err:
                self.reply({"id": ident, "ok": False, "error": str(err)})
        elif cmd == "hints":
            try:
                hints = await _wait(self.lt.submit(self.link.recorder.build_hints()))
                self.reply({"id": ident, "ok": True, "hints": hints_to_json(hints).decode()})
            except Exception as err:
                self.reply({"id": ident, "ok": False, "error": repr(err)})
        elif cmd == "stats":
            self.reply({"id": ident, "ok": True, "stats": self.stats()})
        elif cmd == "stop":
            self.stop_reply = ident
            await self._stop()
        else:
            self.reply({"id": ident, "ok": False, "error": f"unknown command {cmd!r}"})


def main(argv: list[str] | None = None) -> None:
    # The backing files hold a store's content: private to our user (docs/file-modes.md),
    # whatever umask the process was started with.
    os.umask(0o077)
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(
        level=os.environ.get("FUSEFS_LOG_LEVEL", "WARNING"),
        stream=sys.stderr,
        format="%(asctime)s fusefs[%(process)d] %(levelname)s %(name)s %(message)s",
    )
    faulthandler.enable()
    path = argv[0]
    if path == "-":
        # Started ahead of need (mount.PrestartedServer), imports done: wait for the
        # configuration's path on the control pipe; its end means not needed after all (also
        # on the parent's death; an interrupt of the process group is the parent's to handle).
        set_parent_death_signal(signal.SIGTERM)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        path = _read_line(0)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if not path:
            sys.exit(0)
    with open(path) as f:
        cfg = MountConfig.loads(f.read())
    # From here, a stop signal waits for one thread to take it (`_Server._take_signals`,
    # started with the set-up): it then cancels the set-up, or stops the mount cleanly.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    set_parent_death_signal(signal.SIGTERM)
    if cfg.parent_pid and os.getppid() != cfg.parent_pid:
        log.error("parent %d is gone before the mount", cfg.parent_pid)
        _remove_orphaned_hand_over(cfg)
        sys.exit(1)
    server = _Server(cfg)
    try:
        if not trio.run(server.run):
            sys.exit(1)
    finally:
        # Stopped by the parent's death signal, or on seeing it gone, not by its command: it
        # may still be on its way out.
        dying = server.parent_lost or server.stop_signal == signal.SIGTERM
        _remove_orphaned_hand_over(cfg, wait=1.0 if dying and server.stop_reply is None else 0)


if __name__ == "__main__":
    main()
