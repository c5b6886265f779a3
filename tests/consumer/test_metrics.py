"""consumer.metrics: Prometheus' text format of a process's replicas (fake replicas here; the
real process's endpoint is checked in test_http)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gazette.consumer.metrics import render
from gazette.consumer.protocol import pb
from gazette.consumer.txn import PHASES, TxnStats
from tests.prometheus_text import parse


@dataclass
class FakeShard:
    read_through: dict[str, int] = field(default_factory=dict)

    def progress(self) -> tuple[dict[str, int], dict[str, int]]:
        return dict(self.read_through), {}


@dataclass
class FakeReplica:
    status: pb.ReplicaStatus
    shard: FakeShard
    stats: TxnStats


def replica(code: int, read_through: dict[str, int], **counts: Any) -> FakeReplica:
    stats = TxnStats()
    for name, value in counts.items():
        setattr(stats, name, value)
    return FakeReplica(pb.ReplicaStatus(code=code), FakeShard(read_through), stats)


def test_render_samples_of_each_replica_with_upstream_names() -> None:
    phases = [0.5, 1.25, 0.125, 0.0625, 2.0, 0.25]
    replicas = {
        "shard-b": replica(
            pb.ReplicaStatus.PRIMARY,
            {"in/one": 120, "in/two": 7},
            txns=3,
            messages=40,
            read_bytes=4096,
            phase_seconds=phases,
        ),
        'odd "id"\\x\n': replica(pb.ReplicaStatus.STANDBY, {}),
    }
    text = render(replicas)  # type: ignore[arg-type]
    assert text.endswith("\n")
    for name, kind in (
        ("gazette_shard_up", "gauge"),
        ("gazette_shard_transactions_total", "counter"),
        ("gazette_shard_read_messages_total", "counter"),
        ("gazette_shard_read_bytes_total", "counter"),
        ("gazette_shard_read_head", "gauge"),
        ("gazette_shard_phase_seconds_total", "counter"),
    ):
        assert f"# TYPE {name} {kind}\n" in text
    got = parse(text)
    b = (("shard", "shard-b"),)
    assert got[("gazette_shard_up", (*b, ("status", "PRIMARY")))] == 1
    assert got[("gazette_shard_transactions_total", b)] == 3
    assert got[("gazette_shard_read_messages_total", b)] == 40
    assert got[("gazette_shard_read_bytes_total", b)] == 4096
    assert got[("gazette_shard_read_head", (*b, ("journal", "in/one")))] == 120
    assert got[("gazette_shard_read_head", (*b, ("journal", "in/two")))] == 7
    for (phase, kind), seconds in zip(PHASES, phases, strict=True):
        key = ("gazette_shard_phase_seconds_total", (*b, ("phase", phase), ("type", kind)))
        assert got[key] == seconds
    # Label values are escaped (quote, backslash, newline) and read back unchanged.
    odd = (("shard", 'odd "id"\\x\n'),)
    assert got[("gazette_shard_up", (*odd, ("status", "STANDBY")))] == 1
    assert got[("gazette_shard_transactions_total", odd)] == 0
    assert not any(k[0] == "gazette_shard_read_head" and k[1][:1] == odd for k in got)


def test_render_of_no_replicas_is_just_the_families() -> None:
    """No shard samples; the journal client's families (whatever this process appended or
    read) follow the shard families."""
    text = render({})
    assert not any(line.startswith("gazette_shard_") for line in text.splitlines())
    assert text.count("# TYPE gazette_shard_") == 6
    assert "# TYPE gazette_append_bytes_total counter" in text
    assert "# TYPE gazette_read_bytes_total counter" in text
    from gazette.recoverylog import player

    samples = parse(text)
    assert samples[("gazette_recoverylog_recovered_bytes_total", ())] == player.recovered_bytes
