"""JSONFileStore: a consumer Store whose state is one JSON document in a recorded directory.

The application keeps its state in `JSONFileStore.state`, any JSON-serialisable object (a
dict by default), and mutates it in place as it processes messages. `start_commit` serialises
the state together with the transaction's Checkpoint *at once* (so the application may go on
mutating the state for the next transaction), then, once every `wait_for` future succeeded,
writes the document to ``next.json`` and renames it over ``state.json`` through a
`RecordedFS`, and resolves once a Recorder barrier says those operations are in the recovery
log. A crash between the write and the rename leaves ``state.json`` of the previous commit;
the next commit truncates the stale ``next.json`` (as upstream).

``state.json`` holds ``{"checkpoint": <Checkpoint as protobuf JSON>, "state": <state>}``.
`open` also reads upstream's format (three concatenated JSON values: offsets, state,
checkpoint), so a directory played from a Go consumer's log can be taken over.

Failure is crash-only: a commit that fails (a `wait_for` future failed, the state could not
be serialised, or the Recorder failed, e.g. `RecorderFenced` because a newer primary took the
log over) raises `StoreFailed` from that error, and so does every later `start_commit`; the
runtime destroys the store and recovers the shard afresh.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from google.protobuf import json_format

from gazette.consumer.protocol import pb
from gazette.consumer.store import Checkpoint, OpFuture, RecoveredLog, Shard
from gazette.consumer.store_errors import StoreClosed, StoreFailed
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.recorded_files import RecordedFS
from gazette.recoverylog.recorder import Recorder

__all__ = [
    "NEXT_FILE",
    "STATE_FILE",
    "JSONFileStore",
    "decode_state_file",
    "encode_state_file",
]

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
"""The committed state, relative to the store's directory."""
NEXT_FILE = "next.json"
"""The state being committed, renamed over `STATE_FILE` once whole."""


def encode_state_file(checkpoint: Checkpoint, state: Any) -> bytes:
    """The content of a state file holding `checkpoint` and `state`.

    Raises TypeError or ValueError if `state` is not JSON-serialisable (NaN and infinities
    included: they are not JSON).
    """
    doc = {
        "checkpoint": json_format.MessageToDict(checkpoint, preserving_proto_field_name=True),
        "state": state,
    }
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def decode_state_file(content: bytes) -> tuple[Checkpoint, Any]:
    """The (checkpoint, state) of a state file: this store's format, or upstream's.

    Raises ValueError if `content` is neither.
    """
    text = content.decode()
    values: list[Any] = []
    decoder = json.JSONDecoder()
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            break
        value, pos = decoder.raw_decode(text, pos)
        values.append(value)

    if len(values) == 1 and isinstance(values[0], dict) and "checkpoint" in values[0]:
        doc = values[0]
        checkpoint = json_format.ParseDict(doc["checkpoint"] or {}, pb.Checkpoint())
        return checkpoint, doc.get("state")
    if len(values) in (2, 3) and isinstance(values[0], dict):
        # Upstream: json.Encoder values of FlattenReadThrough(checkpoint), the state, and
        # the checkpoint (absent in files of releases before checkpoints).
        checkpoint = pb.Checkpoint()
        if len(values) == 3 and values[2] is not None:
            json_format.ParseDict(values[2], checkpoint, ignore_unknown_fields=True)
        for journal, offset in values[0].items():
            checkpoint.sources[journal].read_through = int(offset)
        return checkpoint, values[1]
    raise ValueError(f"not a JSON store state file ({len(values)} JSON values)")


class JSONFileStore:
    """A recorded store of one JSON-serialisable state (module docs). Create with `open`.

    `state` is the application's, to read and mutate between commits; `directory` is the
    store's (played-back) directory and `recorder` records its changes.
    """

    def __init__(self, recorder: Recorder, state: Any, checkpoint: Checkpoint) -> None:
        self.recorder = recorder
        self.directory = recorder.directory
        self.state = state
        self._fs = RecordedFS(recorder)
        self._checkpoint = checkpoint
        self._commit: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._closed = False

    @classmethod
    async def open(
        cls, recovered: RecoveredLog, new_state: Callable[[], Any] = dict
    ) -> JSONFileStore:
        """Open the store of a played-back recovery log, recording onwards from it.

        Reads ``state.json`` of `recovered.directory` if playback restored one; otherwise the
        state is ``new_state()`` and the checkpoint empty. Raises ValueError (or
        `json.JSONDecodeError`) if ``state.json`` is not a state file.
        """
        return await cls.from_recorder(recovered.recorder(), new_state)

    @classmethod
    async def from_recorder(
        cls, recorder: Recorder, new_state: Callable[[], Any] = dict
    ) -> JSONFileStore:
        """As `open`, recording through `recorder` (of the played-back directory)."""
        path = recorder.directory / STATE_FILE
        recorded = recorder.fnode(path) is not None

        def read() -> tuple[Checkpoint, Any] | None:
            if not recorded:
                return None
            return decode_state_file(path.read_bytes())

        found = await asyncio.to_thread(read)
        if found is None:
            log.info("new JSON file store dir=%s log=%s", recorder.directory, recorder.log)
            return cls(recorder, new_state(), pb.Checkpoint())
        checkpoint, state = found
        log.info("recovered JSON file store dir=%s log=%s", recorder.directory, recorder.log)
        return cls(recorder, state, checkpoint)

    # -- The Store contract -----------------------------------------------------------------

    def start_commit(
        self, shard: Shard, checkpoint: Checkpoint, wait_for: Sequence[OpFuture] = ()
    ) -> asyncio.Task[None]:
        """Commit the current `state` with `checkpoint` (Store contract, module docs).

        `state` and `checkpoint` are serialised before this returns. The returned task
        resolves once ``state.json`` is in the recovery log, or raises `StoreFailed` from
        what failed it (the first error of `wait_for`, TypeError/ValueError for a state that
        is not JSON, the Recorder's `RecorderFenced`/`RecorderBroken`), or from the failure
        of an earlier commit; `StoreClosed` once the store is closed. Any failure
        (cancellation of the task included, which ends it cancelled) makes the store
        unusable. Raises RuntimeError if the previous commit is still in flight (a contract
        breach).
        """
        if self._commit is not None and not self._commit.done():
            raise RuntimeError("start_commit called while the previous commit is in flight")
        content: bytes | None = None
        encode_error: BaseException | None = None
        if self._error is None and not self._closed:
            try:
                content = encode_state_file(checkpoint, self.state)
            except (TypeError, ValueError) as err:
                encode_error = err
        committed = pb.Checkpoint()
        committed.CopyFrom(checkpoint)
        task = asyncio.get_running_loop().create_task(
            self._run_commit(content, encode_error, committed, list(wait_for)),
            name=f"json-store-commit:{self.recorder.log}",
        )
        self._commit = task
        return task

    async def _run_commit(
        self,
        content: bytes | None,
        encode_error: BaseException | None,
        checkpoint: Checkpoint,
        wait_for: list[Awaitable[Any]],
    ) -> None:
        self._check()
        try:
            if encode_error is not None:
                raise encode_error
            assert content is not None
            if wait_for:
                await asyncio.gather(*wait_for)
            self._write(content)
            await self.recorder.barrier()
        except BaseException as err:
            if self._error is None:
                self._error = err
                log.warning(
                    "JSON file store commit failed dir=%s log=%s err=%r",
                    self.directory,
                    self.recorder.log,
                    err,
                )
            if isinstance(err, asyncio.CancelledError):
                raise  # Cancelled by its owner (or `destroy`): it ends cancelled.
            raise StoreFailed(
                f"JSON file store in {self.directory}: commit failed: {err!r}"
            ) from err
        self._checkpoint = checkpoint

    def _check(self) -> None:
        if self._closed:
            raise StoreClosed(f"JSON file store in {self.directory} is closed")
        if self._error is not None:
            raise StoreFailed(
                f"JSON file store in {self.directory} failed: {self._error!r}"
            ) from self._error

    def _write(self, content: bytes) -> None:
        # O_TRUNC, not O_EXCL: a recovered next.json is a commit which never happened.
        with self._fs.open(NEXT_FILE, "wb") as f:
            f.write(content)
        self._fs.rename(NEXT_FILE, STATE_FILE)

    async def build_hints(self) -> rpb.FSMHints:
        """Hints of the files recorded so far (behind a barrier): the shard's primary hints.
        Raises `StoreFailed` once a commit failed, `StoreClosed` once closed."""
        self._check()
        return await self.recorder.build_hints()

    async def restore_checkpoint(self, shard: Shard = None) -> Checkpoint:
        """The Checkpoint of the last commit (read from ``state.json`` when opened)."""
        out = pb.Checkpoint()
        out.CopyFrom(self._checkpoint)
        return out

    @property
    def failed(self) -> BaseException | None:
        """The error which failed a commit, or None."""
        return self._error

    async def close(self) -> None:
        """Wait for the commit in flight, then until everything recorded is in the log.

        The local files stay. Raises `StoreFailed` from the Recorder's error if it failed.
        """
        if self._closed:
            return
        self._closed = True
        commit = self._commit
        if commit is not None and not commit.done():
            await asyncio.wait([commit])
        try:
            await self.recorder.close()
        except Exception as err:
            raise StoreFailed(f"JSON file store in {self.directory} failed: {err!r}") from err

    def destroy(self) -> None:
        """Cancel a commit in flight and remove the store's directory (Store contract).

        Nothing more is recorded: the Recorder is dropped (its append task exits once what
        it already released is settled).
        """
        self._closed = True
        commit, self._commit = self._commit, None
        if commit is not None and not commit.done():
            commit.cancel()
        shutil.rmtree(self.directory, ignore_errors=True)
