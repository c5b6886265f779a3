"""Listing and applying journal specs, listing fragments, probing fragment stores.

A List RPC streams one snapshot in pages (only the first carries status and header). In watch
mode the broker keeps the stream open and sends a new snapshot whenever the matched set
changes, each terminated by an empty ListResponse; a broken watch resumes after the revision of
the last snapshot. Fragment listings are paged by `next_page_token`. Every helper here maps a
non-OK status to its `BrokerError` subclass, and lets transport failures surface as
`grpc.aio.AioRpcError`, except that journal listings pass over a broker that fails to answer
(`list_all_journals`) and the long-lived `watch_journals` / `PolledList` retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import grpc.aio

from gazette.broker.client.errors import (
    JournalNotFound,
    describe_error,
    error_for_status,
    is_transient_rpc_error,
)
from gazette.broker.client.journal_client import JournalClient
from gazette.broker.client.retry_reader import backoff
from gazette.broker.protocol import protocol_pb2 as pb

__all__ = [
    "list_all_journals",
    "watch_journals",
    "PolledList",
    "get_journal",
    "get_journal_entry",
    "apply_journals",
    "apply_journals_in_batches",
    "list_all_fragments",
    "fragment_store_health",
    "name_selector",
]

log = logging.getLogger(__name__)

Journals = list[pb.ListResponse.Journal]

LIST_TRIES = 3
"""A one-shot listing tries at least this many times (each configured broker at least once)."""


def name_selector(journal: str) -> pb.LabelSelector:
    """A selector matching exactly the journal named `journal` (its ``;meta`` suffix dropped)."""
    sel = pb.LabelSelector()
    sel.include.labels.add(name="name", value=journal.split(";", 1)[0])
    return sel


def _list_request(selector: pb.LabelSelector | None, watch: bool) -> pb.ListRequest:
    req = pb.ListRequest(watch=watch)
    if selector is not None:
        req.selector.CopyFrom(selector)
    return req


async def _read_snapshot(
    stream: AsyncIterator[pb.ListResponse], req: pb.ListRequest
) -> tuple[pb.Header, Journals] | None:
    """The next complete snapshot of `stream`, or None at the end of the stream."""
    first: pb.ListResponse | None = None
    journals: Journals = []
    async for resp in stream:
        if first is None:
            if resp.status != pb.OK:
                raise error_for_status(resp.status)
            first = resp
            journals.extend(resp.journals)
            continue
        if not resp.journals:
            if req.watch:
                return first.header, journals
            raise ValueError("unexpected empty ListResponse in a non-watch listing")
        journals.extend(resp.journals)
    if first is None or req.watch:
        return None  # A watch must end snapshots with an empty response.
    return first.header, journals


async def list_all_journals(
    client: JournalClient, selector: pb.LabelSelector | None = None
) -> Journals:
    """All journals matching `selector` (all journals if None), with specs, routes and revisions.

    Routes seen are remembered by the client's route cache. A broker that fails to answer
    (a transient transport error) is passed over for the client's next configured one, each
    tried in turn (and one broker alone a few times), so that the loss of a broker fails no
    listing. Raises the status's `BrokerError`, or the last `grpc.aio.AioRpcError` once every
    try failed. Cancellation cancels the RPC.
    """
    req = _list_request(selector, watch=False)
    tries = max(len(client.endpoints), LIST_TRIES)
    for attempt in range(tries):
        call = client.stub().List(req)
        try:
            snap = await _read_snapshot(call.__aiter__(), req)
            break
        except grpc.aio.AioRpcError as err:
            if not is_transient_rpc_error(err) or attempt + 1 == tries:
                raise
            # A warning when another broker is tried; a broker tried again alone is quiet
            # (a command line reports the final failure in one line).
            (log.warning if len(client.endpoints) > 1 else log.debug)(
                "journal listing failed (trying again) broker=%s err=%s",
                client.default_endpoint,
                describe_error(err),
            )
            client.next_default()
            await asyncio.sleep(backoff(attempt))
        finally:
            call.cancel()
    assert snap is not None
    _, journals = snap
    for j in journals:
        client.routes.update(j.spec.name, j.route)
    return journals


async def watch_journals(
    client: JournalClient,
    selector: pb.LabelSelector | None = None,
    *,
    backoff_fn: Callable[[int], float] = backoff,
) -> AsyncGenerator[Journals, None]:
    """Yield the journals matching `selector` now, then again after every change.

    Transport failures and broken watches are retried with backoff, resuming after the last
    snapshot's revision; a non-OK status raises its `BrokerError`. The watch RPC is cancelled
    when the generator is closed (``aclose()``, or leaving ``async for`` / cancellation).
    """
    req = _list_request(selector, watch=True)
    attempt = 0
    while True:
        call = client.stub().List(req)
        try:
            stream = call.__aiter__()
            while True:
                snap = await _read_snapshot(stream, req)
                if snap is None:
                    break
                header, journals = snap
                req.watch_resume.CopyFrom(header)
                attempt = 0
                yield journals
        except grpc.aio.AioRpcError as err:
            (log.debug if attempt == 0 else log.warning)(
                "journal watch failed (will retry) attempt=%d err=%s", attempt, err.code().name
            )
        finally:
            call.cancel()
        await asyncio.sleep(backoff_fn(attempt))
        attempt += 1


class PolledList:
    """The journals matching a selector, refreshed every `interval` seconds in the background.

    ``async with PolledList(client, selector, 30.0) as pl`` performs the first listing (its
    errors raise), then starts the refresh task. `journals` is the latest listing; `updated()`
    waits for the next one. Refresh failures are logged and retried at the next interval. The
    refresh task is cancelled by `close()` (or leaving the ``async with``).
    """

    def __init__(
        self,
        client: JournalClient,
        selector: pb.LabelSelector | None = None,
        interval: float = 30.0,
    ) -> None:
        self.client = client
        self.selector = selector
        self.interval = interval
        self.journals: Journals = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> PolledList:
        """Perform the first listing and start refreshing. Raises the listing's errors."""
        self.journals = await list_all_journals(self.client, self.selector)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="polled-list")
        return self

    async def refresh(self) -> None:
        """List now, and wake `updated()` waiters."""
        self.journals = await list_all_journals(self.client, self.selector)
        self._changed.set()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.refresh()
            except Exception as err:  # Retried at the next interval.
                log.warning("journal listing refresh failed err=%s", err)

    async def updated(self) -> Journals:
        """Wait for the next refresh, and return its journals."""
        self._changed.clear()
        await self._changed.wait()
        return self.journals

    async def close(self) -> None:
        """Stop refreshing (cancels and awaits the refresh task)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def __aenter__(self) -> PolledList:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def get_journal_entry(client: JournalClient, name: str) -> pb.ListResponse.Journal:
    """The listing entry (spec, mod_revision, route) of journal `name`.

    Raises `JournalNotFound` if it does not exist.
    """
    journals = await list_all_journals(client, name_selector(name))
    for j in journals:
        if j.spec.name == name.split(";", 1)[0]:
            return j
    raise JournalNotFound(journal=name)


async def get_journal(client: JournalClient, name: str) -> pb.JournalSpec:
    """The JournalSpec of journal `name` (see `get_journal_entry` for its mod_revision).

    Raises `JournalNotFound` if it does not exist.
    """
    return (await get_journal_entry(client, name)).spec


async def apply_journals(client: JournalClient, request: pb.ApplyRequest) -> pb.ApplyResponse:
    """Apply all changes of `request` in one etcd transaction.

    Raises `EtcdTransactionFailed` when an expected mod revision no longer matches (nothing was
    applied), another `BrokerError` for other statuses, `grpc.aio.AioRpcError` (e.g.
    INVALID_ARGUMENT for an invalid spec) on RPC failure.
    """
    resp = await client.stub().Apply(request)
    if resp.status != pb.OK:
        journal = ""
        if len(request.changes) == 1:
            ch = request.changes[0]
            journal = ch.upsert.name or ch.delete
        raise error_for_status(resp.status, journal=journal)
    return resp


async def apply_journals_in_batches(
    client: JournalClient, request: pb.ApplyRequest, size: int
) -> pb.ApplyResponse:
    """Apply `request` in transactions of at most `size` changes (0: one transaction).

    Batches apply in order; a failing batch raises (as `apply_journals`) and leaves earlier
    batches applied. Returns the last batch's response.
    """
    changes = list(request.changes)
    if not changes:
        return await apply_journals(client, request)
    size = size if size > 0 else len(changes)
    resp = pb.ApplyResponse()
    for i in range(0, len(changes), size):
        resp = await apply_journals(client, pb.ApplyRequest(changes=changes[i : i + size]))
    return resp


async def list_all_fragments(
    client: JournalClient, request: pb.FragmentsRequest
) -> list[pb.FragmentsResponse._Fragment]:
    """Every fragment of `request.journal` in the request's mod-time range, following pages.

    Raises the status's `BrokerError` (e.g. `JournalNotFound`) or `grpc.aio.AioRpcError`.
    """
    req = pb.FragmentsRequest()
    req.CopyFrom(request)
    out: list[pb.FragmentsResponse._Fragment] = []
    while True:
        stub = client.stub_for(req.journal, primary=False)
        resp = await stub.ListFragments(req)
        client.update_route(req.journal, resp.header if resp.HasField("header") else None)
        if resp.status != pb.OK:
            raise error_for_status(resp.status, journal=req.journal)
        out.extend(resp.fragments)
        if resp.next_page_token == 0:
            return out
        req.next_page_token = resp.next_page_token


async def fragment_store_health(
    client: JournalClient, store: str
) -> pb.FragmentStoreHealthResponse:
    """Ask a broker to probe the fragment store `store` (a URL such as ``s3://bucket/``).

    Raises `FragmentStoreUnhealthy` (its detail is the store's error) or another
    `BrokerError` for non-OK statuses, `grpc.aio.AioRpcError` on RPC failure.
    """
    resp = await client.stub().FragmentStoreHealth(
        pb.FragmentStoreHealthRequest(fragment_store=store)
    )
    if resp.status != pb.OK:
        raise error_for_status(resp.status, detail=resp.store_health_error or store)
    return resp
