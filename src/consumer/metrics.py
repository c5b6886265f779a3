"""Prometheus metrics of a consumer process, served at ``GET /debug/metrics``.

Rendered at each scrape from the replicas' own counters (`consumer.txn.TxnStats`): the
transaction loop pays one addition per message for them (the bytes read). Names, labels and
phases are upstream Gazette's, so dashboards written for Go consumers read these too:

- ``gazette_shard_up{shard, status}`` (gauge): 1 for each replica of this process, labelled
  with its status (BACKFILL, STANDBY, PRIMARY, FAILED, IDLE).
- ``gazette_shard_transactions_total{shard}``: consumer transactions started (counter).
- ``gazette_shard_read_messages_total{shard}``: messages passed to the application (ACKs,
  which are not, excluded).
- ``gazette_shard_read_bytes_total{shard}``: bytes of the envelopes read by transactions,
  acknowledgements included.
- ``gazette_shard_read_head{shard, journal}`` (gauge): the committed read-through offset of
  each source (the next byte a recovery would read).
- ``gazette_shard_phase_seconds_total{shard, phase, type}``: cumulative seconds of each
  transaction phase: ``10-not-running`` (from the previous transaction's commit start to
  this one's first message), ``20-consuming`` (handling messages, the application's time
  included), ``30-stalled`` (waiting for messages, for the previous commit, or for
  ``min_txn_duration``, also after ``max_txn_duration`` closed the transaction),
  ``40-preparing`` (``finalize_txn``, the checkpoint and the start of the store commit):
  ``type="sync"``, the loop's own time; then
  ``50-committing`` (until the store commit is durable) and ``60-acknowledging`` (ACK
  appends): ``type="async"``, overlapping later transactions.

Process-wide, also: ``gazette_recoverylog_recovered_bytes_total`` (bytes this process's
Players wrote to disk, for standbys and recoveries), and its journal client's
``gazette_append_bytes_total{journal}`` and ``gazette_read_bytes_total{journal}``
(`broker.client.metrics`).

Counters restart from zero when a replica is created again (Prometheus' ``rate`` handles
resets). Rejected: the ``prometheus_client`` package (a registry of live counters would cost
a lock per update in the hot loop, and this process has no other metrics to share it with).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gazette.broker.client.metrics import client_families
from gazette.consumer.protocol import pb
from gazette.consumer.txn import PHASES
from gazette.mainboilerplate.prometheus import CONTENT_TYPE, Family
from gazette.mainboilerplate.prometheus import render as render_families
from gazette.recoverylog import player

if TYPE_CHECKING:
    from gazette.consumer.replica import ShardReplica

__all__ = ["CONTENT_TYPE", "render"]


def render(replicas: dict[str, ShardReplica]) -> str:
    """The metrics of `replicas` (a process's, by shard id) in Prometheus' text format."""
    up = Family(
        "gazette_shard_up", "gauge", "Indicates the processing status of a shard by this consumer."
    )
    txns = Family(
        "gazette_shard_transactions_total", "counter", "Total number of consumer transactions."
    )
    messages = Family(
        "gazette_shard_read_messages_total",
        "counter",
        "Total number of messages processed by consumer transactions.",
    )
    read_bytes = Family(
        "gazette_shard_read_bytes_total",
        "counter",
        "Total byte-length of messages read by consumer transactions.",
    )
    head = Family(
        "gazette_shard_read_head",
        "gauge",
        "Committed read-through offset of each source journal of the shard.",
    )
    phase_seconds = Family(
        "gazette_shard_phase_seconds_total",
        "counter",
        "Cumulative number of seconds processing transactions, by phase.",
    )
    for shard, replica in sorted(replicas.items()):
        stats = replica.stats
        who = [("shard", shard)]
        up.add(1, [*who, ("status", pb.ReplicaStatus.Code.Name(replica.status.code))])
        txns.add(stats.txns, who)
        messages.add(stats.messages, who)
        read_bytes.add(stats.read_bytes, who)
        read_through, _ = replica.shard.progress()
        for journal, offset in sorted(read_through.items()):
            head.add(offset, [*who, ("journal", journal)])
        for (phase, kind), seconds in zip(PHASES, stats.phase_seconds, strict=True):
            phase_seconds.add(seconds, [*who, ("phase", phase), ("type", kind)])
    recovered = Family(
        "gazette_recoverylog_recovered_bytes_total",
        "counter",
        "Cumulative number of bytes recovered to local disk from recovery logs.",
    )
    recovered.add(player.recovered_bytes)
    families = [up, txns, messages, read_bytes, head, phase_seconds, recovered]
    return render_families([*families, *client_families()])
