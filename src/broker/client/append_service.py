"""AppendService: asynchronous, batched, ordered and retried appends.

`AppendService.start_append` returns an `AsyncAppend` whose content is buffered locally (in
memory up to 1 MiB, then in an anonymous temporary file). Once *released*, it joins the FIFO
queue of its journal. One dispatcher task per journal with queued appends drains that queue:

- Ordering: appends to a journal commit in the order they were released. A task that releases
  appends one after another sees them land in that order.
- Batching: the dispatcher sends the head of the queue together with the following appends
  whose requests have the same parameters (and no explicit offset) as one Append RPC, so many
  concurrent small appends cost few RPCs. Every append of a batch gets the batch's response
  (its `commit` covers the whole batch).
- Dependencies: an append is not sent before every one of its dependencies (other AsyncAppends,
  or asyncio futures) has completed, or goes in the same batch as those not yet completed (a
  batch commits or fails as one, so a dependent never lands without them). If a dependency
  failed, the append fails with `DependencyFailed` and is never sent. A chain of appends each
  depending on the one before is thus sent as few batches, and stops at the first failure.
- Retries: transport errors and routing statuses (NOT_JOURNAL_PRIMARY_BROKER, ...) are retried
  with backoff, indefinitely unless `retry_for` bounds it (then `AppendRetriesExhausted`).
  RegisterMismatch, WrongAppendOffset, NotAllowed, JournalNotFound and other statuses fail
  the batch's appends with that error. Either way the queue then moves on: appends that must
  not land after one that failed depend on it (as the Recorder's and the Publisher's do).
  A retry after a failure during commit may duplicate content (at-least-once), as with any
  Gazette client.

`pending_except(journal)` lists released appends not yet done, on other journals: a consumer
transaction uses it to make its checkpoint append wait for everything it published.

Dispatcher tasks are owned by the service: each exits when its queue is empty, and `close()`
waits for all queued appends, cancelling the dispatchers only if `close()` itself is cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from gazette.broker.client.appender import (
    CHUNK_SIZE,
    Appender,
    RetryWindow,
    is_retryable_append_error,
)
from gazette.broker.client.errors import describe_error
from gazette.broker.client.journal_client import JournalClient
from gazette.broker.client.retry_reader import backoff
from gazette.broker.protocol import protocol_pb2 as pb

__all__ = [
    "AppendService",
    "AsyncAppend",
    "AppendAborted",
    "DependencyFailed",
    "BUFFER_IN_MEMORY_LIMIT",
    "MAX_BATCH_BYTES",
]

log = logging.getLogger(__name__)

BUFFER_IN_MEMORY_LIMIT = 1 << 20
"""An AsyncAppend's content beyond this size is buffered in a temporary file."""

MAX_BATCH_BYTES = 16 << 20
"""Appends are batched into one RPC up to this many bytes (a larger single append goes alone)."""


class AppendAborted(Exception):
    """The AsyncAppend was aborted before release (its ``async with`` block raised)."""


class DependencyFailed(Exception):
    """A dependency of the AsyncAppend failed, so the append was never sent.

    `__cause__` is the dependency's error.
    """


class AsyncAppend:
    """An append managed by an `AppendService`. Created by `AppendService.start_append`.

    Write content with `write`, then `release` it (or use it as ``async with``: release on a
    clean exit, abort if the block raises). Await `done()` for the broker's response.
    """

    def __init__(
        self,
        service: AppendService,
        request: pb.AppendRequest,
        dependencies: Iterable[AsyncAppend | asyncio.Future[Any]],
    ) -> None:
        self._service = service
        self.request = pb.AppendRequest()
        self.request.CopyFrom(request)
        self.dependencies: tuple[AsyncAppend | asyncio.Future[Any], ...] = tuple(dependencies)
        self.size = 0
        self._mem: list[bytes] = []  # The content while it fits BUFFER_IN_MEMORY_LIMIT...
        self._file: IO[bytes] | None = None  # ...and once it outgrew it.
        self._released = False
        self._future: asyncio.Future[pb.AppendResponse] = asyncio.get_running_loop().create_future()
        # Failures are delivered via done(); don't warn if nobody asked.
        self._future.add_done_callback(_mark_retrieved)

    @property
    def journal(self) -> str:
        return self.request.journal

    @property
    def released(self) -> bool:
        return self._released

    def write(self, data: bytes) -> None:
        """Buffer `data` for the append. Raises RuntimeError once released or aborted."""
        if self._released or self._future.done():
            raise RuntimeError("AsyncAppend.write after release or abort")
        if not isinstance(data, bytes):
            # A copy: the caller may reuse a mutable buffer, and len() of a memoryview counts
            # items, not bytes.
            data = bytes(data)
        if not data:
            return
        if self._file is None and self.size + len(data) <= BUFFER_IN_MEMORY_LIMIT:
            self._mem.append(data)  # No copy into and out of a file for a small append.
        else:
            if self._file is None:
                spill = tempfile.TemporaryFile()  # noqa: SIM115 - closed by _close_buffer
                try:
                    for chunk in self._mem:
                        spill.write(chunk)
                except BaseException:
                    spill.close()  # (e.g. ENOSPC) Nothing is lost: the content stays in _mem.
                    raise
                self._file, self._mem = spill, []
            self._file.write(data)
        self.size += len(data)

    def release(self) -> AsyncAppend:
        """Queue the append for dispatch; returns self. Writes are no longer allowed.

        Raises RuntimeError if already released or aborted, or if the service is closed.
        """
        if self._released or self._future.done():
            raise RuntimeError("AsyncAppend already released or aborted")
        self._released = True
        self._service._enqueue(self)
        return self

    def abort(self, cause: BaseException | None = None) -> None:
        """Discard the (unreleased) append: `done()` raises `AppendAborted` from `cause`."""
        if self._released or self._future.done():
            raise RuntimeError("AsyncAppend already released or aborted")
        err = AppendAborted(f"append to {self.journal} aborted")
        err.__cause__ = cause
        self._fail(err)

    def is_done(self) -> bool:
        """Whether the append has committed or failed."""
        return self._future.done()

    def add_done_callback(self, fn: Callable[[AsyncAppend], None]) -> None:
        """Call `fn(self)` (from the event loop) once the append commits or fails."""
        self._future.add_done_callback(lambda _f: fn(self))

    async def done(self) -> pb.AppendResponse:
        """Wait for the append to commit and return the broker's response.

        Raises the append's error: a `BrokerError` subclass (RegisterMismatch, ...),
        `DependencyFailed`, `AppendAborted`, or CancelledError if the service was cancelled
        while closing. Cancelling `done()` itself does not cancel the append.
        """
        return await asyncio.shield(self._future)

    @property
    def response(self) -> pb.AppendResponse | None:
        """The broker's response once committed, else None."""
        f = self._future
        if f.done() and not f.cancelled() and f.exception() is None:
            return f.result()
        return None

    def error(self) -> BaseException | None:
        """The append's error once failed, else None."""
        f = self._future
        if not f.done():
            return None
        if f.cancelled():
            return asyncio.CancelledError()
        return f.exception()

    def _chunks(self) -> Iterator[bytes]:
        """The content, in pieces of at most CHUNK_SIZE (again from the start at each call)."""
        if self._file is None:
            for data in self._mem:
                if len(data) <= CHUNK_SIZE:
                    yield data
                else:
                    for i in range(0, len(data), CHUNK_SIZE):
                        yield data[i : i + CHUNK_SIZE]
            return
        self._file.seek(0)
        while chunk := self._file.read(CHUNK_SIZE):
            yield chunk

    def _succeed(self, resp: pb.AppendResponse) -> None:
        self._close_buffer()
        if not self._future.done():
            self._future.set_result(resp)

    def _fail(self, err: BaseException) -> None:
        self._close_buffer()
        if not self._future.done():
            if isinstance(err, asyncio.CancelledError):
                self._future.cancel()
            else:
                self._future.set_exception(err)

    def _close_buffer(self) -> None:
        self._mem = []
        if self._file is not None:
            self._file.close()
            self._file = None

    async def __aenter__(self) -> AsyncAppend:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if self._released or self._future.done():
            return
        if exc is None:
            self.release()
        else:
            self.abort(exc)

    def __repr__(self) -> str:
        state = "done" if self.is_done() else "released" if self._released else "open"
        return f"<AsyncAppend journal={self.journal} size={self.size} {state}>"


def _mark_retrieved(f: asyncio.Future[pb.AppendResponse]) -> None:
    if not f.cancelled():
        f.exception()


def _dependency_future(dep: AsyncAppend | asyncio.Future[Any]) -> asyncio.Future[Any]:
    return dep._future if isinstance(dep, AsyncAppend) else dep


def _dependency_error(dep: AsyncAppend | asyncio.Future[Any]) -> BaseException | None:
    f = _dependency_future(dep)
    if f.cancelled():
        return asyncio.CancelledError()
    return f.exception()


def _may_join(a: AsyncAppend, in_batch: set[int]) -> bool:
    """Whether `a` may join a batch holding the appends of ids `in_batch`: each of its
    dependencies is one of them (the batch commits or fails as one) or completed successfully."""
    for dep in a.dependencies:
        if id(dep) in in_batch:
            continue
        if not _dependency_future(dep).done() or _dependency_error(dep) is not None:
            return False
    return True


def _batchable(head: pb.AppendRequest, other: pb.AppendRequest) -> bool:
    # Same journal and parameters; an explicit offset pins an append to one exact position.
    return head.offset == 0 and other.offset == 0 and head == other


class AppendService:
    """Dispatches `AsyncAppend`s of many journals through one `JournalClient`.

    Use as ``async with AppendService(client) as svc`` (or call `close()`).
    `rpc_count` counts Append RPCs attempted, `appends_committed` appends acknowledged.

    An RPC failing with a retryable error (an unreachable broker, a routing status) is
    retried with backoff: for ever by default (a journal's appends wait for its brokers), or,
    with `retry_for` seconds, until its attempts have failed for that long; its appends then
    fail with `AppendRetriesExhausted` (the journal's later appends go on trying).
    """

    def __init__(
        self,
        client: JournalClient,
        *,
        backoff_fn: Callable[[int], float] = backoff,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        retry_for: float | None = None,
    ) -> None:
        self.client = client
        self._backoff = backoff_fn
        self._retry_for = RetryWindow.checked(retry_for)
        self._max_batch = max_batch_bytes
        self._queues: dict[str, deque[AsyncAppend]] = {}
        self._released_log: list[AsyncAppend] | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False
        self.rpc_count = 0
        self.appends_committed = 0

    @property
    def max_batch_bytes(self) -> int:
        """Appends are batched into one RPC up to this many bytes (one append may exceed it)."""
        return self._max_batch

    def start_append(
        self,
        request: pb.AppendRequest,
        dependencies: Iterable[AsyncAppend | asyncio.Future[Any]] = (),
    ) -> AsyncAppend:
        """A new `AsyncAppend` of `request` (content must be empty; write it instead).

        It is sent only after all `dependencies` completed successfully, or in one batch with
        those which have not completed yet (see the module docs). Must be called from
        within the event loop. Raises RuntimeError once the service is closed, ValueError for
        a request without journal or with content.
        """
        if self._closed:
            raise RuntimeError("AppendService is closed")
        if not request.journal:
            raise ValueError("AppendRequest.journal is required")
        if request.content:
            raise ValueError("AppendRequest.content must be empty: write() the content")
        return AsyncAppend(self, request, dependencies)

    def track_released(self) -> None:
        """From now on, remember every released append until `take_released` hands it out
        (a consumer transaction's commit waits for, and fails on, each of its appends, also
        those already done)."""
        if self._released_log is None:
            self._released_log = []

    @property
    def tracks_released(self) -> bool:
        return self._released_log is not None

    def take_released(self, except_journal: str = "") -> list[AsyncAppend]:
        """Appends released since the last call (done or not), other than to
        `except_journal`. Requires `track_released`."""
        if self._released_log is None:
            raise RuntimeError("take_released requires track_released()")
        out, self._released_log = self._released_log, []
        return [a for a in out if a.journal != except_journal]

    def pending_except(self, journal: str) -> list[AsyncAppend]:
        """Released appends not yet done, of every journal other than `journal`.

        ``pending_except("")`` returns all of them.
        """
        return [a for j, q in self._queues.items() if j != journal for a in q if not a.is_done()]

    def _enqueue(self, a: AsyncAppend) -> None:
        if self._closed:
            a._fail(RuntimeError("AppendService is closed"))
            raise RuntimeError("AppendService is closed")
        q = self._queues.setdefault(a.journal, deque())
        q.append(a)
        if self._released_log is not None:
            self._released_log.append(a)
        if a.journal not in self._tasks:
            self._tasks[a.journal] = asyncio.get_running_loop().create_task(
                self._dispatch(a.journal), name=f"append-dispatch:{a.journal}"
            )

    async def _dispatch(self, journal: str) -> None:
        q = self._queues[journal]
        try:
            while q:
                head = q[0]
                await self._await_dependencies(head)
                if head.is_done():
                    q.popleft()
                    continue
                batch = [head]
                in_batch = {id(head)}
                size = head.size
                for a in itertools.islice(q, 1, None):
                    if not _batchable(head.request, a.request):
                        break
                    if size + a.size > self._max_batch:
                        break
                    if not _may_join(a, in_batch):
                        break
                    batch.append(a)
                    in_batch.add(id(a))
                    size += a.size
                await self._send(batch)
                for _ in batch:
                    q.popleft()
        except BaseException as err:
            for a in q:
                a._fail(err)
            q.clear()
            if isinstance(err, asyncio.CancelledError):
                raise
            # Every queued append now carries the error; the task itself ends quietly.
            log.exception("append dispatcher failed journal=%s", journal)
        finally:
            # No await between the emptiness check above and this: a release racing the
            # dispatcher's exit always finds either a live task or no task.
            del self._tasks[journal]
            del self._queues[journal]

    async def _await_dependencies(self, a: AsyncAppend) -> None:
        futures = [_dependency_future(d) for d in a.dependencies]
        pending = [f for f in futures if not f.done()]
        if pending:
            await asyncio.wait(pending)
        for dep in a.dependencies:
            err = _dependency_error(dep)
            if err is not None:
                failed = DependencyFailed(f"append to {a.journal}: a dependency failed: {err}")
                failed.__cause__ = err
                a._fail(failed)
                return

    async def _send(self, batch: list[AsyncAppend]) -> None:
        head = batch[0]
        window = RetryWindow(head.journal, self._retry_for)
        attempt = 0
        while True:
            self.rpc_count += 1
            appender: Appender | None = None
            try:
                # Many small appends travel in few messages: a message per append would cost
                # a gRPC write (tens of microseconds of CPU each side) per append. A message
                # is handed over as the appends' buffers (a direct append frames them as
                # they are; gRPC joins them).
                chunks = (chunk for a in batch for chunk in a._chunks() if chunk)
                message: list[bytes] = []
                size = 0
                more: bytes | None = None  # The first chunk of a second message.
                for chunk in chunks:
                    if message and size + len(chunk) > CHUNK_SIZE:
                        more = chunk
                        break
                    message.append(chunk)
                    size += len(chunk)
                resp = None
                if more is None:
                    # One message at most (the usual case): written at once, when the
                    # primary takes direct appends.
                    resp = await Appender.append_once(self.client, head.request, message)
                if resp is None:
                    # Streamed as it is read: a large append may be a file.
                    appender = Appender(self.client, head.request)
                    if message:
                        await appender.write_message(message)
                    if more is not None:
                        message, size = [more], len(more)
                        for chunk in chunks:
                            if size + len(chunk) > CHUNK_SIZE:
                                await appender.write_message(message)
                                message, size = [], 0
                            message.append(chunk)
                            size += len(chunk)
                        await appender.write_message(message)
                    resp = await appender.close()
            except Exception as err:
                if appender is not None:
                    await appender.abort()
                try:
                    if not is_retryable_append_error(err):
                        raise
                    # Raises once the retry window is over.
                    delay = window.failed(err, attempt, self._backoff(attempt))
                except Exception as final:
                    for a in batch:
                        a._fail(final)
                    return
                (log.debug if attempt == 0 else log.warning)(
                    "append failed (will retry) journal=%s appends=%d attempt=%d err=%s",
                    head.journal,
                    len(batch),
                    attempt,
                    describe_error(err),
                )
                await asyncio.sleep(delay)
                attempt += 1
                continue
            except BaseException:
                if appender is not None:
                    await asyncio.shield(appender.abort())
                raise
            self.appends_committed += len(batch)
            for a in batch:
                a._succeed(resp)
            return

    async def close(self) -> None:
        """Wait until every released append is done, then refuse new ones.

        If `close` is cancelled, the dispatchers are cancelled and their queued appends fail
        with CancelledError (an in-flight RPC may or may not have committed).
        """
        try:
            while self._tasks:
                await asyncio.wait(list(self._tasks.values()))
        except asyncio.CancelledError:
            tasks = list(self._tasks.values())
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            self._closed = True

    async def __aenter__(self) -> AppendService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
