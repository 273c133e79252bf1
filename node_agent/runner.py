"""TaskRunner: runs handlers, restores their state, makes their effects durable.

Theory of operation: the agent shell turns the core's ``StartTask`` and
``StopTask`` commands into ``start`` and ``stop`` calls here, and this module
reports back through a ``Reporter`` (started, progress, finished, stopped,
lost). It decides nothing about ownership: that is ``node_agent.core``.

**Restore** (DESIGN.md §7–§8). Before a handler starts at epoch ``e`` the
runner claims the task in Redis at ``e`` (the fence rises, so an old owner's
later writes are refused), then compares the local store with what Redis
holds: the newer lineage wins. A newer remote lineage is adopted into the
local store (``CheckpointStore.adopt``) so numbering continues; a newer local
one (this node's own writes that never reached Redis, e.g. before a SIGKILL) is
shipped to Redis again. The handler receives the newest checkpoint's state
plus the journal events after it (``Restored``). When Redis is unreachable a
task this node held at the same epoch resumes from local state; any other
task waits (retrying) rather than start from an older state.

**Effects.** ``ctx.checkpoint`` and ``ctx.record`` commit to SQLite (group
commit, fsync) and queue the record for Redis (``Replicator``); with
durability "replicated" they also wait for Redis's ack. A STALE answer from
Redis means a newer owner exists: the task is stopped and reported lost.

**Stop.** The context is cancelled first (every later effect raises
``TaskCancelled``), then an ``async`` handler is cancelled at its next await.
A handler in a thread cannot be interrupted; its effects are already fenced
by the context, and it is reported stopped after ``stop_grace_s``. A stop with
``flush`` (Release, shutdown) waits until Redis acknowledged the task's records.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import sqlite3
import threading
import time
import traceback
from collections import deque
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from lazarus.v1 import agent_pb2, records_pb2
from node_agent.checkpoint import (
    AdoptedCheckpoint,
    AdoptedEvent,
    Checkpoint,
    CheckpointStore,
    CheckpointStoreError,
    PrunePolicy,
    SaveOutcome,
    StaleEpoch,
    StoredCheckpoint,
    StoreIOError,
)
from node_agent.core import Ownership
from node_agent.core.core import DEFAULT_PROGRESS_REPORT_INTERVAL_S
from node_agent.core.history import (
    DEFAULT_KEEP_CHECKPOINTS,
    HistoryEntry,
    PrunePlan,
    history_base,
    plan_prune,
    prune_due,
)
from node_agent.core.redisloss import DataLoss, judge_resume
from node_agent.core.restore import (
    LocalHead,
    RemoteHead,
    Source,
    plan_restore,
    resume_without_redis,
)
from node_agent.core.spooled import PendingAction, in_redis, ingest_now, pending_action
from node_agent.isolation import (
    DEFAULT_WORKER_NICE,
    Worker,
    WorkerDied,
    WorkerPool,
    WorkerRedis,
    replicated_through,
    spooled_through,
    stop_run,
)
from node_agent.metrics import AgentMetrics
from node_agent.replication import (
    ClaimBatcher,
    Outcome,
    RedisCheckpointReplica,
    RemoteState,
    ReplicationItem,
    ReplicationResult,
    Replicator,
    absorbs,
)
from node_agent.sdk import (
    Agent,
    DurabilityName,
    HandlerSpec,
    IsolationName,
    OwnershipLapsed,
    Restored,
    SyncTaskContext,
    TaskCancelled,
    TaskContext,
    TaskFailure,
)
from node_agent.shared import SharedDocument, SharedDocuments
from node_agent.spool import (
    SPOOL_DIRNAME,
    SpoolReader,
    SpoolRow,
    checkpoint_record,
    encode_json,
    leftover_spools,
)

__all__ = ["Reporter", "TaskRunner"]

_log = logging.getLogger("lazarus.agent.runner")

UNSAFE_IGNORE_REDIS_LOSS_ENV = "LAZARUS_UNSAFE_IGNORE_REDIS_LOSS"
"""Set to ``1`` to turn off the re-ship and the DATA_LOSS refusal (mutation tests only)."""

JSON = "application/json"

RESTORE_CONCURRENCY = 128
"""Restores (Redis claim + read, local adopt) in flight at once: hundreds of tasks
moved here together would otherwise starve the event loop, and with it the
heartbeats, until this node self-fences for nothing. Their Redis claims go
together (``ClaimBatcher``), up to this many per round trip."""

RESULT_LABEL = "lazarus:result"
"""Label of the terminal checkpoint that holds a handler's result (its payload is
the result's JSON). Committed before the result is reported; an assignment that
finds one, here or in Redis, reports it again instead of calling the handler."""

OWNERSHIP_SETTLE_S = 1.0
"""How long a handler that stopped on ``OwnershipLapsed`` waits for the agent's own
fence before its run is failed (retryably) as lapsed."""

MAX_RESULT_BYTES = 512 * 1024
"""Largest result: it lives in the task's etcd record (etcd refuses over 1.5 MiB,
and the payload, at most 256 KiB, shares the record)."""


class Reporter(Protocol):
    """Where the runner reports (the agent shell, which feeds the core)."""

    async def started(
        self, task_id: str, epoch: int, started: agent_pb2.TaskUpdate.Started
    ) -> None: ...

    def progress(self, task_id: str, epoch: int, **fields: Any) -> None:
        """A task checkpointed, recorded, replicated or reported progress (on the loop;
        cheap: updates the core's view, sends nothing)."""

    async def finished(
        self,
        task_id: str,
        epoch: int,
        *,
        result: records_pb2.TaskResult | None,
        error: records_pb2.TaskError | None,
        final_checkpoint: records_pb2.CheckpointSummary | None,
        run_ms: int,
    ) -> None: ...

    async def stopped(
        self,
        task_id: str,
        epoch: int,
        *,
        checkpoint: records_pb2.CheckpointSummary | None,
        journal_seq: int,
    ) -> None: ...

    async def lost(self, task_id: str, epoch: int, current_epoch: int) -> None: ...

    async def lineage_kept(self, task_id: str, lineage_task_id: str) -> None:
        """A restore's adopt moved divergent local rows to ``lineage_task_id``: report them."""


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


REPLICATION_WAIT_CHECK_S = 0.25
"""How often a handler thread waiting for Redis's ack re-checks that its run may
still act (``TaskRunner._wait_replicated``), seconds."""


@dataclass(eq=False)
class _Run:
    task_id: str
    epoch: int
    attempt: int
    kind: str
    durability: DurabilityName
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    lost: bool = False
    task: asyncio.Task[None] | None = None
    journal_seq: int = 0
    checkpoint: records_pb2.CheckpointSummary | None = None
    pending: set[asyncio.Future[ReplicationResult]] = field(default_factory=set)
    shipping: set[concurrent.futures.Future[Any]] = field(default_factory=set)
    started_s: float = 0.0
    returned: bool = False  # the handler returned: its result is being committed
    thread: concurrent.futures.Future[Any] | None = None  # a sync handler's thread
    worker: Worker | None = None  # its worker process (isolation="process")
    stopped: bool = False  # stop() completed: nothing of this run may commit any more
    stored_result: records_pb2.TaskResult | None = None  # found at restore
    restored: bool = False  # _restore returned: the local store holds its state
    data_loss: DataLoss | None = None  # the acknowledged state was found nowhere
    reshipping: bool = False  # a re-ship after Redis lost data is queued
    # The newest spooled checkpoint the agent shipped itself: (seq, its future).
    spool_ship: tuple[int, concurrent.futures.Future[Any]] | None = None
    # The newest ingested checkpoint of a local run, left for its worker to
    # write to Redis: (row, stored seq, summary, record); see _ship_pending.
    spool_pending: tuple[Any, int, Any, Any] | None = None
    # The newest seq of the run its spool held when last ingested, and when (monotonic s).
    spool_ingested: int = 0
    spool_ingested_s: float = 0.0
    # Its local history bound (core/history.py): the newest checkpoint seq known
    # to be in Redis, the base of its last look, and whether a prune is on its way.
    replicated_seq: int = 0
    history_base: int = 0
    pruning: bool = False

    @property
    def local(self) -> bool:
        """Its checkpoints promise nothing of Redis: records may linger, reports are sparse."""
        return self.durability != "replicated"

    def lingers(self, *, terminal: bool) -> bool:
        """Whether a record of this run may wait for company on its way to Redis.

        A ``local`` task's records may; a result (``terminal``) never does: a new
        owner that finds it in Redis completes the task without calling the
        handler again, so it must not wait out a linger while its agent may be lost.
        """
        return self.local and not terminal


@dataclass(eq=False, slots=True)
class _Handoff:
    """A record a handler thread committed, on its way to the replicator."""

    run: _Run
    item: ReplicationItem
    ckpt_seq: int
    journal_seq: int
    summary: records_pb2.CheckpointSummary | None
    t_sent: float
    out: concurrent.futures.Future[tuple[ReplicationResult, float]]
    linger: bool  # may wait for company on its way to Redis (see TaskRunner._ship)
    # ``out`` of the earlier handoffs this one absorbed (``coalesce_handoffs``):
    # resolved with this one's answer.
    absorbed: list[concurrent.futures.Future[tuple[ReplicationResult, float]]] = field(
        default_factory=list
    )


HANDOFF_HOLD_MARGIN_S = 0.1
"""How much sooner than the replicator's linger the tick drains lingering handoffs, seconds.

Two of the agent's 50 ms ticks: a record held in the handoff queue reaches the
replicator before its linger (counted from its commit) runs out.
"""


def coalesce_handoffs(batch: list[_Handoff]) -> list[_Handoff]:
    """Drop every lingering handoff a later lingering one of its run makes redundant.

    ``batch`` is in commit order. A handoff is merged into the next handoff of
    the same run (task and epoch) when both may linger and the later item
    absorbs the earlier (``replica.absorbs``: it carries a newer checkpoint
    covering every event of the earlier one); the survivor's answer resolves
    the merged one's ``out``. As the replicator's own merge, which this
    anticipates on the loop's side of the handoff: one submit, one progress
    report and one tracked future per task per drain instead of per
    checkpoint. Per-run order is kept; records the replicator must ship
    (``replicated`` tasks, results) are never merged.

    Returns:
        The survivors, in commit order.
    """
    kept: list[_Handoff | None] = []
    last: dict[_Run, int] = {}  # a run's latest handoff: its index in ``kept``
    for h in batch:
        i = last.get(h.run)
        if i is not None:
            prev = kept[i]
            if prev is not None and prev.linger and h.linger and absorbs(h.item, prev.item):
                h.absorbed.extend(prev.absorbed)
                h.absorbed.append(prev.out)
                kept[i] = None
        last[h.run] = len(kept)
        kept.append(h)
    return [h for h in kept if h is not None]


class _Host:
    """A task's effects, behind ``TaskContext`` (the SDK's ``_Host`` protocol)."""

    def __init__(self, runner: TaskRunner, run: _Run) -> None:
        self._runner = runner
        self._run = run

    @property
    def cancelled(self) -> bool:
        return self._run.cancelled.is_set() or not self._runner.ownership.may_start_at(
            time.monotonic()
        )

    @property
    def incarnation(self) -> str:
        return self._runner.incarnation

    async def wait_cancelled(self) -> None:
        await self._run.cancelled.wait()

    def _check(self) -> None:
        self._runner._ensure(self._run)

    def ensure_owner(self) -> None:
        self._runner._ensure(self._run)

    async def checkpoint(self, state: Any, reason: str) -> int:
        self._check()
        return await self._runner._checkpoint(self._run, state, reason)

    async def record(self, event: Any) -> int:
        self._check()
        return await self._runner._record(self._run, event)

    def checkpoint_sync(self, state: Any, reason: str) -> int:
        return self._runner._checkpoint_sync(self._run, state, reason)

    def record_sync(self, event: Any) -> int:
        return self._runner._record_sync(self._run, event)

    def progress(self, ratio: float, message: str) -> None:
        self._runner._progress(self._run, ratio, message)

    def shared(self, name: str, kind: str) -> SharedDocument:
        if self._runner.shared is None:
            raise RuntimeError("this agent has no shared documents")
        return self._runner.shared.handle(name, kind, check=self._check)

    async def crdt_state(self, kind: str, sync_timeout_s: float) -> SharedDocument:
        if self._runner.shared is None:
            raise RuntimeError("this agent has no shared documents")
        self._check()
        return await self._runner.shared.task_state(
            self._run.task_id, kind, self._check, sync_timeout_s
        )


class TaskRunner:
    """Runs the handlers of ``app`` for one node agent.

    Args:
        app: the handlers.
        store: the local checkpoint store (open).
        replica: direct Redis access (claim, load).
        replicator: the background shipper to Redis (started).
        reporter: where outcomes go.
        node_id, incarnation: this node.
        default_durability: for tasks whose spec does not say.
        max_payload_bytes: limit on payloads, checkpoint states, events and results.
        metrics: the agent's metrics.
        stop_grace_s: how long a stop waits for the handler before reporting it stopped.
        redis_retry_s: pause between two attempts to reach Redis while restoring.
        shared: the agent's shared documents (``ctx.shared``); None: none.
        worker_redis: where worker processes write ``replicated`` checkpoints
            themselves (``isolation="process"``); None: the agent does.
        progress_report_interval_s: the agent's ``--progress-report-interval-s``:
            how often the spool of a ``replicated`` run whose worker writes Redis
            itself is ingested (``ingest_now``).
        keep_checkpoints: the agent's ``--keep-checkpoints``: about how many
            checkpoints the local store keeps of a task running here (0 = all;
            ``node_agent.core.history``).
    """

    def __init__(
        self,
        *,
        app: Agent,
        store: CheckpointStore,
        replica: RedisCheckpointReplica,
        replicator: Replicator,
        reporter: Reporter,
        node_id: str,
        incarnation: str,
        default_durability: DurabilityName,
        max_payload_bytes: int,
        metrics: AgentMetrics,
        stop_grace_s: float = 0.3,
        redis_retry_s: float = 0.25,
        flush_timeout_s: float = 10.0,
        shared: SharedDocuments | None = None,
        default_isolation: IsolationName = "thread",
        slots: int = 8,
        worker_nice: int = DEFAULT_WORKER_NICE,
        worker_redis: WorkerRedis | None = None,
        progress_report_interval_s: float = DEFAULT_PROGRESS_REPORT_INTERVAL_S,
        keep_checkpoints: int = DEFAULT_KEEP_CHECKPOINTS,
    ) -> None:
        self.app = app
        self.keep_checkpoints = keep_checkpoints
        self.worker_redis = worker_redis
        self.progress_report_interval_s = progress_report_interval_s
        self.default_isolation: IsolationName = default_isolation
        self.slots = slots
        self.worker_nice = worker_nice
        self._workers: WorkerPool | None = None
        self._ingesting = False  # the tick's spool ingestion is running (ingest_spools)
        self._ingested_s = 0.0
        self.store = store
        self.replica = replica
        self.replicator = replicator
        self.reporter = reporter
        self.node_id = node_id
        self.incarnation = incarnation
        self.default_durability = default_durability
        self.max_payload_bytes = max_payload_bytes
        self.max_result_bytes = min(max_payload_bytes, MAX_RESULT_BYTES)
        self.metrics = metrics
        self.stop_grace_s = stop_grace_s
        self.redis_retry_s = redis_retry_s
        self.flush_timeout_s = flush_timeout_s
        self.shared = shared
        # Each task's newest run. A run leaves when its stop() completes, or when
        # the agent core forgets the task (``forget``). A run that ended by itself
        # (its result or failure handed to the reporter) is kept until then, not
        # longer: a StopTask the core issued before it took the finish (the
        # finish is then dropped) may reach stop() only after the run ended, and
        # that stop must still report the run's checkpoint and flush its records
        # (a Release, a shutdown); before the leader has the result, reship_all
        # also ships the run's terminal checkpoint again. Once the core forgot the
        # task (the leader acknowledged its terminal update, or a revoke dropped
        # it) no StopTask of it can follow, and nothing else reads the run: its
        # relay ingested its spool and released its worker before the result
        # was reported, and a result is reported again from the core's kept
        # update or the store's terminal checkpoint (``stored_result``), never
        # from the run. A finished task the core detaches instead (its update
        # refused, or lost after it finished) keeps its run, lightened of its
        # result (``_lighten``), as long as the core keeps its slot.
        self._runs: dict[str, _Run] = {}
        self._restoring = asyncio.Semaphore(RESTORE_CONCURRENCY)
        self._claims = ClaimBatcher(replica, max_batch=RESTORE_CONCURRENCY)
        self._pool = ThreadPoolExecutor(
            max_workers=max(16, 2 * slots), thread_name_prefix="lazarus-task"
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ownership = Ownership()
        # Records handler threads committed, in commit order, for the loop to
        # submit; one drain at a time keeps each task's order.
        self._handoff: deque[_Handoff] = deque()
        self._handoff_lock = threading.Lock()
        self._draining = False
        hops = metrics.checkpoint_hop_seconds
        self._hop = {h: hops.labels(hop=h) for h in ("commit", "handoff", "redis", "wake")}
        self._ignore_redis_loss = os.environ.get(UNSAFE_IGNORE_REDIS_LOSS_ENV, "") == "1"
        if self._ignore_redis_loss:
            _log.error(
                "%s=1: Redis data loss is neither re-shipped nor refused; UNSAFE "
                "(a mutation test only)",
                UNSAFE_IGNORE_REDIS_LOSS_ENV,
            )

    @property
    def ownership(self) -> Ownership:
        """The fence as of the core's newest step; the agent shell replaces it after each."""
        return self._ownership

    @ownership.setter
    def ownership(self, own: Ownership) -> None:
        self._ownership = own
        if self._workers is not None:
            self._workers.publish(own.deadline_s, own.fenced)

    def _pool_of_workers(self) -> WorkerPool:
        if self._workers is None:
            data_dir = getattr(self.store, "data_dir", None)
            spool_dir = Path(data_dir) / SPOOL_DIRNAME if data_dir is not None else None
            self._workers = WorkerPool(
                self.slots, self.worker_nice, spool_dir, self.worker_redis if spool_dir else None
            )
            self.metrics.add_checkpoint_source(self._workers.checkpoint_stats)
            self._workers.publish(self._ownership.deadline_s, self._ownership.fenced)
        return self._workers

    def prestart_workers(self) -> None:
        """Start the worker processes now when handlers run in processes (blocking)."""
        kinds = [self.app.handler(k) for k in self.app.kinds]
        if any(h is not None and self._isolation(h) == "process" for h in kinds):
            self._pool_of_workers().prestart(self.slots)

    def _isolation(self, handler: HandlerSpec) -> IsolationName:
        if handler.is_async:
            return "thread"
        return handler.isolation or self.default_isolation

    # -------------------------------------------------------------- ownership

    def _ensure(self, run: _Run, *, committing_result: bool = False) -> None:
        """Raise unless ``run`` may act now; checked in the calling thread, no hop.

        A new effect needs the run not stopped and the fence not begun; a result
        (``committing_result``) only needs the fence deadline not passed and the
        run not stopped yet: a handler that returned while its fence began, and
        before the deadline, has a result that is this owner's.

        Raises:
            OwnershipLapsed: the fence deadline passed.
            TaskCancelled: the run was stopped, revoked or lost, or is being fenced.
        """
        now = time.monotonic()
        own = self.ownership
        if not own.valid_at(now):
            raise OwnershipLapsed(
                f"task {run.task_id!r} at epoch {run.epoch}: this agent's ownership lapsed "
                "(fence deadline passed)"
            )
        if committing_result:
            if run.stopped or run.lost:
                raise TaskCancelled(f"task {run.task_id!r} at epoch {run.epoch} was stopped")
            return
        if run.cancelled.is_set() or own.fenced:
            raise TaskCancelled(f"task {run.task_id!r} at epoch {run.epoch} no longer runs here")

    @property
    def running(self) -> int:
        """Handlers running now."""
        return sum(1 for r in self._runs.values() if r.task is not None and not r.task.done())

    # ------------------------------------------------------------------ start

    def start(self, assign: agent_pb2.Assign) -> None:
        """Restore and start the task of ``assign`` in the background."""
        self._loop = asyncio.get_running_loop()
        old = self._runs.get(assign.task_id)
        if old is not None and old.task is not None and not old.task.done():
            if old.epoch == assign.epoch:
                return
            _log.warning(
                "task %s: start at epoch %d while epoch %d still runs; stopping it",
                assign.task_id,
                assign.epoch,
                old.epoch,
            )
            old.cancelled.set()
            if old.worker is not None:
                stop_run(old.worker)
            old.task.cancel()
        spec = assign.spec
        handler = self.app.handler(spec.kind)
        durability: DurabilityName = self.default_durability
        if spec.durability == records_pb2.CHECKPOINT_DURABILITY_LOCAL:
            durability = "local"
        elif spec.durability == records_pb2.CHECKPOINT_DURABILITY_REPLICATED:
            durability = "replicated"
        elif handler is not None:
            durability = handler.durability
        run = _Run(assign.task_id, assign.epoch, assign.attempt, spec.kind, durability)
        run.started_s = time.monotonic()
        self._runs[assign.task_id] = run
        run.task = asyncio.create_task(self._main(run, assign, handler), name=f"task:{run.task_id}")
        run.task.add_done_callback(functools.partial(_lighten, run))

    def forget(self, task_id: str) -> None:
        """Drop the task's ended run: the agent core forgot the task (``ForgetTask``).

        A run still running is left (its stop removes it); see ``_runs`` for why
        an ended run is kept until this call.
        """
        run = self._runs.get(task_id)
        if run is not None and (run.task is None or run.task.done()):
            del self._runs[task_id]

    async def _main(self, run: _Run, assign: agent_pb2.Assign, handler: HandlerSpec | None) -> None:
        try:
            error = self._precheck(assign, handler)
            if error is not None:
                await self._finish(run, None, error)
                return
            assert handler is not None
            payload = self._decode_payload(assign.spec)
            async with self._restoring:  # a burst of moved tasks restores a few at a time
                restored, started = await self._restore(run, assign)
            if run.cancelled.is_set():
                return
            if run.data_loss is not None:
                self.metrics.data_loss.inc()
                message = f"task {run.task_id}: {run.data_loss.describe()}"
                _log.error("data_loss task_id=%s epoch=%d %s", run.task_id, run.epoch, message)
                await self._finish(
                    run,
                    None,
                    self._error_text(
                        run, message, records_pb2.TASK_ERROR_CODE_DATA_LOSS, retryable=False
                    ),
                )
                return
            await self.reporter.started(run.task_id, run.epoch, started)
            if run.stored_result is not None:
                # The handler returned at this epoch or an earlier one and its result
                # was committed: report it again, never call the handler twice.
                _log.info(
                    "task %s: result found at checkpoint seq %d; reporting it without "
                    "calling the handler again",
                    run.task_id,
                    run.checkpoint.seq if run.checkpoint else 0,
                )
                await self._finish(run, run.stored_result, None)
                return
            ctx = TaskContext(
                task_id=run.task_id,
                kind=run.kind,
                epoch=run.epoch,
                attempt=run.attempt,
                payload=payload,
                restored=restored,
                node_id=self.node_id,
                host=_Host(self, run),
            )
            self.metrics.tasks_running.inc()
            try:
                result, error = await self._call_handler(handler, ctx, run)
            finally:
                self.metrics.tasks_running.dec()
        except OwnershipLapsed as exc:
            if await self._settle_lapse(run):
                return
            await self._finish(run, None, self._error(run, exc, retryable=True))
            return
        except (TaskCancelled, asyncio.CancelledError):
            if not run.cancelled.is_set():
                raise
            return
        except TaskFailure as exc:
            if run.cancelled.is_set():
                return
            await self._finish(run, None, self._error(run, exc, retryable=exc.retryable))
            return
        except Exception as exc:
            if run.cancelled.is_set():
                return
            await self._finish(run, None, self._error(run, exc, retryable=True))
            return
        if result is None and run.cancelled.is_set():
            return  # stopped meanwhile: a failure of a fenced run is dropped
        # A committed result is reported even when a stop began meanwhile: the
        # core takes it while the task is still this node's, and otherwise the
        # next assignment at this epoch finds it and reports it.
        await self._finish(run, result, error)

    async def _settle_lapse(self, run: _Run) -> bool:
        """After ``OwnershipLapsed``: True once the agent's own stop arrived (the usual case)."""
        try:
            await asyncio.wait_for(run.cancelled.wait(), OWNERSHIP_SETTLE_S)
        except TimeoutError:
            return run.cancelled.is_set()
        return True

    def _result_body(
        self, run: _Run, value: Any
    ) -> tuple[bytes | None, records_pb2.TaskError | None]:
        """The handler's return value as result bytes, or the error that replaces it."""
        try:
            body = encode_json(value, "result")
        except TypeError as exc:
            code = records_pb2.TASK_ERROR_CODE_RESULT_NOT_SERIALIZABLE
            return None, self._error(run, exc, retryable=False, code=code)
        if len(body) > self.max_result_bytes:
            code = records_pb2.TASK_ERROR_CODE_PAYLOAD_TOO_LARGE
            msg = (
                f"result is {len(body)} bytes, over the limit of {self.max_result_bytes} "
                "(results are stored in the task record in etcd; keep them small)"
            )
            return None, self._error_text(run, msg, code, retryable=False)
        return body, None

    @staticmethod
    def _task_result(body: bytes) -> records_pb2.TaskResult:
        import google_crc32c

        return records_pb2.TaskResult(
            payload=body, content_type=JSON, size_bytes=len(body), crc32=google_crc32c.value(body)
        )

    def _precheck(
        self, assign: agent_pb2.Assign, handler: HandlerSpec | None
    ) -> records_pb2.TaskError | None:
        spec = assign.spec
        run = self._runs[assign.task_id]
        if handler is None:
            known = ", ".join(self.app.kinds) or "none"
            return self._error_text(
                run,
                f"spec.kind: no handler for kind {spec.kind!r} on node {self.node_id} "
                f"(app {self.app.name!r} serves: {known})",
                records_pb2.TASK_ERROR_CODE_UNKNOWN_KIND,
                retryable=False,
            )
        if len(spec.payload) > self.max_payload_bytes:
            return self._error_text(
                run,
                f"spec.payload: {len(spec.payload)} bytes, over the limit of "
                f"{self.max_payload_bytes} (--max-payload-bytes)",
                records_pb2.TASK_ERROR_CODE_PAYLOAD_TOO_LARGE,
                retryable=False,
            )
        return None

    @staticmethod
    def _decode_payload(spec: records_pb2.TaskSpec) -> Any:
        if spec.content_type in ("", JSON) or spec.content_type.endswith("+json"):
            try:
                return json.loads(spec.payload) if spec.payload else None
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                if spec.content_type:
                    raise TaskFailure(f"spec.payload: not JSON: {exc}", retryable=False) from exc
        return bytes(spec.payload)

    async def _call_handler(
        self, handler: HandlerSpec, ctx: TaskContext, run: _Run
    ) -> tuple[records_pb2.TaskResult | None, records_pb2.TaskError | None]:
        """Call the handler; commit its result (a terminal checkpoint) before returning it."""
        if handler.is_async:
            value = await handler.fn(ctx)
            run.returned = True
            body, error = self._result_body(run, value)
            if body is None:
                return None, error
            await self._commit_result(run, body)
            return self._task_result(body), None
        loop = asyncio.get_running_loop()

        def call(aw: Awaitable[Any]) -> Any:
            async def wrap() -> Any:
                return await aw

            return asyncio.run_coroutine_threadsafe(wrap(), loop).result()

        def body_in_thread() -> tuple[records_pb2.TaskResult | None, records_pb2.TaskError | None]:
            value = handler.fn(SyncTaskContext(ctx, call))
            run.returned = True
            body, error = self._result_body(run, value)
            if body is None:
                return None, error
            self._checkpoint_sync(run, body, RESULT_LABEL, result=True)
            return self._task_result(body), None

        if self._isolation(handler) == "process":
            run.thread = self._pool.submit(self._relay, run, handler, ctx)
        else:
            run.thread = self._pool.submit(body_in_thread)
        return await asyncio.wrap_future(run.thread)

    def _relay(
        self, run: _Run, handler: HandlerSpec, ctx: TaskContext
    ) -> tuple[records_pb2.TaskResult | None, records_pb2.TaskError | None]:
        """Run the handler in a worker process; serve its context calls (a relay thread)."""
        pool = self._pool_of_workers()
        worker = pool.acquire()
        run.worker = worker
        if run.cancelled.is_set():
            stop_run(worker)
        fields = {
            "task_id": ctx.task_id,
            "kind": ctx.kind,
            "epoch": ctx.epoch,
            "attempt": ctx.attempt,
            "payload": ctx.payload,
            "restored": ctx.restored,
            "node_id": ctx.node_id,
            "incarnation": self.incarnation,
            "journal_seq": run.journal_seq,
            "max_payload_bytes": self.max_payload_bytes,
        }
        spooled = worker.spool is not None and (run.local or worker.replicates)
        if spooled:
            # The worker commits this run's checkpoints into its spool, numbered
            # from the task's head: only it writes the task's checkpoints now. A
            # replicated run's it also writes to Redis (node_agent.isolation).
            head = self.store.task_head(run.task_id)
            fields["spool_from_seq"] = head.last_checkpoint_seq if head is not None else 0
            fields["replicate"] = not run.local
            if run.local and worker.replicates:
                fields["direct_every_s"] = self._spool_interval_s()
        conn = worker.conn

        def died() -> WorkerDied:
            return WorkerDied(
                f"the worker process (pid {worker.pid}) running task {run.task_id!r} "
                f"died: {worker.death()}; the agent and its other tasks go on"
            )

        def send(msg: tuple[Any, ...]) -> None:
            # The worker may die between its request and our answer: a broken
            # pipe here is its death, reported as such (not as a BrokenPipeError).
            try:
                conn.send(msg)
            except (EOFError, OSError):
                raise died() from None

        try:
            send(("run", handler.fn, fields))
            while True:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    raise died() from None
                op = msg[0]
                if spooled and op in ("record", "return", "raise", "replicate"):
                    # What the worker spooled before this goes first: the store,
                    # Redis and the result see the run's checkpoints in order.
                    self._ingest_spool(worker, run)
                if op == "replicate":
                    try:
                        self._replicate_spooled(run, msg[1])
                    except Exception as exc:
                        send(("err", type(exc).__name__, str(exc)))
                    else:
                        send(("ok", msg[1]))
                elif op in ("checkpoint", "record"):
                    try:
                        if op == "checkpoint":
                            seq = self._checkpoint_sync(run, msg[1], msg[2])
                        else:
                            seq = self._record_sync(run, msg[1])
                    except Exception as exc:
                        send(("err", type(exc).__name__, str(exc)))
                    else:
                        send(("ok", seq))
                elif op == "progress":
                    if self._loop is not None:
                        self._loop.call_soon_threadsafe(self._progress, run, msg[1], msg[2])
                elif op == "return":
                    pool.release(worker)
                    run.worker = None
                    run.returned = True
                    body, error = self._result_body(run, msg[1])
                    if body is None:
                        return None, error
                    self._checkpoint_sync(run, body, RESULT_LABEL, result=True)
                    return self._task_result(body), None
                elif op == "raise":
                    pool.release(worker)
                    run.worker = None
                    _, kind, text, retryable, tb = msg
                    if kind == "OwnershipLapsed":
                        raise OwnershipLapsed(text)
                    if kind == "TaskCancelled":
                        raise TaskCancelled(text)
                    if kind == "TaskFailure":
                        raise TaskFailure(text, retryable=retryable)
                    raise _RemoteError(f"{kind}: {text}", tb)
        except BaseException:
            if run.worker is not None:
                pool.discard(worker)
                run.worker = None
            # A checkpoint the worker spooled before it died (killed at a stop,
            # OOM, a crash) returned to its handler: it is the store's now.
            if spooled:
                self._ingest_spool(worker, run)
            # Deleted only once no row is left in it: a row an ingestion failed
            # to move stays for the next agent start (ingest_leftover_spools).
            worker.release_spool()
            raise

    # ---------------------------------------------------------------- spool

    def _ingest_spool(self, worker: Worker, run: _Run | None) -> None:
        """``_ingest_spools`` of one worker (a relay, before the run's next message, or
        after its worker died); a deferred newest checkpoint no worker write
        covered is shipped now (the run may end before the tick would)."""
        self._ingest_spools([(worker, run)])
        if run is None:
            return
        with self._handoff_lock:
            pending, run.spool_pending = run.spool_pending, None
        if pending is None:
            return
        covered = in_redis(replicated_through(worker), pending[0].seq, pending[1])
        if pending_action(covered=covered, final=True, age_s=0.0, due_s=0.0) is PendingAction.SHIP:
            self._ship_spooled(run, *pending)

    def _replicate_spooled(self, run: _Run, seq: int) -> None:
        """A worker's own write of spooled checkpoint ``seq`` to Redis failed: ship it
        from here and wait for Redis (a relay; the spool was just ingested).

        Raises:
            TaskCancelled: Redis refused the run's epoch (the run is lost).
            StoreIOError: the checkpoint is not in the store yet (the ingestion
                failed; it is retried); the handler's checkpoint call fails.
        """
        self.metrics.worker_replication_fallbacks.inc()
        shipped = run.spool_ship
        if shipped is None or shipped[0] < seq:
            raise StoreIOError(
                f"task {run.task_id!r}: spooled checkpoint {seq} is not in the store yet; "
                "see the agent's log (spool: not ingested yet)"
            )
        self._wait_replicated(run, shipped[1])
        self._ensure(run)

    def _spool_interval_s(self) -> float:
        """The replicator's linger minus ``HANDOFF_HOLD_MARGIN_S``, seconds: how often the
        tick ingests spools, how often a worker writes a local run's newest
        checkpoint to Redis itself, and when a deferred one is due."""
        return max(0.0, getattr(self.replicator, "linger_s", 0.0) - HANDOFF_HOLD_MARGIN_S)

    def _ingest_spools(
        self, pairs: list[tuple[Worker, _Run | None]], *, defer: bool = False
    ) -> None:
        """Move what the workers spooled into the store; ship each run's newest to Redis.

        In a thread (a relay, the tick's ingestion, the start): one store commit
        for all of them. Rows are deleted from a spool only after the store
        committed them, so a crash in between ingests them again (dropped as
        duplicates). A row of an epoch the store has superseded is refused, and
        its run is lost and stopped, as a ``save`` of that epoch would be.
        """
        pairs = [(w, r) for w, r in pairs if w.spool is not None]
        read: list[tuple[Worker, list[SpoolRow]]] = []
        with contextlib.ExitStack() as held:
            for worker, _ in sorted(pairs, key=lambda p: id(p[0])):
                held.enter_context(worker.spool_lock)  # one order: no deadlock
            # Before the reads: every row up to these seqs is in the spools.
            through = [spooled_through(worker)[0] for worker, _ in pairs]
            try:
                for worker, _ in pairs:
                    assert worker.spool is not None
                    rows = worker.spool.read()
                    if rows:
                        read.append((worker, rows))
                if not read:
                    self._mark_ingested(pairs, through)
                    return
                outcomes = self._ingest_rows(
                    [r for _, rows in read for r in rows],
                    ", ".join(str(w.spool.path) for w, _ in read if w.spool is not None),
                )
                for worker, rows in read:
                    assert worker.spool is not None
                    worker.spool.delete_through(rows[-1].id)
            except (CheckpointStoreError, sqlite3.Error) as exc:
                _log.warning("spool: not ingested yet (%s); will retry", exc)
                return
            self._mark_ingested(pairs, through)
            # Still under the locks: a relay that asks for a run's newest ship
            # (``_replicate_spooled``) sees it once its rows left the spool.
            for worker, run in pairs:
                if run is not None:
                    self._ship_ingested(
                        run,
                        outcomes,
                        replicated_through(worker),
                        defer=defer and run.local and worker.replicates,
                    )

    @staticmethod
    def _mark_ingested(pairs: list[tuple[Worker, _Run | None]], through: list[int]) -> None:
        now = time.monotonic()
        for (_, run), seq in zip(pairs, through, strict=True):
            if run is not None:
                run.spool_ingested = max(run.spool_ingested, seq)
                run.spool_ingested_s = now

    def _ship_ingested(
        self,
        run: _Run,
        outcomes: list[tuple[SpoolRow, SaveOutcome | CheckpointStoreError | None]],
        replicated: int = 0,
        *,
        defer: bool = False,
    ) -> None:
        """Hand ``run``'s newest ingested checkpoint to Redis and the core.

        When the run's worker wrote it to Redis itself (its seq is at most
        ``replicated``, ``replicated_through`` read after the rows), only the
        core hears of it, as replicated. Otherwise a ``replicated`` run's is
        shipped now, and a ``local`` run's as a lingering record; with
        ``defer`` (the tick, while the worker writes a local run's newest
        checkpoint to Redis itself every ``direct_every_s``) it is kept as the
        run's ``spool_pending`` instead, shipped by ``_ship_pending`` only if no
        worker write covered it by the time it would have lingered out.
        """
        newest: tuple[SpoolRow, SaveOutcome] | None = None
        for row, out in outcomes:
            if row.task_id != run.task_id or row.epoch != run.epoch:
                continue
            if isinstance(out, SaveOutcome):
                newest = (row, out)
            elif isinstance(out, StaleEpoch):
                self._call_soon(self._lose(run, out.current_epoch))
        if newest is None:
            return
        row, saved = newest
        summary, record = self._saved(
            run, saved.seq, saved.ref, saved.covers_journal_seq, row.payload, row.label, False
        )
        run.checkpoint = summary
        covered = in_redis(replicated, row.seq, saved.seq)
        if covered:  # its worker wrote it to Redis, and its spool row is gone
            run.replicated_seq = max(run.replicated_seq, saved.seq)
        self._bound_history(run, saved.seq)
        if covered or defer:
            with self._handoff_lock:
                run.spool_pending = None if covered else (row, saved.seq, summary, record)
            self._report_soon(run, summary, replicated=saved.seq if covered else None)
            return
        with self._handoff_lock:
            run.spool_pending = None
        self._ship_spooled(run, row, saved.seq, summary, record)

    def _ship_spooled(
        self,
        run: _Run,
        row: SpoolRow,
        seq: int,
        summary: records_pb2.CheckpointSummary,
        record: records_pb2.CheckpointRecord,
    ) -> None:
        age_s = max(0.0, (_wall_ms() - row.created_at_ms) / 1000)
        item = ReplicationItem(run.task_id, run.epoch, self.node_id, checkpoint=record)
        fut = self._ship(
            run,
            item,
            seq,
            0,
            summary=summary,
            t_sent=time.monotonic() - age_s,
            linger=run.lingers(terminal=False),
        )
        run.spool_ship = (row.seq, fut)

    def _report_soon(
        self, run: _Run, summary: records_pb2.CheckpointSummary, *, replicated: int | None
    ) -> None:
        """Tell the core of a spooled checkpoint (from a thread; ``progress`` runs on the loop)."""
        if self._loop is None:
            return
        fields: dict[str, Any] = {
            "checkpoint": summary,
            "journal_seq": run.journal_seq,
            "local": run.local,
        }
        if replicated is not None:
            fields["replicated_checkpoint_seq"] = replicated
        self._loop.call_soon_threadsafe(
            functools.partial(self.reporter.progress, run.task_id, run.epoch, **fields)
        )

    def _ship_pending(self) -> None:
        """Ship each run's deferred newest checkpoint (``spool_pending``) that no worker
        write covered by the time it would have lingered out (on the loop, each tick)."""
        due_s = self._spool_interval_s()
        now_ms = _wall_ms()
        ship = []
        with self._handoff_lock:
            for run in self._runs.values():
                pending = run.spool_pending
                if pending is None:
                    continue
                row, worker = pending[0], run.worker
                action = pending_action(
                    covered=worker is not None
                    and in_redis(replicated_through(worker), row.seq, pending[1]),
                    final=worker is None,
                    age_s=(now_ms - row.created_at_ms) / 1000,
                    due_s=due_s,
                )
                if action is not PendingAction.KEEP:
                    run.spool_pending = None
                if action is PendingAction.SHIP:
                    ship.append((run, pending))
        for run, (row, seq, summary, record) in ship:
            self._ship_spooled(run, row, seq, summary, record)

    def _ingest_rows(
        self, rows: list[SpoolRow], path: Path | str
    ) -> list[tuple[SpoolRow, SaveOutcome | CheckpointStoreError | None]]:
        """Commit spool rows to the store (one transaction); log what it refused."""
        intact = [r for r in rows if r.intact]
        if len(intact) < len(rows):
            self.metrics.spooled_checkpoints.labels(outcome="corrupt").inc(len(rows) - len(intact))
            _log.error(
                "spool %s: %d checkpoint row(s) failed their checksum; dropped",
                path,
                len(rows) - len(intact),
            )
        items = [
            (
                Checkpoint(r.task_id, r.epoch, r.payload, r.covers_journal_seq, label=r.label),
                r.seq,
                r.created_at_ms,
            )
            for r in intact
        ]
        outcomes = self.store.ingest(items)
        for row, out in zip(intact, outcomes, strict=True):
            if isinstance(out, SaveOutcome):
                self.metrics.spooled_checkpoints.labels(outcome="ingested").inc()
                self.metrics.checkpoint_bytes.observe(len(row.payload))
                if out.seq != row.seq:
                    _log.warning(
                        "task %s: spooled checkpoint %d stored as %d (the task's head moved)",
                        row.task_id,
                        row.seq,
                        out.seq,
                    )
            elif out is None:
                self.metrics.spooled_checkpoints.labels(outcome="duplicate").inc()
            else:
                self.metrics.spooled_checkpoints.labels(outcome="refused").inc()
                _log.warning(
                    "task %s: spooled checkpoint %d at epoch %d refused: %s",
                    row.task_id,
                    row.seq,
                    row.epoch,
                    out,
                )
        return list(zip(intact, outcomes, strict=True))

    def ingest_leftover_spools(self) -> int:
        """Ingest the spools an earlier agent process left behind, then delete them.

        Call once at start (a thread), before anything reads the store: a
        checkpoint its workers acknowledged is not lost with it.

        Returns:
            The spool files ingested.
        """
        data_dir = getattr(self.store, "data_dir", None)
        if data_dir is None:
            return 0
        count = 0
        for path in leftover_spools(Path(data_dir) / SPOOL_DIRNAME):
            reader = SpoolReader(path)
            try:
                rows = reader.read()
                if rows:
                    self._ingest_rows(rows, path)
                    _log.info("spool %s: ingested %d checkpoint row(s)", path, len(rows))
            except (CheckpointStoreError, sqlite3.Error) as exc:
                reader.close()
                _log.error("spool %s: left in place, could not ingest it: %s", path, exc)
                continue
            reader.remove()
            count += 1
        return count

    def ingest_spools(self) -> None:
        """Ingest the running workers' spools, at most every ``linger_s - margin``
        (on the loop; the agent's tick calls it, the work runs in a thread).

        Only the runs ``ingest_now`` picks: the new rows of a worker that does not
        write Redis itself, at once; a run whose worker does, when its newest
        row is not in Redis and due, else every ``LAZY_INGEST_INTERVAL_S`` (2 s)
        for a ``local`` run and every ``progress_report_interval_s`` (the
        progress report interval) for a ``replicated`` one.
        """
        if self._workers is None:
            return
        self._ship_pending()
        if self._ingesting:
            return
        now = time.monotonic()
        if now < self._ingested_s + self._spool_interval_s():
            return
        now_ms = _wall_ms()
        due_s = self._spool_interval_s()
        pairs: list[tuple[Worker, _Run | None]] = []
        for run in self._runs.values():
            worker = run.worker
            if worker is None or worker.spool is None:
                continue
            spooled, spooled_ms = spooled_through(worker)
            if ingest_now(
                local=run.local,
                worker_writes_redis=worker.replicates,
                spooled=spooled,
                ingested=run.spool_ingested,
                replicated=replicated_through(worker),
                newest_age_s=(now_ms - spooled_ms) / 1000,
                due_s=due_s,
                since_s=now - run.spool_ingested_s,
                report_every_s=self.progress_report_interval_s,
            ):
                pairs.append((worker, run))
        if not pairs:
            return
        self._ingesting = True
        self._ingested_s = now

        def ingest() -> None:
            try:
                self._ingest_spools(pairs, defer=True)
            finally:
                self._ingesting = False

        asyncio.get_running_loop().run_in_executor(None, ingest).add_done_callback(_retrieve)

    # ---------------------------------------------------------------- restore

    async def _restore(
        self, run: _Run, assign: agent_pb2.Assign
    ) -> tuple[Restored | None, agent_pb2.TaskUpdate.Started]:
        t0 = time.monotonic()
        task_id, epoch = run.task_id, run.epoch
        local = await self.store.aio.recover(task_id)
        local_ckpt = local.checkpoint
        local_j = (
            local.events[-1].seq
            if local.events
            else (local_ckpt.covers_journal_seq if local_ckpt else 0)
        )
        reattach = assign.reason == agent_pb2.ASSIGN_REASON_REATTACH
        remote: RemoteState | None = None
        attempts = 0
        while not run.cancelled.is_set():
            attempts += 1
            try:
                claim, remote = await self._claims.claim_load(task_id, epoch, self.node_id)
                if claim.outcome is Outcome.STALE:
                    run.lost = True
                    run.cancelled.set()
                    await self.reporter.lost(task_id, epoch, claim.current_epoch)
                    raise TaskCancelled(
                        f"task {task_id!r}: Redis is at epoch {claim.current_epoch}"
                    )
                break
            except (TaskCancelled, asyncio.CancelledError):
                raise
            except Exception as exc:
                has_local = local_ckpt is not None or bool(local.events)
                if resume_without_redis(reattach=reattach, has_local=has_local):
                    _log.warning(
                        "task %s: Redis unreachable (%s); resuming from local state it owns",
                        task_id,
                        exc,
                    )
                    break
                if attempts == 1 or attempts % 40 == 0:
                    _log.warning(
                        "task %s: waiting for Redis to read its replicated state: %s",
                        task_id,
                        exc,
                    )
                await asyncio.sleep(self.redis_retry_s)
        plan = plan_restore(
            LocalHead(
                checkpoint_seq=local_ckpt.seq if local_ckpt else 0,
                journal_seq=local_j,
                has_state=local_ckpt is not None or bool(local.events),
                epoch=max(
                    [local_ckpt.epoch if local_ckpt else 0, *(ev.epoch for ev in local.events)]
                ),
            ),
            RemoteHead(
                checkpoint_seq=remote.ckpt_seq,
                covers_journal_seq=remote.covers_journal_seq,
                journal_seq=remote.journal_seq,
                event_seqs=tuple(ev.seq for ev in remote.events),
                epoch=max([remote.ckpt_epoch, *(ev.epoch for ev in remote.events)]),
            )
            if remote is not None
            else None,
        )
        source: Literal["local", "redis"] = "redis" if plan.source is Source.REDIS else "local"
        if remote is not None and plan.source is Source.REDIS:
            events = [
                AdoptedEvent(ev.seq, ev.epoch, ev.payload)
                for ev in remote.events[: plan.adopt_events]
            ]
            ck = remote.checkpoint
            adopted = (
                AdoptedCheckpoint(
                    ck.seq, ck.epoch, ck.covers_journal_seq, ck.payload, ck.terminal, ck.label
                )
                if ck is not None
                else None
            )
            # With the claims' bases the adopt also moves this node's rows below
            # the adopted seqs that the adopted lineage does not descend from.
            out = await self.store.aio.adopt(
                task_id, epoch=epoch, checkpoint=adopted, events=events, bases=remote.bases
            )
            if out.lineage_task_id:
                _log.warning(
                    "task %s: kept %d checkpoints and %d events of a divergent local lineage as %s",
                    task_id,
                    out.divergent_checkpoints,
                    out.divergent_events,
                    out.lineage_task_id,
                )
                # Nothing else reports these rows (they may be their only copy):
                # the agent reports them as a fork, then forgets the copy.
                await self.reporter.lineage_kept(task_id, out.lineage_task_id)
            local = await self.store.aio.recover(task_id)
            local_ckpt = local.checkpoint
        elif plan.catch_up:
            # Local is newer than (or equal to) Redis: ship what Redis lacks.
            await self._catch_up(run, local_ckpt, local.events, remote)
        run.journal_seq = (
            local.events[-1].seq
            if local.events
            else (local_ckpt.covers_journal_seq if local_ckpt else 0)
        )
        restored: Restored | None = None
        started = agent_pb2.TaskUpdate.Started(
            location=records_pb2.CHECKPOINT_LOCATION_REDIS
            if source == "redis"
            else records_pb2.CHECKPOINT_LOCATION_LOCAL,
            replayed_journal_events=len(local.events),
        )
        if local_ckpt is not None or local.events:
            state = json.loads(local_ckpt.payload) if local_ckpt is not None else None
            restored = Restored(
                state=state,
                checkpoint_seq=local_ckpt.seq if local_ckpt else 0,
                covers_journal_seq=local_ckpt.covers_journal_seq if local_ckpt else 0,
                events=[json.loads(e.payload) for e in local.events],
                journal_seq=run.journal_seq,
                source=source,
            )
            if local_ckpt is not None:
                summary = self._summary(run, local_ckpt)
                summary.replicated = remote is not None
                run.checkpoint = summary
                started.resumed_from.CopyFrom(summary)
                if local_ckpt.info.terminal and local_ckpt.info.label == RESULT_LABEL:
                    run.stored_result = self._task_result(local_ckpt.payload)
        points = [e.created_at_ms for e in local.events[-1:]]
        if local_ckpt is not None:
            points.append(local_ckpt.info.created_at_ms)
        started.resume_point_unix_ms = max(points, default=0)
        started.restore_ms = int((time.monotonic() - t0) * 1000)
        resume = assign.resume_from
        run.data_loss = judge_resume(
            acknowledged_checkpoint_seq=resume.checkpoint.seq
            if resume.HasField("checkpoint")
            else 0,
            acknowledged_journal_seq=resume.replay_through_journal_seq,
            restored_checkpoint_seq=local_ckpt.seq if local_ckpt is not None else 0,
            restored_journal_seq=run.journal_seq,
        )
        if self._ignore_redis_loss:
            run.data_loss = None
        run.restored = True
        return restored, started

    # ------------------------------------------------------------ redis loss

    def reship_all(self) -> int:
        """Re-ship every restored, live task's local state (Redis lost its data).

        Returns:
            How many tasks were queued for a re-ship.
        """
        runs = [r for r in self._runs.values() if r.restored and not r.cancelled.is_set()]
        for run in runs:
            self._reship_soon(run)
        return len(runs)

    def _reship_soon(self, run: _Run) -> None:
        if run.reshipping or run.cancelled.is_set() or not run.restored:
            return
        if self._ignore_redis_loss:
            return
        run.reshipping = True
        asyncio.ensure_future(self._reship(run)).add_done_callback(_log_failure)

    async def _reship(self, run: _Run) -> None:
        """Ship the newest local checkpoint and the journal after it again (see core/redisloss.py).

        Redis skips what it still holds (writes are idempotent per epoch and
        seq), so this only restores what it lost: the task's replicated state
        is whole again once the item is acknowledged.
        """
        try:
            local = await self.store.aio.recover(run.task_id)
            if run.cancelled.is_set() or (local.checkpoint is None and not local.events):
                return
            shipped = await self._catch_up(run, local.checkpoint, list(local.events), None)
            if shipped is None:
                return
            result = await shipped
            if result.outcome is Outcome.STALE:
                return  # fenced meanwhile: the new owner's state is what counts
            self.metrics.reshipped_tasks.inc()
            _log.warning(
                "task %s: re-shipped checkpoint seq %d and %d journal events to Redis "
                "from the local store, acknowledged (Redis had lost them)",
                run.task_id,
                local.checkpoint.seq if local.checkpoint is not None else 0,
                len(local.events),
            )
        finally:
            run.reshipping = False

    async def _catch_up(
        self,
        run: _Run,
        ckpt: StoredCheckpoint | None,
        events: list[Any],
        remote: RemoteState | None,
    ) -> asyncio.Future[ReplicationResult] | None:
        """Ship what Redis lacks of the local state; the item's future, or None if nothing."""
        remote_seq = remote.ckpt_seq if remote is not None else 0
        remote_j = remote.journal_seq if remote is not None else 0
        send_ckpt = ckpt is not None and ckpt.seq > remote_seq
        send_events = tuple(
            self._event_record(run, e.seq, e.epoch, e.payload, e.created_at_ms)
            for e in events
            if e.seq > remote_j
        )
        if not send_ckpt and not send_events:
            return None
        item = ReplicationItem(
            run.task_id,
            run.epoch,
            self.node_id,
            events=send_events,
            checkpoint=self._checkpoint_record(run, ckpt) if send_ckpt and ckpt else None,
        )
        future = await self.replicator.submit(item)
        self._track(run, future, ckpt.seq if send_ckpt and ckpt else 0)
        return future

    # ---------------------------------------------------------------- effects

    async def _checkpoint(self, run: _Run, state: Any, reason: str) -> int:
        t0 = time.monotonic()
        payload = encode_json(state, "checkpoint state")
        if len(payload) > self.max_payload_bytes:
            raise ValueError(
                f"checkpoint state is {len(payload)} bytes, over the limit of "
                f"{self.max_payload_bytes}"
            )
        seq = await self._save_async(run, payload, reason, terminal=False)
        self.metrics.checkpoint_seconds.labels(durability=run.durability).observe(
            time.monotonic() - t0
        )
        self.metrics.checkpoint_bytes.observe(len(payload))
        return seq

    async def _commit_result(self, run: _Run, body: bytes) -> int:
        """Commit the handler's result as its terminal checkpoint (async handlers)."""
        self._ensure(run, committing_result=True)
        return await self._save_async(run, body, RESULT_LABEL, terminal=True)

    async def _save_async(self, run: _Run, payload: bytes, reason: str, *, terminal: bool) -> int:
        try:
            outcome = await self.store.aio.save(
                Checkpoint(
                    run.task_id,
                    run.epoch,
                    payload,
                    covers_journal_seq=run.journal_seq,
                    terminal=terminal,
                    label=reason,
                )
            )
        except StaleEpoch as exc:
            await self._lose(run, exc.current_epoch)
            raise TaskCancelled(str(exc)) from exc
        summary, record = self._saved(
            run, outcome.seq, outcome.ref, outcome.covers_journal_seq, payload, reason, terminal
        )
        run.checkpoint = summary
        fut = await self.replicator.submit(
            ReplicationItem(run.task_id, run.epoch, self.node_id, checkpoint=record),
            linger=run.lingers(terminal=terminal),
        )
        self._track(run, fut, outcome.seq)
        if not terminal:
            self._bound_history(run, outcome.seq)
        self.reporter.progress(
            run.task_id,
            run.epoch,
            checkpoint=summary,
            journal_seq=run.journal_seq,
            local=run.local,
        )
        # Acknowledged after the fence deadline: not a success of this owner.
        self._ensure(run, committing_result=terminal)
        if run.durability == "replicated":
            await self._await_replicated(run, fut)
            self._ensure(run, committing_result=terminal)
        return outcome.seq

    def _saved(
        self,
        run: _Run,
        seq: int,
        ref: str,
        covers: int,
        payload: bytes,
        reason: str,
        terminal: bool,
    ) -> tuple[records_pb2.CheckpointSummary, records_pb2.CheckpointRecord]:
        created = _wall_ms()
        summary = records_pb2.CheckpointSummary(
            checkpoint_ref=ref,
            task_id=run.task_id,
            epoch=run.epoch,
            seq=seq,
            covers_journal_seq=covers,
            terminal=terminal,
            label=reason[:128],
            created_at_unix_ms=created,
            stored_bytes=len(payload),
            node_id=self.node_id,
        )
        record = checkpoint_record(
            run.task_id,
            run.epoch,
            seq,
            covers,
            payload,
            label=reason,
            terminal=terminal,
            created_ms=created,
            node_id=self.node_id,
            incarnation=self.incarnation,
        )
        return summary, record

    # ------------------------------------------- the short path (sync handlers)

    def _checkpoint_sync(self, run: _Run, state: Any, reason: str, *, result: bool = False) -> int:
        """``ctx.checkpoint`` of a sync handler, in its own thread: the fewest hops.

        Hops: (1) this thread commits to the store (inline when its writer is
        idle, else in the writer's next group commit); (2) the record is handed
        to the event loop, which ships it to Redis and updates the core; with
        ``durability="replicated"`` (3) Redis acks and (4) this thread wakes.
        Ownership is checked here before the commit and after each ack.
        With ``result``, ``state`` is the result's encoded JSON and the
        checkpoint is terminal.
        """
        t0 = time.monotonic()
        self._ensure(run, committing_result=result)
        if result:
            payload = state
        else:
            payload = encode_json(state, "checkpoint state")
            if len(payload) > self.max_payload_bytes:
                raise ValueError(
                    f"checkpoint state is {len(payload)} bytes, over the limit of "
                    f"{self.max_payload_bytes}"
                )
        try:
            outcome = self.store.save(
                Checkpoint(
                    run.task_id,
                    run.epoch,
                    payload,
                    covers_journal_seq=run.journal_seq,
                    terminal=result,
                    label=reason,
                )
            )
        except StaleEpoch as exc:
            self._call_soon(self._lose(run, exc.current_epoch))
            raise TaskCancelled(str(exc)) from exc
        t1 = time.monotonic()
        self._hop["commit"].observe(t1 - t0)
        summary, record = self._saved(
            run, outcome.seq, outcome.ref, outcome.covers_journal_seq, payload, reason, result
        )
        run.checkpoint = summary
        item = ReplicationItem(run.task_id, run.epoch, self.node_id, checkpoint=record)
        fut = self._ship(
            run,
            item,
            outcome.seq,
            0,
            summary=summary,
            t_sent=t1,
            linger=run.lingers(terminal=result),
        )
        if not result:
            self._bound_history(run, outcome.seq)
        self._ensure(run, committing_result=result)
        if run.durability == "replicated":
            self._wait_replicated(run, fut, committing_result=result)
            self._ensure(run, committing_result=result)
        self.metrics.checkpoint_seconds.labels(durability=run.durability).observe(
            time.monotonic() - t0
        )
        self.metrics.checkpoint_bytes.observe(len(payload))
        return outcome.seq

    def _record_sync(self, run: _Run, event: Any) -> int:
        """``ctx.record`` of a sync handler, by the short path of ``_checkpoint_sync``."""
        self._ensure(run)
        payload = encode_json(event, "journal event")
        if len(payload) > self.max_payload_bytes:
            raise ValueError(
                f"journal event is {len(payload)} bytes, over the limit of {self.max_payload_bytes}"
            )
        try:
            seq = self.store.append(run.task_id, payload, epoch=run.epoch)
        except StaleEpoch as exc:
            self._call_soon(self._lose(run, 0))
            raise TaskCancelled(str(exc)) from exc
        run.journal_seq = seq
        record = self._event_record(run, seq, run.epoch, payload, _wall_ms())
        item = ReplicationItem(run.task_id, run.epoch, self.node_id, events=(record,))
        fut = self._ship(
            run,
            item,
            0,
            seq,
            summary=None,
            t_sent=time.monotonic(),
            linger=run.lingers(terminal=False),
        )
        self._ensure(run)
        if run.durability == "replicated":
            self._wait_replicated(run, fut)
            self._ensure(run)
        return seq

    # ---------------------------------------------------------------- history

    def _bound_history(self, run: _Run, seq: int) -> None:
        """After the commit of checkpoint ``seq`` (on the loop or a thread): start a prune
        of the task's local history once it is due (``core/history.py``). Cheap when
        it is not; the prune itself never holds up the commit that started it."""
        if run.pruning or not prune_due(
            newest_seq=seq, base_seq=run.history_base, keep_checkpoints=self.keep_checkpoints
        ):
            return
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:  # a handler or ingestion thread
            on_loop = False
        if on_loop:
            self._start_prune(run, seq)
        else:
            loop.call_soon_threadsafe(self._start_prune, run, seq)

    def _may_prune(self, run: _Run) -> bool:
        """The run is its task's current one and still acting (on the loop)."""
        return (
            self._runs.get(run.task_id) is run
            and not run.cancelled.is_set()
            and not (run.lost or run.stopped or run.returned)
        )

    def _start_prune(self, run: _Run, seq: int) -> None:
        if run.pruning or not self._may_prune(run):
            return
        run.pruning = True
        asyncio.ensure_future(self._prune_history(run, seq)).add_done_callback(_log_failure)

    async def _prune_history(self, run: _Run, seq: int) -> None:
        """Thin the task's local history to about ``keep_checkpoints`` checkpoints.

        Off the handlers' path and the loop: a read of the checkpoints' metadata
        and the plan in a thread, then one prune on the store's writer thread.
        The rule (``plan_prune``) keeps the newest, every terminal checkpoint
        and every one Redis may lack, and compacts the journal only up to what
        every kept checkpoint covers. Ownership is checked again in the loop
        step that queues the prune, so a newer run of the task (whose restore
        may adopt another lineage, ``CheckpointStore.adopt``) queues its writes
        after it, never before.
        """
        keep = self.keep_checkpoints
        newest, held = seq, keep
        replicated = run.replicated_seq

        def look() -> tuple[int, int, PrunePlan | None]:
            # in a thread: 11,000 rows take ~0.1 s to list and ~20 ms to plan here
            infos = self.store.list(run.task_id)
            entries = [HistoryEntry(i.seq, i.covers_journal_seq, i.terminal) for i in infos]
            plan = plan_prune(entries, keep_checkpoints=keep, replicated_seq=replicated)
            return max((e.seq for e in entries), default=seq), len(entries), plan

        try:
            newest, held, plan = await asyncio.get_running_loop().run_in_executor(None, look)
            if plan is None:
                _log.debug(
                    "task %s: %d local checkpoints, none may go yet (newest in Redis: seq %d)",
                    run.task_id,
                    held,
                    replicated,
                )
                return
            if not self._may_prune(run):  # in the loop step that queues the prune
                return
            report = await self.store.aio.prune(
                run.task_id,
                PrunePolicy(
                    prune_covered_before=plan.covered_before,
                    preserve_latest_terminal=True,
                    compact_journal=plan.compact_journal,
                    prune_seq_before=plan.seq_before,
                ),
            )
            held -= report.pruned_count
            self.metrics.checkpoints_pruned.inc(report.pruned_count)
            _log.debug(
                "task %s: pruned %d local checkpoints before seq %d and %d journal events "
                "(--keep-checkpoints %d; %d kept)",
                run.task_id,
                report.pruned_count,
                plan.seq_before,
                report.compacted_events,
                keep,
                report.retained_count,
            )
        except Exception as exc:  # the next due commit tries again
            if not self.store.closed:
                _log.warning(
                    "task %s: pruning its local checkpoint history failed: %s", run.task_id, exc
                )
        finally:
            run.history_base = history_base(newest_seq=newest, held=held, keep_checkpoints=keep)
            run.pruning = False

    def _call_soon(self, coro: Any) -> None:
        if self._loop is None:
            coro.close()
            return
        asyncio.run_coroutine_threadsafe(coro, self._loop).add_done_callback(_log_cfailure)

    def _ship(
        self,
        run: _Run,
        item: ReplicationItem,
        ckpt_seq: int,
        journal_seq: int,
        *,
        summary: records_pb2.CheckpointSummary | None,
        t_sent: float,
        linger: bool,
    ) -> concurrent.futures.Future[tuple[ReplicationResult, float]]:
        """Hand a committed record to the event loop (from a handler thread).

        A record that may not ``linger`` (``_Run.lingers``) wakes the loop now:
        every record of a ``replicated`` task (its handler waits for Redis) and a
        task's result. Any other record of a ``local`` task only joins the queue
        the loop's tick drains once its oldest record has nearly lingered out
        (``drain_handoff``), where a task's checkpoints coalesce: no thread
        wake-up, no work on the loop and no round trip of its own per
        checkpoint.

        Returns:
            A future of (Redis's answer, monotonic time the loop saw it).
        """
        out: concurrent.futures.Future[tuple[ReplicationResult, float]] = (
            concurrent.futures.Future()
        )
        run.shipping.add(out)
        out.add_done_callback(run.shipping.discard)
        handoff = _Handoff(run, item, ckpt_seq, journal_seq, summary, t_sent, out, linger)
        with self._handoff_lock:
            self._handoff.append(handoff)
            wake = not linger and not self._draining
            if wake:
                self._draining = True
        if wake:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._start_drain)
        return out

    def drain_handoff(self, *, hold: bool = False) -> None:
        """Submit what handler threads committed (on the loop; the agent's tick calls it).

        With ``hold`` (the tick), records that may linger stay queued until the
        oldest of them is nearly as old as the replicator's linger
        (``HANDOFF_HOLD_MARGIN_S`` sooner): each task's checkpoints committed
        meanwhile then coalesce here (``coalesce_handoffs``) before any work
        on the loop, and reach Redis no later than they would have. Without it
        (a stop) everything queued goes now.
        """
        with self._handoff_lock:
            if not self._handoff or self._draining:
                return
            if hold:
                hold_s = getattr(self.replicator, "linger_s", 0.0) - HANDOFF_HOLD_MARGIN_S
                if hold_s > 0 and time.monotonic() - self._handoff[0].t_sent < hold_s:
                    return
            self._draining = True
        self._start_drain()

    def _start_drain(self) -> None:
        asyncio.ensure_future(self._drain()).add_done_callback(_log_failure)

    async def _drain(self) -> None:
        while True:
            with self._handoff_lock:
                if not self._handoff:
                    self._draining = False
                    return
                batch = list(self._handoff)
                self._handoff.clear()
            survivors = deque(coalesce_handoffs(batch))
            try:
                while survivors:
                    await self._submit_handoff(survivors[0])
                    survivors.popleft()
            except BaseException:
                with self._handoff_lock:
                    self._handoff.extendleft(reversed(survivors))
                    self._draining = False
                if self._handoff and self._loop is not None:
                    self._loop.call_soon(self.drain_handoff)
                raise

    async def _submit_handoff(self, h: _Handoff) -> None:
        run = h.run
        t_loop = time.monotonic()
        self._hop["handoff"].observe(t_loop - h.t_sent)
        outs = [*h.absorbed, h.out]
        try:
            fut = await self.replicator.submit(
                h.item, linger=h.linger, age_s=max(0.0, t_loop - h.t_sent)
            )
        except Exception as exc:
            for out in outs:
                out.set_exception(exc)
            return
        self._track(run, fut, h.ckpt_seq, journal_seq=h.journal_seq)
        hop_redis = self._hop["redis"]

        def done(f: asyncio.Future[ReplicationResult]) -> None:
            if f.cancelled():
                for out in outs:
                    out.cancel()
                return
            exc = f.exception()
            if exc is not None:
                for out in outs:
                    out.set_exception(exc)
                return
            t_ack = time.monotonic()
            hop_redis.observe(t_ack - t_loop)
            for out in outs:
                out.set_result((f.result(), t_ack))

        fut.add_done_callback(done)
        if h.summary is not None:
            self.reporter.progress(
                run.task_id,
                run.epoch,
                checkpoint=h.summary,
                journal_seq=run.journal_seq,
                local=run.local,
            )
        elif h.journal_seq:
            self.reporter.progress(run.task_id, run.epoch, journal_seq=h.journal_seq)

    def _wait_replicated(
        self,
        run: _Run,
        fut: concurrent.futures.Future[tuple[ReplicationResult, float]],
        *,
        committing_result: bool = False,
    ) -> None:
        """Block this (handler) thread until Redis acked; raise when it refused our epoch.

        The wait is checked every ``REPLICATION_WAIT_CHECK_S``: it ends when the run
        may no longer act (``_ensure``: stopped, fenced, ownership lapsed) or the
        agent's event loop is closed, so a handler thread never outlives its run
        waiting for an ack that will not come (Redis down, the agent stopping),
        which would also hold the interpreter's exit (it joins handler threads).

        Raises:
            TaskCancelled: Redis refused the epoch, the run was stopped or is
                being fenced, or the agent stopped.
            OwnershipLapsed: the fence deadline passed while waiting.
        """
        while True:
            try:
                result, t_ack = fut.result(timeout=REPLICATION_WAIT_CHECK_S)
                break
            except TimeoutError:
                if self._loop is None or self._loop.is_closed():
                    raise TaskCancelled(
                        f"task {run.task_id!r}: the agent stopped before Redis acknowledged"
                    ) from None
                self._ensure(run, committing_result=committing_result)
        self._hop["wake"].observe(time.monotonic() - t_ack)
        if result.outcome is Outcome.STALE:
            raise TaskCancelled(
                f"task {run.task_id!r}: Redis refused epoch {run.epoch} "
                f"(now at {result.current_epoch})"
            )

    async def _record(self, run: _Run, event: Any) -> int:
        payload = encode_json(event, "journal event")
        if len(payload) > self.max_payload_bytes:
            raise ValueError(
                f"journal event is {len(payload)} bytes, over the limit of {self.max_payload_bytes}"
            )
        try:
            seq = await self.store.aio.append(run.task_id, payload, epoch=run.epoch)
        except StaleEpoch as exc:
            await self._lose(run, 0)
            raise TaskCancelled(str(exc)) from exc
        run.journal_seq = seq
        fut = await self.replicator.submit(
            ReplicationItem(
                run.task_id,
                run.epoch,
                self.node_id,
                events=(self._event_record(run, seq, run.epoch, payload, _wall_ms()),),
            ),
            linger=run.local,
        )
        self._track(run, fut, 0, journal_seq=seq)
        self._ensure(run)
        if run.durability == "replicated":
            await self._await_replicated(run, fut)
            self._ensure(run)
        return seq

    def _progress(self, run: _Run, ratio: float, message: str) -> None:
        loop = self._loop
        if loop is None:
            return
        report = functools.partial(
            self.reporter.progress, run.task_id, run.epoch, ratio=ratio, message=message
        )
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:  # a handler thread
            on_loop = False
        if on_loop:
            report()
        else:
            loop.call_soon_threadsafe(report)

    async def _await_replicated(self, run: _Run, fut: asyncio.Future[ReplicationResult]) -> None:
        result = await asyncio.shield(fut)
        if result.outcome is Outcome.STALE:
            raise TaskCancelled(
                f"task {run.task_id!r}: Redis refused epoch {run.epoch} "
                f"(now at {result.current_epoch})"
            )

    def _track(
        self,
        run: _Run,
        fut: asyncio.Future[ReplicationResult],
        ckpt_seq: int,
        *,
        journal_seq: int = 0,
    ) -> None:
        run.pending.add(fut)

        def done(f: asyncio.Future[ReplicationResult]) -> None:
            run.pending.discard(f)
            if f.cancelled():
                return
            exc = f.exception()
            if exc is not None:
                self.metrics.replication_errors.inc()
                _log.warning("task %s: replication failed: %s", run.task_id, exc)
                return
            result = f.result()
            if result.outcome is Outcome.STALE:
                asyncio.ensure_future(self._lose(run, result.current_epoch)).add_done_callback(
                    _log_failure
                )
                return
            if result.gap and not run.reshipping:
                # Redis's journal of this task has a hole before this write: it lost
                # records it had acknowledged. Ship the local state again.
                self.metrics.redis_resets.labels(signal="gap").inc()
                _log.warning(
                    "task %s: Redis lost part of its replicated journal; re-shipping",
                    run.task_id,
                )
                self._reship_soon(run)
            fields: dict[str, Any] = {}
            if ckpt_seq:
                run.replicated_seq = max(run.replicated_seq, ckpt_seq)
                fields["replicated_checkpoint_seq"] = ckpt_seq
            if journal_seq:
                fields["replicated_journal_seq"] = journal_seq
            if fields:
                self.reporter.progress(run.task_id, run.epoch, **fields)

        fut.add_done_callback(done)

    async def _lose(self, run: _Run, current_epoch: int) -> None:
        if run.lost:
            return
        run.lost = True
        run.cancelled.set()
        if run.worker is not None:
            stop_run(run.worker)  # its next context call raises, spooled ones too
        _log.warning(
            "task %s: epoch %d was superseded in Redis (now %d); stopping it",
            run.task_id,
            run.epoch,
            current_epoch,
        )
        await self.reporter.lost(run.task_id, run.epoch, current_epoch)

    # ----------------------------------------------------------------- finish

    async def _finish(
        self,
        run: _Run,
        result: records_pb2.TaskResult | None,
        error: records_pb2.TaskError | None,
    ) -> None:
        outcome = "completed" if result is not None else "failed"
        self.metrics.tasks_finished.labels(outcome=outcome).inc()
        if error is not None:
            _log.info("task %s failed at epoch %d: %s", run.task_id, run.epoch, error.message[:300])
        await self.reporter.finished(
            run.task_id,
            run.epoch,
            result=result,
            error=error,
            final_checkpoint=run.checkpoint,
            run_ms=int((time.monotonic() - run.started_s) * 1000),
        )

    def _error(
        self,
        run: _Run,
        exc: BaseException,
        *,
        retryable: bool,
        code: int = records_pb2.TASK_ERROR_CODE_HANDLER_ERROR,
    ) -> records_pb2.TaskError:
        err = self._error_text(run, f"{type(exc).__name__}: {exc}", code, retryable=retryable)
        err.exception_type = type(exc).__qualname__
        remote = getattr(exc, "remote_traceback", "")
        err.traceback = (remote or "".join(traceback.format_exception(exc)))[-4000:]
        return err

    def _error_text(
        self, run: _Run, message: str, code: int, *, retryable: bool
    ) -> records_pb2.TaskError:
        return records_pb2.TaskError(
            code=code,  # type: ignore[arg-type]
            message=message[:2000],
            retryable=retryable,
            node_id=self.node_id,
            epoch=run.epoch,
            attempt=run.attempt,
            occurred_at_unix_ms=_wall_ms(),
        )

    # ------------------------------------------------------------------- stop

    async def stop(self, task_id: str, epoch: int, *, flush: bool) -> None:
        """Stop the task's handler at ``epoch`` and report it stopped (always reports)."""
        run = self._runs.get(task_id)
        if run is None or run.epoch != epoch:
            await self.reporter.stopped(task_id, epoch, checkpoint=None, journal_seq=0)
            return
        run.stopping = True
        run.cancelled.set()
        task = run.task
        waits: set[asyncio.Future[Any]] = set()
        if task is not None and not task.done():
            if not run.returned:  # a returned handler's result commit is left to finish
                task.cancel()
            waits.add(task)
        if run.worker is not None:
            stop_run(run.worker)  # its context calls and ensure_owner raise from now on
        if run.thread is not None and not run.thread.done():
            # A thread cannot be interrupted: give it the grace to return (and
            # commit its result) before nothing of this run may commit any more.
            thread = asyncio.wrap_future(run.thread)
            thread.add_done_callback(_retrieve)
            waits.add(thread)
        if waits:
            await asyncio.wait(waits, timeout=self.stop_grace_s)
        run.stopped = True
        worker = run.worker
        if worker is not None and self._workers is not None:
            # A handler process that ignored the stop is killed: it cannot go on
            # past the fence (or after a revoke) whatever it does.
            _log.warning(
                "task %s: handler process %s did not stop within %.1f s; killing it",
                task_id,
                worker.pid,
                self.stop_grace_s,
            )
            await asyncio.to_thread(self._workers.discard, worker)
            if run.thread is not None and not run.thread.done():
                # Its relay ingests what the dead worker spooled: wait (briefly),
                # so the stop reports and ships the run's last checkpoint.
                relay = asyncio.wrap_future(run.thread)
                relay.add_done_callback(_retrieve)
                await asyncio.wait({relay}, timeout=5.0)
        # Ship what lingers (local durability) at once, on every stop: a fenced
        # or revoked owner's last records reach Redis before a new owner's
        # claim (which refuses them after) as soon as they can. Only a stop
        # with ``flush`` waits for them.
        self.drain_handoff()
        self.replicator.flush()
        if run.shipping:  # records a handler thread committed, not yet handed to Redis
            await asyncio.wait(
                [asyncio.wrap_future(f) for f in list(run.shipping)],
                timeout=self.flush_timeout_s if flush else 0.05,
            )
        if flush and run.pending:
            self.replicator.flush()
            pending = set(run.pending)
            done, _ = await asyncio.wait(pending, timeout=self.flush_timeout_s)
            if len(done) < len(pending):
                _log.warning(
                    "task %s: %d records not yet in Redis after %.1f s",
                    task_id,
                    len(pending) - len(done),
                    self.flush_timeout_s,
                )
            elif run.checkpoint is not None:
                run.checkpoint.replicated = True
        if self._runs.get(task_id) is run:
            del self._runs[task_id]
        await self.reporter.stopped(
            task_id, epoch, checkpoint=run.checkpoint, journal_seq=run.journal_seq
        )

    async def close(self) -> None:
        """Cancel every handler (no reports) and release the thread pool."""
        for run in list(self._runs.values()):
            run.cancelled.set()
            if run.task is not None:
                run.task.cancel()
        tasks = [r.task for r in self._runs.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self.stop_grace_s)
        self._runs.clear()
        # Committed records still waiting for the loop go to the replicator, whose
        # close drains them to Redis (bounded): a restart would re-ship them anyway.
        deadline = time.monotonic() + 1.0
        while (self._handoff or self._draining) and time.monotonic() < deadline:
            self.drain_handoff()
            self.replicator.flush()
            await asyncio.sleep(0.01)
        if self._workers is not None:
            await asyncio.to_thread(self._workers.close)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------- records

    def _summary(self, run: _Run, ckpt: StoredCheckpoint) -> records_pb2.CheckpointSummary:
        info = ckpt.info
        return records_pb2.CheckpointSummary(
            checkpoint_ref=info.ref,
            task_id=run.task_id,
            epoch=info.epoch,
            seq=info.seq,
            covers_journal_seq=info.covers_journal_seq,
            terminal=info.terminal,
            label=info.label,
            created_at_unix_ms=info.created_at_ms,
            stored_bytes=info.stored_bytes,
            node_id=self.node_id,
        )

    def _checkpoint_record(self, run: _Run, ckpt: StoredCheckpoint) -> records_pb2.CheckpointRecord:
        info = ckpt.info
        return records_pb2.CheckpointRecord(
            task_id=run.task_id,
            epoch=info.epoch,
            seq=info.seq,
            covers_journal_seq=info.covers_journal_seq,
            checkpoint_ref=info.ref,
            terminal=info.terminal,
            label=info.label,
            payload=ckpt.payload,
            encoding=records_pb2.PAYLOAD_ENCODING_RAW,
            content_type=JSON,
            decoded_bytes=len(ckpt.payload),
            created_at_unix_ms=info.created_at_ms,
            node_id=self.node_id,
            incarnation=self.incarnation,
        )

    def _event_record(
        self, run: _Run, seq: int, epoch: int, payload: bytes, created_ms: int
    ) -> records_pb2.JournalEventRecord:
        return records_pb2.JournalEventRecord(
            task_id=run.task_id,
            epoch=epoch,
            seq=seq,
            payload=payload,
            content_type=JSON,
            created_at_unix_ms=created_ms,
            node_id=self.node_id,
        )


def _log_failure(task: asyncio.Future[Any]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        _log.error("background report failed: %r", exc)


def _log_cfailure(fut: concurrent.futures.Future[Any]) -> None:
    if fut.cancelled():
        return
    exc = fut.exception()
    if exc is not None:
        _log.error("background step failed: %r", exc)


class _RemoteError(Exception):
    """An exception a handler raised in its worker process (its traceback is kept)."""

    def __init__(self, message: str, remote_traceback: str) -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


def _lighten(run: _Run, _main: asyncio.Task[None]) -> None:
    """Drop what an ended run's result weighs (up to ``MAX_RESULT_BYTES``): the run
    may stay in ``TaskRunner._runs`` until the agent forgets its task."""
    if run.thread is not None and run.thread.done():
        run.thread = None  # stop() only reads a thread still running
    run.stored_result = None


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Consume a stopped run's outcome (its task was cancelled; nobody else reads it)."""
    if not fut.cancelled():
        fut.exception()
