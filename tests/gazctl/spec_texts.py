"""Spec texts the gazctl tests apply: a journal tree (`spec_yaml`), and the journals and
shards of two word-count shards (`JOURNALS`, `TEMPLATE`, with PREFIX to replace).
tests/gazctl/test_repo_specs.py checks that they stay valid."""

from __future__ import annotations

import textwrap
from pathlib import Path


def spec_yaml(prefix: str, store: Path, **extra: str) -> str:
    """Journals {prefix}clicks and {prefix}orders in fragments persisted to `store` (with
    `extra` fragment fields)."""
    frag_extra = "".join(f"\n  {k}: {v}" for k, v in extra.items())
    return (
        textwrap.dedent(
            f"""\
        name: {prefix}
        replication: 1
        labels:
        - {{name: app, value: gazctl-test}}
        fragment:
          length: 1048576
          compression_codec: NONE
          stores: ["file://{store}/"]
          refresh_interval: 10s"""
        )
        + frag_extra
        + textwrap.dedent(
            f"""
        children:
        - name: {prefix}clicks
          labels: [{{name: topic, value: clicks}}]
        - name: {prefix}orders
          labels: [{{name: topic, value: orders}}]
        """
        )
    )


TEMPLATE = """\
common:
  recovery_log_prefix: PREFIXrecovery
  hint_prefix: /gazette/hints
  hint_backups: 2
  max_txn_duration: 1s
  labels:
  - name: app
    value: word-count
shards:
- id: shard-000
  sources:
  - journal: PREFIXwords/part-000
- id: shard-001
  sources:
  - journal: PREFIXwords/part-001
  hot_standbys: 1
  labels:
  - name: tier
    value: gold
"""


JOURNALS = """\
name: PREFIX
replication: 1
fragment:
  length: 1048576
  compression_codec: NONE
  refresh_interval: 1m0s
children:
- name: PREFIXrecovery/
  labels:
  - name: content-type
    value: application/x-gazette-recoverylog
  children:
  - name: PREFIXrecovery/shard-000
  - name: PREFIXrecovery/shard-001
- name: PREFIXwords/
  labels:
  - name: content-type
    value: application/x-ndjson
  children:
  - name: PREFIXwords/part-000
  - name: PREFIXwords/part-001
"""
