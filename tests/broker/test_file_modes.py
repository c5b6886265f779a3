"""A real broker keeps journal content private to its user: every file it creates (spools,
commit logs, registers, the lock, cached fragments, its log) is 0600 and every directory
0700, in its spool directory and in a file:// fragment store, even when started with a
umask that lets others read (docs/file-modes.md)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import grpc

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc
from gazette.broker.spool import COMMITS_SUFFIX, SPOOL_SUFFIX
from gazette.testing.broker import BrokerProcess
from gazette.testing.etcd import EtcdServer
from tests.file_modes import entries, not_private, open_umask

from .conftest import append, journal_spec, persisted, read_all

CHUNK = 1100  # Over the fragment length: each append rolls a fragment.


async def test_broker_files_and_directories_are_private(
    etcd_server: EtcdServer, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    store.mkdir(mode=0o700)  # The operator's; what the broker makes beneath it is checked.
    spool_dir = tmp_path / "spool"
    # Nested names: the broker makes the spool's and the store's parent directories.
    name = f"file-modes/{os.getpid()}/deep/journal"
    proc = BrokerProcess(
        etcd_server.endpoint, root=f"/test-file-modes/{os.getpid()}", spool_dir=spool_dir
    )
    with open_umask():
        proc.start()
    try:
        async with grpc.aio.insecure_channel(proc.endpoint) as channel:
            stub = pb_grpc.JournalStub(channel)
            spec = journal_spec(name, f"file://{store}/", length=1024)
            resp = await stub.Apply(pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=spec)]))
            assert resp.status == pb.OK
            for i in range(3):
                await append(stub, name, bytes([65 + i]) * CHUNK)
            await persisted(stub, name, 2)
            await append(stub, name, b"tail")  # Committed to a spool that is not rolled.

            running = entries(spool_dir)
            names = {p.name for p in running}
            assert any(n.endswith(SPOOL_SUFFIX) for n in names), sorted(names)
            assert any(n.endswith(COMMITS_SUFFIX) for n in names), sorted(names)
            assert {".lock", "broker.log"} <= names, sorted(names)
            assert not_private(running) == {}
        proc.stop()  # Graceful: persists the last spool.

        with open_umask():
            proc.start()  # No spool holds the content now: reads go through the cache.
        async with grpc.aio.insecure_channel(proc.endpoint) as channel:
            stub = pb_grpc.JournalStub(channel)
            content, _ = await read_all(stub, name)
            assert content == b"A" * CHUNK + b"B" * CHUNK + b"C" * CHUNK + b"tail"
            cached = [p for p in entries(spool_dir / "cache") if stat.S_ISREG(p.lstat().st_mode)]
            assert cached, "the reads did not go through the fragment cache"
            assert not_private(entries(spool_dir)) == {}
    finally:
        proc.close()

    stored = entries(store)
    del stored[store]
    assert sum(1 for p in stored if p.is_file()) >= 4, sorted(map(str, stored))
    assert not_private(stored) == {}
