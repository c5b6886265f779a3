"""`fenced_by`: a shard's failure that came of its Recorder being fenced, however wrapped."""

from __future__ import annotations

import pytest

from gazette.broker.client.errors import RegisterMismatch
from gazette.consumer.store import RecordingFenced, fenced_by
from gazette.recoverylog.recorder import RecorderBroken, RecorderFenced, RecordingFailed


def _raised(make: object) -> BaseException:
    """The exception `make()` raises, with the __context__ and __cause__ Python gives it."""
    try:
        make()  # type: ignore[operator]
    except BaseException as err:  # noqa: BLE001 - the test inspects what was raised
        return err
    raise AssertionError("nothing raised")


def _fenced() -> RecorderFenced:
    return RecorderFenced(
        "recovery/a",
        42,
        RegisterMismatch(journal="recovery/a", detail="check {author=a} vs {author=b}"),
    )


def _sqlite_commit() -> None:
    """As a SQLite store fails: the VFS's I/O error from RecordingFailed from the Recorder's."""
    try:
        try:
            raise _fenced()
        except RecorderFenced as err:
            raise RecordingFailed("recording failed") from err
    except RecordingFailed as err:
        raise OSError(5, "disk I/O error") from err


def _in_task_group() -> None:
    raise ExceptionGroup("unhandled errors in a TaskGroup", [_raised(_sqlite_commit)])


@pytest.mark.parametrize(
    ("make", "fenced"),
    [
        (lambda: (_ for _ in ()).throw(_fenced()), True),
        (_sqlite_commit, True),
        (_in_task_group, True),
        (lambda: (_ for _ in ()).throw(RecorderBroken("recovery/a", 1, OSError("gone"))), False),
        (lambda: (_ for _ in ()).throw(ValueError("an application's own error")), False),
    ],
)
def test_fenced_by_finds_the_fencing_through_causes_and_groups(make: object, fenced: bool) -> None:
    got = fenced_by(_raised(make))
    assert isinstance(got, RecordingFenced) if fenced else got is None
    if fenced:
        assert "recovery/a" in str(got)
