"""A consumer process's start: what it does before its shards need it, and what it leaves
for later."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from gazette.broker.client import JournalClient
from gazette.consumer.protocol import pb
from tests.consumer.support import Setup, apply_shards, until_ready


def test_main_imports_no_http_server_nor_yaml_before_its_start() -> None:
    """aiohttp (0.15-0.6 s of imports) is imported once the process started its store kinds'
    processes, which then start meanwhile; yaml only to read a settings file."""
    late = "{'aiohttp', 'yaml'}"
    code = f"import sys, gazette.consumer.main; print(sorted({late} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_a_new_shard_mounts_through_a_fusefs_process_started_with_the_consumer(
    new_setup: Callable[..., Setup], client: JournalClient
) -> None:
    """A new shard's log is empty: nothing in it says RocksDB. Its store mounts through the
    process the consumer started ahead when it started, not one of its own."""
    s = new_setup()
    await s.create_journals(client)
    procs = s.start(1)
    async with s.stubs() as stubs:
        await apply_shards(stubs["consumer-0"], s.shard_specs(hot_standbys=0))
        await until_ready(stubs["consumer-0"], [pb.ReplicaStatus.PRIMARY], "a primary")
    log = procs["consumer-0"].log_path.read_bytes()
    assert b"prestarted=True" in log and b"prestarted=False" not in log, log[-3000:].decode()
