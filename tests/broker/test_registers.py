"""Journal registers: check, union and subtract semantics of the Append RPC."""

from __future__ import annotations

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol import protocol_pb2_grpc as pb_grpc

from .conftest import MakeJournal, append


def ls(**labels: str) -> pb.LabelSet:
    return pb.LabelSet(labels=[pb.Label(name=k, value=v) for k, v in sorted(labels.items())])


def sel(**labels: str) -> pb.LabelSelector:
    return pb.LabelSelector(include=ls(**labels))


async def test_fence_with_registers(stub: pb_grpc.JournalStub, make_journal: MakeJournal) -> None:
    spec = await make_journal()
    # Empty registers match any check, so the first writer can establish its fence.
    r = await append(
        stub, spec.name, b"a", check_registers=sel(author="1"), union_registers=ls(author="1")
    )
    assert r.status == pb.OK
    assert list(r.registers.labels) == [pb.Label(name="author", value="1")]

    r = await append(stub, spec.name, b"b", check_registers=sel(author="1"))
    assert r.status == pb.OK

    # A second author takes over (the union replaces the value of the same name).
    r = await append(stub, spec.name, b"c", union_registers=ls(author="2"))
    assert r.status == pb.OK
    assert [(x.name, x.value) for x in r.registers.labels] == [("author", "2")]

    # The fenced first author is rejected and appends nothing.
    r = await append(stub, spec.name, b"zombie", check_registers=sel(author="1"))
    assert r.status == pb.REGISTER_MISMATCH
    assert [(x.name, x.value) for x in r.registers.labels] == [("author", "2")]
    r = await append(stub, spec.name, b"d", check_registers=sel(author="2"))
    assert r.status == pb.OK and r.commit.begin == 3


async def test_register_updates_need_appended_bytes(
    stub: pb_grpc.JournalStub, make_journal: MakeJournal
) -> None:
    spec = await make_journal()
    r = await append(stub, spec.name, union_registers=ls(key="v"))
    assert r.status == pb.OK
    assert len(r.registers.labels) == 0, "a zero-byte append must not change registers"
    r = await append(stub, spec.name, b"x", union_registers=ls(key="v", other="o"))
    assert [(x.name, x.value) for x in r.registers.labels] == [("key", "v"), ("other", "o")]
    r = await append(stub, spec.name, subtract_registers=ls(key="v"))
    assert len(r.registers.labels) == 2
    r = await append(stub, spec.name, b"y", subtract_registers=ls(key="v"))
    assert [(x.name, x.value) for x in r.registers.labels] == [("other", "o")]


async def test_registers_survive_broker_restart(
    make_journal: MakeJournal, stub: pb_grpc.JournalStub, broker
) -> None:  # type: ignore[no-untyped-def]
    spec = await make_journal()
    r = await append(stub, spec.name, b"x", union_registers=ls(author="7"))
    assert r.status == pb.OK
    broker.kill()
    broker.start()
    import grpc

    async with grpc.aio.insecure_channel(broker.endpoint) as ch:
        s2 = pb_grpc.JournalStub(ch)
        r = await append(s2, spec.name, b"y", check_registers=sel(author="8"))
        assert r.status == pb.REGISTER_MISMATCH
        r = await append(s2, spec.name, b"y", check_registers=sel(author="7"))
        assert r.status == pb.OK and r.commit.begin == 1
