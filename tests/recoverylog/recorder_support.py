"""Support for the Recorder tests: a real broker, recovery-log journals, and a replay of a
recorded log into a model of the files it describes."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gazette.broker.client import (
    AppendService,
    JournalClient,
)
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.codec import DecodedOp, Desync, OpDecoder, PayloadChunk, PayloadEnd
from gazette.recoverylog.fsm import FSM
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.conftest import session_broker
from tests.kit.specs import RECOVERY_LOG, apply_specs, journal_spec

_names = itertools.count()


@pytest.fixture(scope="session")
def recorder_broker(
    etcd_server: EtcdServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    # One per importing module: each module gets its own broker and etcd root.
    yield from session_broker(etcd_server, tmp_path_factory, f"recorder-{next(_names)}")


@pytest.fixture
async def rec_client(recorder_broker: BrokerProcess) -> AsyncIterator[JournalClient]:
    async with JournalClient(recorder_broker.endpoint) as c:
        yield c


@pytest.fixture
async def rec_service(rec_client: JournalClient) -> AsyncIterator[AppendService]:
    async with AppendService(rec_client) as svc:
        yield svc


MakeLog = Callable[..., Awaitable[str]]


@pytest.fixture
def make_rec_log(rec_client: JournalClient, tmp_path: Path) -> MakeLog:
    """Apply a recovery-log journal with a unique name and a file:// store; return its name."""

    async def make(prefix: str = "rec") -> str:
        name = f"recorder/{prefix}-{next(_names)}"
        spec = journal_spec(name, tmp_path / "store", length=1 << 26, content_type=RECOVERY_LOG)
        await apply_specs(rec_client, [spec])
        return name

    return make


@dataclass
class Replay:
    """A log replayed into a fresh FSM: the ops and the files they describe."""

    fsm: FSM
    ops: list[rpb.RecordedOp] = field(default_factory=list)
    contents: dict[int, bytearray] = field(default_factory=dict)

    def files(self) -> dict[str, bytes]:
        """Recorded path -> content of every live file."""
        return {p: bytes(self.contents[f]) for p, f in self.fsm.links.items()}


def replay(data: bytes, log: str) -> Replay:
    """Decode `data` (a whole log) and apply every op; raises on any rejected op or desync."""
    dec = OpDecoder(0, log)
    dec.feed(data)
    r = Replay(FSM(log))
    while (ev := dec.next_event()) is not None:
        if isinstance(ev, Desync):
            raise AssertionError(f"desync {ev}")
        if isinstance(ev, DecodedOp):
            op = ev.op
            r.fsm.apply(op, ev.frame)
            r.ops.append(op)
            if op.HasField("create"):
                r.contents[op.seq_no] = bytearray()
        elif isinstance(ev, PayloadChunk):
            buf = r.contents[ev.fnode]
            end = ev.offset + len(ev.data)
            if len(buf) < end:
                buf.extend(bytes(end - len(buf)))
            buf[ev.offset : end] = ev.data
        else:
            assert isinstance(ev, PayloadEnd)
    assert dec.buffered == 0 and not dec.in_payload, "log ends within an op"
    return r


def disk_files(root: Path) -> dict[str, bytes]:
    """Recorded path -> content of every regular file under `root`."""
    return {
        "/" + p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
