"""One shard assigned to this process: hot standby, then primary, until unassigned.

A replica first plays the shard's recovery log back into its directory and keeps tailing it
(BACKFILL, then STANDBY once it read through the write head). When its assignment becomes the
primary (slot 0), it completes recovery:

1. injects a hand-off no-op with a new author into the log and reads through it: the log's
   fence register now names this process, so the previous primary's writes fail;
2. builds the store from the played files (`Application.new_store`) and restores its
   Checkpoint; writes the hints of the recovered state as the shard's ``backup.0`` (shifting
   older backups along; retried until it succeeds), as upstream does on every recovery;
   re-appends the checkpoint's ACK intents (a previous primary may have crashed between its
   commit and its ACKs);
3. writes primary hints every `hint_interval` (the first one interval after recovery, as
   upstream);
4. runs transactions (`consumer.txn`) with status PRIMARY, over the journals of the spec's
   sources, or over what the Application produces if it is a `MessageProducer`. When a
   producer returns, its last transaction commits and the producer starts again from the
   checkpoint of that commit. The store's `restore_checkpoint` is called once, in step 2
   (for an SQLStore it takes the shard's fence: calling it again at a restart would let a
   process that lost its assignment fence out the new primary).

Any error sets FAILED with the error message; the replica stays FAILED (and assigned) until
it is unassigned (``gazctl shards unassign --failed``), unless the store lost its recording
process (`consumer.store.RecordingLost`, set as `recording_lost`): the runtime then gives the
assignment up itself, so that a standby takes over (docs/consumer.md). Cancellation
(unassigned, or process exit) stops processing; a commit in flight is allowed to finish; the
store is destroyed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from gazette.broker.client import AppendService, JournalClient
from gazette.consumer.application import Application, MessageProducer, Shard, check_message_producer
from gazette.consumer.hints import (
    HintsConflict,
    HintsGuardFailed,
    load_hints,
    rotate_backup_hints,
    store_primary_hints,
)
from gazette.consumer.message_producer import ProducedMessages
from gazette.consumer.protocol import pb
from gazette.consumer.recovery import hand_off
from gazette.consumer.spec import read_channel_size, recovery_log_of, ring_buffer_size
from gazette.consumer.store import (
    RecordingFenced,
    RecordingLost,
    RecoveredLog,
    Store,
    fenced_by,
    recording_fenced,
    recording_lost,
)
from gazette.consumer.txn import (
    MessageSource,
    SourceReaders,
    Transactions,
    TxnStats,
    checkpoint_offsets,
    sequencer_from_checkpoint,
)
from gazette.keyspace.etcd import Compare, Etcd, EtcdError
from gazette.message.publisher import AckIntent, Publisher
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.author import new_author
from gazette.recoverylog.player import TAIL, PlaybackProgress, Player

if TYPE_CHECKING:
    from gazette.consumer.store_hooks import StoreHook

__all__ = ["ReplicaContext", "ShardReplica"]

log = logging.getLogger(__name__)

Code = pb.ReplicaStatus.Code

PRODUCER_IDLE_PAUSE = 0.05
"""Seconds before restarting a MessageProducer that returned without delivering anything."""
PRODUCER_IDLE_PAUSE_MAX = 2.0
"""Longest such pause (it doubles while the producer stays idle)."""
RECOVERED_HINTS_RETRY = 0.05
"""Seconds before retrying to store a new primary's recovered hints (doubling per retry)."""
RECOVERED_HINTS_RETRY_MAX = 5.0
RECOVERED_HINTS_ETCD_ATTEMPTS = 10
"""etcd failures storing a new primary's recovered hints before it serves without them
(guard failures and conflicts are retried for as long as the assignment stays)."""
"""Longest such pause."""


@dataclass
class ReplicaContext:
    """What a replica needs from its process (`consumer.runtime`)."""

    app: Application
    etcd: Etcd
    client: JournalClient
    broker_endpoint: str
    workdir: Path
    root: str
    """The consumer application's etcd root (shard fqn = root/items/id)."""
    status_changed: Callable[[], None]
    """Called when a replica's status changed (the process advertises it in etcd)."""
    hint_interval: float = 300.0
    store_hooks: Sequence[StoreHook] = ()
    """The process's hooks of its store kinds (`consumer.store_hooks`): handed to stores
    in `RecoveredLog.store_hooks`; a standby asks them to prepare for its promotion."""


HOLD_RELEASE_TIMEOUT = 30.0
"""Seconds a stopping or failed replica waits for resolutions holding its store (`hold`)
before releasing it anyway."""


class ShardReplica:
    """A shard assigned to this process (module docs). Owned by the runtime: `start`, then
    `promote` when the assignment becomes primary, `stop` when it is removed."""

    def __init__(self, ctx: ReplicaContext, spec: pb.ShardSpec, assignment: Any) -> None:
        self.ctx = ctx
        self.spec = spec
        self.id = spec.id
        # Each shard appends through its own service: a commit waits for (and fails on)
        # exactly its transaction's appends, never another shard's.
        self.append_service = AppendService(ctx.client)
        self.append_service.track_released()
        self.shard = Shard(spec, f"{ctx.root}/items/{spec.id}", ctx.client, self.append_service)
        self.shard.assignment = assignment
        self.status = pb.ReplicaStatus(code=Code.IDLE)
        self.directory = ctx.workdir / quote(spec.id, safe="") / "store"
        self.store: Store | None = None
        self.transactions: Transactions | None = None
        self.stats = TxnStats()
        """Transactions of this replica as primary (across producer restarts)."""
        self.producer_restarts = 0
        self.player: Player | None = None
        self.progress: PlaybackProgress | None = None
        self._primary = asyncio.Event()
        self.settled = asyncio.Event()
        """Set once the replica is PRIMARY or FAILED (a primary's recovery is over)."""
        self._task: asyncio.Task[None] | None = None
        self.recording_lost: RecordingLost | None = None
        """Why the replica FAILED, if its store's recording process died (module docs)."""
        self._holds = 0
        self._unheld = asyncio.Event()
        self._unheld.set()

    # --- control (from the runtime) ---------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"shard {self.id}")

    def promote(self) -> None:
        """The assignment is now the primary: complete recovery and start processing."""
        self._primary.set()

    @property
    def is_primary(self) -> bool:
        return self._primary.is_set()

    def hold(self) -> None:
        """A resolution uses the shard and its store (`consumer.resolver`): they are released
        only once every hold is `unhold`-ed, also when the replica stops or fails."""
        self._holds += 1
        self._unheld.clear()

    def unhold(self) -> None:
        self._holds -= 1
        if self._holds == 0:
            self._unheld.set()

    async def stop(self) -> None:
        """Stop processing and release the store (once no resolution holds it). Returns once
        done."""
        self.shard.stopping.set()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})  # Not `await task`: our own cancellation propagates.
        await self._wait_unheld()
        self._release()
        await self._close_appends()

    async def _wait_unheld(self) -> None:
        """Wait until no resolution holds the store, at most `HOLD_RELEASE_TIMEOUT` seconds:
        then release it anyway (a holder finds it closed), so that one holder ignoring
        ``shard.stopping`` cannot keep the shard from being assigned here again, nor the
        process from exiting."""
        try:
            async with asyncio.timeout(HOLD_RELEASE_TIMEOUT):
                await self._unheld.wait()
        except TimeoutError:
            log.warning(
                "releasing a store still held shard=%s holds=%d seconds=%.0f (a resolution "
                "was not exited once shard.stopping was set)",
                self.id,
                self._holds,
                HOLD_RELEASE_TIMEOUT,
            )

    async def _close_appends(self) -> None:
        try:
            async with asyncio.timeout(10.0):
                await self.append_service.close()
        except TimeoutError:
            log.warning("shard appends did not complete in 10 s shard=%s", self.id)
        except Exception as err:  # noqa: BLE001
            log.warning("closing shard appends failed shard=%s err=%s", self.id, err)

    # --- lifecycle --------------------------------------------------------------------------
    def _set_status(self, code: int, error: str = "") -> None:
        status = pb.ReplicaStatus(code=code)  # type: ignore[arg-type]
        if error:
            status.errors.append(error)
        if status != self.status:
            self.status = status
            self.ctx.status_changed()
            if code in (Code.PRIMARY, Code.FAILED):
                self.settled.set()

    async def _run(self) -> None:
        try:
            await self._serve()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the shard fails, the process goes on
            cause = _root_cause(err)
            # Asked before `_release` ends the store.
            lost = recording_lost(self.store) or fenced_by(err)
            lost = lost or await recording_fenced(self.store)
            if lost is not None:
                log.warning(
                    "shard %s; handing it over shard=%s err=%s failure=%r",
                    "recorder was fenced"
                    if isinstance(lost, RecordingFenced)
                    else "lost its store's recording process",
                    self.id,
                    lost,
                    cause,
                )
                self.recording_lost = cause = lost  # Before the runtime hears of FAILED.
            else:
                log.error("shard failed shard=%s err=%s", self.id, cause, exc_info=cause)
            self.shard.stopping.set()
            self._set_status(Code.FAILED, f"{type(cause).__name__}: {cause}")
            await self._wait_unheld()
            self._release()

    async def _serve(self) -> None:
        recovered = await self._recover()
        shard = self.shard
        # Taken before the store records on from the recovered FSM.
        recovered_hints = _recovered_hints(recovered)
        self.store = store = await self._new_store(recovered)
        cp = await store.restore_checkpoint(shard)
        if recovered_hints is not None:
            # Only once the checkpoint restored: a store that cannot be opened must not
            # push good backup hints out.
            await self._store_recovered_hints(recovered_hints)
        publisher = Publisher(self.append_service)
        # A previous primary may have committed without appending its ACKs: append them
        # again (a duplicate ACK is harmless), before reading anything.
        restored = [AckIntent(j, bytes(b)) for j, b in sorted(cp.ack_intents.items())]
        publish_at = {}
        for aa in publisher.publish_ack_intents(restored):
            resp = await aa.done()
            publish_at[aa.journal] = resp.commit.end
        await shard._set_progress(checkpoint_offsets(cp), publish_at)
        self._set_status(Code.PRIMARY)
        log.info("shard primary shard=%s checkpoint_sources=%d", self.id, len(cp.sources))
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._process(store, publisher, cp), name=f"process {self.id}")
            if recovered is not None and self.spec.hint_prefix:
                tg.create_task(self._hints_loop(), name=f"hints {self.id}")

    async def _process(self, store: Store, publisher: Publisher, cp: pb.Checkpoint) -> None:
        """Run transactions from checkpoint `cp`. The journal sources never end; a
        MessageProducer that returns has its last transaction committed, then is started
        again from the checkpoint of the last commit (not restored again from the store).
        One that returns without delivering anything is started again no sooner than a
        pause after its previous start, the pause doubling from `PRODUCER_IDLE_PAUSE` up to
        `PRODUCER_IDLE_PAUSE_MAX` while it stays idle: a producer with nothing to do would
        otherwise spin."""
        shard, app = self.shard, self.ctx.app
        check_message_producer(app)  # Fails the shard: not taken for a sources application.
        idle_pause = PRODUCER_IDLE_PAUSE
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            source: MessageSource
            if isinstance(app, MessageProducer):
                source = ProducedMessages(shard, app, store, cp, read_channel_size(self.spec))
            else:
                source = SourceReaders(
                    shard, app, checkpoint_offsets(cp), read_channel_size(self.spec)
                )
            self.transactions = txns = Transactions(
                shard,
                app,
                store,
                publisher,
                sequencer_from_checkpoint(cp, ring_buffer_size(self.spec)),
                source,
                recovery_log=recovery_log_of(self.spec),
                stats=self.stats,
            )
            async with asyncio.TaskGroup() as tg:
                reading = tg.create_task(source.run(), name=f"read {self.id}")
                await txns.run()  # Returns once the source ended and its last commit is done.
                reading.cancel()
            # Transaction boundary: every commit (and its ACKs) completed. Resume from the
            # last one (its ACK intents were appended: they are not appended again), or from
            # `cp` again if no transaction ran.
            if txns.last_committed is not None:
                cp = txns.last_committed
            await shard._set_progress(checkpoint_offsets(cp), {})
            self.producer_restarts += 1
            idle = isinstance(source, ProducedMessages) and source.sink.delivered == 0
            log.log(
                logging.DEBUG if idle else logging.INFO,
                "message producer finished; restarting from the checkpoint shard=%s "
                "restarts=%d delivered=%s",
                self.id,
                self.producer_restarts,
                source.sink.delivered if isinstance(source, ProducedMessages) else "-",
            )
            if idle:
                # At most one idle start per pause: a producer that waited (long-polled)
                # before returning empty is restarted without further delay.
                await asyncio.sleep(max(0.0, started + idle_pause - loop.time()))
                idle_pause = min(idle_pause * 2, PRODUCER_IDLE_PAUSE_MAX)
            else:
                idle_pause = PRODUCER_IDLE_PAUSE

    async def _new_store(self, recovered: RecoveredLog | None) -> Store:
        """The application's store. If cancelled while the store is being built (a RocksDB
        store starts a fusefs process), the construction completes and is destroyed."""
        made = self.ctx.app.new_store(self.shard, recovered)
        if not inspect.isawaitable(made):
            return made
        building = asyncio.ensure_future(made)
        try:
            return await asyncio.shield(building)
        except asyncio.CancelledError:
            try:
                async with asyncio.timeout(30.0):
                    built = await building
                built.destroy()
            except BaseException as err:  # noqa: BLE001 - we are being cancelled anyway
                log.warning(
                    "store built during cancellation not released shard=%s err=%s", self.id, err
                )
            raise

    def update_spec(self, spec: pb.ShardSpec) -> None:
        """Apply a changed ShardSpec that does not need a restart (`needs_restart`)."""
        self.spec = spec
        self.shard.spec = spec
        if self.transactions is not None:
            self.transactions.apply_spec(spec)

    def needs_restart(self, spec: pb.ShardSpec) -> bool:
        """Whether `spec` changes what the replica was started with (sources, logs, hints,
        buffers): it must then be restarted to apply it."""
        old = self.spec
        return (
            list(old.sources) != list(spec.sources)
            or old.recovery_log_prefix != spec.recovery_log_prefix
            or old.hint_prefix != spec.hint_prefix
            or old.hint_backups != spec.hint_backups
            or old.ring_buffer_size != spec.ring_buffer_size
            or old.read_channel_size != spec.read_channel_size
        )

    async def _recover(self) -> RecoveredLog | None:
        """Standby until primary, then take the recovery log over (None: no log)."""
        log_name = recovery_log_of(self.spec)
        if not log_name:
            self._set_status(Code.STANDBY)
            await self._primary.wait()
            return None
        hints = await self._load_hints(log_name)
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        player = Player(
            self.ctx.client,
            log_name,
            hints,
            self.directory,
            on_progress=self._on_progress,
            progress_interval=5.0,
        )
        self.player = player
        self._set_status(Code.BACKFILL)
        play = asyncio.ensure_future(player.play(until=TAIL))
        try:
            await _first_of(play, player.tailing.wait())
            if play.done():
                play.result()  # Playback failed before reaching the head: raise its error.
                raise RuntimeError("playback ended before it was asked to")
            self._set_status(Code.STANDBY)
            log.info("shard standby shard=%s log=%s", self.id, log_name)
            await _first_of(play, self._standby(player))
            if play.done():
                play.result()
                raise RuntimeError("playback ended before it was asked to")
            recovered = await hand_off(
                player,
                play,
                author=new_author(),
                client=self.ctx.client,
                append_service=self.append_service,
                broker_endpoint=self.ctx.broker_endpoint,
                hints=hints,
                store_hooks=self.ctx.store_hooks,
            )
        except BaseException:
            play.cancel()
            with contextlib.suppress(BaseException):
                await play
            raise
        log.info(
            "shard recovered shard=%s log=%s write_head=%d files=%d",
            self.id,
            log_name,
            recovered.write_head,
            len(recovered.fsm.links),
        )
        return recovered

    def _on_progress(self, progress: PlaybackProgress) -> None:
        self.progress = progress

    async def _standby(self, player: Player) -> None:
        """Tail the log until promoted. Meanwhile the store kinds' hooks prepare for the
        promotion once the played files are of their kind (the primary may create them
        later): RocksDB's has a fusefs process ready, so the store mounts without waiting
        for a process to start (~0.35 s)."""
        waiting = list(self.ctx.store_hooks)
        pause = 0.25  # Growing to 4 s: standbys of other stores never see their files.
        while True:
            waiting = [hook for hook in waiting if not hook.standby(player.is_linked)]
            if not waiting:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._primary.wait()
            if self._primary.is_set():
                return
            pause = min(pause * 2, 4.0)
        await self._primary.wait()

    async def _load_hints(self, log_name: str) -> rpb.FSMHints | None:
        if not self.spec.hint_prefix:
            return None
        found = await load_hints(
            self.ctx.etcd,
            self.spec.hint_prefix,
            self.id,
            backups=self.spec.hint_backups,
            log=log_name,
        )
        return next((h for h in found if h is not None), None)

    def _guard(self) -> Compare:
        a = self.shard.assignment
        return Compare(a.key.encode(), "create", a.create_revision)

    async def _store_recovered_hints(self, hints: rpb.FSMHints) -> None:
        """Write `hints` (of the recovered state) as ``backup.0``, shifting the older backups
        along, guarded on our assignment. Retried (with a growing pause) until it succeeds:
        a new primary has then always written backup hints, which upstream's pruning
        requires. Cancellation (the assignment went away) ends the retries."""
        if not self.spec.hint_prefix:
            return
        for attempt in itertools.count():
            try:
                await rotate_backup_hints(
                    self.ctx.etcd,
                    self.spec.hint_prefix,
                    self.id,
                    hints,
                    self.spec.hint_backups,
                    guard=self._guard(),  # Taken again each time: the assignment may move.
                )
                return
            except (HintsConflict, HintsGuardFailed, EtcdError) as err:
                if isinstance(err, EtcdError) and attempt >= RECOVERED_HINTS_ETCD_ATTEMPTS:
                    # etcd refuses it for good (too many backups for one transaction, hints
                    # too large): serving beats waiting for ever; pruning will refuse.
                    log.error(
                        "cannot store recovered hints after %d attempts; serving without "
                        "backup hints shard=%s err=%s",
                        attempt + 1,
                        self.id,
                        err,
                    )
                    return
                pause = min(RECOVERED_HINTS_RETRY * 2**attempt, RECOVERED_HINTS_RETRY_MAX)
                log.warning(
                    "cannot store recovered hints (will retry) shard=%s attempt=%d "
                    "retry_in=%.2fs err=%s",
                    self.id,
                    attempt,
                    pause,
                    err,
                )
                await asyncio.sleep(pause)

    async def _hints_loop(self) -> None:
        """Write primary hints every `hint_interval`, the first one interval after recovery
        (the recovered state is in ``backup.0`` meanwhile)."""
        while True:
            await asyncio.sleep(self.ctx.hint_interval)
            await self.store_hints()

    async def store_hints(self) -> bool:
        """Write the store's current hints as the shard's primary hints. Returns whether it
        did (the store may not record hints, or the assignment moved)."""
        build = getattr(self.store, "build_hints", None)
        if build is None or not self.spec.hint_prefix:
            return False
        hints = await build()
        try:
            await store_primary_hints(
                self.ctx.etcd, self.spec.hint_prefix, self.id, hints, guard=self._guard()
            )
        except (HintsGuardFailed, EtcdError) as err:
            log.warning("cannot store primary hints shard=%s err=%s", self.id, err)
            return False
        return True

    def _release(self) -> None:
        store, self.store = self.store, None
        if store is not None:
            try:
                store.destroy()
            except Exception as err:  # noqa: BLE001
                log.warning("destroying the store failed shard=%s err=%s", self.id, err)
        shutil.rmtree(self.directory.parent, ignore_errors=True)


def _recovered_hints(recovered: RecoveredLog | None) -> rpb.FSMHints | None:
    """Hints of the state played from the recovery log (None without a log, or when the
    played ops end in another log than the shard's: upstream then writes none either)."""
    if recovered is None:
        return None
    fsm = recovered.fsm
    if fsm.last_log != recovered.log:
        return None
    return fsm.build_hints(fsm.last_log)


async def _first_of(task: asyncio.Future[Any], other: Any) -> None:
    """Wait until `task` or the awaitable `other` completes; `other` is cancelled then (its
    error, if it failed, is raised)."""
    waiter = asyncio.ensure_future(other)
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if waiter.done() and not waiter.cancelled() and waiter.exception() is not None:
        raise waiter.exception()  # type: ignore[misc]


def _root_cause(err: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups of task groups."""
    while isinstance(err, BaseExceptionGroup):
        inner = [e for e in err.exceptions if not isinstance(e, asyncio.CancelledError)]
        err = (inner or list(err.exceptions))[0]
    return err
