"""A pytest plugin for testing a Gazette application against the real thing: etcd, brokers and
``gazette-consumer`` processes running the application under test, each one call away.

Installed with the package (entry point ``pytest11``: ``gazette``); ``-p no:gazette`` turns
it off. Its fixtures:

- ``gazette_etcd`` (session): an etcd server on a free loopback port, with a temporary data
  directory.
- ``gazette`` (per test): the test's `GazetteCluster`, under an etcd root of its own, with
  everything below as methods. Whatever the test started is killed or stopped at its end, and
  the end of each process's log is printed (pytest shows it when the test fails).
- ``gazette_brokers(n=1)``: start the test's `n` brokers (`GazetteCluster.brokers`).
- ``gazette_journals(specs)``: create journals from a YAML file or text (``gazctl journals
  apply``'s form) or from ``JournalSpec`` messages, starting a broker if the test has none
  (`GazetteCluster.journals`).
- ``gazette_consumer(app, shards=..., **flags)``: start a consumer process of ``app``
  (``package.module:Class``) and apply the shard specs through it; returns a `Consumer` with
  ``kill()`` (SIGKILL), ``stop()`` (SIGTERM, graceful), ``restart()`` and ``endpoint``
  (`GazetteCluster.consumer`).

and the test's cluster's coroutines:

- ``await gazette.publish(journal, messages, committed=True)``: append messages as a producer
  would; with ``committed=False`` as a transaction that is never acknowledged.
- ``await gazette.read_committed(journal, MessageType, until=...)``: the committed messages of
  a journal, as an application reading it sees them (each once, acknowledgements left out).
- ``await gazette.wait_primary(shard, standbys=0)``: the `Consumer` that is the shard's
  primary once one is (with `standbys` hot standbys ready).
- ``await gazette.shard_statuses()``: each shard's replicas and their status.

Tests must be able to await (pytest-asyncio or anyio); the set-up calls are synchronous and
may be made from either kind of test.

Isolation: every test gets new brokers under its own etcd root, so journal names never meet
another test's. Spec files written for a deployment are used as they are, with two paths
moved into the test's own space: a ``file://`` fragment store into the test's temporary
directory (a shared store would hand the new journals the fragments of an earlier run), and
a shard's ``hint_prefix`` under the test's etcd root (hints name offsets of an earlier run's
recovery logs). Consumer processes import the application with the test's ``sys.path``.

The module imports only the process harnesses when pytest loads it; the package's client
code (gRPC, the message layer) is imported at the first call that needs it, so collecting a
test suite that never uses the plugin costs nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from gazette.testing.cluster import BrokerCluster
from gazette.testing.consumer import ConsumerProcess
from gazette.testing.etcd import EtcdServer
from gazette.testing.process import ReadyProcess

if TYPE_CHECKING:
    from gazette.broker.client import JournalClient

__all__ = ["Consumer", "GazetteCluster", "SpecsArg"]

M = TypeVar("M")

SpecsArg = str | os.PathLike[str] | Iterable[Any]
"""Specs as a test gives them: a path to a YAML file (relative paths are from the test file's
directory), YAML text (a string holding a newline), or spec messages."""

WAIT_TIMEOUT = 60.0
"""Seconds a wait (a primary, an output) is given by default: processes start, recover and
hand over within it on a loaded machine."""

_tests = itertools.count()


class Consumer:
    """A ``gazette-consumer`` process of the test (`GazetteCluster.consumer`)."""

    def __init__(self, process: ConsumerProcess) -> None:
        self.process = process

    @property
    def endpoint(self) -> str:
        """Its gRPC address, ``127.0.0.1:PORT`` (the Shard API and the application's
        services)."""
        return self.process.endpoint

    @property
    def http_endpoint(self) -> str:
        """Its HTTP server, ``http://127.0.0.1:PORT``."""
        return self.process.http_endpoint

    @property
    def suffix(self) -> str:
        """Its member id suffix, as shard routes name it."""
        return self.process.suffix

    @property
    def running(self) -> bool:
        return self.process.running

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def kill(self) -> None:
        """SIGKILL: its shards move to other consumers once its etcd lease ends (3 s)."""
        self.process.kill()

    def stop(self) -> None:
        """SIGTERM: it hands its shards over and exits (SIGKILL after 40 s)."""
        self.process.stop()

    def restart(self) -> None:
        """Start it again, with the same ports and work directory (stopped first if it runs).
        Returns once it is ready; its previous instance's assignments are gone by then."""
        if self.process.running:
            self.process.stop()
        self.process.start()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"Consumer({self.suffix} {self.endpoint} {state})"


class _App:
    """The consumers of the test's `index`th application, under their own etcd root."""

    def __init__(self, index: int, root: str) -> None:
        self.index = index
        self.root = root
        self.consumers: list[Consumer] = []

    def running(self) -> Consumer | None:
        return next((c for c in self.consumers if c.running), None)


class GazetteCluster:
    """The processes of one test (module docs): brokers under ``{root}/brokers``, the
    consumers of each application under ``{root}/consumers/{n}``, their data and logs under
    `directory`. `base` resolves relative spec paths."""

    def __init__(self, etcd: EtcdServer, directory: Path, root: str, base: Path) -> None:
        self.etcd = etcd
        self.directory = directory
        self.root = root
        self.base = base
        self.broker_cluster: BrokerCluster | None = None
        self._apps: dict[str, _App] = {}

    # Set-up.

    def brokers(self, n: int = 1) -> BrokerCluster:
        """The test's brokers, `n` of them started at the first call (in zones ``zone-a`` and
        ``zone-b`` alternately); later calls return them. Raises `BrokerUnavailable` if one
        does not start, ValueError if `n` differs from the running cluster's size."""
        if self.broker_cluster is not None:
            if n != len(self.broker_cluster.brokers):
                raise ValueError(
                    f"the test runs {len(self.broker_cluster.brokers)} broker(s), not {n}"
                )
            return self.broker_cluster
        if n < 1:
            raise ValueError(f"a cluster needs a broker, not {n}")
        self.broker_cluster = BrokerCluster(
            self.etcd.endpoint,
            root=f"{self.root}/brokers",
            spool_root=self.directory / "brokers",
            zones=[("zone-a", "zone-b")[i % 2] for i in range(n)],
        ).start()
        return self.broker_cluster

    def journals(self, specs: SpecsArg) -> list[str]:
        """Create (or update) the journals of `specs` (`SpecsArg`: a ``gazctl journals
        apply`` YAML tree, or ``JournalSpec`` messages), starting one broker if the test has
        none; the names of the journals. ``file://`` fragment stores are moved under the
        test's directory. Raises `ValidationError` for a malformed tree, grpc.RpcError or
        RuntimeError (the status) if the brokers refuse."""
        import grpc

        from gazette.broker.protocol import protocol_pb2 as bpb
        from gazette.broker.protocol.protocol_pb2_grpc import JournalStub
        from gazette.gazctl.journalspace import apply_changes, check_required, load_tree

        if isinstance(specs, str | os.PathLike):
            changes = apply_changes(load_tree(self._yaml_text(specs)))
            check_required(changes)
        else:
            messages: list[Any] = list(specs)
            changes = [bpb.ApplyRequest.Change(upsert=s) for s in messages]
        for ch in changes:
            ch.expect_mod_revision = -1  # Whatever exists: a test may apply twice.
            if ch.HasField("upsert"):
                stores = [self._store(s) for s in ch.upsert.fragment.stores]
                del ch.upsert.fragment.stores[:]
                ch.upsert.fragment.stores.extend(stores)
        endpoint = self.brokers().endpoints[0]
        with grpc.insecure_channel(endpoint) as channel:
            resp = JournalStub(channel).Apply(bpb.ApplyRequest(changes=changes), timeout=30)
        if resp.status != bpb.OK:
            raise RuntimeError(f"journals apply: {bpb.Status.Name(resp.status)}")
        return [ch.upsert.name or ch.delete for ch in changes]

    def consumer(
        self,
        app: str,
        shards: SpecsArg | None = None,
        *,
        env: Mapping[str, str] | None = None,
        **flags: object,
    ) -> Consumer:
        """Start another consumer process of `app` (``package.module:Class``) and, given
        `shards` (`SpecsArg`: a ``gazctl shards apply`` YAML set, or ``ShardSpec`` messages),
        apply them through it; returns once it is ready. Starts one broker if the test has
        none.

        Consumers of one `app` share its etcd root and are named ``consumer-0``,
        ``consumer-1``, ... in zones ``zone-a``/``zone-b`` alternately. `flags` become command
        line flags (``hint_interval=1``: ``--hint-interval 1``; True: the bare flag; False or
        None: left out; ``**{"app.top-n": 5}`` for an application setting), `env` the
        process's environment beside ``PYTHONPATH`` (the test's ``sys.path``). Raises
        `ConsumerUnavailable` (with its log) if it does not start, as `journals` if the specs
        are refused."""
        brokers = self.brokers()
        group = self._apps.get(app)
        if group is None:
            n = len(self._apps)
            group = self._apps[app] = _App(n, f"{self.root}/consumers/{n}")
        i = len(group.consumers)
        process = ConsumerProcess(
            app,
            self.etcd.endpoint,
            brokers.endpoints,
            root=group.root,
            zone=("zone-a", "zone-b")[i % 2],
            suffix=f"consumer-{i}",
            workdir=self.directory / "consumers" / f"{group.index}-{i}",
            extra_env={"PYTHONPATH": _pythonpath(), **(env or {})},
            extra_args=_flag_args(flags),
        )
        consumer = Consumer(process)
        group.consumers.append(consumer)
        process.start()
        if shards is not None:
            self._apply_shards(consumer, shards)
        return consumer

    def _apply_shards(self, consumer: Consumer, specs: SpecsArg) -> None:
        import grpc

        from gazette.consumer.protocol import pb as cpb
        from gazette.consumer.protocol.consumer_pb2_grpc import ShardStub
        from gazette.gazctl.shardspace import apply_changes, load_set

        if isinstance(specs, str | os.PathLike):
            changes = apply_changes(load_set(self._yaml_text(specs)))
        else:
            messages: list[Any] = list(specs)
            changes = [cpb.ApplyRequest.Change(upsert=s) for s in messages]
        for ch in changes:
            ch.expect_mod_revision = -1
            if ch.HasField("upsert") and ch.upsert.hint_prefix:
                ch.upsert.hint_prefix = f"{self.root}/hints{ch.upsert.hint_prefix}"
        with grpc.insecure_channel(consumer.endpoint) as channel:
            resp = ShardStub(channel).Apply(cpb.ApplyRequest(changes=changes), timeout=30)
        if resp.status != cpb.OK:
            raise RuntimeError(f"shards apply: {cpb.Status.Name(resp.status)} {resp.extension!r}")

    def _yaml_text(self, specs: str | os.PathLike[str]) -> str:
        if isinstance(specs, str) and "\n" in specs:
            return specs
        return (self.base / specs).read_text()

    def _store(self, url: str) -> str:
        if not url.startswith("file://"):
            return url
        path = url.removeprefix("file://").strip("/")
        moved = self.directory / "fragments" / path
        moved.mkdir(parents=True, exist_ok=True)
        return f"file://{moved}/"

    # Data.

    async def publish(
        self,
        journal: str | Callable[[Any], str],
        messages: Iterable[Any],
        *,
        committed: bool = True,
    ) -> None:
        """Append `messages` to `journal` (a name, or a function of a message naming its
        journal: a partitioning), framed as the journal's ``content-type`` label says, and
        wait until every append committed. `committed`: each message readable at once
        (OUTSIDE_TXN); False: all of them in one transaction that is never acknowledged, as a
        producer that died before committing leaves it (read-committed, nobody ever sees
        them). Raises the append's or the mapping's error."""
        from gazette.broker.client import AppendService
        from gazette.broker.client.list import get_journal
        from gazette.message.framing import CONTENT_TYPE_LABEL
        from gazette.message.publisher import Publisher

        content_types: dict[str, str] = {}
        async with self._client() as client:
            service = AppendService(client)
            pub = Publisher(service)
            try:
                for msg in messages:
                    name = journal if isinstance(journal, str) else journal(msg)
                    if name not in content_types:
                        spec = await get_journal(client, name)
                        labels = {lb.name: lb.value for lb in spec.labels.labels}
                        content_types[name] = labels.get(CONTENT_TYPE_LABEL, "")
                    mapping = _to(name, content_types[name])
                    if committed:
                        pub.publish_committed(mapping, msg)
                    else:
                        pub.publish_uncommitted(mapping, msg)
                await pub.barrier()
            finally:
                await service.close()

    async def read_committed(
        self,
        journal: str,
        message_type: Callable[[], M],
        *,
        until: Callable[[list[M]], bool] | int | None = None,
        timeout: float = WAIT_TIMEOUT,
    ) -> list[M]:
        """The committed messages of `journal` from its start, each once, in commit order,
        acknowledgements left out; each decoded into a new ``message_type()``.

        `until`: None, what is committed up to the journal's write head now; a number, that
        many messages; a predicate of the messages read so far, the messages when it first
        holds. Raises AssertionError, with what was read, if that takes over `timeout`
        seconds."""
        from gazette.broker.client.list import get_journal
        from gazette.broker.client.reader import write_head
        from gazette.broker.protocol import protocol_pb2 as bpb
        from gazette.message.iterators import ReadCommittedIter
        from gazette.message.uuid import Flags, get_flags

        out: list[M] = []
        if isinstance(until, int):
            count = until
            until = lambda ms: len(ms) >= count  # noqa: E731
        async with self._client() as client:
            spec = await get_journal(client, journal)
            request = bpb.ReadRequest(journal=journal, offset=0, block=True)
            if until is None:
                request.end_offset = await write_head(client, journal)
                if request.end_offset == 0:
                    return out
            it = ReadCommittedIter(client, request, spec, lambda _spec: message_type())
            try:
                async with asyncio.timeout(timeout):
                    while until is None or not until(out):
                        try:
                            env = await it.next()
                        except StopAsyncIteration:
                            break
                        u = env.message.get_uuid()
                        if u is not None and get_flags(u) & Flags.ACK_TXN:
                            continue
                        out.append(env.message)
            except TimeoutError:
                shown = ", ".join(map(repr, out[-5:]))
                raise AssertionError(
                    f"read_committed({journal}): `until` did not hold within {timeout:g} s; "
                    f"read {len(out)} message(s), the last: {shown}"
                ) from None
            finally:
                it.close()
        return out

    # Shards.

    async def shard_statuses(self) -> dict[str, dict[str, str]]:
        """Shard id -> consumer suffix -> its replica's status (``PRIMARY``, ``STANDBY``,
        ``BACKFILL``, ``FAILED``, ``IDLE``), of every application of the test, as a running
        consumer of each lists them (a killed consumer's replicas stay listed until its lease
        ends). Raises grpc.RpcError if that consumer does not answer."""
        out: dict[str, dict[str, str]] = {}
        for group in self._apps.values():
            out.update(await _statuses(group))
        return out

    async def wait_primary(
        self, shard: str, *, standbys: int = 0, timeout: float = WAIT_TIMEOUT
    ) -> Consumer:
        """The running consumer that is `shard`'s primary, once one is and `standbys` running
        consumers are its ready hot standbys. A replica of a consumer killed by the test
        never counts, though it stays listed until its lease ends. Raises AssertionError,
        with the shard's last statuses, after `timeout` seconds."""
        import grpc

        deadline = time.monotonic() + timeout
        last: object = "no consumer running"
        while True:
            for group in self._apps.values():
                try:
                    replicas = (await _statuses(group)).get(shard)
                except grpc.RpcError as err:
                    last = err  # A consumer still starting, or just killed.
                    continue
                if replicas is None:
                    continue
                last = replicas
                by_suffix = {c.suffix: c for c in group.consumers if c.running}
                live = {s: st for s, st in replicas.items() if s in by_suffix}
                primary = [s for s, st in live.items() if st == "PRIMARY"]
                ready = sum(st == "STANDBY" for st in live.values())
                if primary and ready >= standbys:
                    return by_suffix[primary[0]]
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"waited {timeout:g} s for a primary of {shard} with {standbys} standby(s) "
                    f"(last: {last})"
                )
            await asyncio.sleep(0.1)

    # Tear-down.

    def processes(self) -> list[ReadyProcess]:
        """The brokers and consumers started, consumers first."""
        consumers = [c.process for g in self._apps.values() for c in g.consumers]
        return [*consumers, *(self.broker_cluster.brokers if self.broker_cluster else [])]

    def close(self) -> None:
        """Kill the consumers (the test is over: nothing needs their hand-over), then stop
        the brokers."""
        for group in self._apps.values():
            for c in group.consumers:
                c.kill()
        if self.broker_cluster is not None:
            self.broker_cluster.close()

    def _client(self) -> JournalClient:
        from gazette.broker.client import JournalClient

        return JournalClient(self.brokers().endpoints)


async def _statuses(group: _App) -> dict[str, dict[str, str]]:
    """The statuses of `group`'s shards (`GazetteCluster.shard_statuses`)."""
    import grpc.aio

    from gazette.consumer.protocol import pb as cpb
    from gazette.consumer.protocol.consumer_pb2_grpc import ShardStub

    consumer = group.running()
    if consumer is None:
        return {}
    async with grpc.aio.insecure_channel(consumer.endpoint) as channel:
        resp = await ShardStub(channel).List(cpb.ListRequest(), timeout=10)
    return {
        shard.spec.id: {
            m.suffix: cpb.ReplicaStatus.Code.Name(st.code)
            for m, st in zip(shard.route.members, shard.status, strict=False)
        }
        for shard in resp.shards
    }


def _to(journal: str, content_type: str) -> Callable[[Any], tuple[str, str]]:
    """The mapping of every message to `journal`."""
    return lambda _msg: (journal, content_type)


def _flag_args(flags: Mapping[str, object]) -> list[str]:
    args: list[str] = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False and value is not None:
            args += [flag, str(value)]
    return args


def _pythonpath() -> str:
    """The test process's import path, for consumers to import the application as the
    test does."""
    entries = [p for p in sys.path if p and os.path.isdir(p)]
    return os.pathsep.join(dict.fromkeys(entries))


# Fixtures.


@pytest.fixture(scope="session")
def gazette_etcd() -> Iterator[EtcdServer]:
    """An etcd server for the session (module docs)."""
    with EtcdServer() as server:
        yield server


@pytest.fixture
def gazette(
    gazette_etcd: EtcdServer,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[GazetteCluster]:
    """The test's cluster (module docs)."""
    root = f"/gazette-test/{os.getpid()}-{next(_tests)}"
    cluster = GazetteCluster(
        gazette_etcd, tmp_path_factory.mktemp("gazette"), root, Path(request.path).parent
    )
    try:
        yield cluster
    finally:
        cluster.close()
        for p in cluster.processes():
            print(f"--- {p.name} {p.endpoint} log {p.log_path}, its end:\n{p.tail_log(3000)}")


@pytest.fixture
def gazette_brokers(gazette: GazetteCluster) -> Callable[..., BrokerCluster]:
    """`GazetteCluster.brokers` of the test's cluster."""
    return gazette.brokers


@pytest.fixture
def gazette_journals(gazette: GazetteCluster) -> Callable[[SpecsArg], list[str]]:
    """`GazetteCluster.journals` of the test's cluster."""
    return gazette.journals


@pytest.fixture
def gazette_consumer(gazette: GazetteCluster) -> Callable[..., Consumer]:
    """`GazetteCluster.consumer` of the test's cluster."""
    return gazette.consumer
