"""The coordinator's leader loop: election, core events in, commands out.

Theory of operation: one ``CoordinatorRuntime`` per coordinator process owns a
``CoordinatorCore``, an ``Election`` and an ``EtcdStore``. It decides nothing;
it observes and acts:

- *leadership*: ``run()`` campaigns with the advertised address; when the
  campaign returns it loads every record from etcd and feeds
  ``LeadershipAcquired``; it then feeds ``Tick`` every
  ``CoreSettings.tick_interval_s`` until ``Leadership.lost()`` reports a loss,
  feeds ``LeadershipLost``, ends every Session, and campaigns again.
- *events*: every event goes through :meth:`feed`, which holds one
  ``asyncio.Lock`` while it calls ``core.step`` and runs the returned commands
  in list order, so lists never overtake each other (commands.py's rule).
- *commands*: ``PersistNodes`` / ``PersistTasks`` -> ``EtcdStore.write`` with
  the leadership's ``Fence`` (awaited before the next command); a
  ``FencedWriteRejected`` feeds ``LeadershipLost`` and drops the rest of the
  list; an etcd outage that outlasts the retries feeds ``PersistFailed``,
  whose ``StepDown`` resigns. ``EmitEvent`` appends to the leader's event log
  (``event_log``, ``coordinator.eventlog``: a bounded ring buffer with
  revisions ``term << 32 | counter``, served by WatchEvents; a new
  leadership starts it with a ``LeaderElected`` event, and losing leadership
  ends its watchers with UNAVAILABLE). ``SendDirective`` puts the converted message on the Session's
  outbound queue; ``CloseSession`` queues the end of that stream with the
  status; ``ReplyToRequest`` resolves the waiting orchestrator request;
  ``StepDown`` resigns the election. Before a graceful resign the server
  feeds ``ResignRequested`` (:meth:`flush_before_resign`), whose answer writes
  the task progress the core holds back.

Sessions are :class:`Channel` objects the gRPC servicer
(``coordinator.session``) opens per stream; the runtime routes directives to
them by ``session_id``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from random import Random
from typing import Any, Protocol

import aetcd
import grpc
from google.protobuf.message import DecodeError, Message

from coordinator import convert
from coordinator.core import (
    CloseSession,
    Command,
    CoordinatorCore,
    CoreSettings,
    EmitEvent,
    Event,
    ForkSeeded,
    HeartbeatAck,
    LeadershipAcquired,
    LeadershipLost,
    NodeRecord,
    PersistFailed,
    PersistNodes,
    PersistTasks,
    ReplyToRequest,
    ResignRequested,
    RetireRecords,
    Role,
    SeedFork,
    SendDirective,
    StatusCode,
    StepDown,
    TaskRecord,
    Tick,
)
from coordinator.core.admission import AdmissionSettings, HelloAdmission
from coordinator.core.commands import merge_steps
from coordinator.core.loadcheck import Quarantine, screen_loaded
from coordinator.core.notices import IdentityConflict
from coordinator.core.records import CheckpointSummary
from coordinator.election import Election, Leadership
from coordinator.election import LeadershipLost as ElectionLost
from coordinator.etcd_store import (
    Collection,
    DeleteRecord,
    EtcdStore,
    EtcdUnavailable,
    FencedWriteRejected,
    PutRecord,
    RecordOp,
    Snapshot,
)
from coordinator.eventlog import EventLog
from coordinator.recordarchive import RecordArchive
from lazarus.v1 import agent_pb2, records_pb2

CPU_WINDOW_S = 1.0
"""Window of the CPU measure that defers Hellos on a saturated replica, seconds."""

__all__ = [
    "Channel",
    "CoordinatorRuntime",
    "Observer",
    "RuntimeSettings",
    "grpc_status",
    "wall_anchored_clock",
]

MAX_QUEUED_RETIREMENTS = 64
"""Retirement batches (``RetireRecords``, each up to the core's retire batch) the
leader may have waiting on a slow archive; more stay in etcd for a next leader."""

_log = logging.getLogger("lazarus.coordinator.runtime")

EVENT_LOG_SIZE = 50_000
"""Most cluster events kept in memory (WatchEvents replays from them)."""

PERSIST_RETRIES = 5
FEED_BATCH = 256
"""Most queued events one group commit steps (see ``CoordinatorRuntime._drain``)."""
"""Attempts of one fenced write while etcd is unavailable, before PersistFailed."""

PERSIST_RETRY_INTERVAL_S = 0.2
"""Pause between those attempts."""

CAMPAIGN_RETRY_INTERVAL_S = 0.5
"""Pause before campaigning again after an etcd error."""

MAX_ECHOES = 64
"""Heartbeat send times kept per Session for the ack's echo."""


def wall_anchored_clock() -> Callable[[], float]:
    """A clock that advances with ``time.monotonic`` and starts at Unix time (seconds)."""
    wall0 = time.time()
    mono0 = time.monotonic()
    return lambda: wall0 + time.monotonic() - mono0


def grpc_status(code: StatusCode) -> grpc.StatusCode:
    """The gRPC status code of a core ``StatusCode`` (same names)."""
    return grpc.StatusCode[code.name]


class CpuMeter:
    """Cores this process used over about the last second (``time.process_time``, every thread).

    Sampled when asked; the window slides by at most :data:`CPU_WINDOW_S`.
    """

    def __init__(self) -> None:
        self._mark = (time.monotonic(), time.process_time())
        self._last = 0.0

    def cores(self, now_s: float) -> float:
        """CPU seconds per wall second over the window ending near ``now_s``."""
        wall0, cpu0 = self._mark
        if now_s - wall0 >= CPU_WINDOW_S:
            cpu = time.process_time()
            self._last = (cpu - cpu0) / (now_s - wall0)
            self._mark = (now_s, cpu)
        return self._last


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """What the runtime needs beyond the core's settings.

    Attributes:
        cluster: the cluster name (etcd prefix ``/lazarus/<cluster>/``).
        member_id: this coordinator's id (Welcome.leader_id, logs).
        advertise_address: host:port node agents and peers dial (election value).
        max_message_bytes: announced in Welcome (0: unspecified).
        max_payload_bytes: announced in Welcome (0: unspecified).
        admission: Hello rate, Session cap, outbound queue bound.
    """

    cluster: str
    member_id: str
    advertise_address: str
    max_message_bytes: int = 0
    max_payload_bytes: int = 0
    admission: AdmissionSettings = dataclasses.field(default_factory=AdmissionSettings)


class Observer(Protocol):
    """Receives facts for metrics; every method must be cheap and never raise."""

    def leadership_changed(self, leading: bool, term: int) -> None:
        """This replica started or stopped leading."""

    def leader_observed(self, key: str, term: int) -> None:
        """The election shows this leader key (every replica; repeats possible)."""

    def heartbeats_received(self, node_ids: Sequence[str], now_s: float) -> None:
        """Heartbeats of ``node_ids`` were stepped at ``now_s`` (one call per batch)."""

    def event_emitted(self, event: EmitEvent) -> None:
        """The core emitted a cluster event."""

    def nodes_retired(self, node_ids: Sequence[str]) -> None:
        """The core retired these nodes (``RetireRecords``): forget what is kept per node."""

    def etcd_write(self, seconds: float, ok: bool) -> None:
        """A fenced etcd write finished."""

    def state_changed(self, core: CoordinatorCore) -> None:
        """A step ran; gauges may be refreshed from the core."""


class _NullObserver:
    def leadership_changed(self, leading: bool, term: int) -> None:
        pass

    def leader_observed(self, key: str, term: int) -> None:
        pass

    def heartbeats_received(self, node_ids: Sequence[str], now_s: float) -> None:
        pass

    def event_emitted(self, event: EmitEvent) -> None:
        pass

    def nodes_retired(self, node_ids: Sequence[str]) -> None:
        pass

    def etcd_write(self, seconds: float, ok: bool) -> None:
        pass

    def state_changed(self, core: CoordinatorCore) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Close:
    """End the stream with this status (queued after any earlier message)."""

    code: grpc.StatusCode
    reason: str


END = None
"""Queued when the stream should end with OK (the agent half-closed it)."""

Outbound = agent_pb2.CoordinatorMessage | Close | None


class Channel:
    """One Session stream's outbound side and what the shell knows of it.

    Attributes:
        session_id: the id given to the core in SessionOpened.
        node_id: the node of its first Hello ("" before).
        hello_seen: a Hello was translated on this stream.
    """

    def __init__(self, session_id: str, max_outbound_messages: int = 10_000) -> None:
        self.session_id = session_id
        self.node_id = ""
        self.hello_seen = False
        self._queue: asyncio.Queue[Outbound] = asyncio.Queue()
        self._echoes: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()
        self._max_outbound = max_outbound_messages
        self.closed = False
        self.overflowed = False
        """True once the agent stopped reading and the stream was closed for it."""
        self.writer: asyncio.Task[Any] | None = None
        """The task writing this stream (cancelled when it is stuck on a full stream)."""
        self.writing = False
        self.held_by = ""
        """Member id of the follower that holds and forwards this Session ("": this replica)."""
        self.ack_sink: Callable[[], agent_pb2.HeartbeatAck | None] | None = None
        """Fan-in: gives the message to fill in place with a forwarded Session's
        heartbeat ack, which then goes straight to its follower
        (``coordinator.forwarding``), bypassing the stream writer while nothing
        is queued before it (None from it: the ack is dropped, the Session
        ended); None: acks are queued like any message."""

    def put(self, message: agent_pb2.CoordinatorMessage) -> None:
        """Queue a message for the stream (dropped once the stream is closing).

        An agent that does not read leaves messages queued; once
        ``max_outbound_messages`` wait, the queue is dropped and the stream
        ends with RESOURCE_EXHAUSTED at once (the write it is stuck in is
        cancelled): never buffered without limit.
        """
        if self.closed:
            return
        if self._queue.qsize() < self._max_outbound:
            self._queue.put_nowait(message)
            return
        self.overflowed = True
        self.closed = True
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(
            Close(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self._max_outbound} messages unread: the agent does not read its stream",
            )
        )
        if self.writing and self.writer is not None:
            self.writer.cancel()

    def close(self, code: grpc.StatusCode, reason: str) -> None:
        """Queue the end of the stream with a status; later messages are dropped."""
        if not self.closed:
            self.closed = True
            self._queue.put_nowait(Close(code, reason))

    def end(self) -> None:
        """Queue the end of the stream with OK."""
        if not self.closed:
            self.closed = True
            self._queue.put_nowait(END)

    @property
    def idle(self) -> bool:
        """Nothing is queued or being written: a message sent now cannot overtake another."""
        return not self.writing and self._queue.empty()

    async def next(self) -> Outbound:
        """The next thing to do on the stream."""
        return await self._queue.get()

    def remember_heartbeat(self, msg: agent_pb2.Heartbeat) -> None:
        """Keep a heartbeat's send times for the ack's echo."""
        self._echoes[msg.seq] = (msg.sent_at_unix_ms, msg.sent_at_monotonic_ms)
        while len(self._echoes) > MAX_ECHOES:
            self._echoes.popitem(last=False)

    def echo(self, seq: int) -> tuple[int, int]:
        """Send times of heartbeat ``seq`` ((0, 0) when unknown), forgotten after."""
        return self._echoes.pop(seq, (0, 0))


class CoordinatorRuntime:
    """The IO shell around ``CoordinatorCore``; see the module docstring.

    Args:
        core_settings: the core's settings.
        settings: cluster, member id, advertised address.
        election: the etcd election (campaigns under ``election_prefix(cluster)``).
        store: the fenced record store of the cluster.
        seed: seed of the core's random source (None: random).
        clock: leader clock in seconds (default: ``wall_anchored_clock()``).
        observer: receives facts for metrics.
    """

    def __init__(
        self,
        core_settings: CoreSettings,
        settings: RuntimeSettings,
        *,
        election: Election,
        store: EtcdStore,
        seed: int | None = None,
        clock: Callable[[], float] | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.core_settings = core_settings
        self.settings = settings
        self.election = election
        self.store = store
        self.core = CoordinatorCore(core_settings, rng=Random(seed))
        self.now_s = clock if clock is not None else wall_anchored_clock()
        self.observer: Observer = observer if observer is not None else _NullObserver()
        self.event_log = EventLog(EVENT_LOG_SIZE)
        self._observed_terms: set[int] = set()  # recent leader terms seen in the election
        self._lock = asyncio.Lock()
        self._feed_queue: list[tuple[Event, asyncio.Future[bool]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self._channels: dict[str, Channel] = {}
        self._requests: dict[str, asyncio.Future[ReplyToRequest]] = {}
        self._leadership: Leadership | None = None
        self._last_now_s = float("-inf")
        self._background: set[asyncio.Task[None]] = set()
        self._leader_listeners: list[Callable[[str, int], None]] = []
        self.leader_changes = 0
        self._hellos = HelloAdmission(
            settings.admission.hello_rate_per_s,
            settings.admission.hello_burst,
            settings.admission.degraded_after_lag_s,
            settings.admission.defer_hellos_above_cpu,
        )
        self._cpu = CpuMeter()
        self._fatal: asyncio.Future[None] | None = None
        self._failure_listeners: list[Callable[[BaseException], None]] = []
        self.failure: BaseException | None = None
        """What ended the leader loop (None while it runs or after a cancel)."""
        self.record_archive: RecordArchive | None = None
        """Where retired records go (None: they stay in etcd); see ``RetireRecords``."""
        self.retired = 0
        """Records moved from etcd to the archive by this replica."""
        self._retirements: collections.deque[tuple[Leadership, RetireRecords]] = collections.deque()
        self._retirer: asyncio.Task[None] | None = None
        self.fork_seeder: Callable[[str, bytes], Awaitable[CheckpointSummary]] | None = None
        """Writes a fork's seed checkpoint to Redis (set by the API); see ``SeedFork``."""

    # ------------------------------------------------------------------ state

    @property
    def leading(self) -> bool:
        """True while this replica leads and its core has the records loaded."""
        return self._leadership is not None and self.core.role is Role.LEADER

    @property
    def events(self) -> collections.deque[records_pb2.Event]:
        """The events of the current (or last) leadership, oldest first."""
        return self.event_log.events

    @property
    def leadership(self) -> Leadership | None:
        """The current leadership, or None."""
        return self._leadership

    def _now(self) -> float:
        now = max(self.now_s(), self._last_now_s)
        self._last_now_s = now
        return now

    # ------------------------------------------------------------------ leader loop

    def on_failure(self, listener: Callable[[BaseException], None]) -> None:
        """Call ``listener(exc)`` once when the leader loop fails (see :meth:`run`)."""
        self._failure_listeners.append(listener)

    async def run(self) -> None:
        """Campaign, lead until the leadership is lost, repeat; until cancelled.

        No zombie leader: an exception that ends this loop (a bug in the core
        or the shell, not an etcd outage, which only resigns) resigns the
        election at once, records itself in :attr:`failure`, tells the
        ``on_failure`` listeners (the server turns health NOT_SERVING) and is
        raised: the replica stops campaigning, so its orchestrator restarts it.

        Raises:
            Exception: whatever ended the loop, after resigning.
        """
        try:
            await self._campaign_and_lead()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            _log.exception("the leader loop failed; resigning and turning NOT_SERVING")
            self.failure = exc
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await self.election.resign()
            for listener in self._failure_listeners:
                with contextlib.suppress(Exception):
                    listener(exc)
            raise

    def _failed(self) -> bool:
        """A step or its commands failed in this leadership: nothing more is stepped."""
        return self._fatal is not None and self._fatal.done() and not self._fatal.cancelled()

    def _fail(self, exc: BaseException) -> None:
        """A step raised: the core's state is not to be trusted; end the leadership loop."""
        fatal = self._fatal
        if fatal is not None and not fatal.done():
            fatal.set_exception(exc)

    async def _campaign_and_lead(self) -> None:
        while True:
            try:
                leadership = await self.election.campaign(self.settings.advertise_address)
            except (ElectionLost, aetcd.ClientError, EtcdUnavailable) as exc:
                _log.warning("campaign failed: %s; retrying", exc)
                await asyncio.sleep(CAMPAIGN_RETRY_INTERVAL_S)
                continue
            try:
                await self._lead(leadership)
            except (aetcd.ClientError, EtcdUnavailable) as exc:
                _log.warning("leading failed on etcd: %s; resigning", exc)
                with contextlib.suppress(Exception):
                    await self.election.resign()
            finally:
                await self._lose_leadership(leadership)

    async def _lead(self, leadership: Leadership) -> None:
        snapshot = await self.store.load()
        screened = screen_loaded(*_decode_records(snapshot.nodes, snapshot.tasks))
        nodes, tasks = screened.nodes, screened.tasks
        if screened.quarantined:
            await self._quarantine(leadership, snapshot, screened.quarantined)
        fatal: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._fatal = fatal
        async with self._lock:
            if leadership.is_lost:
                return
            self._leadership = leadership
            self.leader_changes += 1
            _log.info(
                "leading: term=%d nodes=%d tasks=%d revision=%d",
                leadership.term,
                len(nodes),
                len(tasks),
                snapshot.revision,
            )
            self.observer.leadership_changed(True, leadership.term)
            self.event_log.begin_term(leadership.term)
            previous = max((t for t in self._observed_terms if t < leadership.term), default=0)
            self.event_log.append(
                records_pb2.Event(
                    occurred_at_unix_ms=convert.s_to_ms(self._now()),
                    leader_elected=records_pb2.LeaderElected(
                        leader_id=self.settings.member_id,
                        leader_address=self.settings.advertise_address,
                        term=leadership.term,
                        previous_term=previous,
                    ),
                )
            )
            event = LeadershipAcquired(
                term=leadership.term,
                now_s=self._now(),
                nodes=nodes,
                tasks=tasks,
                quarantined=screened.quarantined,
            )
            await self._step_locked(event)
        ticker = asyncio.create_task(self._tick_loop(), name="coordinator-tick")
        lost = asyncio.create_task(leadership.lost(), name="coordinator-lease")
        try:
            watched: set[asyncio.Future[Any]] = {ticker, lost, fatal}
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for ended in (fatal, ticker):  # a step or the ticker failed: no zombie leader
                if ended.done() and not ended.cancelled():
                    problem = ended.exception()
                    if problem is not None:
                        raise problem
            if lost.done():
                reason = lost.result()
                _log.warning("leadership lost: term=%d reason=%s", leadership.term, reason.name)
        finally:
            for task in (ticker, lost):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if not fatal.done():
                fatal.cancel()

    async def _quarantine(
        self, leadership: Leadership, snapshot: Snapshot, quarantined: tuple[Quarantine, ...]
    ) -> None:
        """Move the records the core refused under ``quarantine/`` (one fenced write)."""
        ops: list[RecordOp] = []
        at_ms = convert.s_to_ms(self._now())
        for q in quarantined:
            collection = Collection(q.collection)
            value = snapshot.records.get(collection, {}).get(q.name, b"")
            record = records_pb2.QuarantinedRecord(
                collection=q.collection,
                name=q.name,
                reason=q.reason,
                value=value,
                quarantined_at_unix_ms=at_ms,
                term=leadership.term,
            )
            _log.error("quarantining %s/%s: %s", q.collection, q.name, q.reason)
            ops.append(PutRecord(Collection.QUARANTINE, f"{q.collection}/{q.name}", _bytes(record)))
            ops.append(DeleteRecord(collection, q.name))
        await self.store.write(leadership.fence, ops)

    async def _lose_leadership(self, leadership: Leadership) -> None:
        async with self._lock:
            was = self._leadership is leadership
            self._leadership = None
            if self.core.role is Role.LEADER:
                self.core.step(LeadershipLost(now_s=self._now(), reason="leadership lost"))
            if was:
                self.observer.leadership_changed(False, leadership.term)
            self.event_log.close_all("this coordinator is no longer leader; resume elsewhere")
            for channel in list(self._channels.values()):
                channel.close(grpc.StatusCode.UNAVAILABLE, "this coordinator is no longer leader")
            self.observer.state_changed(self.core)

    async def _tick_loop(self) -> None:
        interval = self.core_settings.tick_interval_s
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            deadline += interval
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            if loop.time() - deadline > interval:
                deadline = loop.time()  # fell behind (a long step): do not burst
            await self.feed(Tick(now_s=0.0))

    async def observe_leaders(self) -> None:
        """Report every leader the election shows to the observer; until cancelled."""
        while True:
            try:
                async for leader in self.election.observe():
                    self.observer.leader_observed(leader.key, leader.term)
                    for listener in self._leader_listeners:
                        listener(leader.value, leader.term)
                    self._observed_terms.add(leader.term)
                    while len(self._observed_terms) > 8:
                        self._observed_terms.discard(min(self._observed_terms))
            except (aetcd.ClientError, ElectionLost) as exc:
                _log.warning("observing the election failed: %s; retrying", exc)
            await asyncio.sleep(CAMPAIGN_RETRY_INTERVAL_S)

    def on_leader_observed(self, listener: Callable[[str, int], None]) -> None:
        """Call ``listener(address, term)`` each time the election shows a new leader.

        Called from :meth:`observe_leaders` on the event loop; the listener must
        not block (the fan-in forwarder drops a link to a replaced leader).
        """
        self._leader_listeners.append(listener)

    async def resign(self) -> None:
        """Give up leadership at once (SIGTERM); ``run`` campaigns again unless cancelled."""
        await self.election.resign()

    async def flush_before_resign(self) -> bool:
        """Write the task progress the core holds back (``ResignRequested``), before a resign.

        Returns:
            False when this replica does not lead (nothing to write).
        """
        return await self.feed(ResignRequested(now_s=0.0))

    # ------------------------------------------------------------------ events in

    @property
    def feed_backlog(self) -> int:
        """Events queued (``enqueue``) and not yet taken for a step."""
        return len(self._feed_queue)

    async def feed(self, event: Event) -> bool:
        """Step the core with ``event`` (re-stamped with the current time) and run its commands.

        Args:
            event: a fact; its ``now_s`` is replaced by the runtime's clock.

        Returns:
            False when this replica is not leading (the event was not fed).
        """
        return await asyncio.shield(self.enqueue(event))

    def enqueue(self, event: Event) -> asyncio.Future[bool]:
        """Queue ``event`` for the next group commit without waiting for it.

        Events are stepped in the order they were queued, so a Session reader
        can queue a stream's messages one after another and only then wait
        (pipelining): a burst of 500 task updates then shares a few etcd
        transactions, and the heartbeat behind them is acked with them, instead
        of each message waiting for the previous one's transaction.

        Returns:
            A future resolved (True) once the event was stepped and its commands
            run, or False at once / later when this replica does not lead.
        """
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if not self.leading:
            future.set_result(False)
            return future
        self._feed_queue.append((event, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name="coordinator-steps")
        return future

    async def _drain(self) -> None:
        """Group commit: step every queued event, persist their records together, then act.

        Events that queued while etcd was busy are stepped through the core one
        after another (pure and fast), their records merged (the newest of each
        key wins) and written in as few fenced transactions as MAX_TXN_OPS
        allows, and only then are their events emitted and their directives,
        acks and replies sent, in order. Persisting a record earlier than its
        place is safe: what matters is that nothing is sent before what it
        reports is in etcd. So a burst of task updates costs a few etcd round
        trips, not one each, and a heartbeat queued behind them is acked within
        one batch instead of after all of them (a late ack makes a healthy node
        self-fence). Raft implementations batch their log appends the same way.
        """
        while self._feed_queue:
            async with self._lock:
                batch = self._feed_queue[:FEED_BATCH]
                del self._feed_queue[:FEED_BATCH]
                if not self.leading or self._failed():
                    for _, future in batch:
                        if not future.done():
                            future.set_result(False)
                    continue
                now = self._now()
                steps: list[list[Command]] = []
                for event, future in batch:
                    try:
                        steps.append(self.core.step(dataclasses.replace(event, now_s=now)))
                    except Exception as exc:  # a bug in the core: it must stop deciding
                        future.set_exception(exc)
                        self._fail(exc)
                try:
                    await self._run_steps(steps)
                except Exception as exc:  # a bug in the shell: no zombie leader either
                    _log.exception("running the commands of %d events failed", len(batch))
                    self._fail(exc)
                    for _, future in batch:
                        if not future.done():
                            future.set_result(False)
                    continue
                self.observer.state_changed(self.core)
                for _, future in batch:
                    if not future.done():
                        future.set_result(True)

    async def _run_steps(self, steps: list[list[Command]]) -> None:
        """Run several steps' commands as the core's one batch (``merge_steps``), in order."""
        await self._run_locked(merge_steps(steps))

    async def _step_locked(self, event: Event) -> None:
        commands = self.core.step(event)
        await self._run_locked(commands)
        self.observer.state_changed(self.core)

    async def _run_locked(self, commands: list[Command]) -> None:
        for index, command in enumerate(commands):
            if isinstance(command, PersistNodes | PersistTasks):
                if not await self._persist(command):
                    _log.warning(
                        "dropping %d commands after a failed persist", len(commands) - index
                    )
                    return
            elif isinstance(command, SeedFork):
                await self._seed_fork(command)
            elif isinstance(command, RetireRecords):
                self._queue_retirement(command)
            elif isinstance(command, EmitEvent):
                self._emit(command)
            elif isinstance(command, SendDirective):
                self._send(command)
            elif isinstance(command, CloseSession):
                channel = self._channels.get(command.session_id)
                if channel is not None:
                    _log.info(
                        "closing session %s of %r: %s %s",
                        command.session_id,
                        command.node_id,
                        command.code.name,
                        command.reason,
                    )
                    channel.close(grpc_status(command.code), command.reason)
            elif isinstance(command, ReplyToRequest):
                future = self._requests.pop(command.request_id, None)
                if future is not None and not future.done():
                    future.set_result(command)
            elif isinstance(command, StepDown):
                _log.warning("stepping down: %s", command.reason)
                self._spawn(self._resign_quietly())

    def _queue_retirement(self, command: RetireRecords) -> None:
        """Hand retired records to the retirer: archived off the step lock, then deleted.

        Writing the archive under the step lock held every ack and directive
        for as long as Redis took to answer: a hung Redis (SIGSTOPped,
        blackholed, failing over) stalled the leader 5 s (its socket timeout)
        per tick with records to retire, and the whole fleet self-fenced while
        the leader kept its lease. The queue is bounded: past
        ``MAX_QUEUED_RETIREMENTS`` a batch is dropped, and its records stay in
        etcd for a next leader to retire (as when Redis refuses them).
        """
        if command.nodes:  # the core has forgotten them, whatever happens to their records
            self.observer.nodes_retired([n.node_id for n in command.nodes])
        leadership = self._leadership
        if self.record_archive is None or leadership is None:
            return
        if len(self._retirements) >= MAX_QUEUED_RETIREMENTS:
            _log.warning(
                "%d retirements queued (the archive is slow): %d records stay in etcd",
                len(self._retirements),
                len(command.tasks) + len(command.nodes),
            )
            return
        self._retirements.append((leadership, command))
        if self._retirer is None or self._retirer.done():
            self._retirer = asyncio.create_task(self._retire_queued(), name="coordinator-retire")

    async def _retire_queued(self) -> None:
        while self._retirements:
            leadership, command = self._retirements.popleft()
            try:
                await self._retire(leadership, command)
            except Exception:  # a bug here must not stop later retirements
                _log.exception(
                    "retiring %d records failed", len(command.tasks) + len(command.nodes)
                )

    async def _retire(self, leadership: Leadership, command: RetireRecords) -> None:
        """Archive retired records in Redis (no lock held), then delete them from etcd.

        The delete runs under the step lock, fenced, and skips a record the
        core holds again by then (a node id that came back and was persisted
        since): under the lock no write of it can be in flight, so what the
        core does not hold is what etcd should not hold either.
        """
        archive = self.record_archive
        if archive is None or self._leadership is not leadership:
            return
        tasks = [
            (t.task_id, convert.task_record_to_pb(t).SerializeToString()) for t in command.tasks
        ]
        nodes = [
            (n.node_id, convert.node_record_to_pb(n).SerializeToString()) for n in command.nodes
        ]
        try:
            await archive.put(tasks, nodes)
        except Exception as exc:  # Redis down: they stay in etcd; a next leader retires them
            _log.warning("archiving %d records failed (%s); they stay in etcd", len(tasks), exc)
            return
        async with self._lock:
            if self._leadership is not leadership:
                return  # a next leader loads them and retires them again
            ops: list[RecordOp] = [
                DeleteRecord(Collection.TASKS, task_id)
                for task_id, _ in tasks
                if self.core.task(task_id) is None
            ]
            ops.extend(
                DeleteRecord(Collection.NODES, node_id)
                for node_id, _ in nodes
                if self.core.node(node_id) is None
            )
            if not ops:
                return
            try:
                await self.store.write(leadership.fence, ops)
            except FencedWriteRejected as exc:
                leadership.report_fence_rejected()
                self.core.step(LeadershipLost(now_s=self._now(), reason=str(exc)))
                return
            except (EtcdUnavailable, aetcd.ClientError) as exc:
                _log.warning(
                    "deleting %d retired records failed (%s); retried later", len(ops), exc
                )
                return
            self.retired += len(ops)

    async def _seed_fork(self, command: SeedFork) -> None:
        """Write a forked task's seed (its task is persisted), then step the outcome."""
        seeder = self.fork_seeder
        checkpoint = None
        reason = ""
        try:
            if seeder is None:
                raise RuntimeError("this replica has no checkpoint store to seed forks in")
            checkpoint = await seeder(command.task_id, command.seed)
        except Exception as exc:  # Redis down, or state already under that id
            reason = str(exc) or type(exc).__name__
            _log.warning("seeding fork %s failed: %s", command.task_id, reason)
        event = ForkSeeded(
            command.task_id, self._now(), ok=not reason, checkpoint=checkpoint, reason=reason
        )
        await self._run_locked(self.core.step(event))

    async def _resign_quietly(self) -> None:
        try:
            await self.election.resign()
        except Exception as exc:  # the key then goes with the lease
            _log.warning("resign failed: %s", exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _persist(self, command: PersistNodes | PersistTasks) -> bool:
        leadership = self._leadership
        if leadership is None:
            return False
        ops: list[PutRecord]
        if isinstance(command, PersistNodes):
            ops = [
                PutRecord(
                    Collection.NODES, r.node_id, convert.node_record_to_pb(r).SerializeToString()
                )
                for r in command.records
            ]
        else:
            ops = [
                PutRecord(
                    Collection.TASKS, r.task_id, convert.task_record_to_pb(r).SerializeToString()
                )
                for r in command.records
            ]
        problem = ""
        for _attempt in range(PERSIST_RETRIES):
            started = time.monotonic()
            try:
                await self.store.write(leadership.fence, ops)
            except FencedWriteRejected as exc:
                self.observer.etcd_write(time.monotonic() - started, False)
                _log.error("fenced write rejected: %s", exc)
                leadership.report_fence_rejected()
                self.core.step(LeadershipLost(now_s=self._now(), reason=str(exc)))
                return False
            except (EtcdUnavailable, aetcd.ClientError) as exc:
                self.observer.etcd_write(time.monotonic() - started, False)
                problem = str(exc)
                _log.warning("etcd write failed (%s); retrying", exc)
                if leadership.is_lost:
                    break
                await asyncio.sleep(PERSIST_RETRY_INTERVAL_S)
                continue
            self.observer.etcd_write(time.monotonic() - started, True)
            return True
        commands = self.core.step(PersistFailed(now_s=self._now(), reason=problem))
        await self._run_locked(commands)
        return False

    def _emit(self, command: EmitEvent) -> None:
        self.event_log.append(convert.notice_to_pb(command))
        self.observer.event_emitted(command)
        level = logging.WARNING if isinstance(command.body, IdentityConflict) else logging.INFO
        _log.log(level, "event term=%d %s", command.term, command.body)

    def _send(self, command: SendDirective) -> None:
        channel = self._channels.get(command.session_id)
        if channel is None:
            return  # that Session is gone: drop
        directive = command.directive
        if isinstance(directive, HeartbeatAck):
            echo = channel.echo(directive.seq)
            if channel.ack_sink is not None and channel.idle and not channel.closed:
                # Fan-in's digest path: one small entry to the follower, no stream hop.
                into = channel.ack_sink()
                if into is not None:
                    convert.heartbeat_ack_to_pb(directive, self._last_now_s, echo, into=into)
                return
            message = agent_pb2.CoordinatorMessage()
            convert.heartbeat_ack_to_pb(
                directive, self._last_now_s, echo, into=message.heartbeat_ack
            )
            channel.put(message)
            return
        channel.put(
            convert.directive_to_pb(
                directive,
                session_id=command.session_id,
                leader_id=self.settings.member_id,
                cluster_name=self.settings.cluster,
                now_s=self._last_now_s,
                max_message_bytes=self.settings.max_message_bytes,
                max_payload_bytes=self.settings.max_payload_bytes,
            )
        )

    def count_heartbeats(self, stepped: asyncio.Future[bool], node_ids: list[str]) -> None:
        """Report the heartbeats of ``node_ids`` to the observer once ``stepped`` succeeded."""

        def done(future: asyncio.Future[bool]) -> None:
            if not future.cancelled() and future.exception() is None and future.result():
                self.observer.heartbeats_received(node_ids, self.now_s())

        stepped.add_done_callback(done)

    # ------------------------------------------------------------------ sessions

    def open_channel(self) -> Channel:
        """Register a new Session stream and give it a fresh session id."""
        channel = Channel(uuid.uuid4().hex, self.settings.admission.max_outbound_messages)
        self._channels[channel.session_id] = channel
        return channel

    def admit_session(self) -> tuple[grpc.StatusCode, float] | None:
        """Whether a new Session may open now (admission control, issue 16).

        Returns:
            None when admitted; else the status to end it with and the delay
            (seconds) to tell the agent to come back after: RESOURCE_EXHAUSTED
            past ``max_sessions``, UNAVAILABLE when Hellos arrive over the
            admitted rate (the delay spreads them at that rate) or while the
            replica is saturated (its process used ``defer_hellos_above_cpu``
            of a core over the last second, or its event loop lags past
            ``degraded_after_lag_s``): a saturated leader takes no more nodes.
        """
        admission = self.settings.admission
        if len(self._channels) >= admission.max_sessions:
            return grpc.StatusCode.RESOURCE_EXHAUSTED, 1.0
        delay_s = self._hellos.admit(
            self._now(), self.election.loop_lag_s, self._cpu.cores(time.monotonic())
        )
        if delay_s > 0:
            return grpc.StatusCode.UNAVAILABLE, delay_s
        return None

    def session_replica(self, session_id: str) -> str:
        """Member id of the replica holding Session ``session_id`` ("" when it is not open)."""
        channel = self._channels.get(session_id)
        if channel is None:
            return ""
        return channel.held_by or self.settings.member_id

    def sessions_by_replica(self) -> dict[str, int]:
        """Open Sessions with a Hello per member id of the replica holding them."""
        counts: dict[str, int] = {}
        for channel in self._channels.values():
            if channel.hello_seen:
                holder = channel.held_by or self.settings.member_id
                counts[holder] = counts.get(holder, 0) + 1
        return counts

    def release_channel(self, channel: Channel) -> None:
        """The stream is over: forget it (the servicer feeds SessionClosed first)."""
        self._channels.pop(channel.session_id, None)

    # ------------------------------------------------------------------ requests

    async def request(self, event: Event, request_id: str) -> ReplyToRequest:
        """Feed an orchestrator request and return the core's reply to it.

        The reply comes out of the same step, after the step's persists, so a
        reply is only returned once etcd holds what it reports.

        Raises:
            NotLeading: this replica does not lead, or the step's persist
                failed and it stepped down (UNAVAILABLE).
        """
        future: asyncio.Future[ReplyToRequest] = asyncio.get_running_loop().create_future()
        async with self._lock:
            if not self.leading:
                raise NotLeading()
            self._requests[request_id] = future
            try:
                await self._step_locked(dataclasses.replace(event, now_s=self._now()))
            except (aetcd.ClientError, EtcdUnavailable):
                raise
            except Exception as exc:  # a bug in the core: it must stop deciding
                self._fail(exc)
                raise NotLeading() from exc
            finally:
                if self._requests.get(request_id) is future:
                    del self._requests[request_id]
        if not future.done() or future.exception() is not None:
            raise NotLeading()
        return future.result()


class NotLeading(Exception):
    """This replica does not lead (UNAVAILABLE)."""


def _decode_records(
    nodes: Mapping[str, bytes], tasks: Mapping[str, bytes]
) -> tuple[dict[str, NodeRecord | str], dict[str, TaskRecord | str]]:
    """Parse loaded values; an unreadable one becomes its parse error (for ``screen_loaded``)."""
    out_nodes: dict[str, NodeRecord | str] = {}
    out_tasks: dict[str, TaskRecord | str] = {}
    for name, data in sorted(nodes.items()):
        try:
            out_nodes[name] = convert.node_record_from_pb(records_pb2.NodeRecord.FromString(data))
        except (DecodeError, ValueError, TypeError) as exc:
            out_nodes[name] = f"{type(exc).__name__}: {exc}"
    for name, data in sorted(tasks.items()):
        try:
            out_tasks[name] = convert.task_record_from_pb(records_pb2.TaskRecord.FromString(data))
        except (DecodeError, ValueError, TypeError) as exc:
            out_tasks[name] = f"{type(exc).__name__}: {exc}"
    return out_nodes, out_tasks


def _bytes(message: Message) -> bytes:
    return message.SerializeToString()
