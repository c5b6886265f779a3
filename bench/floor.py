"""Floor benchmark: what shipping each commit's bytes over Python gRPC costs a store, with
every component of ours removed.

The stores' targets (SQLite <= 1.25x native, RocksDB <= 1.5x) are ratios against an embedded
database on local disk. This bench measures, in the same run and on the same workloads as
`bench/sqlite.py` and `bench/rocksdb.py`, what the cheapest possible recording costs:

- native: the database alone (apsw WAL ``synchronous=FULL``; rocksdict ``sync=True`` writes).
- awaited: each commit's new WAL bytes (captured by a pass-through APSW VFS; for RocksDB read
  back from the WAL files) are sent as one bare grpc.aio client-streaming call shaped like a
  Gazette Append (a request message, the content in 256 KiB messages, an empty commit
  message), and the call is awaited before the next transaction. Nothing is synced locally:
  as in the stores, a commit is made durable by the log.
- inproc: the same calls from the same process, the next transaction running (in a thread)
  while the previous call is in flight.
- shipper: the bytes are handed over a unix socket to a second process that makes the calls,
  one call at a time and in order, with up to `--inflight` commits queued (the most favourable
  process layout for 2 cores; the shipper's start-up is not timed).
- consumer, consumer_shipper: as inproc and shipper, under a Gazette consumer's rule for
  transactions: transaction i's work (the SQLite statements; the RocksDB WriteBatch) runs
  while commit i-1 is in flight, but transaction i commits (locally, then to the log) only
  once commit i-1 is in the log. inproc and shipper let the next transaction commit locally
  while the previous commit is still in flight, which a consumer's store may not do: its
  checkpoint, written in the same local transaction, is only known once the consumer starts
  the commit, after the previous one completed.

The server is a bare grpc.aio servicer in its own process doing only the per-byte work our
broker does for an append: two SHA1 sums of every byte (the spool's and the commit's) and a
write to a file. No Recorder, AppendService, broker, FUSE or page store takes part, so
each ratio is a floor for a store recording through Python gRPC on this machine. With
`--transport tcp`, the calls are frames on a plain TCP stream instead, as our brokers'
direct-append port takes them (docs/direct-appends.md): the floor without gRPC.

Prints progress on stderr, then one JSON line: per mode, the median over `--runs` of its time
over the native time of the same run, and their range. `--quick` runs in under a minute.
"""

from __future__ import annotations

import os.path
import sys

# This script shares its name with no package, but keep its directory off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse
import asyncio
import hashlib
import importlib.util
import json
import select
import socket
import statistics
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import apsw
import grpc
from grpc import aio

from gazette.testing.process import free_port

_HERE = os.path.dirname(os.path.abspath(__file__))
CHUNK = 256 << 10  # Content message size, as the client's appends.
REQUEST = b"R" * 40  # Stands for the Append's first message (journal and parameters).
_METHOD = "/floor.Floor/Append"
_END = 0xFFFFFFFF  # Shipper frame length that ends the stream.
_READY, _ACK, _DONE = b"R", b"A", b"Z"  # What the shipper says.
_TIMEOUT = 60.0  # Longest wait for the shipper or the server.


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _sibling(name: str) -> ModuleType:
    """Another bench script of this directory, as a module (for its workload)."""
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", os.path.join(_HERE, f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _identity(b: bytes) -> bytes:
    return b


# -- The bare server ----------------------------------------------------------------------------


async def serve(addr: str, path: str) -> None:
    """A servicer doing what the append protocol requires of any broker, and nothing else."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    spool = hashlib.sha1()

    async def append(requests: Any, _context: Any) -> bytes:
        commit = hashlib.sha1()
        n = 0
        first = True
        async for msg in requests:
            if first or not msg:  # The request message, or the empty commit message.
                first = False
                continue
            spool.update(msg)
            commit.update(msg)
            os.write(fd, msg)
            n += len(msg)
        return n.to_bytes(8, "little") + commit.digest()

    server = aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    handler = grpc.stream_unary_rpc_method_handler(append, _identity, _identity)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("floor.Floor", {"Append": handler})]
    )
    server.add_insecure_port(addr)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def serve_tcp(host: str, port: int, path: str) -> None:
    """The same work as `serve`, over direct-append-like frames on a plain TCP stream (a
    u32 length, then a message; length 0 commits)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    spool = hashlib.sha1()

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                (n,) = struct.unpack("<I", await reader.readexactly(4))
            except asyncio.IncompleteReadError:
                return
            await reader.readexactly(n)  # The request message.
            commit = hashlib.sha1()
            total = 0
            while (n := struct.unpack("<I", await reader.readexactly(4))[0]) != 0:
                msg = await reader.readexactly(n)
                spool.update(msg)
                commit.update(msg)
                os.write(fd, msg)
                total += n
            writer.write(total.to_bytes(8, "little") + commit.digest())

    server = await asyncio.start_server(conn, host, port, limit=1 << 20)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


class TcpLink:
    """Append-shaped calls to `serve_tcp`, one at a time on one connection."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def close(self) -> None:
        if self.conn is not None:
            self.conn[1].close()

    async def append(self, data: bytes) -> bytes:
        if self.conn is None:
            self.conn = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        reader, writer = self.conn
        writer.write(struct.pack("<I", len(REQUEST)) + REQUEST)
        for i in range(0, len(data), CHUNK):
            chunk = data[i : i + CHUNK]
            writer.write(struct.pack("<I", len(chunk)))
            writer.write(chunk)
        writer.write(struct.pack("<I", 0))
        await writer.drain()
        return await reader.readexactly(28)


def link(addr: str) -> Link | TcpLink:
    """A link to the server at `addr`: ``tcp://host:port`` for `serve_tcp`, else gRPC."""
    if addr.startswith("tcp://"):
        host, port = addr.removeprefix("tcp://").rsplit(":", 1)
        return TcpLink(host, int(port))
    return Link(addr)


class Link:
    """Bare Append-shaped calls to the server."""

    def __init__(self, addr: str) -> None:
        self.channel = aio.insecure_channel(addr)
        self._call = self.channel.stream_unary(_METHOD, _identity, _identity)

    async def close(self) -> None:
        await self.channel.close()

    async def append(self, data: bytes) -> bytes:
        call = self._call()
        await call.write(REQUEST)
        for i in range(0, len(data), CHUNK):
            await call.write(data[i : i + CHUNK])
        await call.write(b"")
        await call.done_writing()
        return bytes(await call)


# -- The shipper process ------------------------------------------------------------------------


async def ship(fd: int, addr: str, inflight: int) -> None:
    """Read length-prefixed commits from socket `fd` and append each, one call at a time and in
    order (as a journal's appends go), acknowledging each with one byte. Commits received
    while a call is in flight queue behind it (the writer bounds them to `inflight`). Says
    ``R`` once warmed up; a failed call ends the process (the writer then sees EOF)."""
    to = link(addr)
    await to.append(b"warm-up")
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    writer.write(_READY)
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=inflight)

    async def send() -> None:
        while (data := await queue.get()) is not None:
            await to.append(data)
            writer.write(_ACK)

    async def receive() -> None:
        while True:
            (n,) = struct.unpack("<I", await reader.readexactly(4))
            if n == _END:
                break
            await queue.put(await reader.readexactly(n))
        await queue.put(None)

    sender = asyncio.create_task(send())
    receiver = asyncio.create_task(receive())
    done, _ = await asyncio.wait([sender, receiver], return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        if task.exception() is not None:
            say(f"shipper failed: {task.exception()!r}")
            os._exit(1)
    await sender
    writer.write(_DONE)
    await writer.drain()


class Shipper:
    """The writer's end of a shipper process. Returns once the process is ready (started and
    warmed up), so that its start-up is not timed."""

    def __init__(self, addr: str, inflight: int) -> None:
        self.sock, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--ship", str(theirs.fileno()), addr, str(inflight)],
            pass_fds=[theirs.fileno()],
        )
        theirs.close()
        self.sock.settimeout(_TIMEOUT)  # A stuck shipper fails the bench, never hangs it.
        self.inflight = inflight
        self.pending = 0
        try:
            self._expect(_READY)
        except BaseException:
            self.kill()
            raise

    def send(self, data: bytes) -> None:
        self.sock.sendall(struct.pack("<I", len(data)) + data)
        self.pending += 1
        while self.pending > self.inflight:
            self._acks()

    def drain(self) -> None:
        while self.pending:
            self._acks()

    def _acks(self) -> None:
        got = self.sock.recv(4096)
        if not got:
            raise RuntimeError(f"the shipper process ended (exit status {self.proc.poll()})")
        if got.strip(_ACK):
            raise RuntimeError(f"unexpected bytes from the shipper: {got[:16]!r}")
        self.pending -= len(got)

    def _expect(self, what: bytes) -> None:
        got = self.sock.recv(1)
        if got != what:
            raise RuntimeError(f"the shipper said {got!r}, not {what!r}")

    def close(self) -> None:
        """Ship what is pending, then end the shipper."""
        self.drain()
        self.sock.sendall(struct.pack("<I", _END))
        self._expect(_DONE)
        self.proc.wait(timeout=_TIMEOUT)
        self.sock.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.sock.close()


# -- Workloads ------------------------------------------------------------------------------------


class CapturingVFS(apsw.VFS):
    """The default VFS, keeping a copy of every write to a WAL file and syncing nothing: a
    recorded store's commits are made durable by the log, not by a local fsync (the
    SQLite store's VFS never syncs local files)."""

    def __init__(self, name: str) -> None:
        super().__init__(name, "")
        self.name = name
        self.captured: list[bytes] = []

    def xOpen(self, name: Any, flags: Any) -> apsw.VFSFile:
        return _CapturingFile(self, name, flags)

    def take(self) -> bytes:
        out = b"".join(self.captured)
        self.captured.clear()
        return out


class _CapturingFile(apsw.VFSFile):
    def __init__(self, vfs: CapturingVFS, name: Any, flags: Any) -> None:
        super().__init__("", name, flags)
        filename = name.filename() if hasattr(name, "filename") else str(name)
        self._sink = vfs.captured if filename.endswith("-wal") else None

    def xWrite(self, data: bytes, offset: int) -> None:
        super().xWrite(data, offset)
        if self._sink is not None:
            self._sink.append(bytes(data))

    def xSync(self, flags: int) -> None:
        pass


Txn = Callable[[int], bytes]


class Opened:
    """An open workload: `work(i)` does transaction i's work (no commit), `commit(i)` commits it
    and returns the bytes it added to the WAL (empty natively); `close()` closes."""

    def __init__(self, work: Callable[[int], None], commit: Txn, close: Callable[[], None]) -> None:
        self.work = work
        self.commit = commit
        self.close = close

    def txn(self, i: int) -> bytes:
        """Transaction i, work and commit."""
        self.work(i)
        return self.commit(i)


class SQLiteWork:
    """bench/sqlite.py's consumer-like workload: a transaction's bytes are its WAL writes."""

    def __init__(self, txns: int) -> None:
        self.b = _sibling("sqlite")
        self.batches = self.b.consumer_batches(txns, 1000)

    def open(self, directory: Path, capture: bool) -> Opened:
        vfs = CapturingVFS(f"floor-{directory.name}") if capture else None
        if vfs is None:
            conn = apsw.Connection(str(directory / "db"))
        else:
            conn = apsw.Connection(str(directory / "db"), vfs=vfs.name)
        conn.execute("PRAGMA cache_size = -65536")
        conn.execute("PRAGMA journal_mode = wal")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(self.b.SCHEMA)
        if vfs:
            vfs.take()

        def work(i: int) -> None:
            conn.execute("BEGIN")
            self.b.apply_batch(conn, self.batches[i])

        def commit(i: int) -> bytes:
            conn.execute("COMMIT")
            return vfs.take() if vfs else b""

        def close() -> None:
            conn.close()
            if vfs is not None:
                vfs.unregister()

        return Opened(work, commit, close)

    def __len__(self) -> int:
        return len(self.batches)


class RocksWork:
    """bench/rocksdb.py's write phase: a transaction's bytes are what its WAL files grew by."""

    def __init__(self, puts: int) -> None:
        self.b = _sibling("rocksdb")
        self.batches, _ = self.b.workload(puts, 1000, 1)

    def open(self, directory: Path, capture: bool) -> Opened:
        from rocksdict import Rdict, WriteBatch, WriteOptions

        from gazette.stores.rocksdb.store import CHECKPOINT_KEY, recorded_options

        db = Rdict(str(directory), recorded_options())
        sync = WriteOptions()
        sync.sync = not capture  # Recorded, a commit is made durable by the log instead.
        sizes: dict[str, int] = {}

        def grown() -> bytes:
            out = []
            for name in sorted(os.listdir(directory)):
                if name.endswith(".log"):
                    try:
                        f = open(directory / name, "rb")  # noqa: SIM115
                    except FileNotFoundError:
                        continue  # Deleted since the listing (its memtable was flushed).
                    with f:
                        f.seek(sizes.get(name, 0))
                        out.append(f.read())
                        sizes[name] = f.tell()
            return b"".join(out)

        batch: list[Any] = []

        def work(i: int) -> None:
            wb = WriteBatch(raw_mode=True)
            for k in self.batches[i]:
                wb.put(self.b.key(k), self.b.VALUE)
            batch[:] = [wb]

        def commit(i: int) -> bytes:
            (wb,) = batch
            wb.put(CHECKPOINT_KEY, self.b.checkpoint("write", i).SerializeToString())
            db.write(wb, sync)
            return grown() if capture else b""

        return Opened(work, commit, db.close)

    def __len__(self) -> int:
        return len(self.batches)


async def run(
    mode: str, work: SQLiteWork | RocksWork, directory: Path, addr: str, inflight: int
) -> tuple[float, int]:
    """Time `work` in `mode`; returns (seconds, bytes shipped)."""
    directory.mkdir()
    db = work.open(directory, capture=mode != "native")
    to = link(addr) if mode in ("awaited", "inproc", "consumer") else None
    shipper: Shipper | None = None
    try:
        if to is not None:
            await to.append(b"warm-up")
        if mode in ("shipper", "consumer_shipper"):
            shipper = Shipper(addr, inflight)
        elapsed, shipped = await _timed(mode, len(work), db, to, shipper)
        if shipper is not None:
            shipper.close()
            shipper = None
    finally:
        if shipper is not None:
            shipper.kill()
        if to is not None:
            await to.close()
        db.close()
    return elapsed, shipped


async def _timed(
    mode: str, n: int, db: Opened, link: Link | TcpLink | None, shipper: Shipper | None
) -> tuple[float, int]:
    shipped = 0
    t0 = time.perf_counter()
    if mode == "native":
        for i in range(n):
            db.txn(i)
    elif mode == "awaited":
        assert link is not None
        for i in range(n):
            data = db.txn(i)
            shipped += len(data)
            await link.append(data)
    elif mode == "inproc":
        assert link is not None
        pending: asyncio.Task[bytes] | None = None
        for i in range(n):
            data = await asyncio.to_thread(db.txn, i)
            shipped += len(data)
            if pending is not None:
                await pending
            pending = asyncio.create_task(link.append(data))
        if pending is not None:
            await pending
    elif mode == "consumer":
        # A consumer's rule: transaction i's work runs while commit i-1 is in flight, but it
        # commits (locally, then to the log) only once commit i-1 is in the log.
        assert link is not None
        pending = None
        for i in range(n):
            await asyncio.to_thread(db.work, i)
            if pending is not None:
                await pending
            data = await asyncio.to_thread(db.commit, i)
            shipped += len(data)
            pending = asyncio.create_task(link.append(data))
        if pending is not None:
            await pending
    elif mode == "consumer_shipper":
        assert shipper is not None
        for i in range(n):
            db.work(i)
            shipper.drain()  # Commit i-1 is in the log.
            data = db.commit(i)
            shipped += len(data)
            shipper.send(data)
        shipper.drain()
    else:
        assert shipper is not None
        for i in range(n):
            data = db.txn(i)
            shipped += len(data)
            shipper.send(data)
        shipper.drain()
    return time.perf_counter() - t0, shipped


def measure(
    name: str,
    work: SQLiteWork | RocksWork,
    modes: tuple[str, ...],
    tmp: Path,
    addr: str,
    runs: int,
    inflight: int,
) -> dict[str, float]:
    """Each run times every mode once, native first; a mode's ratio is paired with the native
    time of its own run. Returns the median ratio of each mode and their range."""
    ratios: dict[str, list[float]] = {m: [] for m in modes[1:]}
    natives = []
    for r in range(runs):
        native = 0.0
        for mode in modes:
            s, shipped = asyncio.run(run(mode, work, tmp / f"{name}-{mode}-{r}", addr, inflight))
            if mode == "native":
                native = s
                natives.append(s)
                say(f"  {name} run {r}: native: {s:.3f} s")
                continue
            ratios[mode].append(s / native)
            say(
                f"  {name} run {r}: {mode}: {s:.3f} s = {s / native:.2f}x, "
                f"{shipped / (1 << 20):.1f} MiB shipped"
            )
    out: dict[str, Any] = {f"{name}_native_s": round(statistics.median(natives), 3)}
    for mode, rs in ratios.items():
        out[f"{name}_ratio_{mode}"] = round(statistics.median(rs), 3)
        out[f"{name}_ratio_{mode}_range"] = [round(min(rs), 3), round(max(rs), 3)]
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        if sys.argv[2].startswith("tcp://"):
            host, port = sys.argv[2].removeprefix("tcp://").rsplit(":", 1)
            asyncio.run(serve_tcp(host, int(port), sys.argv[3]))
            return
        asyncio.run(serve(sys.argv[2], sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--ship":
        asyncio.run(ship(int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small run (< 1 minute)")
    parser.add_argument("--runs", type=int, default=0, help="alternating runs of each mode")
    parser.add_argument(
        "--inflight", type=int, default=2, help="commits queued for the shipper (one in flight)"
    )
    parser.add_argument(
        "--transport",
        choices=("grpc", "tcp"),
        default="grpc",
        help="how commits reach the server: bare grpc.aio calls, or frames on a plain TCP "
        "stream as the brokers' direct-append port (docs/direct-appends.md)",
    )
    args = parser.parse_args()
    runs = args.runs or 3
    txns = 200 if args.quick else 1000  # As bench/sqlite.py.
    puts = 200_000 if args.quick else 1_000_000  # As bench/rocksdb.py's write phase.
    with tempfile.TemporaryDirectory(prefix="bench-floor-", dir="/var/tmp") as t:
        tmp = Path(t)
        addr = f"127.0.0.1:{free_port()}"  # TCP on loopback, as the stores reach their broker.
        if args.transport == "tcp":
            addr = f"tcp://{addr}"
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", addr, str(tmp / "spool")], stdout=subprocess.PIPE
        )
        try:
            assert server.stdout is not None
            ready, _, _ = select.select([server.stdout], [], [], _TIMEOUT)
            if not ready or server.stdout.readline().strip() != b"ready":
                raise SystemExit("the bare server did not start")
            say(
                f"sqlite: {txns} transactions of 1000 rows; rocksdb: {puts} puts in batches "
                f"of 1000; {runs} runs"
            )
            modes = ("native", "awaited", "inproc", "shipper", "consumer", "consumer_shipper")
            result: dict[str, Any] = {"bench": "floor"}
            result |= measure("sqlite", SQLiteWork(txns), modes, tmp, addr, runs, args.inflight)
            result |= measure("rocksdb", RocksWork(puts), modes, tmp, addr, runs, args.inflight)
        finally:
            server.kill()
            server.wait()
    result |= {
        "sqlite_target": 1.25,
        "rocksdb_target": 1.5,
        "inflight": args.inflight,
        "transport": args.transport,
        "runs": runs,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
