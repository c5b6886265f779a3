"""Support for the Player tests: a real broker, recovery-log journals, a hand-driven log writer
with a model of the tree it describes, and a reader of played trees."""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gazette.broker.client import JournalClient, append
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.author import author_fence
from gazette.recoverylog.codec import HEADER_LENGTH, encode_op
from gazette.recoverylog.fsm import FSM
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.conftest import session_broker
from tests.kit.specs import apply_specs, journal_spec

_names = itertools.count()

RECOVERYLOG_CONTENT_TYPE = "application/x-gazette-recoverylog"


@pytest.fixture(scope="session")
def player_broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    # One per importing module: each module gets its own broker and etcd root.
    yield from session_broker(etcd_server, tmp_path_factory, f"player-{next(_names)}")


@pytest.fixture
async def client(player_broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(player_broker.endpoint) as c:
        yield c


MakeLog = Callable[..., Awaitable[str]]


@pytest.fixture
def make_log(client: JournalClient, tmp_path: Path) -> MakeLog:
    """Apply a recovery-log journal with a unique name; return its name."""

    async def make(prefix: str = "log", fragment_length: int = 1 << 26) -> str:
        name = f"recoverylog/{prefix}-{os.getpid()}-{next(_names)}"
        spec = journal_spec(
            name, tmp_path / "store", length=fragment_length, content_type=RECOVERYLOG_CONTENT_TYPE
        )
        await apply_specs(client, [spec])
        return name

    return make


@dataclass
class Model:
    """The tree a log describes: Fnode contents, links and properties."""

    files: dict[int, bytearray] = field(default_factory=dict)
    links: dict[str, int] = field(default_factory=dict)
    properties: dict[str, str] = field(default_factory=dict)

    def apply(self, op: rpb.RecordedOp, payload: bytes) -> None:
        if op.HasField("create"):
            self.files[op.seq_no] = bytearray()
            self.links[op.create.path] = op.seq_no
        elif op.HasField("link"):
            self.links[op.link.path] = op.link.fnode
        elif op.HasField("unlink"):
            del self.links[op.unlink.path]
            if op.unlink.fnode not in self.links.values():
                del self.files[op.unlink.fnode]
        elif op.HasField("write"):
            f = self.files[op.write.fnode]
            end = op.write.offset + len(payload)
            if len(f) < end:
                f.extend(bytes(end - len(f)))
            f[op.write.offset : end] = payload
        elif op.HasField("property"):
            self.properties[op.property.path] = op.property.content

    def tree(self) -> dict[str, bytes]:
        out = {path: bytes(self.files[fnode]) for path, fnode in self.links.items()}
        out.update({path: content.encode() for path, content in self.properties.items()})
        return out


class SharedLog:
    """A journal written by tests, whose write head they track (one appender at a time)."""

    def __init__(self, client: JournalClient, name: str, head: int = 0) -> None:
        self.client = client
        self.name = name
        self.head = head

    async def append(self, content: bytes, request: pb.AppendRequest | None = None) -> None:
        req = pb.AppendRequest(journal=self.name)
        if request is not None:
            req.MergeFrom(request)
        resp = await append(self.client, req, content)
        assert resp.commit.begin == self.head, "another writer appended unexpectedly"
        self.head = resp.commit.end


class LogWriter:
    """Writes ops to a `SharedLog` the way a Recorder does, from its own FSM's view.

    Ops are buffered by `op` (and its helpers) and appended by `flush`, checking the author's
    fence; the first flush of a new author also sets it.
    """

    def __init__(self, log: SharedLog, author: int, fsm: FSM | None = None) -> None:
        self.log = log
        self.author = author
        self.fsm = fsm if fsm is not None else FSM(log.name)
        self.model = Model()
        self.pending = bytearray()
        self.fenced = False

    def fork(self, author: int) -> LogWriter:
        """Another writer continuing from this one's state (a hand-off, or a zombie)."""
        out = LogWriter(self.log, author, copy.deepcopy(self.fsm))
        out.model = copy.deepcopy(self.model)
        return out

    def op(self, op: rpb.RecordedOp, payload: bytes = b"") -> rpb.RecordedOp:
        op.seq_no, op.checksum, op.author = (
            self.fsm.next_seq_no,
            self.fsm.next_checksum,
            self.author,
        )
        frame = encode_op(op)
        op.first_offset = self.log.head + len(self.pending)
        op.last_offset = op.first_offset + len(frame) + len(payload)
        op.log = self.log.name
        self.fsm.apply(op, frame[HEADER_LENGTH:])
        self.model.apply(op, payload)
        self.pending += frame
        self.pending += payload
        return op

    def noop(self) -> None:
        self.op(rpb.RecordedOp())

    def create(self, path: str) -> int:
        return self.op(rpb.RecordedOp(create=rpb.RecordedOp.Create(path=path))).seq_no

    def write(self, fnode: int, offset: int, data: bytes) -> None:
        w = rpb.RecordedOp.Write(fnode=fnode, offset=offset, length=len(data))
        self.op(rpb.RecordedOp(write=w), data)

    def link(self, fnode: int, path: str) -> None:
        self.op(rpb.RecordedOp(link=rpb.RecordedOp.Link(fnode=fnode, path=path)))

    def unlink(self, path: str) -> None:
        fnode = self.model.links[path]
        self.op(rpb.RecordedOp(unlink=rpb.RecordedOp.Link(fnode=fnode, path=path)))

    def rename(self, src: str, dst: str) -> None:
        if dst in self.model.links:
            self.unlink(dst)
        self.link(self.model.links[src], dst)
        self.unlink(src)

    def prop(self, path: str, content: str) -> None:
        self.op(rpb.RecordedOp(property=rpb.Property(path=path, content=content)))

    async def flush(self, *, union: bool | None = None, check: bool | None = None) -> None:
        """Append pending ops, checking the author's fence (`check`, by default once it is
        set) or setting it (`union`, by default on the first flush). A zombie's ops are
        appended with neither."""
        if not self.pending:
            return
        fence = author_fence(self.author)
        req = pb.AppendRequest()
        do_union = not self.fenced if union is None else union
        if do_union:
            req.union_registers.CopyFrom(fence)
            self.fenced = True
        if not do_union if check is None else check:
            req.check_registers.include.CopyFrom(fence)
        content, self.pending = bytes(self.pending), bytearray()
        await self.log.append(content, req)


def read_tree(directory: Path) -> dict[str, bytes]:
    """Every regular file under `directory`, by ``/``-prefixed relative path."""
    out: dict[str, bytes] = {}
    for root, _dirs, files in os.walk(directory):
        for name in files:
            p = Path(root) / name
            out["/" + p.relative_to(directory).as_posix()] = p.read_bytes()
    return out


def inode_groups(directory: Path) -> list[set[str]]:
    """Paths sharing an inode (hard links of one file), for files with several links."""
    by_inode: dict[int, set[str]] = {}
    for root, _dirs, files in os.walk(directory):
        for name in files:
            p = Path(root) / name
            by_inode.setdefault(p.stat().st_ino, set()).add(
                "/" + p.relative_to(directory).as_posix()
            )
    return sorted((g for g in by_inode.values() if len(g) > 1), key=sorted)
