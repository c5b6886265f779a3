"""RetryReader and AppendService across a SIGKILL and restart of the broker."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gazette.broker.client import AppendService, JournalClient, RetryReader, append, apply_journals
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer

from .conftest import journal_spec


async def test_retry_reader_survives_broker_kill_and_restart(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    proc = BrokerProcess(
        etcd_server.endpoint,
        root=f"/test-restart/{os.getpid()}",
        spool_dir=tmp_path / "spool",
    )
    proc.start()
    try:
        async with JournalClient(proc.endpoint) as client:
            (tmp_path / "store").mkdir()
            spec = journal_spec("restart/journal", f"file://{tmp_path}/store/")
            await apply_journals(
                client, pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)])
            )
            first = b"".join(f"before {i}\n".encode() for i in range(100))
            await append(client, pb.AppendRequest(journal=spec.name), first)

            rr = RetryReader(
                client, pb.ReadRequest(journal=spec.name, block=True), backoff_fn=lambda _: 0.1
            )
            got = bytearray()
            while len(got) < len(first):
                got += await rr.read()
            assert bytes(got) == first

            # A blocked read is in flight when the broker dies.
            pending = asyncio.create_task(rr.read())
            # Time for the read to reach the broker and block at the write head.
            await asyncio.sleep(0.2)
            await asyncio.to_thread(proc.kill)
            await asyncio.sleep(0.5)
            assert not pending.done()
            await asyncio.to_thread(proc.start)

            # Appends issued while the broker comes back are retried by the service.
            async with AppendService(client, backoff_fn=lambda _: 0.1) as svc:
                after = svc.start_append(pb.AppendRequest(journal=spec.name))
                after.write(b"after restart\n")
                after.release()
                resp = await asyncio.wait_for(after.done(), 60)
            assert resp.commit.begin == len(first)

            data = await asyncio.wait_for(pending, 60)
            while len(data) < len(b"after restart\n"):
                data += await asyncio.wait_for(rr.read(), 30)
            assert data == b"after restart\n"
            assert rr.offset == len(first) + len(data)
            assert rr.restarts >= 1 and rr.jump_count == 0
            rr.close()
    finally:
        proc.close()
