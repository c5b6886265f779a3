"""Durability: after fragments roll and the broker is SIGKILLed and restarted, every committed
byte reads back identically, from file:// and s3:// stores, for every codec; a corrupted
persisted fragment is detected by its SHA1 and never served."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from gazette.testing.s3 import MotoS3Server
from tests.kit.eventually import eventually

from .conftest import append, journal_spec, read_all

CODECS = [pb.NONE, pb.GZIP, pb.ZSTANDARD, pb.SNAPPY]


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3Server]:
    with MotoS3Server() as server:
        server.create_bucket("fragments")
        yield server


@pytest.fixture(scope="module")
def crash_broker(
    etcd_server: EtcdServer, s3: MotoS3Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(
        etcd_server.endpoint,
        root=f"/test/{os.getpid()}/recovery",
        spool_dir=tmp_path_factory.mktemp("spool"),
        extra_env=s3.env(),
    )
    with proc:
        yield proc


async def _stub(endpoint: str) -> tuple[grpc.aio.Channel, pb_grpc.JournalStub]:
    ch = grpc.aio.insecure_channel(endpoint)
    return ch, pb_grpc.JournalStub(ch)


async def _wait_rolled(
    stub: pb_grpc.JournalStub, journal: str, timeout: float = 20
) -> list[pb.Fragment]:
    """Wait until every fragment but the open spool (the last) is persisted."""

    async def rolled() -> list[pb.Fragment] | None:
        resp = await stub.ListFragments(pb.FragmentsRequest(journal=journal))
        frags = [f.spec for f in resp.fragments]
        return frags[:-1] if len(frags) > 1 and all(f.backing_store for f in frags[:-1]) else None

    fragments: list[pb.Fragment] = await eventually(
        rolled, what=f"the persisted fragments of {journal}", timeout=timeout, interval=0.1
    )
    return fragments


def _store_url(kind: str, s3: MotoS3Server, tmp: Path) -> str:
    if kind == "file":
        return f"file://{tmp}/"
    return f"s3://fragments/{tmp.name}/?endpoint={s3.endpoint}&region=us-east-1"


@pytest.mark.parametrize("codec", CODECS, ids=[pb.CompressionCodec.Name(c) for c in CODECS])
@pytest.mark.parametrize("kind", ["file", "s3"])
async def test_every_committed_byte_survives_sigkill(
    crash_broker: BrokerProcess, s3: MotoS3Server, tmp_path: Path, kind: str, codec: int
) -> None:
    rng = random.Random(f"{kind}{codec}")
    name = f"tests/recovery/{kind}-{pb.CompressionCodec.Name(codec).lower()}"
    spec = journal_spec(name, _store_url(kind, s3, tmp_path), codec=codec, length=16 << 10)
    ch, stub = await _stub(crash_broker.endpoint)
    resp = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
    assert resp.status == pb.OK

    expect = bytearray()
    for _ in range(60):  # ~60 KiB: several rolled fragments plus an open spool
        record = bytes(rng.getrandbits(8) for _ in range(rng.randint(200, 1800)))
        r = await append(stub, name, record)
        assert r.status == pb.OK and r.commit.begin == len(expect)
        expect += record
    # Every rolled fragment is persisted (the last, open spool is not).
    persisted = await _wait_rolled(stub, name)
    assert len(persisted) >= 3
    await ch.close()

    # Crash: the open spool's committed bytes were never persisted.
    crash_broker.kill()
    crash_broker.start()
    ch, stub = await _stub(crash_broker.endpoint)
    try:
        content, metas = await read_all(stub, name)
        assert content == bytes(expect)
        assert metas[-1].write_head == len(expect)
        # Appends continue at the recovered head.
        r = await append(stub, name, b"after restart")
        assert r.commit.begin == len(expect)
        # And everything reaches the store once the broker is stopped gracefully.
        await ch.close()
        crash_broker.stop()
        crash_broker.start()
        ch, stub = await _stub(crash_broker.endpoint)
        frags = (await stub.ListFragments(pb.FragmentsRequest(journal=name))).fragments
        assert all(f.spec.backing_store for f in frags)
        assert frags[-1].spec.end == len(expect) + len(b"after restart")
        content, _ = await read_all(stub, name)
        assert content == bytes(expect) + b"after restart"
    finally:
        await ch.close()


async def test_corrupted_fragment_is_detected_and_not_served(
    crash_broker: BrokerProcess, tmp_path: Path
) -> None:
    name = "tests/recovery/corrupt"
    spec = journal_spec(name, f"file://{tmp_path}/", codec=pb.NONE, length=4 << 10)
    ch, stub = await _stub(crash_broker.endpoint)
    try:
        await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
        for _ in range(3):
            await append(stub, name, b"A" * 3000)
        await _wait_rolled(stub, name)
        files = sorted(tmp_path.rglob("*.raw"))
        assert files
        victim = files[0]
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
        # Restart so the fragment is served from the store, not from a local spool or cache.
        await ch.close()
        crash_broker.kill()
        crash_broker.start()
        ch, stub = await _stub(crash_broker.endpoint)
        received = bytearray()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for resp in stub.Read(pb.ReadRequest(journal=name, offset=0)):
                received += resp.content
        assert err.value.code() == grpc.StatusCode.DATA_LOSS
        assert "sha1" in err.value.details().lower() or "corrupt" in err.value.details().lower()
        assert received == b"", "no byte of a corrupted fragment may be served"
        assert "corrupted fragment" in crash_broker.tail_log()
    finally:
        await ch.close()
