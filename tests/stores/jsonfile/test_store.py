"""JSONFileStore against a real broker: commits recorded to the recovery log and played back
into fresh directories; serialisation at start_commit; fencing by a newer primary; failed
dependencies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gazette.consumer import StoreFailed
from gazette.consumer.protocol import pb
from gazette.recoverylog.recorder import RecorderFenced
from gazette.stores.jsonfile import (
    NEXT_FILE,
    STATE_FILE,
    JSONFileStore,
    decode_state_file,
    encode_state_file,
)
from tests.stores.jsonfile.conftest import MakeLog, Recover

A, B, C = 0xA11CE, 0xB0B, 0xC0C0A


def _checkpoint(n: int) -> pb.Checkpoint:
    cp = pb.Checkpoint()
    src = cp.sources["examples/input"]
    src.read_through = 1000 * n
    entry = src.producers.add(id=b"\x01\x02\x03\x04\x05\x06")
    entry.state.last_ack = (1 << 63) + n  # A fixed64 beyond int64, as clocks are.
    entry.state.begin = -1
    cp.ack_intents["examples/output"] = b"\x00ack\xff" + bytes([n])
    return cp


async def test_commit_plays_back_into_a_fresh_directory(
    make_log: MakeLog, recover: Recover, tmp_path: Path
) -> None:
    log = await make_log()
    store = await JSONFileStore.open(await recover(log, tmp_path / "a", A))
    assert store.state == {}
    assert await store.restore_checkpoint(None) == pb.Checkpoint()

    for n in range(1, 4):
        store.state[f"key-{n}"] = {"n": n, "text": "é\u2603", "list": [1.5, None, True]}
        await store.start_commit(None, _checkpoint(n), [])
    assert await store.restore_checkpoint(None) == _checkpoint(3)
    expected = json.loads(json.dumps(store.state))

    played = await JSONFileStore.open(await recover(log, tmp_path / "b", B))
    assert played.state == expected
    assert await played.restore_checkpoint(None) == _checkpoint(3)
    assert not (tmp_path / "b" / NEXT_FILE).exists()  # Renamed over state.json.
    # The played file is the one the primary wrote.
    assert (tmp_path / "b" / STATE_FILE).read_bytes() == (tmp_path / "a" / STATE_FILE).read_bytes()

    # The new primary continues the log; a third instance sees its commit.
    played.state["key-4"] = 4
    await played.start_commit(None, _checkpoint(4), [])
    third = await JSONFileStore.open(await recover(log, tmp_path / "c", C))
    assert third.state == {**expected, "key-4": 4}
    assert await third.restore_checkpoint(None) == _checkpoint(4)
    for s in (store, played, third):
        s.destroy()
    assert not (tmp_path / "a").exists()


async def test_new_state_factory_and_empty_log(
    make_log: MakeLog, recover: Recover, tmp_path: Path
) -> None:
    log = await make_log()
    store = await JSONFileStore.open(await recover(log, tmp_path / "a", A), new_state=list)
    assert store.state == []
    store.state.append("x")
    await store.start_commit(None, pb.Checkpoint(), [])
    played = await JSONFileStore.open(await recover(log, tmp_path / "b", B), new_state=list)
    assert played.state == ["x"]
    played.destroy()
    store.destroy()


async def test_state_mutated_after_start_commit_is_not_in_that_commit(
    make_log: MakeLog, recover: Recover, tmp_path: Path
) -> None:
    log = await make_log()
    store = await JSONFileStore.open(await recover(log, tmp_path / "a", A))
    store.state["committed"] = 1
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = store.start_commit(None, _checkpoint(1), [gate])
    # The next transaction mutates the state while the commit waits and is in flight.
    store.state["committed"] = 2
    store.state["next-txn"] = True
    await asyncio.sleep(0.05)
    assert not commit.done()  # Waits for its dependency ...
    assert not (tmp_path / "a" / STATE_FILE).exists()  # ... before writing anything.
    gate.set_result(None)
    await commit

    played = await JSONFileStore.open(await recover(log, tmp_path / "b", B))
    assert played.state == {"committed": 1}
    assert await played.restore_checkpoint(None) == _checkpoint(1)
    played.destroy()
    store.destroy()


async def test_fenced_store_cannot_commit_after_takeover(
    make_log: MakeLog, recover: Recover, tmp_path: Path
) -> None:
    log = await make_log()
    old = await JSONFileStore.open(await recover(log, tmp_path / "a", A))
    old.state["v"] = "old-1"
    await old.start_commit(None, _checkpoint(1), [])

    # A new primary plays the log and takes it over: the hand-off fences author A.
    new = await JSONFileStore.open(await recover(log, tmp_path / "b", B))
    assert new.state == {"v": "old-1"}

    old.state["v"] = "zombie"
    with pytest.raises(StoreFailed) as failed:
        await old.start_commit(None, _checkpoint(2), [])
    assert isinstance(failed.value.__cause__, RecorderFenced)
    assert old.failed is failed.value.__cause__
    with pytest.raises(StoreFailed) as later:  # Crash-only: the store is unusable.
        await old.start_commit(None, _checkpoint(3), [])
    assert later.value.__cause__ is old.failed

    new.state["v"] = "new-2"
    await new.start_commit(None, _checkpoint(2), [])
    played = await JSONFileStore.open(await recover(log, tmp_path / "c", C))
    assert played.state == {"v": "new-2"}
    assert await played.restore_checkpoint(None) == _checkpoint(2)
    for s in (old, new, played):
        s.destroy()


class DependencyError(Exception):
    pass


async def test_failed_dependency_fails_the_commit(
    make_log: MakeLog, recover: Recover, tmp_path: Path
) -> None:
    log = await make_log()
    store = await JSONFileStore.open(await recover(log, tmp_path / "a", A))
    store.state["v"] = 1
    await store.start_commit(None, _checkpoint(1), [])

    async def failing_append() -> None:
        # Fails a moment later, while the commit waits on it.
        await asyncio.sleep(0.01)
        raise DependencyError("append to examples/output failed")

    ok: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    ok.set_result(None)
    store.state["v"] = 2
    with pytest.raises(StoreFailed) as failed:
        await store.start_commit(None, _checkpoint(2), [ok, failing_append()])
    assert isinstance(failed.value.__cause__, DependencyError)
    with pytest.raises(StoreFailed):
        await store.start_commit(None, _checkpoint(3), [])
    assert await store.restore_checkpoint(None) == _checkpoint(1)

    played = await JSONFileStore.open(await recover(log, tmp_path / "b", B))
    assert played.state == {"v": 1}
    assert await played.restore_checkpoint(None) == _checkpoint(1)
    played.destroy()
    store.destroy()


async def test_unserialisable_state_fails_the_commit(
    make_log: MakeLog, recover: Recover, tmp_path: Path
) -> None:
    log = await make_log()
    store = await JSONFileStore.open(await recover(log, tmp_path / "a", A))
    store.state["bad"] = {1, 2}
    with pytest.raises(StoreFailed) as failed:
        await store.start_commit(None, _checkpoint(1), [])
    assert isinstance(failed.value.__cause__, TypeError)
    assert store.failed is failed.value.__cause__
    store.destroy()


async def test_stale_next_file_of_an_unfinished_commit_is_overwritten(
    make_log: MakeLog, recover: Recover, tmp_path: Path
) -> None:
    # A primary which recorded next.json but crashed before the rename.
    log = await make_log()
    store = await JSONFileStore.open(await recover(log, tmp_path / "a", A))
    store.state["v"] = 1
    await store.start_commit(None, _checkpoint(1), [])
    with store._fs.open(NEXT_FILE, "wb") as f:
        f.write(encode_state_file(_checkpoint(9), {"v": "torn"})[:20])
    await store.recorder.barrier()

    played = await JSONFileStore.open(await recover(log, tmp_path / "b", B))
    assert (tmp_path / "b" / NEXT_FILE).exists()
    assert played.state == {"v": 1}
    played.state["v"] = 2
    await played.start_commit(None, _checkpoint(2), [])
    third = await JSONFileStore.open(await recover(log, tmp_path / "c", C))
    assert third.state == {"v": 2}
    assert not (tmp_path / "c" / NEXT_FILE).exists()
    for s in (store, played, third):
        s.destroy()


async def test_destroy_cancels_a_waiting_commit(
    make_log: MakeLog, recover: Recover, tmp_path: Path
) -> None:
    log = await make_log()
    store = await JSONFileStore.open(await recover(log, tmp_path / "a", A))
    store.state["v"] = 1
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commit = store.start_commit(None, _checkpoint(1), [gate])
    await asyncio.sleep(0.01)  # The commit waits on its dependency.
    store.destroy()
    with pytest.raises(asyncio.CancelledError):
        await commit
    assert not (tmp_path / "a").exists()
    played = await JSONFileStore.open(await recover(log, tmp_path / "b", B))
    assert played.state == {}
    played.destroy()


def test_state_file_round_trip_and_upstream_format() -> None:
    cp = _checkpoint(7)
    content = encode_state_file(cp, {"a": [1, 2]})
    doc = json.loads(content)
    assert set(doc) == {"checkpoint", "state"}
    assert decode_state_file(content) == (cp, {"a": [1, 2]})

    # Upstream's Go JSONFileStore: offsets, state and checkpoint as three JSON values.
    upstream = (
        b'{"examples/input":7000}\n'
        b'{"a":[1,2]}\n'
        b'{"sources":{"examples/input":{"read_through":7000,"producers":[{"id":"AQIDBAUG",'
        b'"state":{"last_ack":9223372036854775815,"begin":-1}}]}},'
        b'"ack_intents":{"examples/output":"AGFja/8H"}}\n'
    )
    assert decode_state_file(upstream) == (cp, {"a": [1, 2]})
    # Releases before checkpoints: offsets and state only.
    legacy_cp, legacy_state = decode_state_file(b'{"j":5}\n[1]\n')
    assert legacy_state == [1]
    assert legacy_cp.sources["j"].read_through == 5

    with pytest.raises(ValueError):
        decode_state_file(b"[1]")
    with pytest.raises(ValueError):
        decode_state_file(b'{"state": 1')
