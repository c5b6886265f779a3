"""Client library of the broker protocol: readers, appenders and listing helpers.

- `JournalClient` holds channels to brokers and routes journal RPCs (`RouteCache`).
- `Reader` streams one Read RPC; `RetryReader` reads a journal across RPCs and failures.
- `Appender` streams one Append RPC; `append` is a retrying one-shot append.
- `AppendService` batches, orders and retries asynchronous appends (`AsyncAppend`).
- `list_all_journals`, `watch_journals`, `PolledList`, `get_journal`, `apply_journals`,
  `list_all_fragments`, `fragment_store_health` wrap the remaining RPCs.
- Non-OK statuses raise `BrokerError` subclasses (`errors`).

Everything is asyncio (grpc.aio). A typical use::

    async with JournalClient("127.0.0.1:8080") as client:
        await append(client, pb.AppendRequest(journal="a/journal"), b"hello\\n")
        rr = RetryReader(client, pb.ReadRequest(journal="a/journal", offset=0))
        print(await rr.readline())
"""

from gazette.broker.client.append_service import (
    AppendAborted,
    AppendService,
    AsyncAppend,
    DependencyFailed,
)
from gazette.broker.client.appender import (
    Appender,
    AppendRetriesExhausted,
    append,
    is_retryable_append_error,
)
from gazette.broker.client.errors import (
    BrokerError,
    EtcdTransactionFailed,
    FragmentStoreUnhealthy,
    IndexHasGreaterOffset,
    InsufficientJournalBrokers,
    JournalNotFound,
    NoJournalPrimaryBroker,
    NotAllowed,
    NotJournalBroker,
    NotJournalPrimaryBroker,
    OffsetJump,
    OffsetNotYetAvailable,
    ProposalMismatch,
    RegisterMismatch,
    Suspended,
    WrongAppendOffset,
    WrongRoute,
    error_for_status,
    is_transient_rpc_error,
)
from gazette.broker.client.fragment_reader import VerifiedFragment, fetch_verified_fragment
from gazette.broker.client.journal_client import JournalClient, JournalStub
from gazette.broker.client.list import (
    PolledList,
    apply_journals,
    apply_journals_in_batches,
    fragment_store_health,
    get_journal,
    get_journal_entry,
    list_all_fragments,
    list_all_journals,
    name_selector,
    watch_journals,
)
from gazette.broker.client.reader import Reader, write_head
from gazette.broker.client.retry_reader import RetryReader, backoff
from gazette.broker.client.route_cache import RouteCache

__all__ = [
    "AppendAborted",
    "AppendService",
    "Appender",
    "AppendRetriesExhausted",
    "AsyncAppend",
    "BrokerError",
    "DependencyFailed",
    "EtcdTransactionFailed",
    "FragmentStoreUnhealthy",
    "IndexHasGreaterOffset",
    "InsufficientJournalBrokers",
    "JournalClient",
    "JournalNotFound",
    "JournalStub",
    "NoJournalPrimaryBroker",
    "NotAllowed",
    "NotJournalBroker",
    "NotJournalPrimaryBroker",
    "OffsetJump",
    "OffsetNotYetAvailable",
    "PolledList",
    "ProposalMismatch",
    "Reader",
    "RegisterMismatch",
    "RetryReader",
    "RouteCache",
    "Suspended",
    "VerifiedFragment",
    "WrongAppendOffset",
    "WrongRoute",
    "append",
    "apply_journals",
    "apply_journals_in_batches",
    "backoff",
    "error_for_status",
    "fetch_verified_fragment",
    "fragment_store_health",
    "get_journal",
    "get_journal_entry",
    "is_retryable_append_error",
    "is_transient_rpc_error",
    "list_all_fragments",
    "list_all_journals",
    "name_selector",
    "watch_journals",
    "write_head",
]
