"""RocksDBStore's reads through its layers (the current transaction's writes, then those of
transactions still committing, newest first, then the database), on a dict standing in for
rocksdict: the layering is pure Python, the database itself is covered by test_store."""

from __future__ import annotations

import pytest

from gazette.consumer import StoreFailed
from gazette.stores.rocksdb.store import _DELETED, InvalidKey, RocksDBStore


class _Batch:
    def __init__(self) -> None:
        self.ops: list[tuple[str, bytes]] = []

    def put(self, key: bytes, value: bytes) -> None:
        self.ops.append(("put", key))

    def delete(self, key: bytes) -> None:
        self.ops.append(("delete", key))


def _store(db: dict[bytes, bytes], *committing: dict[bytes, object]) -> RocksDBStore:
    store = RocksDBStore.__new__(RocksDBStore)
    RocksDBStore.__init__(store)
    store.db = db  # type: ignore[assignment]
    store._batch = _Batch()  # type: ignore[assignment]
    store._overlay = {}
    store._committing = list(committing)
    store._error = None
    store._closed = False
    return store


def test_reads_see_the_newest_layer_and_deletes_hide_older_values() -> None:
    older = {b"\x01a": b"older", b"\x01b": b"older", b"\x01gone": _DELETED, b"\x01x": b"older"}
    newer = {b"\x01b": b"newer", b"\x01c": _DELETED, b"\x01x": _DELETED}
    store = _store({b"\x01c": b"db", b"\x01d": b"db", b"\x01gone": b"db"}, older, newer)
    store.put(b"\x01a", b"current")
    store.delete(b"\x01d")
    assert store.get(b"\x01a") == b"current"  # The current transaction first,
    assert store.get(b"\x01b") == b"newer"  # then the newest committing one,
    assert store.get(b"\x01c") is None  # whose delete hides the database's value;
    assert store.get(b"\x01c", b"dflt") == b"dflt"
    assert store.get(b"\x01gone") is None  # an older committing delete too,
    assert store.get(b"\x01x") is None  # and a newer delete an older value.
    assert store.get(b"\x01d", b"dflt") == b"dflt"  # Deleted in the current transaction.
    assert store.get(b"\x01e") is None and store.get(b"\x01e", b"x") == b"x"  # Nowhere.
    store._committing.clear()
    store._overlay.clear()
    assert store.get(b"\x01c") == b"db"
    assert store._batch.ops == [("put", b"\x01a"), ("delete", b"\x01d")]  # type: ignore[attr-defined]


@pytest.mark.parametrize("key", [b"", b"\x00checkpoint"])
def test_reserved_and_empty_keys_are_refused_before_anything_is_written(key: bytes) -> None:
    store = _store({})
    with pytest.raises(InvalidKey):
        store.put(key, b"v")
    with pytest.raises(InvalidKey):
        store.delete(key)
    assert store._overlay == {} and store._batch.ops == []  # type: ignore[attr-defined]


def test_a_closed_or_failed_store_refuses_writes() -> None:
    store = _store({})
    store._closed = True
    with pytest.raises(RuntimeError, match="closed"):
        store.put(b"\x01a", b"v")
    store = _store({})
    store._error = OSError("disk")
    with pytest.raises(StoreFailed, match="store failed"):
        store.delete(b"\x01a")
    assert store._overlay == {}
