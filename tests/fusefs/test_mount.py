"""fusefs end to end against a real broker and a real FUSE mount: fsync means committed to
the log, a clean stop leaves a log that plays back byte for byte, unrecordable operations
fail with an errno, a fenced mount's fsync fails, and no mount outlives its processes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import signal
import sys
from pathlib import Path

import pytest

from gazette.broker.client import JournalClient
from gazette.fusefs import FuseMount, MountFailed, is_mounted, play_for_mount
from gazette.recoverylog.fsm import FSM
from gazette.recoverylog.player import Player
from gazette.testing.broker import BrokerProcess
from tests.fusefs.support import MakeLog, client, fuse_broker, make_log, no_stale_mounts, tree
from tests.kit.eventually import eventually

__all__ = ["client", "fuse_broker", "make_log", "no_stale_mounts"]

A, B = 0xA11CE, 0xB0B


async def _mount(
    client: JournalClient, endpoint: str, log: str, root: Path, author: int = A, **kw: object
) -> FuseMount:
    fsm = await play_for_mount(client, log, root / "backing", author)
    return await FuseMount.start(endpoint, log, fsm, author, root / "backing", root / "mnt", **kw)  # type: ignore[arg-type]


def _fsync_write(path: Path, data: bytes, mode: str = "wb") -> None:
    with open(path, mode) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


async def _in_thread(fn: object, *args: object) -> object:
    return await asyncio.to_thread(fn, *args)  # type: ignore[arg-type]


async def _played(client: JournalClient, log: str, into: Path) -> dict[str, bytes]:
    """The tree a whole playback of `log` into `into` leaves."""
    await Player(client, log, None, into).play()
    return tree(into)


@pytest.mark.parametrize("writeback", [True, False])
async def test_fsync_is_committed(
    client: JournalClient,
    fuse_broker: BrokerProcess,
    make_log: MakeLog,
    no_stale_mounts: Path,
    writeback: bool,
) -> None:
    log = await make_log()
    root = no_stale_mounts
    mount = await _mount(client, fuse_broker.endpoint, log, root, writeback=writeback)
    try:
        mnt = mount.mountpoint
        big = random.Random(1).randbytes(3 << 20)

        def work() -> None:
            _fsync_write(mnt / "a", b"hello")
            _fsync_write(mnt / "a", b" world", "ab")
            (mnt / "d" / "e").mkdir(parents=True)
            _fsync_write(mnt / "d" / "e" / "big", big)
            _fsync_write(mnt / "tmp", b"renamed")
            os.rename(mnt / "tmp", mnt / "d" / "r")
            os.link(mnt / "a", mnt / "a2")
            _fsync_write(mnt / "gone", b"x" * 100)
            os.unlink(mnt / "gone")
            _fsync_write(mnt / "t", b"0123456789")
            os.truncate(mnt / "t", 4)
            with open(mnt / "t", "ab") as f:  # Grow by writing past a hole-free end.
                f.write(b"!")
                os.fsync(f.fileno())
            with open(mnt / "a2", "r+b") as f:
                os.fsync(f.fileno())

        await _in_thread(work)
        # Nothing stopped: the fsyncs alone put everything in the log.
        await Player(client, log, None, root / "play").play()
        want = {
            "a": b"hello world",
            "a2": b"hello world",
            "d/e/big": big,
            "d/r": b"renamed",
            "t": b"0123!",
        }
        assert tree(root / "play") == want
        assert tree(mnt) == want
        stats = await mount.stats()
        assert stats["error"] is None and stats["barriers"] >= 6
    finally:
        assert await mount.stop() is not None
    assert not is_mounted(root / "mnt")


async def test_clean_stop_plays_back_identically(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log()
    root = no_stale_mounts
    rnd = random.Random(7)
    for round_ in range(2):  # The second round records onwards from a played-back tree.
        mount = await _mount(client, fuse_broker.endpoint, log, root, author=A + round_)
        mnt = mount.mountpoint
        stopped = False

        def churn(mnt: Path = mnt) -> None:
            names = [f"f{i}" for i in range(12)]
            for _ in range(300):
                n, op = rnd.choice(names), rnd.random()
                p = mnt / n
                if op < 0.5:
                    mode = rnd.choice(["wb", "ab", "r+b"]) if p.exists() else "wb"
                    with open(p, mode) as f:
                        if mode == "r+b":
                            f.seek(rnd.randrange(max(1, p.stat().st_size)))
                        f.write(rnd.randbytes(rnd.randrange(1, 70000)))
                elif op < 0.65 and p.exists():
                    os.rename(p, mnt / rnd.choice(names))
                elif op < 0.75 and p.exists():
                    os.unlink(p)
                elif op < 0.85 and p.exists():
                    os.truncate(p, rnd.randrange(p.stat().st_size + 100))
                elif op < 0.9 and p.exists() and not (mnt / (n + ".l")).exists():
                    os.link(p, mnt / (n + ".l"))

        try:
            await _in_thread(churn)
            result = await mount.stop()
            stopped = True
        finally:
            if not stopped:
                await mount.stop()
        assert result is not None
        assert not is_mounted(mnt)
        played = root / f"play{round_}"
        assert await _played(client, log, played) == tree(root / "backing")
        assert len(tree(played)) > 3


async def test_file_removed_while_open(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    """A descriptor kept open on a file another one deleted (as the RocksDB store keeps its
    WAL files open to sync them) still syncs, takes attribute changes and closes without an
    error; none of it is recorded."""
    log = await make_log()
    mount = await _mount(client, fuse_broker.endpoint, log, no_stale_mounts)
    try:
        mnt = mount.mountpoint

        def work() -> None:
            _fsync_write(mnt / "kept", b"live")
            keep = os.open(mnt / "wal", os.O_RDONLY | os.O_CREAT, 0o644)
            with open(mnt / "wal", "ab") as f:
                f.write(b"x" * 5000)  # Dirty pages of a file about to be deleted.
            os.unlink(mnt / "wal")
            os.fdatasync(keep)
            os.utime(keep, ns=(1, 2))  # setattr of the removed file.
            os.fchmod(keep, 0o600)
            assert os.fstat(keep).st_mtime_ns == 2
            os.close(keep)  # Writes back its times first: no EIO.
            kept2 = os.open(mnt / "wal2", os.O_RDONLY | os.O_CREAT, 0o644)  # Found first.
            w = os.open(mnt / "wal2", os.O_RDWR)
            os.write(w, b"y" * 5000)
            os.unlink(mnt / "wal2")
            os.ftruncate(w, 10)  # Through the writable descriptor, not the first one found.
            assert os.fstat(w).st_size == 10
            os.truncate(f"/proc/self/fd/{w}", 20)  # No descriptor given: a writable one.
            assert os.fstat(w).st_size == 20
            os.close(kept2)
            os.close(w)

        await _in_thread(work)
        assert (await mount.stats())["error"] is None
    finally:
        assert await mount.stop() is not None
    assert await _played(client, log, no_stale_mounts / "play") == {"kept": b"live"}


async def test_unrecordable_ops_fail(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log()
    mount = await _mount(client, fuse_broker.endpoint, log, no_stale_mounts)
    try:
        mnt = mount.mountpoint

        def work() -> list[int]:
            codes = []
            for fn in (
                lambda: os.symlink("a", mnt / "s"),
                lambda: os.mkfifo(mnt / "p"),
                lambda: os.setxattr(mnt, "user.x", b"1"),
            ):
                try:
                    fn()
                    codes.append(0)
                except OSError as err:
                    codes.append(err.errno)
            _fsync_write(mnt / "ok", b"still fine")
            return codes

        codes = await _in_thread(work)
        assert codes == [errno.EPERM, errno.EPERM, errno.ENOTSUP]
        assert (await mount.stats())["refused"] == 3
    finally:
        assert await mount.stop() is not None
    assert await _played(client, log, no_stale_mounts / "play") == {"ok": b"still fine"}


async def test_fenced_mount_fails_fsync(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log()
    root = no_stale_mounts
    mount = await _mount(client, fuse_broker.endpoint, log, root)
    try:
        mnt = mount.mountpoint
        await _in_thread(_fsync_write, mnt / "a", b"before")
        # A new primary takes the log over.
        await play_for_mount(client, log, root / "new", B)

        def after() -> int:
            try:
                _fsync_write(mnt / "a", b"after", "ab")
            except OSError as err:
                return err.errno or -1
            return 0

        assert await _in_thread(after) == errno.EIO
        with pytest.raises(MountFailed):
            await mount.barrier()
        # Later mutations fail at once.
        assert await _in_thread(after) == errno.EIO
    finally:
        assert await mount.stop() is None  # Recording had failed.
    assert await _played(client, log, root / "play") == {"a": b"before"}


async def test_killed_fusefs_leaves_no_mount(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    log = await make_log()
    mount = await _mount(client, fuse_broker.endpoint, log, no_stale_mounts)
    os.kill(mount.pid, signal.SIGKILL)
    await mount.proc.wait()
    # The process's guardian detaches its dead mount (nobody else is asked to).
    await eventually(
        lambda: not is_mounted(mount.mountpoint),
        what="the killed process's mount detached",
        timeout=5,
        interval=0.05,
    )
    with pytest.raises(MountFailed):
        await mount.barrier()
    await mount.stop()
    assert not is_mounted(mount.mountpoint)


async def test_sigterm_stops_cleanly(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    """SIGTERM stops the process: what was written is committed, the mount is detached, and
    it exits normally, even when more SIGTERMs arrive while it stops (a parent's death can
    send two, and an operator may repeat it)."""
    log = await make_log()
    root = no_stale_mounts
    mount = await _mount(client, fuse_broker.endpoint, log, root)
    await _in_thread(_fsync_write, root / "mnt" / "a", b"kept")
    while mount.proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(mount.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(mount.proc.wait()), 0.002)
    assert mount.proc.returncode == 0
    assert not is_mounted(mount.mountpoint)
    await mount.stop()
    assert await _played(client, log, root / "play") == {"a": b"kept"}


async def _start_parent(script: str, *args: str) -> asyncio.subprocess.Process:
    """A Python process running `script` with `args`, on the code under test, its stdout
    piped to us."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        stdout=asyncio.subprocess.PIPE,
        env=dict(os.environ),
    )


_PARENT = """
import asyncio, os, signal, sys
from gazette.broker.client import JournalClient
from gazette.fusefs import FuseMount, play_for_mount

async def main(endpoint: str, log: str, root: str, how: str) -> None:
    async with JournalClient(endpoint) as client:
        fsm = await play_for_mount(client, log, root + "/backing", 1)
    mount = await FuseMount.start(endpoint, log, fsm, 1, root + "/backing", root + "/mnt")
    print(os.path.dirname(mount.config.fsm_in), flush=True)
    if how == "stopped_then_dying":  # As a death signal ahead of the parent's end.
        await asyncio.sleep(0.5)
        os.kill(mount.pid, signal.SIGTERM)
        while not os.path.exists(mount.config.fsm_out):  # Its stop is all but done.
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        os._exit(0)
    await asyncio.sleep(3600)

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.parametrize("how", ["killed", "stopped_then_dying"])
async def test_a_mount_outliving_its_parent_cleans_up(
    fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path, how: str
) -> None:
    """The parent of a mount is SIGKILLed, or dies just after the stop signal (as a
    SIGKILLed parent of many threads does: its death signal comes as its first thread
    ends): the fusefs process stops, detaches its mount and removes the hand-over files its
    parent would have removed."""
    log = await make_log()
    parent = await _start_parent(_PARENT, fuse_broker.endpoint, log, str(no_stale_mounts), how)
    assert parent.stdout is not None
    hand_over = Path((await asyncio.wait_for(parent.stdout.readline(), 60)).decode().strip())
    assert (hand_over / "config.json").exists()
    assert is_mounted(no_stale_mounts / "mnt")
    if how == "killed":
        parent.kill()
    await parent.wait()

    def cleaned_up() -> bool:
        assert not is_mounted(no_stale_mounts / "mnt"), "still mounted"
        assert not hand_over.exists(), "the hand-over files remain"
        return True

    await eventually(cleaned_up, what="the mount's clean-up", timeout=10, interval=0.05)


_UNREACHABLE_PARENT = """
import os, subprocess, sys
from gazette.fusefs._config import MountConfig, dump_fsm
from gazette.recoverylog.fsm import FSM

root = sys.argv[1]
hand_over = root + "/hand-over"
os.makedirs(hand_over)
with open(hand_over + "/fsm.in", "wb") as f:
    f.write(dump_fsm(FSM("unreachable/log"), 0))
cfg = MountConfig(  # A broker nobody answers at: Recorder.open retries its fence forever.
    endpoint="127.0.0.1:1", log="unreachable/log2", author=1, backing=root + "/backing",
    mountpoint=root + "/mnt", fsm_in=hand_over + "/fsm.in", fence_log=True,
    parent_pid=os.getpid(), hand_over_dir=hand_over,
)
with open(hand_over + "/config.json", "w") as f:
    f.write(cfg.dumps())
proc = subprocess.Popen(
    [sys.executable, "-m", "gazette.fusefs.server", hand_over + "/config.json"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(root + "/fusefs.log", "wb"),
)
print(proc.pid, flush=True)
if sys.argv[2] == "signal":
    print("exit", proc.wait(), flush=True)
else:
    proc.wait()
"""


def _blocks_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigBlk:"))
    return bool(mask & 1 << (signal.SIGTERM - 1))


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("how", ["signal", "parent_killed"])
async def test_a_mount_stopped_during_its_set_up_exits(no_stale_mounts: Path, how: str) -> None:
    """The fusefs process is stopped while its set-up still waits (here, for a broker that
    never answers): it exits instead of retrying forever, and an orphan removes its
    hand-over files. Before, the stop signal stayed blocked until the mount was up."""
    root = no_stale_mounts
    parent = await _start_parent(_UNREACHABLE_PARENT, str(root), how)
    assert parent.stdout is not None
    pid = int(await asyncio.wait_for(parent.stdout.readline(), 60))
    await eventually(
        lambda: _blocks_sigterm(pid),
        what="the fusefs process blocking the stop signals (its imports done)",
        timeout=30,
        interval=0.05,
    )
    await asyncio.sleep(0.5)  # Into Recorder.open's retries.
    assert _pid_alive(pid)
    if how == "signal":
        os.kill(pid, signal.SIGTERM)
        line = await asyncio.wait_for(parent.stdout.readline(), 10)
        assert line.split() == [b"exit", b"1"]
        assert b"stopped before the mount" in (root / "fusefs.log").read_bytes()
        assert (root / "hand-over" / "config.json").exists()  # Its parent's to remove.
    else:
        parent.kill()
        await eventually(
            lambda: not _pid_alive(pid),
            what="the orphaned fusefs process gone",
            timeout=10,
            interval=0.05,
        )
        assert not (root / "hand-over").exists()
    await parent.wait()
    assert not is_mounted(root / "mnt")


@pytest.mark.parametrize("writeback", [True, False])
async def test_reused_backing_inodes(
    client: JournalClient,
    fuse_broker: BrokerProcess,
    make_log: MakeLog,
    no_stale_mounts: Path,
    writeback: bool,
) -> None:
    """RocksDB's pattern: write a file, read it, delete it, write another (the backing file
    system reuses the inode number): the kernel must never serve the old file's cached pages
    or attributes for the new one."""
    log = await make_log()
    mount = await _mount(client, fuse_broker.endpoint, log, no_stale_mounts, writeback=writeback)
    try:
        mnt = mount.mountpoint

        def work() -> list[str]:
            bad = []
            for i in range(200):
                a, b = mnt / f"OPTIONS-{i:06d}", mnt / f"OPTIONS-{i:06d}.dbtmp"
                _fsync_write(b, b"%d" % i * (100 + i))
                os.rename(b, a)
                if a.read_bytes() != b"%d" % i * (100 + i):
                    bad.append(a.name)
                if i:
                    os.unlink(mnt / f"OPTIONS-{i - 1:06d}")
            return bad

        assert await _in_thread(work) == []
    finally:
        assert await mount.stop() is not None
    assert await _played(client, log, no_stale_mounts / "play") == {"OPTIONS-000199": b"199" * 299}


@pytest.mark.parametrize("writeback", [False, True])
async def test_direct_writes_reach_fusefs_whole(
    client: JournalClient,
    fuse_broker: BrokerProcess,
    make_log: MakeLog,
    no_stale_mounts: Path,
    writeback: bool,
) -> None:
    """A write beginning inside a page the kernel does not hold reaches fusefs as two
    requests through the page cache (RocksDB's WAL appends, each after a write that ended
    mid-page), as one when its file is opened with direct I/O (`direct_writes`, the RocksDB
    store's WAL files); a reader that cached the file's first page still reads what was
    written, and the log holds it. With the write-back cache, cached writes reach fusefs
    later (their count is not checked), direct ones at once."""
    log = await make_log()
    mount = await _mount(
        client,
        fuse_broker.endpoint,
        log,
        no_stale_mounts,
        writeback=writeback,
        direct_writes=[".log"],
    )
    rnd = random.Random(5)
    head, body = rnd.randbytes(100), rnd.randbytes(119_000)
    try:
        mnt = mount.mountpoint

        async def fuse_writes(name: str, cached_reader: bool) -> tuple[int, bytes]:
            """The FUSE writes of an unaligned 119,000-byte write to `name` after a 100-byte
            one, and the first 8 KiB read back (by a reader which read the first page before
            the write, if `cached_reader`)."""
            w = os.open(mnt / name, os.O_CREAT | os.O_WRONLY, 0o644)
            r = -1
            try:
                os.write(w, head)
                r = os.open(mnt / name, os.O_RDONLY)
                if cached_reader:
                    assert os.pread(r, 4096, 0) == head
                n0 = (await mount.stats())["writes"]
                await _in_thread(os.write, w, body)
                n1 = (await mount.stats())["writes"]
                read = os.pread(r, 8192, 0)
                os.fsync(w)
            finally:
                os.close(w)
                if r >= 0:
                    os.close(r)
            return n1 - n0, read

        want = (head + body)[:8192]
        sst_writes, sst_read = await fuse_writes("000005.sst", cached_reader=False)
        assert sst_read == want and (writeback or sst_writes == 2)
        assert await fuse_writes("000004.log", cached_reader=False) == (1, want)
        assert await fuse_writes("000006.log", cached_reader=True) == (1, want)
    finally:
        assert await mount.stop() is not None
    assert await _played(client, log, no_stale_mounts / "play") == {
        name: head + body for name in ("000004.log", "000005.sst", "000006.log")
    }


async def test_direct_writes_must_be_suffixes(no_stale_mounts: Path) -> None:
    """A bare string (each of its characters a suffix) or an empty suffix (every file) is
    refused before anything starts."""
    for bad in (".log", [".log", ""], [b".log"]):
        with pytest.raises(ValueError, match="direct_writes must be non-empty"):
            await FuseMount.start(
                "127.0.0.1:1",
                "a/log",
                FSM("a/log"),
                A,
                no_stale_mounts / "backing",
                no_stale_mounts / "mnt",
                direct_writes=bad,  # type: ignore[arg-type]
            )
    assert not (no_stale_mounts / "mnt").exists()


async def test_unsynced_writes_are_throttled(
    client: JournalClient, fuse_broker: BrokerProcess, make_log: MakeLog, no_stale_mounts: Path
) -> None:
    """A writer that never fsyncs waits for the log every 64 MiB: the fusefs process's
    memory stays bounded however fast it writes."""
    log = await make_log()
    mount = await _mount(client, fuse_broker.endpoint, log, no_stale_mounts)
    try:
        chunk = random.Random(3).randbytes(1 << 20)

        def work() -> None:
            with open(mount.mountpoint / "big", "wb") as f:
                for _ in range(200):
                    f.write(chunk)

        await _in_thread(work)
        stats = await mount.stats()
        assert stats["barriers"] >= 2
        hwm_kib = next(
            int(ln.split()[1])
            for ln in Path(f"/proc/{mount.pid}/status").read_text().splitlines()
            if ln.startswith("VmHWM:")
        )
        assert hwm_kib < 400 << 10, f"fusefs peak RSS {hwm_kib} KiB"
    finally:
        assert await mount.stop() is not None
