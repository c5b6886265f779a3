"""A full spool disk is relieved: appends that hit ENOSPC are refused with
RESOURCE_EXHAUSTED (retryable), and the broker rolls and persists its spools, whose files it
then removes, so that appends go through again without an operator (a real broker whose
spools live on a small tmpfs)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer

from .conftest import append, journal_spec, read_all

DISK = 6 << 20


@pytest.fixture
def small_spool_disk(tmp_path: Path) -> Iterator[Path]:
    """A broker directory whose spools (``journals/``) live on a 6 MiB tmpfs."""
    spools = tmp_path / "broker" / "journals"
    spools.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(spools)], check=True)
    try:
        yield tmp_path / "broker"
    finally:
        subprocess.run(["umount", "-l", str(spools)], check=False)


async def test_a_full_spool_disk_is_relieved_by_persisting(
    etcd_server: EtcdServer, small_spool_disk: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    b = BrokerProcess(
        etcd_server.endpoint, root=f"/test-disk-full/{os.getpid()}", spool_dir=small_spool_disk
    )
    chunks = [bytes([65 + i]) * (1 << 20) for i in range(16)]  # 16 MiB through 6 MiB
    refused = 0
    with b:
        async with grpc.aio.insecure_channel(b.endpoint) as ch:
            stub = pb_grpc.JournalStub(ch)
            # One fragment could hold it all: only the relief rolls the spool.
            spec = journal_spec("disk/full", f"file://{store}/", length=1 << 30)
            resp = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
            assert resp.status == pb.OK
            for chunk in chunks:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        resp = await append(stub, spec.name, chunk)
                        assert resp.status == pb.OK
                        break
                    except grpc.aio.AioRpcError as err:
                        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                        assert "No space left on device" in (err.details() or "")
                        refused += 1
                    assert time.monotonic() < deadline, f"the disk stayed full\n{b.tail_log()}"
                    await asyncio.sleep(0.2)
            content, _ = await read_all(stub, spec.name)
        assert "spool disk full" in b.tail_log(200000)
    assert refused, "the disk never filled: the test proves nothing"
    assert content == b"".join(chunks)
    assert sum(p.stat().st_size for p in store.rglob("*.raw")) > DISK
