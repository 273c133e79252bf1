"""NodeAgent: the node agent's shell — Session stream, clocks, store, Redis, runner.

Theory of operation: every decision is ``node_agent.core.AgentCore``'s. This
module feeds it (messages from the leader, the passage of time, what the
runner reports) under one lock and carries its commands out in order:
``Send`` goes to the Session's outbound queue, ``PersistMeta`` /
``ForgetTask`` are awaited on the store before the next command runs,
``StartTask`` / ``StopTask`` go to the runner, ``CloseSession`` cancels the
stream, ``Notice`` becomes a log line and a metric.

**Finding a replica.** The agent dials the coordinator addresses in turn,
skipping for a few seconds one it could not reach (``node_agent.core.dial``:
after a leader crash it does not come back to the dead replica every
``len(--coordinators)``-th dial). A replica that answers NotLeader names the
address to dial next (dialled at once unless it is held off); any other
failure backs off with full jitter (tenacity's ``wait_random_exponential``,
capped by ``reconnect_max_backoff_s``). With ``resolve_coordinators`` the list
is every address the names resolve to (a headless Service: each replica),
resolved again every ``RESOLVE_INTERVAL_S``.

**Shutdown** (SIGTERM): every task is paused with its records flushed to
Redis, then the agent says Goodbye, so the leader moves the tasks at once and
their new owners redo nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import math
import os
import secrets
import socket
import time
import uuid
from typing import Any

import grpc
import grpc.aio
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from tenacity import wait_random_exponential

from lazarus import __version__
from lazarus.grpcopts import channel_options
from lazarus.storage.keys import fork_key, fork_records_key
from lazarus.v1 import agent_pb2, agent_pb2_grpc, records_pb2
from node_agent import convert
from node_agent.checkpoint import CheckpointInfo, CheckpointStore, JournalEvent
from node_agent.checkpoint.store import lineage_copy_of
from node_agent.core import (
    AgentCore,
    CloseSession,
    Command,
    ForgetTask,
    Notice,
    PersistMeta,
    PersistMetas,
    ReportLineage,
    Send,
    StartTask,
    StopTask,
    lineage,
)
from node_agent.core.core import ReportLineageCopy
from node_agent.core.dial import DialEnd, DialPlan
from node_agent.core.records import LineageReport
from node_agent.core.redisloss import generation_reset
from node_agent.isolation import WorkerRedis
from node_agent.metrics import AgentMetrics
from node_agent.replication import RedisCheckpointReplica, ReplicationObserver, Replicator
from node_agent.runner import TaskRunner
from node_agent.sdk import Agent, ServiceContext
from node_agent.settings import AgentSettings
from node_agent.shared import DOCUMENT_BODIES, SharedDocuments

__all__ = ["NodeAgent", "lineage_wire_report", "load_app"]


_log = logging.getLogger("lazarus.agent")


def lineage_wire_report(full: agent_pb2.LineageReport) -> agent_pb2.LineageReport:
    """The LineageReport sent on the Session: ``full`` without payloads.

    The full report (checkpoint and journal payloads) goes to Redis under
    ``fork_records_key`` and stays in the local store; the coordinator reads
    only counts, seqs and ranges from the wire (``convert.lineage_report_to_event``).
    Sending the payloads made a fork of a task with large checkpoints exceed
    gRPC's 4 MiB message limit: the leader ended every new Session with
    RESOURCE_EXHAUSTED and the agent, re-sending the unacknowledged report after
    each Welcome, could never hold a Session (seen in chaos seed 20: 5.5 MB).
    Without payloads the message is bounded by the 64 checkpoints and 4,096
    events a report carries, a few hundred KiB at the intake limits.

    Args:
        full: the report as written to Redis.

    Returns:
        A copy with every checkpoint and journal event payload cleared.
    """
    wire = agent_pb2.LineageReport()
    wire.CopyFrom(full)
    for checkpoint in wire.checkpoints:
        checkpoint.ClearField("payload")
    for event in wire.journal_events:
        event.ClearField("payload")
    return wire


MAX_RETRY_AFTER_S = 10.0
"""Longest pause a NotLeader's retry_after_ms can impose before the next dial."""

RESOLVE_INTERVAL_S = 5.0
"""With ``resolve_coordinators``: how often the names are resolved again, seconds
(a restarted coordinator pod comes back with a new address)."""

REDIS_GENERATION_CHECK_S = 2.0
"""How often the agent reads Redis's dataset marker (node_agent/core/redisloss.py), seconds."""

DIRECTIVE_BATCH = 64
"""Most leader messages stepped through the core as one batch (the lock is held
that long: heartbeats and acks wait for it)."""

TICK_S = 0.05
"""Cadence of the core's clock input, seconds (heartbeats and the fence are checked)."""


def load_app(path: str) -> Agent:
    """Import ``module:attribute`` and return the ``Agent`` it names.

    Raises:
        ValueError: malformed path, import failure, or not an ``Agent`` (names ``--app``).
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--app: {path!r} is not module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--app: cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, Agent):
        raise ValueError(f"--app: {path!r} is {type(app).__name__}, not a node_agent.sdk.Agent")
    return app


UNSAFE_DISABLE_SELF_FENCE_ENV = "LAZARUS_UNSAFE_DISABLE_SELF_FENCE"
"""Set to exactly ``1`` to turn the self-fence off (the drills' mutation test only)."""


def _unsafe_disable_self_fence() -> bool:
    """True when ``LAZARUS_UNSAFE_DISABLE_SELF_FENCE=1``; any other non-empty value is refused.

    Raises:
        ValueError: the variable is set to something other than ``1``.
    """
    value = os.environ.get(UNSAFE_DISABLE_SELF_FENCE_ENV, "")
    if not value:
        return False
    if value != "1":
        raise ValueError(
            f"{UNSAFE_DISABLE_SELF_FENCE_ENV}={value!r}: refused; only 1 (a test of the "
            "drills) turns the self-fence off"
        )
    _log.error(
        "%s=1: the self-fence is OFF; this agent is UNSAFE (a mutation test only)",
        UNSAFE_DISABLE_SELF_FENCE_ENV,
    )
    return True


class _ReplicationMetrics(ReplicationObserver):
    def __init__(self, metrics: AgentMetrics) -> None:
        self._m = metrics

    def outage_started(self) -> None:
        _log.warning("Redis unreachable: replication is queueing and retrying")

    def outage_ended(self, duration_s: float) -> None:
        _log.info("Redis reachable again: replication caught up after %.1f s", duration_s)

    def item_failed(self, error: BaseException) -> None:
        self._m.replication_errors.inc()


class NodeAgent:
    """One node agent; ``await start()``, then ``await stop()``.

    Args:
        settings: the agent's settings.
        app: the handlers (default: loaded from ``settings.app``).
        metrics: where to count (default: a fresh registry).
        incarnation: this process's incarnation (default: a random one).
    """

    def __init__(
        self,
        settings: AgentSettings,
        app: Agent | None = None,
        *,
        metrics: AgentMetrics | None = None,
        incarnation: str | None = None,
    ) -> None:
        self.settings = settings
        self.app = app if app is not None else load_app(settings.app)
        self.metrics = metrics or AgentMetrics()
        self.incarnation = incarnation or uuid.uuid4().hex[:16]
        # The proof of this incarnation (DESIGN.md §4): 128 random bits, sent in
        # every Hello; the leader keeps only its SHA-256.
        hello = agent_pb2.Hello(
            address=settings.node_id,
            agent_version=__version__,
            started_at_unix_ms=time.time_ns() // 1_000_000,
            incarnation_secret=secrets.token_bytes(16),
        )
        self._hello = hello
        hello.capacity.slots = settings.slots
        hello.labels.update(settings.labels)
        if settings.advertise_kinds:
            hello.kinds.extend(self.app.kinds)
        self.core = AgentCore(
            settings.node_id,
            self.incarnation,
            fence_lead_s=settings.fence_lead_s,
            progress_report_interval_s=settings.progress_report_interval_s,
            local_progress_report_interval_s=settings.local_progress_report_interval_s,
            unsafe_disable_self_fence=_unsafe_disable_self_fence(),
        )
        self._lock = asyncio.Lock()
        self._store: CheckpointStore | None = None
        self._redis: aioredis.Redis | None = None
        self._replica: RedisCheckpointReplica | None = None
        self._replicator: Replicator | None = None
        self._runner: TaskRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._outbound: asyncio.Queue[agent_pb2.AgentMessage] | None = None
        self._call: Any = None
        self._dial = DialPlan(settings.coordinators, node_id=settings.node_id)
        self._retry_after_s = 0.0
        self._close_requested = asyncio.Event()  # the core said CloseSession
        self.shared: SharedDocuments | None = None
        """Shared CRDT documents (``node_agent.shared``), open after ``start``."""
        self._services: list[asyncio.Task[None]] = []
        self._stopping = False
        self._failure: str | None = None  # why the agent stopped itself (``_fail``)
        self._failed = asyncio.Event()  # set once that stop has completed
        self._stopper: asyncio.Task[None] | None = None
        self._sessions = 0
        self._mono0 = time.monotonic()
        self.fence_log: list[dict[str, Any]] = []
        """Fence events with wall times (for tests and the drill report)."""

    # --------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open the store, connect Redis, restore held tasks, start the Session loop.

        Raises:
            StoreLocked: another agent holds the data directory.
        """
        s = self.settings
        self._store = CheckpointStore(
            s.data_dir, durability="group", max_payload_bytes=max(s.max_payload_bytes, 1 << 16)
        )
        holder = await asyncio.to_thread(self._store.take_holder, self.incarnation)
        self._hello.store_id = holder.store_id
        self._hello.store_previous_incarnation = holder.previous_incarnation
        if holder.previous_incarnation:
            _log.info(
                "store %s: took over from incarnation %s (stopped: its lock was free)",
                holder.store_id,
                holder.previous_incarnation,
            )
        kwargs: dict[str, Any] = {
            "socket_timeout": 2.0,
            "socket_connect_timeout": 2.0,
            "retry": Retry(NoBackoff(), 0),  # the Replicator retries, with backoff and order
        }
        if s.redis_password:
            kwargs["password"] = s.redis_password
        if s.redis_ca_file:
            kwargs["ssl_ca_certs"] = s.redis_ca_file
        self._redis = aioredis.from_url(s.redis_url, **kwargs)
        replica = RedisCheckpointReplica(self._redis, owner=self.incarnation)
        self._replica = replica
        self._replicator = Replicator(
            replica,
            max_backlog=s.replication_backlog,
            observer=_ReplicationMetrics(self.metrics),
            linger_s=s.replication_linger_s,
        )
        await self._replicator.start()
        self.shared = SharedDocuments(s.data_dir, s.node_id)
        await self.shared.start()
        self._runner = TaskRunner(
            app=self.app,
            store=self._store,
            replica=replica,
            replicator=self._replicator,
            reporter=self,
            node_id=s.node_id,
            incarnation=self.incarnation,
            default_durability=s.durability,
            max_payload_bytes=s.max_payload_bytes,
            metrics=self.metrics,
            shared=self.shared,
            default_isolation=s.isolation,
            slots=s.slots,
            worker_nice=s.worker_nice,
            worker_redis=WorkerRedis(
                s.redis_url, s.redis_password, s.redis_ca_file, replica.prefix
            ),
            progress_report_interval_s=s.progress_report_interval_s,
            keep_checkpoints=s.keep_checkpoints,
        )
        # Checkpoints the worker processes of an earlier run of this agent
        # committed (and acknowledged) go into the store before anyone reads it.
        await asyncio.to_thread(self._runner.ingest_leftover_spools)
        metas = await self._store.aio.metas()
        readable, unreadable = convert.decode_metas(metas)
        async with self._lock:
            await self._execute(self.core.restore(readable, unreadable))
        await self._report_leftover_copies(set(metas))
        held = sum(1 for t in metas)
        _log.info(
            "node agent %s (incarnation %s) starting: %d task(s) held in %s, app %s (%s)",
            s.node_id,
            self.incarnation,
            held,
            s.data_dir,
            s.app,
            ", ".join(self.app.kinds),
        )
        loops = [  # after the lineage reports restore() may have spawned
            asyncio.create_task(self._session_loop(), name="agent-session"),
            asyncio.create_task(self._tick_loop(), name="agent-tick"),
            asyncio.create_task(self._redis_generation_loop(), name="agent-redis-generation"),
        ]
        for loop in loops:
            loop.add_done_callback(self._supervise)
        self._tasks += loops
        self._spawn(asyncio.to_thread(self._runner.prestart_workers))  # isolation="process"
        shared = self.shared
        for spec in self.app.services:
            ctx = ServiceContext(
                node_id=s.node_id,
                data_dir=str(s.data_dir),
                open_shared=lambda name, kind: shared.handle(name, kind),
            )
            task: asyncio.Task[None] = asyncio.ensure_future(spec.fn(ctx))
            task.set_name(f"service:{spec.name}")
            task.add_done_callback(_log_service_end)
            self._services.append(task)

    async def stop(self, *, goodbye: bool = True, timeout_s: float = 10.0) -> None:
        """Pause every task (flushing it to Redis), say Goodbye, close everything."""
        if self._stopping:
            return
        self._stopping = True
        for service in self._services:
            service.cancel()
        for service in self._services:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await service
        self._services = []
        runner = self._runner
        if runner is not None:
            async with self._lock:
                commands = self.core.shutdown()
            stops = [
                runner.stop(c.task_id, c.epoch, flush=True)
                for c in commands
                if isinstance(c, StopTask)
            ]
            if stops:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout_s):
                        await asyncio.gather(*stops, return_exceptions=True)
        if goodbye and self._call is not None and self.core.session_open:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._call.write(
                        agent_pb2.AgentMessage(
                            goodbye=agent_pb2.Goodbye(reason="shutdown", released_all=True)
                        )
                    )
                    await asyncio.sleep(0.1)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if runner is not None:
            await runner.close()
        if self._replicator is not None:
            await self._replicator.close(drain_timeout_s=2.0)
        if self.shared is not None:
            await self.shared.close()
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
        if self._store is not None:
            await self._store.aio.close()
        _log.info("node agent %s stopped", self.settings.node_id)

    @property
    def stopping(self) -> bool:
        """True once ``stop`` began."""
        return self._stopping

    @property
    def failure(self) -> str | None:
        """Why the agent stopped itself (a loop or a directive failed), or None."""
        return self._failure

    async def failed(self) -> str:
        """Wait until the agent has stopped itself because a part of it failed.

        Returns:
            The reason (``failure``), once the stop it began has completed;
            the process should then exit non-zero, so it is restarted.
        """
        await self._failed.wait()
        assert self._failure is not None
        return self._failure

    def _supervise(self, loop: asyncio.Task[None]) -> None:
        """Done-callback of the agent's long-lived loops: any end outside ``stop`` is fatal.

        A process whose tick loop died sends no heartbeats and never self-fences
        while its handlers run on; one whose session loop died never dials
        again; one whose generation loop died misses Redis's data loss. None of
        them may stay up: the agent stops (``_fail``) and ``node_agent.main``
        exits 1, so Kubernetes restarts it.
        """
        if self._stopping or self._failure is not None:
            return  # stop() ended it, or the agent is stopping for another failure
        name = loop.get_name()
        exc: BaseException | None = None
        if loop.cancelled():
            how = "was cancelled"
        else:
            exc = loop.exception()
            how = "failed" if exc is not None else "returned"
        self.metrics.loop_failures.labels(loop=name).inc()
        _log.error(
            "agent loop %s %s unexpectedly; stopping the agent (exit 1, to be restarted)",
            name,
            how,
            exc_info=exc,
        )
        self._fail(f"loop {name} {how}: {exc!r}" if exc is not None else f"loop {name} {how}")

    def _fail(self, reason: str) -> None:
        """Stop the agent because a part of it failed (``failure`` says why).

        The stop is ``stop``'s: every running task is paused with its records
        flushed, then the handlers are cancelled and everything closed. The
        pauses are given only until the core would fence (``fence_lead_s``
        before the fence deadline; never longer than ``stop``'s default): after
        a dead tick loop nothing else fences, and the leader moves the tasks
        once it holds the node dead. No Goodbye: this
        process's view of its tasks may be wrong (a directive half applied), so
        the leader judges it by the heartbeats it stops getting, never by a
        "released all" it cannot check.
        """
        if self._stopping or self._failure is not None:
            return
        self._failure = reason
        timeout_s = 10.0
        deadline = self.core.fence_deadline()
        if deadline is not None:
            timeout_s = max(0.0, min(timeout_s, deadline - self.core.fence_lead_s - self._now()))
        self._stopper = asyncio.create_task(self._stop_failed(timeout_s), name="agent-fail-stop")

    async def _stop_failed(self, timeout_s: float) -> None:
        try:
            await self.stop(goodbye=False, timeout_s=timeout_s)
        except Exception:
            _log.exception("stopping the failed agent failed too")
        finally:
            self._failed.set()

    @property
    def redirect_pending(self) -> bool:
        """True when NotLeader named the address to dial next."""
        return self._dial.redirect_pending

    # ----------------------------------------------------------------- clocks

    def _now(self) -> float:
        return time.monotonic()

    @staticmethod
    def _wall_ms() -> int:
        return time.time_ns() // 1_000_000

    async def _tick_loop(self) -> None:
        while True:
            async with self._lock:
                await self._execute(self.core.tick(self._now(), self._wall_ms()))
            if self._runner is not None:
                self._runner.ingest_spools()  # checkpoints worker processes committed
                self._runner.drain_handoff(hold=True)  # local-durability records
            if self._replicator is not None:
                self.metrics.replication_lag.set(self._replicator.lag_seconds)
                self.metrics.replication_backlog.set(self._replicator.backlog_records)
            await asyncio.sleep(TICK_S)

    async def _redis_generation_loop(self) -> None:
        """Read Redis's dataset marker; when it changed, re-ship every task (core/redisloss.py)."""
        seen: str | None = None
        while True:
            current: str | None = None
            if self._replica is not None:
                try:
                    current = await self._replica.generation()
                except Exception as exc:  # unreachable now: no evidence either way
                    _log.debug("redis generation unreadable: %s", exc)
            if generation_reset(seen, current) and self._runner is not None:
                self.metrics.redis_resets.labels(signal="generation").inc()
                queued = self._runner.reship_all()
                _log.warning(
                    "redis_reset generation %s -> %s: Redis lost its data (restarted without "
                    "persistence?); re-shipping %d task(s) from the local store",
                    seen,
                    current,
                    queued,
                )
            if current is not None:
                seen = current
            await asyncio.sleep(REDIS_GENERATION_CHECK_S)

    # ---------------------------------------------------------------- session

    async def _session_loop(self) -> None:
        plan = self._dial
        wait = wait_random_exponential(multiplier=0.1, max=self.settings.reconnect_max_backoff_s)
        resolved_at = -math.inf
        while not self._stopping:
            if self.settings.resolve_coordinators and (
                self._now() - resolved_at >= RESOLVE_INTERVAL_S
            ):
                resolved_at = self._now()
                await self._resolve_coordinators()
            choice = plan.next(self._now())
            if choice.skipped:
                self.metrics.dials_held_off.inc(len(choice.skipped))
                _log.info(
                    "dialling %s; holding off %s (unreachable within %g s)",
                    choice.address,
                    ", ".join(choice.skipped),
                    plan.hold_off_s,
                )
            target = choice.address
            self._retry_after_s = 0.0
            end = await self._one_session(target)
            if self.stopping or self._failure is not None:
                return  # stop(), begun by a signal or by _fail, ends the agent
            pause = plan.ended(target, self._now(), end)
            if pause is None:  # a failed dial: back off by the failures since a Welcome
                pause = float(wait(_Attempt(plan.failures + 1)))  # type: ignore[arg-type]
            if pause > 0:
                await asyncio.sleep(pause)

    async def _resolve_coordinators(self) -> None:
        """Dial every address the ``--coordinators`` names resolve to (``resolve_coordinators``).

        A name that does not resolve (DNS down, no such name, slower than
        ``rpc_timeout_s``) is kept as given, so the dial still goes somewhere;
        the first resolution starts this node's rotation at ``spread_start``
        (``DialPlan.set_addresses``).
        """
        loop = asyncio.get_running_loop()
        addresses: list[str] = []
        for name in self.settings.coordinators:
            host, _, port = name.rpartition(":")
            host = host.strip("[]")
            try:
                infos = await asyncio.wait_for(
                    loop.getaddrinfo(host, int(port), type=socket.SOCK_STREAM),
                    self.settings.rpc_timeout_s,
                )
            except (OSError, TimeoutError, ValueError) as exc:
                _log.warning("cannot resolve coordinator %s (%s); dialling the name", name, exc)
                addresses.append(name)
                continue
            for info in infos:
                ip = str(info[4][0])
                address = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
                if address not in addresses:
                    addresses.append(address)
        resolved = tuple(sorted(addresses))
        if self._dial.set_addresses(resolved):
            _log.info("coordinators resolved to %s", ", ".join(resolved))

    async def _one_session(self, target: str) -> DialEnd:
        """One Session with ``target``: what was seen of it, for ``DialPlan.ended`` to judge.

        Facts only: whether a Welcome or a NotLeader came, the status the call
        ended with, silence for ``rpc_timeout_s``, a call broken outside
        gRPC's statuses, and the pause a CloseSession asked for.
        """
        welcomed = not_leader = silent = broken = False
        status = ""
        outbound: asyncio.Queue[agent_pb2.AgentMessage] = asyncio.Queue()
        reason = "closed"
        try:
            # TLS verifies the coordinator (a NotLeader redirect too) against the cluster CA.
            # Keepalive: a coordinator gone silent (blackholed) fails the call
            # within lazarus.grpcopts' bound even while nothing is being written.
            async with self.settings.tls.aio_channel(target, channel_options()) as channel:
                stub = agent_pb2_grpc.AgentServiceStub(channel)  # type: ignore[no-untyped-call]
                call = stub.Session()
                self._call = call
                async with self._lock:
                    hello = convert.hello_to_pb(
                        self.core.hello(self._now(), self._wall_ms()), self._hello
                    )
                # A follower answers NotLeader and ends the call at once, maybe
                # before our Hello is written: read on even when the write fails.
                self._close_requested.clear()
                with contextlib.suppress(
                    grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError
                ):
                    await asyncio.wait_for(call.write(hello), self.settings.rpc_timeout_s)
                self._outbound = outbound
                writer = asyncio.create_task(self._write_loop(call, outbound), name="agent-write")
                closer = asyncio.ensure_future(self._close_requested.wait())
                # Directives are applied in order by a processor; the reader keeps
                # reading, so a burst of Assigns (each persisted before its task
                # starts) never delays a HeartbeatAck behind it: a late ack would
                # make this agent self-fence for nothing.
                inbox: asyncio.Queue[agent_pb2.CoordinatorMessage] = asyncio.Queue()
                processor = asyncio.create_task(self._process(inbox), name="agent-directives")
                try:
                    while True:
                        # Never wait on the stream alone: a CloseSession from the
                        # clock (the self-fence) or a silent peer must end it too.
                        read = asyncio.ensure_future(call.read())
                        done, _ = await asyncio.wait(
                            {read, closer, processor},
                            timeout=self.settings.rpc_timeout_s,
                            return_when=asyncio.FIRST_COMPLETED,
                        )
                        if processor in done:
                            # The directives it failed on, and every later one,
                            # were never applied: a Session that only acks
                            # heartbeats would leave Assigns unstarted and
                            # Revokes unobeyed. End it as any lost Session ends
                            # (the fence deadline runs; a Welcome re-syncs).
                            read.cancel()
                            reason = "the directive processor failed"
                            if not processor.cancelled() and processor.exception() is not None:
                                reason = f"{reason}: {processor.exception()!r}"
                            break
                        if read not in done:
                            read.cancel()
                            if closer in done:
                                reason = "closed by the agent"
                            else:
                                reason = (
                                    f"nothing from {target} for {self.settings.rpc_timeout_s:g} s"
                                )
                                silent = True
                            break
                        if read.cancelled():
                            # grpc-python cancels the whole call when a write of it
                            # was cancelled (the Hello's wait_for timed out under an
                            # overloaded leader): the read then ends cancelled, not
                            # with an AioRpcError. The Session is over; dial again.
                            reason = f"the call to {target} was cancelled under us"
                            broken = True
                            break
                        msg = read.result()
                        if msg is grpc.aio.EOF:
                            reason = "stream ended by the coordinator"
                            break
                        body = msg.WhichOneof("body")
                        if body in DOCUMENT_BODIES and self.shared is not None:
                            self.shared.receive(msg)  # shared documents: not the core's
                            continue
                        if body == "heartbeat_ack":
                            # Without the lock: the core's step is synchronous (atomic on
                            # this loop) and an ack yields only notices. Waiting behind
                            # hundreds of queued task reports would fence a healthy node.
                            now, wall = self._now(), self._wall_ms()
                            step = self.core.on_message(
                                convert.coordinator_message_from_pb(msg), now, wall
                            )
                            await self._execute(step)
                            continue
                        if body == "not_leader":
                            not_leader = True  # the abort that follows is its answer
                        elif body == "welcome":
                            welcomed = True
                            self._sessions += 1
                            if self._sessions > 1:
                                self.metrics.session_reconnects.inc()
                            _log.info(
                                "session open with %s (leader %s, term %d)",
                                target,
                                msg.welcome.leader_id,
                                msg.welcome.term,
                            )
                        inbox.put_nowait(msg)
                finally:
                    processor.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await processor
                    closer.cancel()
                    writer.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await writer
                    call.cancel()
        except grpc.aio.AioRpcError as exc:
            status = exc.code().name
            reason = f"{status}: {exc.details()}"
            if exc.code() is grpc.StatusCode.FAILED_PRECONDITION:
                # An identity conflict (another live process holds our node id)
                # or a protocol mismatch: nothing runs here; retry with backoff.
                self.metrics.session_refusals.inc()
                _log.error(
                    "session refused by %s: %s (node %s, incarnation %s; running nothing, "
                    "retrying with backoff)",
                    target,
                    exc.details(),
                    self.settings.node_id,
                    self.incarnation,
                )
            else:
                level = (
                    logging.INFO if exc.code() is grpc.StatusCode.UNAVAILABLE else logging.WARNING
                )
                _log.log(level, "session with %s ended: %s", target, reason)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._stopping or (task is not None and task.cancelling()):
                raise  # the agent is stopping this loop
            # A CancelledError of the gRPC call's own, not of this task: ending the
            # session loop here would leave a live process that never dials again.
            reason = "the gRPC call was cancelled"
            broken = True
            _log.warning("session with %s ended: %s; dialling again", target, reason)
        except Exception as exc:
            reason = repr(exc)
            broken = True
            _log.warning("session with %s failed: %r", target, exc)
        finally:
            self._call = None
            self._outbound = None
            if self.shared is not None:
                self.shared.session_closed()
            async with self._lock:
                await self._execute(self.core.on_session_closed(self._now(), reason))
        return DialEnd(
            welcomed=welcomed,
            not_leader=not_leader,
            retry_after_s=self._retry_after_s,
            status=status,
            silent=silent,
            broken=broken,
        )

    async def _process(self, inbox: asyncio.Queue[agent_pb2.CoordinatorMessage]) -> None:
        """Apply the leader's messages in order (a CloseSession ends the reader).

        Messages that arrived together are stepped through the core together
        (``AgentCore.on_messages``): the core returns one ready batch whose metas
        come first, written in one group commit (one fsync) before any task of
        them starts; after a node dies its tasks arrive here by the hundred.
        """
        while True:
            batch = [await inbox.get()]
            while not inbox.empty() and len(batch) < DIRECTIVE_BATCH:
                batch.append(inbox.get_nowait())
            async with self._lock:
                try:
                    msgs = [convert.coordinator_message_from_pb(m) for m in batch]
                except Exception:
                    # Nothing of the batch reached the core: ending the Session
                    # (the caller does, on this task's end) loses no state.
                    self.metrics.directive_failures.inc()
                    _log.exception("directive(s) %s unreadable; ending the session", _kinds(batch))
                    raise
                try:
                    await self._execute(self.core.on_messages(msgs, self._now(), self._wall_ms()))
                except Exception as exc:
                    # The core stepped past these directives but its commands did
                    # not all run (a meta not written, a StopTask of a Revoke not
                    # carried out): its view and the runner's differ, and neither
                    # a new Session nor the fence (which stops only RUNNING slots)
                    # repairs that. Only a restart from the store does: the
                    # agent stops and exits non-zero. A StoreIOError (a full
                    # disk) would recur on every reconnect anyway.
                    self.metrics.directive_failures.inc()
                    _log.exception(
                        "applying directive(s) %s failed; ending the session and stopping "
                        "the agent (exit 1, to be restarted)",
                        _kinds(batch),
                    )
                    self._fail(f"applying directive(s) {_kinds(batch)} failed: {exc!r}")
                    raise

    async def _write_loop(self, call: Any, queue: asyncio.Queue[agent_pb2.AgentMessage]) -> None:
        while True:
            msg = await queue.get()
            await call.write(msg)

    # --------------------------------------------------------------- commands

    async def _execute(self, commands: list[Command]) -> None:
        """Carry out the core's commands in order (caller holds the lock)."""
        runner = self._runner
        for cmd in commands:
            if isinstance(cmd, Send):
                if self._outbound is not None:
                    # A Hello (after a Reattach) gets the static fields of the first one.
                    self._outbound.put_nowait(convert.agent_message_to_pb(cmd.message, self._hello))
            elif isinstance(cmd, PersistMeta):
                assert self._store is not None
                await self._store.aio.put_meta(cmd.task_id, convert.encode_meta(cmd.meta))
            elif isinstance(cmd, PersistMetas):
                assert self._store is not None
                await asyncio.gather(
                    *(
                        self._store.aio.put_meta(task_id, convert.encode_meta(meta))
                        for task_id, meta in cmd.metas
                    )
                )
            elif isinstance(cmd, ForgetTask):
                if runner is not None:
                    runner.forget(cmd.task_id)  # its ended run, if any
                assert self._store is not None
                await self._store.aio.forget(cmd.task_id)
                if self.shared is not None:  # its task/<id> document, once shipped
                    self.shared.forget_task(cmd.task_id)
            elif isinstance(cmd, StartTask):
                assert runner is not None
                runner.start(convert.assign_to_pb(cmd.assign))
            elif isinstance(cmd, StopTask):
                assert runner is not None
                self._spawn(runner.stop(cmd.task_id, cmd.epoch, flush=cmd.flush))
            elif isinstance(cmd, CloseSession):
                if cmd.redirect:
                    self._dial.redirect(cmd.redirect)
                self._retry_after_s = cmd.retry_after_s
                _log.info("closing session: %s", cmd.reason)
                self._close_requested.set()  # the reader ends; the loop says Hello again
            elif isinstance(cmd, Notice):
                self._notice(cmd)
            elif isinstance(cmd, ReportLineage):
                self._spawn(self._report_lineage(cmd))
            elif isinstance(cmd, ReportLineageCopy):
                self._spawn(self._report_lineage_copy(cmd))
        if runner is not None:
            # Handler threads check ownership against this snapshot, with no hop here.
            runner.ownership = self.core.ownership()

    def _notice(self, notice: Notice) -> None:
        kind, f = notice.kind, notice.fields
        if kind == "session_open" and self.shared is not None and self._outbound is not None:
            self.shared.session_opened(self._outbound.put_nowait)
        if kind == "heartbeat_rtt":
            self.metrics.heartbeat_rtt.observe(f["seconds"])
            return
        if kind == "self_fence":
            self.metrics.fence_events.inc()
            entry = {"event": "self_fence", "wall_ms": self._wall_ms(), **f}
            self.fence_log.append(entry)
            _log.warning(
                "self-fence: no heartbeat ack in time; pausing %d task(s) (deadline in %.3f s)",
                f["tasks"],
                f["deadline_in_s"],
                extra={"lazarus": entry},
            )
            return
        if kind == "stale_welcome":
            self.metrics.stale_welcomes.inc()
            _log.warning(
                "ignored a Welcome from %r (term %d) answering Hello %d: the newest Hello is "
                "%d; its fence is not moved, the newest Hello's Welcome is awaited",
                f["leader"],
                f["term"],
                f["hello_seq"],
                f["newest_hello_seq"],
            )
            return
        if kind == "task_paused":
            entry = {"event": "task_paused", "wall_ms": self._wall_ms(), **f}
            self.fence_log.append(entry)
            _log.warning(
                "task %s paused at epoch %d (self-fence)",
                f["task_id"],
                f["epoch"],
                extra={"lazarus": entry},
            )
            return
        level = logging.INFO
        if kind in ("meta_unreadable", "update_refused", "stale_assign"):
            level = logging.WARNING
        _log.log(level, "%s %s", kind, " ".join(f"{k}={v}" for k, v in f.items()))

    async def _report_lineage(self, cmd: ReportLineage) -> None:
        """Keep a fenced task's unreplicated progress as a fork: Redis record + report."""
        assert self._store is not None
        store = self._store.aio
        task_id = cmd.task_id
        bases = None
        if self._replica is not None:
            with contextlib.suppress(Exception):
                bases = await self._replica.lineage_bases(task_id)
        base = lineage.fork_base(
            cmd.epoch, bases, (cmd.replicated_journal_seq, cmd.replicated_checkpoint_seq)
        )
        infos = {(i.seq, i.epoch): i for i in await store.list(task_id)}
        replayed = {(e.seq, e.epoch): e for e in await store.replay(task_id, after_seq=base[0])}
        crdt = self._crdt_state(task_id, cmd.epoch)
        fork = lineage.select_divergent(
            cmd.epoch,
            base,
            sorted(infos),
            sorted(replayed),
            crdt=crdt,
        )
        if fork.empty:
            _log.info(
                "task %s revoked at epoch %d: no progress beyond what Redis holds",
                task_id,
                cmd.epoch,
            )
            async with self._lock:  # settled: the core forgets the task once revoked
                await self._execute(self.core.lineage_empty(task_id, cmd.epoch))
            return
        fork_id = lineage.fork_id(task_id, cmd.epoch, self.settings.node_id, self.incarnation)
        await self._keep_fork(
            task_id,
            task_id,
            fork_id,
            cmd.epoch,
            cmd.current_epoch,
            base[1],
            fork,
            infos,
            replayed,
        )

    async def _report_leftover_copies(self, tasks: set[str]) -> None:
        """Name to the core every lineage copy an earlier run left in the store.

        Its fork was never written, never acknowledged, or not stored in Redis
        (the old process died first): each is reported now, so it is
        forgotten once settled. ``tasks`` are the ids with a meta: a task the
        application named like a copy has one, a copy never does.
        """
        assert self._store is not None
        for head in await self._store.aio.task_heads():
            parent = lineage_copy_of(head.task_id)
            if parent and head.task_id not in tasks:
                async with self._lock:
                    await self._execute(self.core.lineage_copy_kept(parent, head.task_id))

    async def _report_lineage_copy(self, cmd: ReportLineageCopy) -> None:
        """Keep the rows a restore's adopt moved to a lineage copy as a fork (core docstring)."""
        assert self._store is not None
        store = self._store.aio
        task_id, copy = cmd.task_id, cmd.copy_task_id
        infos = {(i.seq, i.epoch): i for i in await store.list(copy)}
        replayed = {(e.seq, e.epoch): e for e in await store.replay(copy)}
        if not infos and not replayed:
            async with self._lock:
                await self._execute(self.core.lineage_copy_empty(copy))
            return
        # Every row of a copy is divergent: the stale epoch is the newest among
        # them, the base the seqs just before the first of them.
        stale_epoch = max(epoch for _, epoch in [*infos, *replayed])
        heads = {h.task_id: h for h in await store.task_heads()}
        head = heads.get(task_id)
        current_epoch = head.epoch if head is not None else 0
        fork = lineage.select_divergent(
            stale_epoch,
            (0, 0),
            sorted(infos),
            sorted(replayed),
            crdt=self._crdt_state(task_id, stale_epoch),
        )
        ckpt_base = max(min((seq for seq, _ in infos), default=1) - 1, 0)
        fork_id = lineage.copy_fork_id(
            copy, self.settings.node_id, self.incarnation, cmd.report_seq
        )
        await self._keep_fork(
            task_id,
            copy,
            fork_id,
            stale_epoch,
            current_epoch,
            ckpt_base,
            fork,
            infos,
            replayed,
        )

    def _crdt_state(self, task_id: str, epoch: int) -> bool:
        """True when the task's state is a CRDT document (it merges instead of forking)."""
        # What it did at the stale epoch is in its replica of task/<id> and
        # merges into the current owner's state through the shared-document
        # reconciliation.
        crdt = self.shared is not None and self.shared.holds(f"task/{task_id}")
        if crdt:
            _log.warning(
                "task %s revoked at epoch %d: its CRDT state merges into the current owner's",
                task_id,
                epoch,
                extra={"lazarus": {"event": "crdt_state_merged", "task_id": task_id}},
            )
        return crdt

    async def _keep_fork(
        self,
        task_id: str,
        lineage_task_id: str,
        fork_id: str,
        stale_epoch: int,
        current_epoch: int,
        ckpt_base: int,
        fork: lineage.Divergence,
        infos: dict[tuple[int, int], CheckpointInfo],
        replayed: dict[tuple[int, int], JournalEvent],
    ) -> None:
        """Write a fork's ForkRecord and records to Redis, then hand its report to the core.

        Args:
            task_id: the task the fork is of.
            lineage_task_id: where its records are in the local store: the task,
                or a lineage copy of it (then the core forgets the copy once the
                fork is in Redis and acknowledged).
            fork_id: the fork's name.
            stale_epoch: the epoch the records were made at (the newest).
            current_epoch: the task's epoch now, as far as this node knows.
            ckpt_base: the checkpoint seq the fork starts after.
            fork: the divergent records, as (seq, epoch) keys of ``infos`` / ``replayed``.
            infos, replayed: the local checkpoints and journal events by (seq, epoch).
        """
        assert self._store is not None
        assert self._redis is not None
        store = self._store.aio
        report = agent_pb2.LineageReport(
            fork_id=fork_id, task_id=task_id, epoch=stale_epoch, chunk_index=0, last=True
        )
        for key in fork.reported_checkpoints:
            info = infos[key]
            stored = await store.load(info.ref)
            report.checkpoints.add(
                task_id=task_id,
                epoch=info.epoch,
                seq=info.seq,
                covers_journal_seq=info.covers_journal_seq,
                checkpoint_ref=info.ref,
                terminal=info.terminal,
                label=info.label,
                payload=stored.payload,
                encoding=records_pb2.PAYLOAD_ENCODING_RAW,
                content_type="application/json",
                decoded_bytes=len(stored.payload),
                created_at_unix_ms=info.created_at_ms,
                node_id=self.settings.node_id,
                incarnation=self.incarnation,
                parent_ref=info.parent_ref if lineage_task_id != task_id else "",
            )
        for key in fork.reported_events:
            event = replayed[key]
            report.journal_events.add(
                task_id=task_id,
                epoch=event.epoch,
                seq=event.seq,
                payload=event.payload,
                content_type="application/json",
                created_at_unix_ms=event.created_at_ms,
                node_id=self.settings.node_id,
            )
        seqs = [seq for seq, _ in fork.events]
        head = infos[fork.checkpoints[-1]] if fork.checkpoints else None
        record = records_pb2.ForkRecord(
            fork_id=fork_id,
            task_id=task_id,
            lineage_task_id=lineage_task_id,
            node_id=self.settings.node_id,
            incarnation=self.incarnation,
            stale_epoch=stale_epoch,
            current_epoch=current_epoch,
            divergent_checkpoints=len(fork.checkpoints),
            divergent_journal_events=len(fork.events),
            first_divergent_journal_seq=min(seqs, default=0),
            last_divergent_journal_seq=max(seqs, default=0),
            resolution=records_pb2.FORK_RESOLUTION_MERGED
            if fork.resolution is lineage.Resolution.MERGED
            else records_pb2.FORK_RESOLUTION_KEPT,
            detected_at_unix_ms=self._wall_ms(),
        )
        record.base_checkpoint.task_id = task_id
        record.base_checkpoint.seq = ckpt_base
        if head is not None:
            record.head_checkpoint.task_id = task_id
            record.head_checkpoint.seq = head.seq
            record.head_checkpoint.epoch = head.epoch
            record.head_checkpoint.checkpoint_ref = head.ref
        in_redis = True
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(fork_key(task_id), fork_id, record.SerializeToString())
                pipe.set(fork_records_key(task_id, fork_id), report.SerializeToString())
                await pipe.execute()
        except Exception as exc:  # Redis down: the lineage stays in the local store
            in_redis = False
            _log.warning("task %s: fork %s not written to Redis: %s", task_id, fork_id, exc)
        _log.warning(
            "task %s: kept %d checkpoint(s) and %d journal event(s) made at stale epoch %d "
            "as fork %s (owner now at epoch %d)",
            task_id,
            len(fork.checkpoints),
            len(fork.events),
            stale_epoch,
            fork_id,
            current_epoch,
            extra={
                "lazarus": {
                    "event": "fork_kept",
                    "task_id": task_id,
                    "fork_id": fork_id,
                    "epoch": stale_epoch,
                    "checkpoints": len(fork.checkpoints),
                    "events": len(fork.events),
                    "lineage_task_id": lineage_task_id,
                }
            },
        )
        wire = lineage_wire_report(report).SerializeToString()
        async with self._lock:
            await self._execute(
                self.core.lineage_ready(
                    LineageReport(fork_id, task_id, stale_epoch, wire),
                    stored=in_redis,
                    copy_task_id=lineage_task_id if lineage_task_id != task_id else "",
                )
            )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error("background step failed: %r", task.exception(), exc_info=task.exception())

    # ------------------------------------------- Reporter (from the runner)

    async def started(
        self, task_id: str, epoch: int, started: agent_pb2.TaskUpdate.Started
    ) -> None:
        resumed = started.resumed_from if started.HasField("resumed_from") else None
        fields = {
            "event": "task_started",
            "task_id": task_id,
            "epoch": epoch,
            "source": "redis"
            if started.location == records_pb2.CHECKPOINT_LOCATION_REDIS
            else "local",
            "checkpoint_seq": resumed.seq if resumed else 0,
            "covers_journal_seq": resumed.covers_journal_seq if resumed else 0,
            "replayed_journal_events": started.replayed_journal_events,
            "restore_ms": started.restore_ms,
        }
        if resumed is not None or started.replayed_journal_events:
            _log.info(
                "task %s resumed at epoch %d from %s checkpoint seq %d + %d journal events "
                "(restore %d ms)",
                task_id,
                epoch,
                fields["source"],
                fields["checkpoint_seq"],
                started.replayed_journal_events,
                started.restore_ms,
                extra={"lazarus": fields},
            )
        else:
            _log.info("task %s started at epoch %d", task_id, epoch, extra={"lazarus": fields})
        # Lock-free like progress: it only queues a Started update (a Send), and a
        # burst of restores must not queue hundreds of waiters ahead of the clock.
        await self._execute(
            self.core.task_started(
                task_id, epoch, convert.started_from_pb(started), self._wall_ms()
            )
        )

    def progress(self, task_id: str, epoch: int, **fields: Any) -> None:
        # task_progress only updates the core's view; a synchronous call is atomic
        # here, so it needs neither the lock nor a task of its own (it runs once or
        # twice per checkpoint).
        checkpoint = fields.get("checkpoint")
        if checkpoint is not None:
            fields["checkpoint"] = convert.checkpoint_from_pb(checkpoint)
        commands = self.core.task_progress(task_id, epoch, **fields)
        if commands:
            self._spawn(self._execute_locked(commands))

    async def _execute_locked(self, commands: list[Command]) -> None:
        async with self._lock:
            await self._execute(commands)

    async def finished(
        self,
        task_id: str,
        epoch: int,
        *,
        result: records_pb2.TaskResult | None,
        error: records_pb2.TaskError | None,
        final_checkpoint: records_pb2.CheckpointSummary | None,
        run_ms: int,
    ) -> None:
        async with self._lock:
            await self._execute(
                self.core.task_finished(
                    task_id,
                    epoch,
                    result=convert.result_from_pb(result) if result is not None else None,
                    error=convert.error_from_pb(error) if error is not None else None,
                    final_checkpoint=convert.checkpoint_from_pb(final_checkpoint)
                    if final_checkpoint is not None
                    else None,
                    run_ms=run_ms,
                    wall_ms=self._wall_ms(),
                )
            )

    async def stopped(
        self,
        task_id: str,
        epoch: int,
        *,
        checkpoint: records_pb2.CheckpointSummary | None,
        journal_seq: int,
    ) -> None:
        async with self._lock:
            await self._execute(
                self.core.task_stopped(
                    task_id,
                    epoch,
                    checkpoint=convert.checkpoint_from_pb(checkpoint)
                    if checkpoint is not None
                    else None,
                    journal_seq=journal_seq,
                    wall_ms=self._wall_ms(),
                )
            )

    async def lost(self, task_id: str, epoch: int, current_epoch: int) -> None:
        async with self._lock:
            await self._execute(self.core.task_lost(task_id, epoch, current_epoch))

    async def lineage_kept(self, task_id: str, lineage_task_id: str) -> None:
        async with self._lock:
            await self._execute(self.core.lineage_copy_kept(task_id, lineage_task_id))


def _kinds(batch: list[agent_pb2.CoordinatorMessage]) -> str:
    """The bodies of a batch of leader messages, for a log line: ``assign x3, revoke``."""
    counts: dict[str, int] = {}
    for msg in batch:
        body = msg.WhichOneof("body") or "empty"
        counts[body] = counts.get(body, 0) + 1
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in counts.items())


def _log_service_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        _log.error("service %s failed: %r", task.get_name(), task.exception())


class _Attempt:
    """The slice of tenacity's RetryCallState that its wait functions read."""

    def __init__(self, attempt_number: int) -> None:
        self.attempt_number = attempt_number
