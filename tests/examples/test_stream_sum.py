"""The stream-sum example: its parts alone (the chunk generator, the running sum, the record,
the verifier's check), the verifier against a sums journal holding planted violations, and
the whole end to end: etcd, a broker, two `gazette-consumer` processes of
`stream_sum.app:Summer` (SQLite stores, hot standbys 1), the chunker's command publishing
while a summer holding primaries is SIGKILLed, and the verifier finding every stream summed
exactly once."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc.aio
import pytest
from stream_sum.chunker import ChunkerConfig, generate
from stream_sum.messages import (
    CONTENT_TYPE,
    SUMS,
    Chunk,
    ChunkOutOfSequence,
    RunningSum,
    Sum,
    chunks_selector,
    shard_id,
)
from stream_sum.record import Expected, RecordWriter, RunRecord, load_record
from stream_sum.specs import journal_specs, journals_yaml, shard_specs, shards_yaml
from stream_sum.verifier import SumChecker, verify_sums

from gazette.broker.client import AppendService, JournalClient, list_all_journals, write_head
from gazette.broker.client.list import apply_journals
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.consumer.protocol import consumer_pb2_grpc as pb_grpc
from gazette.consumer.protocol import pb
from gazette.message.publisher import Publisher
from gazette.testing.broker import BrokerProcess
from gazette.testing.consumer import ConsumerProcess
from gazette.testing.etcd import EtcdServer
from tests.examples.conftest import STREAM_SUM
from tests.examples.shards_support import all_shards, statuses, until

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 2
PRIMARY, STANDBY = pb.ReplicaStatus.PRIMARY, pb.ReplicaStatus.STANDBY
EXAMPLE_ENV = {"PYTHONPATH": f"{STREAM_SUM}{os.pathsep}{REPO}"}


# -- The parts alone ----------------------------------------------------------------------------


def test_generate_interleaves_bounded_streams_each_ending_with_its_sum() -> None:
    cfg = ChunkerConfig(streams=7, chunks=5, concurrency=3)
    chunks = list(generate("r1", cfg, random.Random(3)))
    by_stream: dict[str, list[Chunk]] = {}
    for c in chunks:
        by_stream.setdefault(c.stream, []).append(c)
    assert sorted(by_stream) == [f"r1-{i:07d}" for i in range(7)]
    for stream, cs in by_stream.items():
        assert [c.seq for c in cs] == list(range(1, 7)), stream
        assert [c.end for c in cs] == [False] * 5 + [True]
        assert cs[-1].total == sum(c.value for c in cs[:-1])
        assert all(1 <= c.value <= cfg.max_value for c in cs[:-1])
    # Interleaved, never more than `concurrency` open at once.
    open_now: set[str] = set()
    widest = 0
    for c in chunks:
        open_now.add(c.stream)
        widest = max(widest, len(open_now))
        if c.end:
            open_now.discard(c.stream)
    assert widest == 3


def test_generate_without_a_stream_limit_goes_on() -> None:
    cfg = ChunkerConfig(streams=0, chunks=2, concurrency=4)
    chunks = list(itertools.islice(generate("r", cfg, random.Random(1)), 5000))
    assert len(chunks) == 5000
    assert sum(c.end for c in chunks) > 1000


@pytest.mark.parametrize(
    ("seqs", "bad"),
    [
        ([1, 2, 2], "chunk 2, expected chunk 3"),  # Duplicated.
        ([1, 3], "chunk 3, expected chunk 2"),  # Lost.
        ([2], "chunk 2, expected chunk 1"),  # The start lost.
        ([1, 2, 3, 4], "chunk 4 after its end"),  # Chunk 3 ended it.
    ],
    ids=["duplicate", "gap", "no-start", "after-end"],
)
def test_running_sum_refuses_chunks_out_of_sequence(seqs: list[int], bad: str) -> None:
    s = RunningSum("x")
    with pytest.raises(ChunkOutOfSequence, match=bad):
        for seq in seqs:
            s.add(Chunk("x", seq, value=10 * seq, end=seq == 3, total=30))


def test_running_sum_folds_a_stream() -> None:
    s = RunningSum("x")
    assert not s.add(Chunk("x", 1, 5))
    assert not s.add(Chunk("x", 2, 7))
    assert s.add(Chunk("x", 3, end=True, total=12))
    assert s.final() == Sum("x", 2, 12)


def test_record_round_trip_ignores_a_line_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    w = RecordWriter(path, "r9", SUMS, 123)
    w.add([Expected("r9-0000000", 3, 30), Expected("r9-0000001", 1, 4)])
    w.close()
    rec = load_record(path)
    assert (rec.run, rec.sums_journal, rec.sums_offset, rec.complete) == ("r9", SUMS, 123, False)
    assert rec.streams == {
        "r9-0000000": Expected("r9-0000000", 3, 30),
        "r9-0000001": Expected("r9-0000001", 1, 4),
    }
    with path.open("a") as f:
        f.write('{"stream": "r9-00000')  # A chunker killed mid-write.
    assert load_record(path).streams == rec.streams
    w = RecordWriter(path, "r9", SUMS, 123)
    w.add([Expected("r9-0000000", 3, 30)])
    w.complete()
    w.close()
    assert load_record(path).complete


def _record(run: str, complete: bool, *streams: tuple[int, int, int]) -> RunRecord:
    rec = RunRecord(run, SUMS, 0, complete=complete)
    for i, chunks, total in streams:
        rec.streams[f"{run}-{i}"] = Expected(f"{run}-{i}", chunks, total)
    return rec


@pytest.mark.parametrize(
    ("sums", "violations", "verified"),
    [
        ([("a-0", 2, 20), ("a-1", 3, 30)], [], 2),
        ([("a-0", 2, 20)], [("missing", "a-1")], 1),
        ([("a-0", 2, 20), ("a-1", 3, 30), ("a-0", 2, 20)], [("duplicate", "a-0")], 1),
        ([("a-0", 2, 21), ("a-1", 3, 30)], [("wrong", "a-0")], 1),
        ([("a-0", 1, 20), ("a-1", 3, 30)], [("wrong", "a-0")], 1),
        ([("a-0", 2, 20), ("a-1", 3, 30), ("a-7", 1, 1)], [("unexpected", "a-7")], 2),
        # Other runs' sums, and unrecorded sums of a run whose record is incomplete.
        ([("a-0", 2, 20), ("a-1", 3, 30), ("z-0", 1, 1), ("b-5", 1, 1)], [], 2),
    ],
    ids=["ok", "missing", "duplicate", "wrong-total", "wrong-chunks", "unexpected", "ignored"],
)
def test_sum_checker(
    sums: list[tuple[str, int, int]], violations: list[tuple[str, str]], verified: int
) -> None:
    checker = SumChecker([_record("a", True, (0, 2, 20), (1, 3, 30)), _record("b", False)])
    for stream, chunks, total in sums:
        checker.observe(Sum(stream, chunks, total))
    result = checker.result()
    assert sorted((v.kind, v.stream) for v in result.violations) == sorted(violations)
    assert result.ok == (not violations)
    assert result.verified == verified
    assert checker.complete == all(k != "missing" for k, _ in violations)
    assert ("OK" if result.ok else "VIOLATIONS") in result.summary()


def test_spec_files_are_the_specs_of_four_partitions() -> None:
    def body(name: str) -> str:
        lines = (STREAM_SUM / name).read_text().splitlines(keepends=True)
        return "".join(line for line in lines if not line.startswith("#"))

    assert body("journals.yaml") == journals_yaml(4)
    assert body("shards.yaml") == shards_yaml(4)


# -- With a broker ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fragments(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stream-sum-fragments")


@pytest.fixture
async def client(broker: BrokerProcess, fragments: Path) -> AsyncIterator[JournalClient]:
    """A client of the broker, whose stream-sum journals exist (applied by the module's
    first test)."""
    async with JournalClient(broker.endpoint) as c:
        if not await list_all_journals(c, chunks_selector()):
            specs = journal_specs(PARTITIONS, f"file://{fragments}/")
            changes = [bpb.ApplyRequest.Change(upsert=s) for s in specs]
            await apply_journals(c, bpb.ApplyRequest(changes=changes))
        yield c


def _to_sums(_msg: Sum) -> tuple[str, str]:
    return SUMS, CONTENT_TYPE


async def run_command(module: str, *args: str, out: Path) -> int:
    """Run ``python -m module args`` (the example's command line) to its end; its exit status.
    Its output goes to `out`."""
    with out.open("wb") as f:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *args,
            stdout=f,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **EXAMPLE_ENV},
        )
        return await proc.wait()


async def test_verifier_reports_violations_planted_in_the_sums_journal(
    broker: BrokerProcess, client: JournalClient, tmp_path: Path
) -> None:
    """Sums appended to the real journal: one right, one committed twice, one of a transaction
    never acknowledged (invisible read-committed: missing), one wrong, one not recorded; one
    stream never summed. The function and the command both report each."""
    run = "planted1"
    s = [f"{run}-{i}" for i in range(6)]
    path = tmp_path / "planted.jsonl"
    w = RecordWriter(path, run, SUMS, await write_head(client, SUMS))
    w.add(Expected(stream, 3, 30) for stream in s[:5])
    w.complete()
    w.close()

    service = AppendService(client)
    pub, never_acked = Publisher(service), Publisher(service)
    pub.publish_committed(_to_sums, Sum(s[0], 3, 30))
    pub.publish_committed(_to_sums, Sum(s[1], 3, 30))
    pub.publish_committed(_to_sums, Sum(s[1], 3, 30))
    never_acked.publish_uncommitted(_to_sums, Sum(s[2], 3, 30))
    pub.publish_committed(_to_sums, Sum(s[3], 3, 31))
    pub.publish_committed(_to_sums, Sum(s[5], 3, 30))
    await pub.barrier()
    await never_acked.barrier()
    await service.close()

    result = await verify_sums(client, [load_record(path)], timeout=2.0)
    assert not result.ok
    assert sorted((v.kind, v.stream) for v in result.violations) == [
        ("duplicate", s[1]),
        ("missing", s[2]),
        ("missing", s[4]),
        ("unexpected", s[5]),
        ("wrong", s[3]),
    ]
    assert result.verified == 1
    assert result.read_through is None  # Never all seen.

    out = tmp_path / "verifier.out"
    args = ["--broker", broker.endpoint, "--record", str(path), "--timeout", "1"]
    assert await run_command("stream_sum.verifier", *args, out=out) == 1
    text = out.read_text()
    assert f"duplicate stream={s[1]}" in text and "VIOLATIONS: 1/5 streams" in text, text


async def test_verifier_reads_through_a_tail_never_acknowledged(
    client: JournalClient, tmp_path: Path
) -> None:
    """Every sum committed, then a zombie's sum whose transaction is never acknowledged at
    the journal's head: read-committed it is never delivered, yet the verifier has read
    through the head and finishes at once, well before its timeout."""
    run = "zombie-tail"
    path = tmp_path / "tail.jsonl"
    w = RecordWriter(path, run, SUMS, await write_head(client, SUMS))
    w.add([Expected(f"{run}-0", 3, 30)])
    w.complete()
    w.close()

    service = AppendService(client)
    pub, zombie = Publisher(service), Publisher(service)
    pub.publish_committed(_to_sums, Sum(f"{run}-0", 3, 30))
    await pub.barrier()
    zombie.publish_uncommitted(_to_sums, Sum(f"{run}-0", 3, 30))
    await zombie.barrier()
    await service.close()
    head = await write_head(client, SUMS)

    result = await verify_sums(client, [load_record(path)], timeout=20.0)
    assert result.ok and result.verified == 1, result.summary()
    assert result.read_through == head
    assert result.seconds < 5.0


# -- End to end ---------------------------------------------------------------------------------


async def test_every_stream_summed_exactly_once_through_summer_kills(
    etcd_server: EtcdServer, broker: BrokerProcess, client: JournalClient, tmp_path: Path
) -> None:
    root = f"/test-stream-sum-consumers/{os.getpid()}"
    procs = [
        ConsumerProcess(
            "stream_sum.app:Summer",
            etcd_server.endpoint,
            [broker.endpoint],
            root=root,
            zone=f"z{i}",
            suffix=f"summer-{i}",
            workdir=tmp_path / f"summer-{i}",
            extra_env=EXAMPLE_ENV,
            extra_args=["--hint-interval", "1"],
        )
        for i in range(2)
    ]
    by_suffix = {p.suffix: p for p in procs}
    t_start = time.monotonic()
    try:
        for p in procs:
            p.start()
        async with (
            grpc.aio.insecure_channel(procs[0].endpoint) as ch0,
            grpc.aio.insecure_channel(procs[1].endpoint) as ch1,
        ):
            chans = (ch0, ch1)
            stubs = {p.suffix: pb_grpc.ShardStub(ch) for p, ch in zip(procs, chans, strict=True)}
            hints = f"/test-hints/stream-sum/{os.getpid()}"
            # Transactions of at least 100 ms: a summer killed mid-transaction has consumed
            # last chunks (and published their sums) that its successor consumes again.
            specs = shard_specs(
                PARTITIONS, hot_standbys=1, max_txn_ms=500, min_txn_ms=100, hint_prefix=hints
            )
            req = pb.ApplyRequest(changes=[pb.ApplyRequest.Change(upsert=s) for s in specs])
            assert (await stubs["summer-0"].Apply(req)).status == pb.OK
            both = lambda s: sorted(s.values()) == sorted([PRIMARY, STANDBY])  # noqa: E731
            await until(
                all_shards(stubs["summer-0"], PARTITIONS, both), "a primary and a standby per shard"
            )
            t_ready = time.monotonic()

            # The chunker, by its command line: ~13 s of load, for two kills.
            record = tmp_path / "run.jsonl"
            sums_before = await write_head(client, SUMS)
            chunker = asyncio.create_task(
                run_command(
                    "stream_sum.chunker",
                    *("--broker", broker.endpoint, "--record", str(record)),
                    *("--streams", "600", "--chunks", "10", "--concurrency", "30"),
                    *("--rate", "500", "--seed", "5"),
                    out=tmp_path / "chunker.out",
                )
            )

            async def summing() -> bool:
                return await write_head(client, SUMS) > sums_before

            await until(summing, "the first sums")
            kills = []
            while not chunker.done() and len(kills) < 2:
                await asyncio.sleep(0.5)  # The primaries sum until one is killed.
                st = await statuses(stubs[next(p.suffix for p in procs if p.running)])
                victim = next(m for m, c in st[shard_id(len(kills) % 2)].items() if c == PRIMARY)
                survivor = next(s for s in by_suffix if s != victim)
                killed_during_load = not chunker.done()
                by_suffix[victim].kill()
                kills.append((victim, killed_during_load))
                await until(
                    all_shards(
                        stubs[survivor], PARTITIONS, lambda s, sv=survivor: s.get(sv) == PRIMARY
                    ),
                    f"{survivor} primary of every shard (kill {len(kills)})",
                )
                by_suffix[victim].start()
                await until(
                    all_shards(stubs[survivor], PARTITIONS, both), f"a standby (kill {len(kills)})"
                )
            assert kills and kills[0][1], f"no summer was killed during the load: {kills}"

            assert await chunker == 0, (tmp_path / "chunker.out").read_text()
            t_load = time.monotonic()
            rec = load_record(record)
            assert rec.complete and len(rec.streams) == 600

            result = await verify_sums(client, [rec], timeout=45)
            found = [*map(str, result.violations[:20]), result.summary(), f"kills: {kills}"]
            assert result.ok, "\n".join(found)
            assert result.verified == 600 and result.read_through is not None

            out = tmp_path / "verifier.out"
            args = ["--broker", broker.endpoint, "--record", str(record), "--timeout", "30"]
            assert await run_command("stream_sum.verifier", *args, out=out) == 0, out.read_text()
            print(
                f"ready in {t_ready - t_start:.1f}s; load and {len(kills)} SIGKILLs "
                f"{[v for v, _ in kills]} in {t_load - t_ready:.1f}s; {result.summary()}"
            )
    finally:
        for p in procs:
            p.kill()
