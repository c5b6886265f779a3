"""JournalReplica unit tests: index refresh vs. persistence, head durability."""

from __future__ import annotations

import hashlib
from pathlib import Path

from gazette.broker.fragment.store import store_for_url
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.replica import JournalReplica, Listing
from gazette.broker.spool import Spool

from .conftest import journal_spec


def _committed_spool(replica: JournalReplica, data: bytes) -> Spool:
    spool = replica.ensure_spool()
    p = spool.begin_append()
    p.write(data)
    p.commit()
    replica.committed(spool)
    return spool


async def test_listing_taken_before_a_persist_does_not_drop_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    spec = journal_spec("tests/race/refresh", f"file://{store}/", length=1024)
    replica = JournalReplica(spec, 1, tmp_path / "spool")
    await replica.recover()
    _committed_spool(replica, b"a" * 2000)
    (rolled,) = replica.roll()
    _committed_spool(replica, b"b" * 10)

    stale = await replica.list_stores()  # the listing starts: nothing is persisted yet
    persisted = await store_for_url(spec.fragment.stores[0]).persist(rolled.spec, rolled.local_path)  # type: ignore[arg-type]
    replica.mark_persisted(rolled, persisted)
    replica.apply_listing(stale)  # ...and lands after the persist

    entry, found = replica.index.find(10)
    assert found and entry is not None and entry.spec.backing_store, "fragment was dropped"
    assert [(e.begin, e.end) for e in replica.index] == [(0, 2000), (2000, 2010)]

    # A listing taken after the persist rebuilds normally, and still has it.
    replica.apply_listing(await replica.list_stores())
    assert [(e.begin, e.end) for e in replica.index] == [(0, 2000), (2000, 2010)]


async def test_head_survives_losing_all_content(tmp_path: Path) -> None:
    spec = journal_spec("tests/head/storeless", None, length=1024)
    replica = JournalReplica(spec, 1, tmp_path)
    await replica.recover()
    _committed_spool(replica, b"x" * 1500)
    rolled = replica.roll()
    for entry in rolled:  # a journal without stores drops rolled spools
        replica.mark_persisted(entry, None)
        assert entry.local_path is not None
        entry.local_path.unlink()
    replica.close()

    again = JournalReplica(spec, 1, tmp_path)
    await again.recover()
    assert again.write_head == 1500, "offsets must never be handed out twice"


async def test_storeless_recovered_spool_is_readable_until_next_roll(tmp_path: Path) -> None:
    spec = journal_spec("tests/head/retained", None, length=1024)
    replica = JournalReplica(spec, 1, tmp_path)
    await replica.recover()
    _committed_spool(replica, b"kept")
    replica.close()  # a crash or graceful stop: the spool stays on disk

    again = JournalReplica(spec, 1, tmp_path)
    assert await again.recover() == [], "nothing to persist without stores"
    entry, found = again.index.find(0)
    assert found and entry is not None and entry.local_path is not None
    assert entry.local_path.read_bytes() == b"kept"
    assert hashlib.sha1(b"kept").digest()  # sanity
    assert again.write_head == 4
    _committed_spool(again, b"y" * 1100)
    assert [e.begin for e in again.roll()] == [0, 4], "retained spool is dropped at the roll"


async def test_appends_start_at_the_head_after_a_listing_beyond_it(tmp_path: Path) -> None:
    """A listing that finds content beyond the head (another broker persisted it) moves the
    head while our spool holds content: the next append must roll and start at the head,
    not write other content at the listed fragment's offsets (and move the head back)."""
    spec = journal_spec("tests/head/listed", None, length=1024)
    replica = JournalReplica(spec, 1, tmp_path)
    await replica.recover()
    _committed_spool(replica, b"abc")
    elsewhere = pb.Fragment(journal=spec.name, begin=0, end=10, compression_codec=pb.NONE)
    replica.apply_listing(Listing([elsewhere], [], replica.index_epoch))
    assert replica.write_head == 10
    assert replica.should_roll(0.0)
    replica.roll()
    spool = _committed_spool(replica, b"next")
    assert (spool.begin, spool.end, replica.write_head) == (10, 14, 14)
