"""The List and Apply RPCs: the journals in the keyspace, and changes to their specs.

List answers the journals matching a selector, with their routes, in pages of `LIST_PAGE`
journals; a watching List sends a new snapshot whenever the listing changes. Apply writes
upserts and deletions of specs to etcd in one transaction, guarded by the mod revisions the
request expects, and answers once this broker's view of the keyspace includes them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import Any

import grpc

from gazette.auth.claims import Claims
from gazette.auth.grpc_auth import refuse
from gazette.broker.broker import Broker
from gazette.broker.fragment.postfix import PostfixTemplateError, evaluate_postfix_template
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.labels import label_set
from gazette.broker.protocol.selector import journal_labels_with_meta, matches
from gazette.broker.protocol.validation import validate_apply_request, validate_list_request
from gazette.broker.serving import UNLIMITED, abort_invalid
from gazette.keyspace.etcd import Compare, EtcdError, op_delete, op_put

__all__ = ["LIST_PAGE", "apply", "list_journals"]

LIST_PAGE = 25  # journals per ListResponse


async def list_journals(
    broker: Broker, request: pb.ListRequest, context: Any, claims: Claims = UNLIMITED
) -> AsyncGenerator[pb.ListResponse, None]:
    """Serve one List (or a watch of it, until cancelled) on `broker`: the journals both
    the request's selector and the caller's `claims` select."""
    try:
        validate_list_request(request)
    except ValidationError as err:
        await abort_invalid(context, err)
    ks = broker.keyspace
    if request.HasField("watch_resume"):
        await ks.wait_for_change(request.watch_resume.etcd.revision)
    sent: list[bytes] | None = None
    while True:
        revision = ks.revision
        journals = []
        for kv in ks.prefixed(broker.keys.items):
            spec: pb.JournalSpec = kv.value
            if request.selector.ByteSize() or claims.selector.ByteSize():
                labels = journal_labels_with_meta(spec)
                if not matches(request.selector, labels) or not claims.covers(labels):
                    continue
            journals.append(
                pb.ListResponse.Journal(
                    spec=spec,
                    mod_revision=kv.mod_revision,
                    create_revision=kv.create_revision,
                    route=broker.route_of(spec.name),
                )
            )
        if request.watch:
            # A watch sends a snapshot only when the listing changed (not on every
            # keyspace change: routes' advertisements and other journals churn it).
            listing = [j.SerializeToString(deterministic=True) for j in journals]
            if listing == sent:
                await ks.wait_for_change(revision)
                continue
            sent = listing
        first = pb.ListResponse(status=pb.OK, header=broker.header())
        if not journals:
            yield first
        for i in range(0, len(journals), LIST_PAGE):
            resp = first if i == 0 else pb.ListResponse()
            resp.journals.extend(journals[i : i + LIST_PAGE])
            yield resp
        if not request.watch:
            return
        yield pb.ListResponse()  # ends this snapshot
        await ks.wait_for_change(revision)


async def apply(
    broker: Broker, request: pb.ApplyRequest, context: Any, claims: Claims = UNLIMITED
) -> pb.ApplyResponse:
    """Serve one Apply on `broker`: ETCD_TRANSACTION_FAILED if an expected mod revision
    does not hold; UNAVAILABLE if etcd fails, or this broker's keyspace does not reach the
    transaction's revision within 10s. A change of a journal the caller's `claims` do not
    cover (an upsert by its labels and meta-labels, a deletion by its name) refuses the
    whole request UNAUTHENTICATED, as upstream does."""
    try:
        validate_apply_request(request)
    except ValidationError as err:
        await abort_invalid(context, err)
    for ch in request.changes:
        if ch.HasField("upsert"):
            covered, name = claims.covers(journal_labels_with_meta(ch.upsert)), ch.upsert.name
        else:
            covered, name = claims.covers(label_set(("name", ch.delete))), ch.delete
        if not covered:
            await refuse(context, f"not authorized to {name}")
    for i, ch in enumerate(request.changes):
        template = ch.upsert.fragment.path_postfix_template
        if ch.HasField("upsert") and template:
            try:
                evaluate_postfix_template(template, datetime.now(UTC), ch.upsert)
            except PostfixTemplateError as err:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"Changes[{i}].Upsert.Fragment.PathPostfixTemplate: {err}",
                )
    assert broker.etcd is not None
    compares, ops = [], []
    for change in request.changes:
        name = change.upsert.name if change.HasField("upsert") else change.delete
        key = broker.keys.item(name).encode()
        if change.expect_mod_revision != -1:
            compares.append(Compare(key, "mod", change.expect_mod_revision))
        if change.HasField("upsert"):
            ops.append(op_put(key, change.upsert.SerializeToString()))
        else:
            ops.append(op_delete(key))
    try:
        resp = await broker.etcd.txn(compares, ops)
    except EtcdError as err:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
    if not resp.succeeded:
        return pb.ApplyResponse(status=pb.ETCD_TRANSACTION_FAILED, header=broker.header())
    try:
        await broker.keyspace.wait_for_revision(resp.header.revision, timeout=10)
    except TimeoutError:
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"applied at revision {resp.header.revision}, but this broker's "
            "view of etcd did not catch up within 10s",
        )
    return pb.ApplyResponse(status=pb.OK, header=broker.header())
