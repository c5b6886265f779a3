"""Journal specs as the tests build them: one builder, with the defaults tests share."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from google.protobuf.duration_pb2 import Duration

from gazette.broker.client import JournalClient
from gazette.broker.client.list import apply_journals
from gazette.broker.protocol import protocol_pb2 as pb

RECOVERY_LOG = "application/x-gazette-recoverylog"
"""The content type of a recovery log's journal."""


def store_url(store: str | Path) -> str:
    """A fragment store URL: a directory becomes its ``file://`` URL."""
    return f"file://{store}/" if isinstance(store, Path) else store


def journal_spec(
    name: str,
    store: str | Path | None = None,
    *,
    replication: int = 1,
    length: int = 1 << 20,
    codec: int = pb.NONE,
    refresh: int = 60,
    flush: int | None = None,
    labels: Mapping[str, str] | None = None,
    content_type: str | None = None,
) -> pb.JournalSpec:
    """A spec of journal `name`: fragments of `length` bytes compressed with `codec` into
    `store` (a URL, or a directory, created if missing; none if None), the store refreshed
    every `refresh` seconds, spools flushed every `flush` seconds (if given), `labels` (with
    `content_type` as the content-type label, if given) in name order (as upstream
    requires)."""
    if isinstance(store, Path):
        store.mkdir(parents=True, exist_ok=True)
    frag = pb.JournalSpec.Fragment(
        length=length, compression_codec=codec, refresh_interval=Duration(seconds=refresh)
    )
    if flush is not None:
        frag.flush_interval.FromSeconds(flush)
    if store is not None:
        frag.stores.append(store_url(store))
    spec = pb.JournalSpec(name=name, replication=replication, fragment=frag)
    labels = dict(labels or {})
    if content_type is not None:
        labels["content-type"] = content_type
    for k, v in sorted(labels.items()):
        spec.labels.labels.add(name=k, value=v)
    return spec


async def apply_specs(client: JournalClient, specs: Iterable[pb.JournalSpec]) -> None:
    """Create or update the journals of `specs` (without expecting any revision)."""
    changes = [pb.ApplyRequest.Change(upsert=s) for s in specs]
    await apply_journals(client, pb.ApplyRequest(changes=changes))
