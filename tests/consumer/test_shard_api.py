"""ShardAPI (the ``consumer.Shard`` service) against a real etcd, served over gRPC."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import grpc.aio
import pytest
from google.protobuf.duration_pb2 import Duration

from gazette.broker.protocol.selector import parse_label_selector
from gazette.consumer.hints import backup_hints_key, encode_hints
from gazette.consumer.protocol import pb
from gazette.consumer.shard_client import (
    ShardClient,
    ShardStatusError,
    apply_shards,
    get_hints,
    list_shards,
    stat_shard,
    unassign_shards,
)
from gazette.keyspace.etcd import Etcd
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.testing.etcd import EtcdServer

from .shard_api_server import ShardAPIServer


def make_spec(shard: str, **labels: str) -> pb.ShardSpec:
    spec = pb.ShardSpec(
        id=shard,
        recovery_log_prefix="recovery/logs",
        hint_prefix="/hints/app",
        hint_backups=2,
        max_txn_duration=Duration(seconds=1),
    )
    spec.sources.add(journal="examples/words", min_offset=0)
    for name, value in sorted(labels.items()):
        spec.labels.labels.add(name=name, value=value)
    return spec


def upsert(spec: pb.ShardSpec, rev: int = 0) -> pb.ApplyRequest.Change:
    return pb.ApplyRequest.Change(upsert=spec, expect_mod_revision=rev)


def hints_of(log: str) -> rpb.FSMHints:
    hints = rpb.FSMHints(log=log)
    node = hints.live_nodes.add(fnode=1)
    node.segments.add(author=0x1234, first_seq_no=1, last_seq_no=3, first_checksum=0)
    return hints


@pytest.fixture
def server(etcd_server: EtcdServer) -> Iterator[ShardAPIServer]:
    with ShardAPIServer(etcd_server.endpoint) as srv:
        yield srv


async def test_apply_and_list(server: ShardAPIServer) -> None:
    async with ShardClient(server.endpoint) as sc:
        resp = await apply_shards(
            sc,
            pb.ApplyRequest(
                changes=[upsert(make_spec("shard-a", app="wc")), upsert(make_spec("shard-b"))]
            ),
        )
        assert resp.header.process_id.suffix == "shard-api"
        assert resp.header.etcd.revision > 0
        shards = await list_shards(sc)
        assert [s.spec.id for s in shards] == ["shard-a", "shard-b"]
        assert shards[0].spec == make_spec("shard-a", app="wc")
        assert shards[0].mod_revision == shards[0].create_revision == resp.header.etcd.revision
        assert shards[0].route.primary == -1 and not shards[0].route.members
        assert not shards[0].status

        # Selectors match spec labels and the `id` meta-label.
        picked = await list_shards(sc, parse_label_selector("app=wc"))
        assert [s.spec.id for s in picked] == ["shard-a"]
        picked = await list_shards(sc, parse_label_selector("id in (shard-b, shard-c)"))
        assert [s.spec.id for s in picked] == ["shard-b"]
        picked = await list_shards(sc, parse_label_selector("id:prefix=shard-"))
        assert len(picked) == 2


async def test_route_and_status(server: ShardAPIServer) -> None:
    async with ShardClient(server.endpoint) as sc:
        await apply_shards(sc, pb.ApplyRequest(changes=[upsert(make_spec("shard-a"))]))
        server.put_member("zone-b", "c1", "http://c1:8081")
        server.put_member("zone-a", "c2", "http://c2:8081")
        server.put_assignment("shard-a", "zone-b", "c1", 0, pb.ReplicaStatus.PRIMARY)
        server.put_assignment("shard-a", "zone-a", "c2", 1, pb.ReplicaStatus.STANDBY)
        # An assignment of a shard whose id extends this one's is not part of its route.
        server.put_assignment("shard-ab", "zone-a", "c2", 0)

        (shard,) = await list_shards(sc, parse_label_selector("id=shard-a"))
        assert [(m.zone, m.suffix) for m in shard.route.members] == [
            ("zone-a", "c2"),
            ("zone-b", "c1"),
        ]
        assert shard.route.primary == 1
        assert list(shard.route.endpoints) == ["http://c2:8081", "http://c1:8081"]
        assert [s.code for s in shard.status] == [
            pb.ReplicaStatus.STANDBY,
            pb.ReplicaStatus.PRIMARY,
        ]


async def test_apply_guards(server: ShardAPIServer) -> None:
    async with ShardClient(server.endpoint) as sc:
        first = await apply_shards(sc, pb.ApplyRequest(changes=[upsert(make_spec("shard-a"))]))
        rev = first.header.etcd.revision

        # Creating again (expect 0) fails: the shard exists.
        resp = await sc.stub.Apply(pb.ApplyRequest(changes=[upsert(make_spec("shard-a"))]))
        assert resp.status == pb.ETCD_TRANSACTION_FAILED
        with pytest.raises(ShardStatusError, match="ETCD_TRANSACTION_FAILED"):
            await apply_shards(sc, pb.ApplyRequest(changes=[upsert(make_spec("shard-a"), 1)]))

        # A failed guard applies none of the changes of the request.
        resp = await sc.stub.Apply(
            pb.ApplyRequest(
                changes=[upsert(make_spec("shard-new")), upsert(make_spec("shard-a"), rev + 100)]
            )
        )
        assert resp.status == pb.ETCD_TRANSACTION_FAILED
        assert [s.spec.id for s in await list_shards(sc)] == ["shard-a"]

        # The right revision, and -1 (any), both apply.
        updated = make_spec("shard-a", app="x")
        second = await apply_shards(sc, pb.ApplyRequest(changes=[upsert(updated, rev)]))
        (shard,) = await list_shards(sc)
        assert shard.spec == updated
        assert shard.mod_revision == second.header.etcd.revision
        assert shard.create_revision == rev
        await apply_shards(sc, pb.ApplyRequest(changes=[upsert(make_spec("shard-a"), -1)]))

        # Deletes are guarded too.
        (shard,) = await list_shards(sc)
        resp = await sc.stub.Apply(
            pb.ApplyRequest(
                changes=[pb.ApplyRequest.Change(delete="shard-a", expect_mod_revision=rev)]
            )
        )
        assert resp.status == pb.ETCD_TRANSACTION_FAILED
        await apply_shards(
            sc,
            pb.ApplyRequest(
                changes=[
                    pb.ApplyRequest.Change(delete="shard-a", expect_mod_revision=shard.mod_revision)
                ]
            ),
        )
        assert await list_shards(sc) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            pb.ApplyRequest.Change(upsert=pb.ShardSpec(id="shard-a")),
            "Changes[0].Upsert.max_txn_duration: invalid value (0s; expected > 0s)",
        ),
        (
            pb.ApplyRequest.Change(
                upsert=pb.ShardSpec(id="shard#b", max_txn_duration=Duration(seconds=1))
            ),
            "Changes[0].Upsert.id: not a valid token",
        ),
        (
            pb.ApplyRequest.Change(
                upsert=pb.ShardSpec(
                    id="shard-c",
                    min_txn_duration=Duration(seconds=5),
                    max_txn_duration=Duration(seconds=1),
                )
            ),
            "Changes[0].Upsert.min_txn_duration: invalid value (5s; expected <= max_txn_duration",
        ),
        (pb.ApplyRequest.Change(delete="shard-a"), "Changes[0]: invalid ExpectModRevision (0"),
        (pb.ApplyRequest.Change(), "neither Upsert nor Delete"),
    ],
)
async def test_apply_invalid(
    server: ShardAPIServer, change: pb.ApplyRequest.Change, message: str
) -> None:
    async with ShardClient(server.endpoint) as sc:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await sc.stub.Apply(pb.ApplyRequest(changes=[change]))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (info.value.details() or "")


async def test_apply_twice_in_one_request_is_invalid(server: ShardAPIServer) -> None:
    async with ShardClient(server.endpoint) as sc:
        with pytest.raises(grpc.aio.AioRpcError, match="changed more than once"):
            await sc.stub.Apply(
                pb.ApplyRequest(
                    changes=[upsert(make_spec("shard-a")), upsert(make_spec("shard-a"))]
                )
            )


async def test_hints(server: ShardAPIServer) -> None:
    spec = make_spec("shard-h")
    log = "recovery/logs/shard-h"
    async with ShardClient(server.endpoint) as sc:
        with pytest.raises(ShardStatusError, match="SHARD_NOT_FOUND"):
            await get_hints(sc, "shard-h")

        change = upsert(spec)
        change.primary_hints.CopyFrom(hints_of(log))
        await apply_shards(sc, pb.ApplyRequest(changes=[change]))
        backup = hints_of(log)
        backup.live_nodes[0].segments[0].last_seq_no = 2
        server.put(backup_hints_key(spec.hint_prefix, spec.id, 1), encode_hints(backup, "proto"))

        resp = await get_hints(sc, "shard-h")
        assert resp.primary_hints.hints == hints_of(log)
        assert len(resp.backup_hints) == spec.hint_backups == 2
        assert not resp.backup_hints[0].HasField("hints")
        assert resp.backup_hints[1].hints == backup

        # Hints of another log are refused at Apply.
        bad = upsert(spec, -1)
        bad.primary_hints.CopyFrom(hints_of("recovery/logs/other"))
        with pytest.raises(grpc.aio.AioRpcError, match="not the recovery log"):
            await sc.stub.Apply(pb.ApplyRequest(changes=[bad]))

        # Corrupt stored hints are reported, not served.
        server.put(backup_hints_key(spec.hint_prefix, spec.id, 0), b"{not json")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await get_hints(sc, "shard-h")
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "shard-h.backup.0" in (info.value.details() or "")

        # A shard without a recovery log has no hints.
        plain = pb.ShardSpec(id="shard-plain", max_txn_duration=Duration(seconds=1))
        await apply_shards(sc, pb.ApplyRequest(changes=[upsert(plain)]))
        resp = await get_hints(sc, "shard-plain")
        assert not resp.HasField("primary_hints") and not resp.backup_hints


async def test_unassign(server: ShardAPIServer) -> None:
    async with ShardClient(server.endpoint) as sc:
        await apply_shards(
            sc,
            pb.ApplyRequest(changes=[upsert(make_spec(s)) for s in ("shard-a", "shard-b")]),
        )
        server.put_member("zone-a", "c1")
        server.put_member("zone-b", "c2")
        a0 = server.put_assignment("shard-a", "zone-a", "c1", 0, pb.ReplicaStatus.PRIMARY)
        a1 = server.put_assignment("shard-a", "zone-b", "c2", 1, pb.ReplicaStatus.STANDBY)
        b0 = server.put_assignment("shard-b", "zone-b", "c2", 0, pb.ReplicaStatus.PRIMARY)
        b1 = server.put_assignment("shard-b", "zone-a", "c1", 1, pb.ReplicaStatus.FAILED, ("boom",))

        def present() -> set[str]:
            async def get(etcd: Etcd) -> set[str]:
                resp = await etcd.get_prefix(server.keys.assign.encode())
                return {kv.key.decode() for kv in resp.kvs}

            return server.call(get)

        # Only failed: shard-b's failed standby; a dry run removes nothing.
        assert await unassign_shards(
            sc, ["shard-a", "shard-b"], only_failed=True, dry_run=True
        ) == ["shard-b"]
        assert present() == {a0, a1, b0, b1}
        assert await unassign_shards(
            sc, ["shard-b", "shard-b"], only_failed=False, dry_run=True
        ) == ["shard-b"]
        assert await unassign_shards(
            sc, ["shard-a", "shard-b"], only_failed=True, dry_run=False
        ) == ["shard-b"]
        assert present() == {a0, a1, b0}
        (b,) = await list_shards(sc, parse_label_selector("id=shard-b"))
        assert [s.code for s in b.status] == [pb.ReplicaStatus.PRIMARY]

        # Otherwise the primary goes (standbys stay, to take over).
        assert await unassign_shards(sc, ["shard-a"], only_failed=False, dry_run=False) == [
            "shard-a"
        ]
        assert present() == {a1, b0}
        assert await unassign_shards(sc, ["shard-x"], only_failed=False, dry_run=False) == []

        with pytest.raises(grpc.aio.AioRpcError, match=r"Shards\[0\]"):
            await unassign_shards(sc, ["#bad"], only_failed=False, dry_run=False)


async def test_stat(server: ShardAPIServer) -> None:
    async with ShardClient(server.endpoint) as sc:
        with pytest.raises(ShardStatusError, match="SHARD_NOT_FOUND"):
            await stat_shard(sc, "shard-a")
        await apply_shards(sc, pb.ApplyRequest(changes=[upsert(make_spec("shard-a"))]))
        server.read_through["shard-a"] = {"examples/words": 42}
        resp = await stat_shard(sc, "shard-a")
        assert dict(resp.read_through) == {"examples/words": 42}


async def test_stat_unimplemented(etcd_server: EtcdServer) -> None:
    with ShardAPIServer(etcd_server.endpoint, with_stat=False) as server:
        async with ShardClient(server.endpoint) as sc:
            await apply_shards(sc, pb.ApplyRequest(changes=[upsert(make_spec("shard-a"))]))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stat_shard(sc, "shard-a")
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_list_invalid_selector(server: ShardAPIServer) -> None:
    async with ShardClient(server.endpoint) as sc:
        req = pb.ListRequest()
        req.selector.include.labels.add(name="x", value="1")  # label name too short
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await sc.stub.List(req)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Selector.Include" in (info.value.details() or "")
