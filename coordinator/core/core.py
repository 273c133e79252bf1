"""CoordinatorCore: the leader's whole decision logic as one sans-IO state machine.

Theory of operation: the shell owns every socket, stream, etcd client and
clock. It turns what it observes into events (``coordinator.core.events``) and
calls ``step(event)``; the core updates its in-memory view and returns the
commands (``coordinator.core.commands``) that carry the decision out. Like
etcd/raft's ``RawNode``, time is an input (``tick``) and outputs are data.

**Clock.** Every event carries ``now_s``: seconds on the leader's clock, never
decreasing between events (a decrease raises ``UsageError``). The core does
not care which clock it is; the recommended one is a monotonic clock anchored
to wall time at start (``wall0 + monotonic() - mono0``), so rates follow the
monotonic clock and the ``*_s`` times in records stay close to Unix time for
the adapter's ``*_unix_ms`` fields. Task deadlines use the same clock.

**Tick cadence (the contract with the shell).** Call ``tick(now_s)`` every
``CoreSettings.tick_interval_s`` (100 ms at the defaults; it must be at most
``heartbeat_interval_s``). Verdicts happen only on ticks, so a node that stops
sending is DEAD at the first tick at or after ``last heartbeat +
dead_after_s``: within ``dead_after_s + tick_interval_s`` of its last
heartbeat, inside the ``dead_after_s + heartbeat_interval_s`` budget. A closed
stream makes its node SUSPECT in the step that reports it, without a tick.

**Ordering.** Commands of one list follow the rule in
``coordinator.core.commands``: persist, then emit, then send; the core checks
every list it returns. The shell runs the lists in order.

**Leadership.** The core starts as a follower and only accepts
``LeadershipAcquired`` (and the harmless ``LeadershipLost`` / ``PersistFailed``)
until then. ``LeadershipAcquired`` carries the node and task records loaded
from etcd and resets the core to them. Then:

- *grace*: for ``failover_reconnect_s + dead_after_s`` from
  ``LeadershipAcquired.now_s`` no node is judged SUSPECT or DEAD by silence
  and no task of a DEAD or LEFT owner moves; every node gets a fair chance to
  reconnect (issue 16: no false DEAD verdict after a leader change). A closed stream or a
  Goodbye still counts at once (they are facts, not judgments).
- *half-done work*: tasks the previous leader left owned by a DEAD, LEFT or
  unknown node are moved after the grace, by the same sweep that moves the
  tasks of nodes this leader declares DEAD; tasks owned by an earlier
  incarnation of a node whose record names a newer one (a takeover whose
  node record was written, its tasks' move not) move at that node's next
  Hello. Planning works on the records alone, so it is idempotent over
  whatever prefix of a command list the previous leader managed to persist.
- ``LeadershipLost`` drops all state (etcd is the truth; the next leader
  reloads). ``PersistFailed`` does the same and returns ``StepDown``.

**What the core assumes of node agents** (the seeded simulator in
``coordinator.core.sim`` fails without these; issue [node-agent] must keep them):

- self-fencing: with no HeartbeatAck for a heartbeat sent at ``s``, every task
  is paused by ``s + fence_after_s``;
- a self-fenced agent starts or resumes nothing until it has closed its
  Session and received a new Welcome: directives still buffered on the old
  stream may be stale (an Assign for an epoch that has since moved). Its
  Hello then lists the paused tasks; the leader re-attaches (Assign REATTACH,
  same epoch) the ones it still owns and revokes the rest;
- every heartbeat lists the tasks the agent runs, with their epochs: that is
  how the leader learns a revoked task has stopped before it moves it after a
  release timeout, and how it fences progress reported at a stale epoch.

**What a step decides.** Sessions: Hello is answered with Welcome and the
node's held tasks are reconciled (a task it holds at the current epoch is
re-attached, one it lost is revoked); heartbeats are acked; bad input closes
that Session only (``CloseSession`` with INVALID_ARGUMENT / FAILED_PRECONDITION)
and never raises. Ticks: failure-detector verdicts, the mass-failure guard
(``coordinator.core.guard``), moving the tasks of DEAD nodes, deadlines and
release timeouts. Tasks: submission (idempotent on request id), updates with
epoch fencing (an update older than the task's epoch is refused with
STALE_EPOCH and a Revoke and never changes state), cancel, drain. Every step
ends with a placement round (``coordinator.core.placement``) when something
changed that could let a PENDING task run.

**Progress is flushed, state changes are written at once.** A Checkpointed
update of a task already RUNNING changes only its checkpoint fields (the
record's first checkpoint and first replicated one excepted: written at once,
so etcd never shows "none" for long where the leader has some): the core
applies it in memory, acks it, and writes all such records together on the
first tick ``progress_flush_interval_s`` (1 s) after the oldest of them
(``_flush_progress``): one etcd transaction per interval, not one per task
per update (on a 2-core machine each such write cost the leader and etcd about
2 ms of CPU). Every other write of the task carries its newest record. After a
leader crash the next leader therefore loads progress up to one interval (plus
a tick) older than the old one knew, on top of the agents' own report interval
(a graceful resign flushes first: ``ResignRequested``); the newest replicated
checkpoint it hands a new owner (``Assign.resume_from``) is then older, which
only weakens the DATA_LOSS check of that resume (``node_agent/core/redisloss.py``:
restored < acknowledged), never makes a false one. Followers' read caches lag
as long. 0 writes every update at once.
"""

from __future__ import annotations

import collections
import enum
import heapq
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from random import Random
from typing import Any

from coordinator.core import limits, notices
from coordinator.core.commands import (
    CloseSession,
    Command,
    EmitEvent,
    PersistNodes,
    PersistTasks,
    ReplyToRequest,
    RetireRecords,
    SeedFork,
    SendDirective,
    StatusCode,
    StepDown,
    batched,
    check_command_order,
)
from coordinator.core.detector import FailureDetector, Liveness, Verdict, make_detector
from coordinator.core.directives import (
    Assign,
    Directive,
    Drain,
    HeartbeatAck,
    LineageAck,
    Release,
    Revoke,
    TaskUpdateAck,
    Welcome,
)
from coordinator.core.errors import InvariantViolation, UsageError
from coordinator.core.events import (
    CancelRequested,
    Checkpointed,
    Completed,
    DrainRequested,
    Event,
    Failed,
    ForkSeeded,
    GoodbyeReceived,
    HeartbeatDigest,
    HeartbeatReceived,
    LeadershipAcquired,
    LeadershipLost,
    LineageReported,
    MigrateRequested,
    PersistFailed,
    Released,
    ResignRequested,
    SessionClosed,
    SessionOpened,
    Started,
    TaskSubmitted,
    TaskUpdateReceived,
    Tick,
    UncordonRequested,
)
from coordinator.core.guard import GuardInput, GuardStatus, MassFailureGuard
from coordinator.core.identity import Claim, ClaimKind, ClaimVerdict, judge_claim
from coordinator.core.membership import NodeEntry, NodeTrigger, next_node_state
from coordinator.core.placement import Candidate, is_eligible, place
from coordinator.core.records import (
    AssignReason,
    FenceSource,
    HeldTask,
    HeldTaskStatus,
    MoveReason,
    NodeLoad,
    NodeRecord,
    NodeState,
    RevokeReason,
    SuspicionReason,
    TaskError,
    TaskErrorCode,
    TaskMove,
    TaskRecord,
    TaskState,
    UpdateOutcome,
    labels_match,
)
from coordinator.core.settings import CoreSettings
from coordinator.core.tasks import TaskTable, TaskTrigger

__all__ = ["CoordinatorCore", "CoreSnapshot", "NodeView", "Role"]

MAX_PREVIOUS_OWNERS = 16
"""TaskRecord.previous_owner_node_ids keeps at most this many (the newest)."""

MAX_ID_BYTES = limits.LIMITS.id_bytes
"""Longest request id and task kind accepted, UTF-8 bytes (``coordinator.core.limits``)."""
MAX_SPEC_PAYLOAD_BYTES = limits.LIMITS.spec_payload_bytes
"""Largest ``spec.payload`` accepted: the task record (payload, then the result) is
one etcd value, and etcd refuses requests over 1.5 MiB. Large inputs belong in
an object store; pass a reference."""

MAX_RETIRE = 64
"""Most tasks (and nodes) one RetireRecords moves; a tick retires at most this many."""

_RECORD_STATE = operator.attrgetter("record.state")
"""A ``NodeEntry``'s state, read without the property (``counts_by_state``)."""

_LIVE = frozenset({NodeState.ALIVE, NodeState.DRAINING})
_GONE = frozenset({NodeState.DEAD, NodeState.LEFT})
_GUARD_QUIET = GuardStatus(
    active=False, changed=False, dead_nodes=0, failing_nodes=0, total_nodes=0
)
"""The guard's status on a tick where nothing it reads changed and it is not active."""


class Role(enum.Enum):
    """Whether this core is deciding."""

    FOLLOWER = "follower"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node for read RPCs: its record plus what only the leader's memory knows."""

    record: NodeRecord
    connected: bool
    session_id: str
    last_heartbeat_at_s: float | None
    mean_interarrival_s: float | None
    phi: float
    load: NodeLoad
    assigned_tasks: int
    assigned_slots: int


@dataclass(frozen=True, slots=True)
class CoreSnapshot:
    """A consistent, immutable copy of the core's state for read RPCs and tests.

    Attributes:
        role: LEADER or FOLLOWER (a follower's snapshot is empty).
        term: the leader's term (0 before the first leadership).
        now_s: the latest time the core was given.
        guard_active: the mass-failure guard stops redistribution.
        grace_until_s: end of the new-leader grace (None when not leading).
        nodes: every node, sorted by id.
        tasks: every task, sorted by id.
    """

    role: Role
    term: int
    now_s: float
    guard_active: bool
    grace_until_s: float | None
    nodes: tuple[NodeView, ...]
    tasks: tuple[TaskRecord, ...]

    def node(self, node_id: str) -> NodeView | None:
        """The node with this id, or None."""
        return next((n for n in self.nodes if n.record.node_id == node_id), None)

    def task(self, task_id: str) -> TaskRecord | None:
        """The task with this id, or None."""
        return next((t for t in self.tasks if t.task_id == task_id), None)

    def nodes_by_state(self) -> dict[NodeState, int]:
        """Node counts for every state with at least one node."""
        counts: dict[NodeState, int] = {}
        for n in self.nodes:
            counts[n.record.state] = counts.get(n.record.state, 0) + 1
        return counts

    def tasks_by_state(self) -> dict[TaskState, int]:
        """Task counts for every state with at least one task."""
        counts: dict[TaskState, int] = {}
        for t in self.tasks:
            counts[t.state] = counts.get(t.state, 0) + 1
        return counts


@dataclass(slots=True)
class _Recovery:
    """A gone node's tasks on their way to new owners (for RecoveryCompleted)."""

    incarnation: str
    started_s: float
    detection_s: float
    waiting: set[str] = field(default_factory=set)
    recovered: int = 0
    failed: int = 0


@dataclass(slots=True)
class _Out:
    """What one step produces, gathered before it is turned into ordered commands."""

    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    tasks: dict[str, TaskRecord] = field(default_factory=dict)
    seeds: list[SeedFork] = field(default_factory=list)
    retired_tasks: list[TaskRecord] = field(default_factory=list)
    retired_nodes: list[NodeRecord] = field(default_factory=list)
    notices: list[notices.Notice] = field(default_factory=list)
    sends: list[SendDirective | ReplyToRequest | CloseSession] = field(default_factory=list)
    step_down: StepDown | None = None

    def commands(self, term: int, now_s: float) -> list[Command]:
        out: list[Command] = []
        if self.retired_tasks or self.retired_nodes:
            for i in range(0, max(len(self.retired_tasks), len(self.retired_nodes)), MAX_RETIRE):
                out.append(
                    RetireRecords(
                        term,
                        tuple(self.retired_tasks[i : i + MAX_RETIRE]),
                        tuple(self.retired_nodes[i : i + MAX_RETIRE]),
                    )
                )
        node_records = [self.nodes[k] for k in sorted(self.nodes)]
        task_records = [self.tasks[k] for k in sorted(self.tasks)]
        out.extend(PersistNodes(term, chunk) for chunk in batched(node_records))
        out.extend(PersistTasks(term, chunk) for chunk in batched(task_records))
        out.extend(self.seeds)
        out.extend(EmitEvent(term, now_s, body) for body in self.notices)
        out.extend(self.sends)
        if self.step_down is not None:
            out.append(self.step_down)
        return out


class CoordinatorCore:
    """The leader's decision logic: ``step(event) -> commands``, ``tick(now_s)``, ``snapshot()``."""

    def __init__(self, settings: CoreSettings | None = None, *, rng: Random) -> None:
        """Build a follower core.

        Args:
            settings: the settings (defaults of DESIGN.md §10 when None).
            rng: the injected random source (placement tie-breaks, generated
                task ids); pass ``random.Random(seed)`` for a reproducible run.
        """
        self._settings = settings if settings is not None else CoreSettings()
        self._rng = rng
        self._role = Role.FOLLOWER
        self._term = 0
        self._now_s = -math.inf
        self._grace_until_s = -math.inf
        self._detector: FailureDetector = make_detector(self._settings)
        self._guard = self._new_guard()
        self._nodes: dict[str, NodeEntry] = {}
        # Nodes neither ALIVE nor DRAINING (the mass-failure guard's inputs), and
        # the earliest time a tick's verdicts can change anything (see _on_tick).
        self._unhealthy: set[str] = set()
        self._next_judgement_s = -math.inf
        # A node was added, removed or written since the guard last evaluated.
        self._guard_dirty = True
        self._tasks = TaskTable()
        # Why a PENDING task waits (for its next Assign): reason, move reason, from node.
        self._requeue: dict[str, tuple[AssignReason, MoveReason | None, str]] = {}
        # Recoveries under way: a gone node -> its tasks not yet RUNNING elsewhere.
        # A task moved off a gone node whose next owner goes before it starts
        # waits in both nodes' recoveries: each completes only once the task
        # runs again (or ends), as RecoveryCompleted promises.
        self._recoveries: dict[str, _Recovery] = {}
        self._recovering: dict[str, list[str]] = {}  # task id -> gone nodes it came from
        self._interrupted_at: dict[str, float] = {}  # task id -> when it lost its owner
        self._last_heard: dict[str, float] = {}  # moved task id -> its dead owner's last beat
        # Migrated tasks released by their owner, waiting for placement on the
        # target: task id -> (target node id, or "" for any node but the avoided
        # one; node to avoid). Memory only: a new leader places them anywhere.
        self._pinned: dict[str, tuple[str, str]] = {}
        self._placement_dirty = False
        # Tasks whose release timed out: revoked at this epoch, requeued once the
        # owner shows it stopped (a heartbeat or Hello without it) or is gone.
        self._revoking: dict[str, int] = {}
        # Revokes no heartbeat may have answered yet (NodeEntry.note_revoked,
        # held=False): task id -> (node id, epoch), forgotten with the task.
        self._unseen_revokes: dict[str, set[tuple[str, int]]] = {}
        # Forked tasks whose seed checkpoint is being written: not placed until ForkSeeded.
        self._unseeded: set[str] = set()
        # Retention: (finished or left at, id), soonest first; stale entries skipped.
        self._retire_tasks: list[tuple[float, str]] = []
        self._retire_nodes: list[tuple[float, str]] = []
        # True once a tick ran after the grace: verdicts and moves are under way.
        self._judging = False
        # Progress not yet in etcd (see _flush_progress): RUNNING tasks whose
        # in-memory record is newer than the one written, and since when.
        self._unflushed: set[str] = set()
        self._unflushed_since_s = math.inf
        self._handlers: dict[type, Callable[[Any, _Out], None]] = {
            LeadershipAcquired: self._on_leadership_acquired,
            SessionOpened: self._on_session_opened,
            HeartbeatReceived: self._on_heartbeat,
            HeartbeatDigest: self._on_heartbeat_digest,
            SessionClosed: self._on_session_closed,
            GoodbyeReceived: self._on_goodbye,
            TaskUpdateReceived: self._on_task_update,
            TaskSubmitted: self._on_task_submitted,
            CancelRequested: self._on_cancel,
            DrainRequested: self._on_drain,
            MigrateRequested: self._on_migrate,
            UncordonRequested: self._on_uncordon,
            LineageReported: self._on_lineage,
            ForkSeeded: self._on_fork_seeded,
            Tick: self._on_tick,
            ResignRequested: self._on_resign_requested,
        }

    # ------------------------------------------------------------------
    # Public API.
    # ------------------------------------------------------------------

    @property
    def settings(self) -> CoreSettings:
        """The settings in force."""
        return self._settings

    @property
    def role(self) -> Role:
        """LEADER or FOLLOWER."""
        return self._role

    @property
    def term(self) -> int:
        """The current (or last) term; 0 before the first leadership."""
        return self._term

    @property
    def now_s(self) -> float:
        """The latest time passed in."""
        return self._now_s

    @property
    def guard_active(self) -> bool:
        """True while the mass-failure guard stops redistribution."""
        return self._guard.active

    def step(self, event: Event) -> list[Command]:
        """Feed one event; return the commands to run, in order.

        Args:
            event: a fact the shell observed, stamped with ``now_s``.

        Returns:
            Commands in the order of ``coordinator.core.commands`` (persist,
            emit, send, step down); possibly empty.

        Raises:
            UsageError: ``now_s`` decreased or is not finite, an unknown event
                type, or a leader-only event fed to a follower.
            InvariantViolation: the step broke a rule of the core (a bug).
        """
        self._advance_clock(event.now_s)
        if isinstance(event, LeadershipLost):
            self._become_follower()
            return []
        if isinstance(event, PersistFailed):
            if self._role is not Role.LEADER:
                return []
            self._become_follower()
            return [StepDown(f"persist failed: {event.reason}")]
        handler = self._handlers.get(type(event))
        if handler is None:
            raise UsageError(f"unknown event type {type(event).__name__}")
        if self._role is not Role.LEADER and isinstance(event, Tick | ResignRequested):
            return []  # a follower's ticker may keep running; nothing to judge or flush
        if self._role is not Role.LEADER and not isinstance(event, LeadershipAcquired):
            raise UsageError(f"{type(event).__name__} fed to a core that is not leading")
        out = _Out()
        screened = limits.screen(event)
        if isinstance(screened, limits.Refusal):
            self._refuse_at_intake(event, screened.message, out)
        else:
            handler(screened, out)
        self._place(out)
        commands = out.commands(self._term, self._now_s)
        check_command_order(commands)
        if self._settings.self_check:
            self.check_invariants()
        return commands

    def tick(self, now_s: float) -> list[Command]:
        """Let time pass: same as ``step(Tick(now_s))``; call it every ``tick_interval_s``."""
        return self.step(Tick(now_s))

    def counts_by_state(self) -> tuple[dict[NodeState, int], dict[TaskState, int]]:
        """Nodes and tasks per state, as ``snapshot()``'s ``nodes_by_state`` /
        ``tasks_by_state`` would give them, without building a snapshot (the
        metrics read this every half second; a snapshot costs a view per node).
        Empty while not leading, like a follower's snapshot."""
        if self._role is not Role.LEADER:
            return {}, {}
        # Counted in C (Counter over attrgetter): half the cost of a Python loop
        # over a property, which showed in the leader's profile with 1,200 nodes.
        nodes = collections.Counter(map(_RECORD_STATE, self._nodes.values()))
        return nodes, self._tasks.counts_by_state()

    def snapshot(self) -> CoreSnapshot:
        """An immutable copy of the node and task state (for read RPCs).

        Returns:
            The snapshot; nodes and tasks sorted by id.
        """
        views = [self._view(self._nodes[node_id]) for node_id in sorted(self._nodes)]
        leading = self._role is Role.LEADER
        return CoreSnapshot(
            role=self._role,
            term=self._term,
            now_s=self._now_s,
            guard_active=self._guard.active,
            grace_until_s=self._grace_until_s if leading else None,
            nodes=tuple(views),
            tasks=tuple(self._tasks.records()),
        )

    def task(self, task_id: str) -> TaskRecord | None:
        """The task with this id, or None (cheaper than a snapshot)."""
        return self._tasks.get(task_id)

    def task_for_request(self, request_id: str) -> TaskRecord | None:
        """The task a SubmitTask request id created, or None."""
        return self._tasks.by_request(request_id)

    def node(self, node_id: str) -> NodeView | None:
        """One node as ``snapshot`` would show it, or None (cheaper than a snapshot)."""
        entry = self._nodes.get(node_id)
        return None if entry is None else self._view(entry)

    def _view(self, entry: NodeEntry) -> NodeView:
        node_id = entry.node_id
        owned = self._tasks.owned_by(node_id)
        last = self._detector.last_heard_s(node_id)
        return NodeView(
            record=entry.record,
            connected=entry.connected,
            session_id=entry.session_id,
            last_heartbeat_at_s=last if last is not None else entry.record.last_heartbeat_at_s,
            mean_interarrival_s=self._detector.mean_interarrival_s(node_id),
            phi=0.0 if last is None else self._detector.phi(node_id, self._now_s),
            load=entry.load,
            assigned_tasks=len(owned),
            assigned_slots=sum(t.spec.effective_slots for t in owned),
        )

    def check_invariants(self) -> None:
        """Check every rule the core's state must satisfy.

        Raises:
            InvariantViolation: naming the rule and the task or node that broke it.
        """
        self._tasks.check()
        for node_id in self._tasks.owners():
            if node_id not in self._nodes:
                raise InvariantViolation(f"tasks owned by unknown node {node_id!r}")
        settled = self._judging and not self._guard.active
        for node_id, entry in self._nodes.items():
            state = entry.state
            if entry.record.node_id != node_id:
                raise InvariantViolation(f"node {node_id!r} indexed under another id")
            if state in _GONE and entry.connected:
                raise InvariantViolation(f"node {node_id!r} is {state.name} with a Session open")
            if state in _LIVE and (state is NodeState.DRAINING) != entry.record.cordoned:
                raise InvariantViolation(f"node {node_id!r} is {state.name}, cordon disagrees")
            if (state not in _LIVE) != (node_id in self._unhealthy):
                raise InvariantViolation(f"node {node_id!r} is {state.name}, health index differs")
            if settled and state in _GONE and self._tasks.owned_by(node_id):
                raise InvariantViolation(
                    f"node {node_id!r} is {state.name} but still owns tasks outside grace "
                    "and with the mass-failure guard inactive"
                )
        if not self._unhealthy <= self._nodes.keys():
            raise InvariantViolation("health index names a node that is not known")
        for task_id in self._requeue:
            task = self._tasks.get(task_id)
            if task is None or task.state is not TaskState.PENDING:
                raise InvariantViolation(f"requeue entry for non-PENDING task {task_id!r}")
        for task_id in self._pinned:
            task = self._tasks.get(task_id)
            if task is None or task.state is not TaskState.PENDING:
                raise InvariantViolation(f"migration pin for non-PENDING task {task_id!r}")
        for task_id, epoch in self._revoking.items():
            task = self._tasks.get(task_id)
            if task is None or not task.state.owned or task.epoch != epoch:
                raise InvariantViolation(f"revoking entry for a task not owned at {epoch}")
        for task_id in self._unflushed:
            task = self._tasks.get(task_id)
            if task is None or task.state is not TaskState.RUNNING:
                raise InvariantViolation(f"unflushed progress of non-RUNNING task {task_id!r}")

    # ------------------------------------------------------------------
    # Leadership.
    # ------------------------------------------------------------------

    def _new_guard(self) -> MassFailureGuard:
        s = self._settings
        return MassFailureGuard(
            threshold_ratio=s.mass_failure_threshold_ratio,
            min_nodes=s.mass_failure_min_nodes,
            window_s=s.mass_failure_window_s,
        )

    def _reset(self) -> None:
        self._detector = make_detector(self._settings)
        self._guard = self._new_guard()
        self._nodes = {}
        self._tasks = TaskTable()
        self._requeue = {}
        self._recoveries = {}
        self._recovering = {}
        self._interrupted_at = {}
        self._last_heard = {}
        self._revoking = {}
        self._unseen_revokes = {}
        self._pinned = {}
        self._unseeded = set()
        self._retire_tasks = []
        self._retire_nodes = []
        self._placement_dirty = False
        self._judging = False
        self._unflushed = set()
        self._unflushed_since_s = math.inf
        self._unhealthy = set()
        self._next_judgement_s = -math.inf
        self._guard_dirty = True

    def _become_follower(self) -> None:
        self._role = Role.FOLLOWER
        self._grace_until_s = -math.inf
        self._reset()

    def _refuse_at_intake(self, ev: Event, message: str, out: _Out) -> None:
        """An input over a limit of ``coordinator.core.limits``: refuse it, decide nothing.

        A Hello closes its Session, a heartbeat or lineage report closes the
        node's current Session (INVALID_ARGUMENT naming the field); a task
        update is answered REJECTED naming the field; a request is replied
        INVALID_ARGUMENT.
        """
        if isinstance(ev, SessionOpened):
            out.sends.append(
                CloseSession(ev.node_id, ev.session_id, StatusCode.INVALID_ARGUMENT, message)
            )
        elif isinstance(ev, HeartbeatReceived | LineageReported):
            entry = self._current(ev.node_id, ev.session_id)
            if entry is not None:
                self._close_session(entry, StatusCode.INVALID_ARGUMENT, message, out)
        elif isinstance(ev, TaskUpdateReceived):
            entry = self._current(ev.node_id, ev.session_id)
            task = self._tasks.get(ev.task_id)
            if entry is not None:
                current = task.epoch if task is not None else 0
                ack = TaskUpdateAck(
                    ev.update_seq, ev.task_id, ev.epoch, UpdateOutcome.REJECTED, current, message
                )
                self._send(entry, ack, out)
        elif isinstance(
            ev,
            TaskSubmitted | CancelRequested | DrainRequested | MigrateRequested | UncordonRequested,
        ):
            out.sends.append(ReplyToRequest(ev.request_id, StatusCode.INVALID_ARGUMENT, message))

    def _on_leadership_acquired(self, ev: LeadershipAcquired, out: _Out) -> None:
        if ev.term < self._term:
            raise UsageError(f"term went backwards: {ev.term} < {self._term}")
        self._reset()
        self._role = Role.LEADER
        self._term = ev.term
        now = ev.now_s
        # A node loaded from etcd is silent only from when it had a fair chance to
        # find this leader; a node that says Hello to it is judged as usual.
        heard_s = now + self._settings.failover_reconnect_s
        self._grace_until_s = now + self._settings.dead_after_s
        for record in sorted(ev.nodes, key=lambda r: r.node_id):
            if record.node_id in self._nodes:
                raise UsageError(f"node {record.node_id!r} loaded twice")
            entry = NodeEntry(record=record)
            if record.state in _GONE:
                at = record.state_changed_at_s if record.state_changed_at_s is not None else now
                heapq.heappush(self._retire_nodes, (at, record.node_id))
                if record.state is NodeState.DEAD:
                    entry.dead_since_s = record.state_changed_at_s
                    entry.unavailable_since_s = record.state_changed_at_s
            else:
                self._detector.watch(record.node_id, heard_s)
                if record.state is NodeState.SUSPECT:
                    entry.unavailable_since_s = record.state_changed_at_s
            self._nodes[record.node_id] = entry
            self._track_health(entry)
        for task in sorted(ev.tasks, key=lambda t: t.task_id):
            owner = task.owner_node_id
            if task.state.owned and owner not in self._nodes:
                # A node etcd has no record of: treat it as DEAD (its tasks move after
                # grace) and retire it like any DEAD node once it owns none.
                self._nodes[owner] = NodeEntry(
                    record=NodeRecord(
                        node_id=owner, incarnation=task.owner_incarnation, state=NodeState.DEAD
                    )
                )
                self._track_health(self._nodes[owner])
                heapq.heappush(self._retire_nodes, (now, owner))
            self._tasks.insert(task)
            if task.state.terminal:
                at = task.finished_at_s if task.finished_at_s is not None else now
                heapq.heappush(self._retire_tasks, (at, task.task_id))
        for q in ev.quarantined:
            out.notices.append(notices.RecordQuarantined(q.collection, q.name, q.reason))
        self._fail_unseeded_forks(out)
        self._placement_dirty = True

    # ------------------------------------------------------------------
    # Sessions.
    # ------------------------------------------------------------------

    def _on_session_opened(self, ev: SessionOpened, out: _Out) -> None:
        if not ev.session_id:
            raise UsageError("SessionOpened.session_id must not be empty")
        problem = ""
        if not ev.node_id:
            problem = "hello.node_id: must not be empty"
        elif not ev.incarnation:
            problem = "hello.incarnation: must not be empty"
        elif ev.capacity_slots < 1:
            problem = f"hello.capacity.slots: must be >= 1, got {ev.capacity_slots}"
        if problem:
            out.sends.append(
                CloseSession(ev.node_id, ev.session_id, StatusCode.INVALID_ARGUMENT, problem)
            )
            return
        entry = self._nodes.get(ev.node_id)
        now = self._now_s
        verdict = ClaimVerdict(ClaimKind.NEW_NODE)
        if entry is not None:
            if entry.session_id == ev.session_id:
                self._close_session(entry, StatusCode.INVALID_ARGUMENT, "a second Hello", out)
                return
            if entry.state is NodeState.LEFT and entry.record.incarnation == ev.incarnation:
                out.sends.append(
                    CloseSession(
                        ev.node_id,
                        ev.session_id,
                        StatusCode.FAILED_PRECONDITION,
                        f"node left under incarnation {ev.incarnation!r}; start a new one",
                    )
                )
                return
            verdict = judge_claim(
                entry.record,
                Claim(
                    ev.incarnation,
                    ev.incarnation_secret_sha256,
                    ev.store_id,
                    ev.store_previous_incarnation,
                ),
                connected=entry.connected,
                last_heard_s=self._detector.last_heard_s(ev.node_id),
                now_s=now,
                dead_after_s=self._settings.dead_after_s,
            )
            if not verdict.kind.admitted:
                out.sends.append(
                    CloseSession(
                        ev.node_id, ev.session_id, StatusCode.FAILED_PRECONDITION, verdict.message
                    )
                )
                out.notices.append(
                    notices.IdentityConflict(
                        node_id=ev.node_id,
                        holder_incarnation=entry.record.incarnation,
                        claimant_incarnation=ev.incarnation,
                        claimant_address=ev.address,
                        holder_heard_ago_s=verdict.heard_ago_s,
                        reason=verdict.kind.value,
                    )
                )
                return
            if entry.connected:
                why = (
                    "replaced by a newer Session of this incarnation"
                    if verdict.kind is ClaimKind.SAME_INCARNATION
                    else f"incarnation {entry.record.incarnation} proven stopped: "
                    f"{ev.incarnation} restarted in place on its store"
                )
                out.sends.append(
                    CloseSession(ev.node_id, entry.session_id, StatusCode.ABORTED, why)
                )
                entry.session_id = ""
        prev = entry.record if entry is not None else None
        joined = prev is None or prev.incarnation != ev.incarnation or verdict.kind.takes_over
        cordoned = prev.cordoned if prev is not None else False
        if prev is None:
            state = NodeState.DRAINING if cordoned else NodeState.ALIVE
            base = NodeRecord(node_id=ev.node_id, incarnation=ev.incarnation, registered_at_s=now)
        else:
            state = next_node_state(prev.state, NodeTrigger.SESSION_OPENED, cordoned)
            base = prev
        record = replace(
            base,
            incarnation=ev.incarnation,
            state=state,
            address=ev.address,
            capacity_slots=ev.capacity_slots,
            capacity_cpu_millicores=ev.capacity_cpu_millicores,
            capacity_memory_bytes=ev.capacity_memory_bytes,
            labels=ev.labels,
            kinds=ev.kinds,
            agent_version=ev.agent_version,
            incarnation_secret_sha256=ev.incarnation_secret_sha256
            or (b"" if joined else base.incarnation_secret_sha256),
            store_id=ev.store_id,
            incarnation_started_at_s=now if joined else base.incarnation_started_at_s,
            state_changed_at_s=now
            if prev is None or prev.state is not state
            else base.state_changed_at_s,
        )
        if entry is None:
            entry = NodeEntry(record=record)
            self._nodes[ev.node_id] = entry
        entry.session_id = ev.session_id
        entry.last_seq = 0
        entry.load = NodeLoad()
        entry.new_session()
        entry.dead_since_s = None
        self._detector.watch(ev.node_id, now)
        self._put_node(entry, record, out)
        if joined:
            out.notices.append(
                notices.NodeJoined(
                    node_id=ev.node_id,
                    incarnation=ev.incarnation,
                    previous_incarnation=prev.incarnation if prev is not None else "",
                    address=ev.address,
                    held_tasks=len(ev.held_tasks),
                )
            )
        elif prev is not None and prev.state in (NodeState.SUSPECT, NodeState.DEAD):
            out.notices.append(self._recovered(entry, prev.state))
        entry.unavailable_since_s = None
        self._send(
            entry,
            Welcome(
                term=self._term,
                heartbeat_interval_s=self._settings.heartbeat_interval_s,
                fence_after_s=self._settings.fence_after_s,
                dead_after_s=self._settings.dead_after_s,
                node_state=record.state,
                hello_seq=ev.hello_seq,
            ),
            out,
        )
        # A takeover moves the replaced incarnation's tasks. Without one, a task can
        # still be owned by an earlier incarnation: a leader admitted this incarnation's
        # claim and wrote the node record, then lost its lease before the tasks' move
        # was written (nodes and tasks are separate etcd transactions). The record
        # changes incarnation only on an admitted claim, so that owner is proven
        # replaced, and its tasks move now, as the takeover would have moved them.
        taken = (
            self._take_over(entry, ev.held_tasks, out, joined=joined) if prev is not None else set()
        )
        self._reconcile_held(entry, ev.held_tasks, out, taken)
        self._placement_dirty = True

    def _take_over(
        self, entry: NodeEntry, held: tuple[HeldTask, ...], out: _Out, *, joined: bool
    ) -> set[str]:
        """Move what earlier incarnations of this node own here, epoch + 1.

        Every task the node owns under an incarnation other than the registered
        one moves: such an owner was replaced through an admitted claim, so it
        is proven stopped (its DEAD or LEFT state, or the store proof of a
        restart in place), whether the claim is this Hello's or an earlier
        one whose node record reached etcd without the tasks' move (the
        leader lost its lease between the two writes). A Hello of the
        registered incarnation whose tasks are all its own moves nothing, and
        neither does one whose tasks name no owner incarnation (records written
        before incarnations were recorded: ``joined`` False). The
        tasks are requeued (an owner lost: one attempt spent) and pinned to
        this node, so the new process resumes them from its own local store
        at once.

        A task the new incarnation lists as finished at the current epoch
        stays: the stopped incarnation computed its outcome once, and the
        unacknowledged update that carries it follows the Welcome (the handler
        is never run again for it).

        Returns:
            The ids of the tasks moved (the new incarnation's Hello may list them).
        """
        finished = {
            h.task_id: h.epoch
            for h in held
            if h.status in (HeldTaskStatus.COMPLETED, HeldTaskStatus.FAILED)
        }
        moved: set[str] = set()
        for task in self._tasks.owned_by(entry.node_id):
            if task.owner_incarnation == entry.record.incarnation:
                continue
            if not joined and not task.owner_incarnation:
                continue
            if finished.get(task.task_id) == task.epoch:
                continue
            self._owner_lost(task, MoveReason.NODE_DEAD, out)
            requeued = self._tasks.get(task.task_id)
            if requeued is not None and requeued.state is TaskState.PENDING:
                self._pinned[task.task_id] = (entry.node_id, "")
            moved.add(task.task_id)
        return moved

    def _reconcile_held(
        self,
        entry: NodeEntry,
        held: tuple[HeldTask, ...],
        out: _Out,
        taken: set[str] | None = None,
    ) -> None:
        """Answer a Hello's held tasks: re-attach what it still owns, revoke what it lost.

        Tasks in ``taken`` were just moved here from a stopped incarnation:
        their Assign (epoch + 1) follows from placement, no Revoke.
        """
        node_id = entry.node_id
        listed: dict[str, HeldTask] = {}
        for h in held:
            listed[h.task_id] = h
        for task_id in sorted(listed):
            if taken and task_id in taken:
                continue
            h = listed[task_id]
            task = self._tasks.get(task_id)
            if task is None:
                self._revoke(entry, task_id, h.epoch, 0, RevokeReason.UNKNOWN_TASK, "", out)
                continue
            holder = _epoch_holder(task)
            same_owner = task.owner_incarnation in ("", entry.record.incarnation)
            if task.epoch == h.epoch and holder == node_id:
                if task.state.owned:
                    if self._revoking.get(task_id) == task.epoch:
                        continue  # revoked again below
                    if not same_owner and h.status in (
                        HeldTaskStatus.PAUSED,
                        HeldTaskStatus.RUNNING,
                    ):
                        # Another incarnation's epoch: never re-attached (DESIGN.md §4).
                        self._fence(entry, task, h.epoch, FenceSource.HELLO, out)
                        continue
                    if h.status is HeldTaskStatus.PAUSED:
                        self._send(entry, self._assign_directive(task, AssignReason.REATTACH), out)
                    continue
                if h.status in (HeldTaskStatus.COMPLETED, HeldTaskStatus.FAILED):
                    continue  # its unacked update follows; it gets DUPLICATE or is taken
            self._fence(entry, task, h.epoch, FenceSource.HELLO, out)
        for task in self._tasks.owned_by(node_id):
            held_now = listed.get(task.task_id)
            if self._revoking.get(task.task_id) == task.epoch:
                if held_now is not None and held_now.epoch == task.epoch:
                    self._revoke(
                        entry,
                        task.task_id,
                        task.epoch,
                        task.epoch,
                        RevokeReason.RELEASE_TIMEOUT,
                        "",
                        out,
                    )
                else:
                    self._stopped_after_revoke(task, out)
                continue
            if held_now is None or held_now.epoch != task.epoch:
                # It never got (or lost) the Assign of the current epoch: send it again.
                self._send(entry, self._assign_directive(task, AssignReason.REATTACH), out)
            if task.move is not None:
                self._send_release(entry, task, out)

    def _on_heartbeat(self, ev: HeartbeatReceived, out: _Out) -> None:
        entry = self._current(ev.node_id, ev.session_id)
        if entry is None:
            return
        if ev.seq <= entry.last_seq:
            reason = f"heartbeat.seq: {ev.seq} is not greater than the previous {entry.last_seq}"
            self._close_session(entry, StatusCode.INVALID_ARGUMENT, reason, out)
            return
        entry.last_seq = ev.seq
        entry.load = ev.load
        self._detector.heartbeat(ev.node_id, self._now_s)
        if entry.state is NodeState.SUSPECT:
            previous = entry.state
            self._set_state(entry, NodeTrigger.HEARTBEAT, out)
            out.notices.append(self._recovered(entry, previous))
            entry.unavailable_since_s = None
        self._send(entry, HeartbeatAck(ev.seq, self._term, entry.state), out)
        if entry.revoked:  # rare: most heartbeats follow no Revoke and skip this
            entry.prune_revoked({(p.task_id, p.epoch) for p in ev.tasks})
        if self._revoking:  # rare: a release timed out; most heartbeats skip this
            running = {(p.task_id, p.epoch) for p in ev.tasks}
            for owned in self._tasks.owned_by(ev.node_id):
                if self._revoking.get(owned.task_id) == owned.epoch and (
                    (owned.task_id, owned.epoch) not in running
                ):
                    self._stopped_after_revoke(owned, out)
        for progress in sorted(ev.tasks, key=lambda p: (p.task_id, p.epoch)):
            key = (progress.task_id, progress.epoch)
            if key in entry.revoked:
                continue
            task = self._tasks.get(progress.task_id)
            if task is None:
                self._revoke(
                    entry, progress.task_id, progress.epoch, 0, RevokeReason.UNKNOWN_TASK, "", out
                )
                continue
            if (
                task.state.owned
                and task.owner_node_id == ev.node_id
                and task.epoch == progress.epoch
            ):
                continue
            self._fence(entry, task, progress.epoch, FenceSource.TASK_UPDATE, out)

    def _on_heartbeat_digest(self, ev: HeartbeatDigest, out: _Out) -> None:
        """Each forwarded heartbeat as if stepped alone at the batch's arrival."""
        for heartbeat in ev.heartbeats:
            screened = limits.screen(heartbeat)
            if isinstance(screened, limits.Refusal):
                self._refuse_at_intake(heartbeat, screened.message, out)
            elif isinstance(screened, HeartbeatReceived):
                self._on_heartbeat(screened, out)

    def _on_session_closed(self, ev: SessionClosed, out: _Out) -> None:
        entry = self._current(ev.node_id, ev.session_id)
        if entry is None:
            return  # a stream we already replaced or closed
        self._lose_session(entry, out)

    def _on_goodbye(self, ev: GoodbyeReceived, out: _Out) -> None:
        entry = self._current(ev.node_id, ev.session_id)
        if entry is None:
            return
        entry.session_id = ""
        if entry.unavailable_since_s is None:
            entry.unavailable_since_s = self._now_s
        self._set_state(entry, NodeTrigger.LEFT, out)
        self._detector.forget(ev.node_id)
        owned = self._tasks.owned_by(ev.node_id)
        for task in owned:
            self._owner_lost(task, MoveReason.NODE_DEAD, out)
        out.notices.append(
            notices.NodeLeft(ev.node_id, entry.record.incarnation, ev.reason, len(owned))
        )

    def _close_session(self, entry: NodeEntry, code: StatusCode, reason: str, out: _Out) -> None:
        """Close the node's current Session on our own initiative (bad input)."""
        out.sends.append(CloseSession(entry.node_id, entry.session_id, code, reason))
        self._lose_session(entry, out)

    def _lose_session(self, entry: NodeEntry, out: _Out) -> None:
        """The node's current Session is gone: SUSPECT at once if it was live."""
        entry.session_id = ""
        if entry.state in _LIVE:
            self._suspect(entry, SuspicionReason.STREAM_CLOSED, 0.0, out)

    # ------------------------------------------------------------------
    # Time: verdicts, the guard, moving tasks, deadlines, release timeouts.
    # ------------------------------------------------------------------

    def _on_tick(self, ev: Tick, out: _Out) -> None:
        now = self._now_s
        if now >= self._grace_until_s:
            self._judging = True
            newly_dead: list[tuple[NodeEntry, Verdict]] = []
            detector = self._detector
            alive_within = detector.alive_within_s
            # With a detector that judges ALIVE every node heard within
            # alive_within_s, no verdict can change before the oldest last-heard
            # time plus that bound; heartbeats and new Sessions only move it
            # later. So a tick before it skips the scan (one per node per tick
            # was the leader's largest cost with thousands of nodes attached).
            scan = alive_within is None or now >= self._next_judgement_s
            # A node watched from now on is due no earlier than now + the bound.
            next_judgement = now + alive_within if alive_within is not None else now
            for node_id in sorted(self._nodes) if scan else ():
                entry = self._nodes[node_id]
                if entry.state in _GONE:
                    continue
                if alive_within is not None:
                    last = detector.last_heard_s(node_id)
                    if last is not None and now - last <= alive_within:
                        # Judged ALIVE, and an ALIVE verdict changes nothing here.
                        next_judgement = min(next_judgement, last + alive_within)
                        continue
                    next_judgement = now  # SUSPECT or DEAD: judge again next tick
                verdict = detector.judge(node_id, now)
                if verdict.liveness is Liveness.DEAD:
                    self._declare_dead(entry, out)
                    newly_dead.append((entry, verdict))
                elif verdict.liveness is Liveness.SUSPECT and entry.state in _LIVE:
                    reason = verdict.reason or SuspicionReason.HEARTBEAT_TIMEOUT
                    self._suspect(entry, reason, verdict.phi, out)
            if scan:
                self._next_judgement_s = next_judgement
            status = self._evaluate_guard(now)
            for entry, verdict in newly_dead:
                to_move = 0 if status.active else len(self._tasks.owned_by(entry.node_id))
                out.notices.append(
                    notices.NodeDead(
                        node_id=entry.node_id,
                        incarnation=entry.record.incarnation,
                        last_heartbeat_at_s=self._detector.last_heard_s(entry.node_id),
                        detection_s=verdict.silent_s,
                        tasks_to_move=to_move,
                    )
                )
            if status.changed:
                out.notices.append(
                    notices.MassFailureGuardChanged(
                        active=status.active,
                        dead_nodes=status.dead_nodes,
                        total_nodes=status.total_nodes,
                        threshold_ratio=self._guard.threshold_ratio,
                    )
                )
            if not status.active:
                self._move_tasks_of_gone_nodes(out)
            self._expire_releases(out)
        self._expire_deadlines(out)
        self._flush_progress(out)
        self._retire(out)

    def _evaluate_guard(self, now: float) -> GuardStatus:
        """The mass-failure guard's status at ``now``, evaluated only when it can change.

        Inactive, it can engage only when a node's state changes or nodes come
        or go (time only ages DEAD nodes out of its window); active, it is
        evaluated on every tick. Its inputs are the unhealthy nodes, with the
        healthy ones as a count.
        """
        if not self._guard_dirty and not self._guard.active:
            return _GUARD_QUIET
        self._guard_dirty = False
        failing = [self._nodes[node_id] for node_id in self._unhealthy]
        return self._guard.evaluate(
            (GuardInput(e.node_id, e.state, e.dead_since_s) for e in failing),
            now,
            healthy=len(self._nodes) - len(failing),
        )

    def _on_resign_requested(self, ev: ResignRequested, out: _Out) -> None:
        self._flush_progress(out, now=True)

    def _flush_progress(self, out: _Out, *, now: bool = False) -> None:
        """Write the progress held back by ``_put_task(..., defer=True)``: all of it, at once.

        Due on the first tick ``progress_flush_interval_s`` after the oldest
        unwritten record, so a record waits at most that plus a tick, and etcd
        sees at most one such write per interval (``batched`` splits it only
        past ``MAX_TXN_OPS``); with ``now`` (before a resign), at once. Each
        task's newest in-memory record is written.
        """
        if not self._unflushed:
            return
        if not now and self._now_s < (
            self._unflushed_since_s + self._settings.progress_flush_interval_s
        ):
            return
        for task_id in sorted(self._unflushed):
            task = self._tasks.get(task_id)
            if task is not None:
                out.tasks[task_id] = task
        self._unflushed = set()
        self._unflushed_since_s = math.inf

    def _retire(self, out: _Out) -> None:
        """Retention: forget terminal tasks, and DEAD or LEFT nodes, older than ``retention_s``.

        They leave etcd for the Redis archive (``RetireRecords``), at most
        ``MAX_RETIRE`` of each per tick, so etcd holds live state only. A DEAD
        node is a crashed process that never came back (a pod scaled away, a
        DaemonSet pod re-created under a new name): kept, such records would
        pile up in etcd and in the leader for the cluster's life. A gone node
        is retired only once it owns no task and the mass-failure guard is
        inactive (its DEAD verdict may count toward an episode); otherwise it
        is looked at again a retention period later. Retiring is safe for
        fencing: task epochs live in the task records, and the node id coming
        back is judged as a new node (``ClaimKind.NEW_NODE``), as after a
        DEAD or LEFT record (``HOLDER_GONE``) with no task to take over.
        """
        horizon = self._now_s - self._settings.retention_s
        heap = self._retire_tasks
        while heap and heap[0][0] <= horizon and len(out.retired_tasks) < MAX_RETIRE:
            _, task_id = heapq.heappop(heap)
            task = self._tasks.get(task_id)
            if task is None or not task.state.terminal or task_id in out.tasks:
                continue
            finished = task.finished_at_s if task.finished_at_s is not None else -math.inf
            if finished > horizon:  # finished again later (a stale entry)
                heapq.heappush(heap, (finished, task_id))
                continue
            out.retired_tasks.append(self._tasks.remove(task_id))
            for node_id, epoch in self._unseen_revokes.pop(task_id, ()):
                revoked_on = self._nodes.get(node_id)
                if revoked_on is not None:
                    revoked_on.forget_revoked((task_id, epoch))
        nodes = self._retire_nodes
        while nodes and nodes[0][0] <= horizon and len(out.retired_nodes) < MAX_RETIRE:
            _, node_id = heapq.heappop(nodes)
            entry = self._nodes.get(node_id)
            if entry is None or entry.state not in _GONE or entry.connected:
                continue  # back (pushed again if it goes again), or already retired
            changed = entry.record.state_changed_at_s
            if changed is not None and changed > horizon:
                heapq.heappush(nodes, (changed, node_id))
                continue
            if self._retirement_blocked(entry, out):
                heapq.heappush(nodes, (self._now_s, node_id))  # again a retention period later
                continue
            del self._nodes[node_id]
            # Its recovery, if a task of it still waits (unplaced for a retention
            # period), ends untold: the id coming back is a new node.
            self._recoveries.pop(node_id, None)
            self._unhealthy.discard(node_id)
            self._guard_dirty = True
            self._detector.forget(node_id)
            out.retired_nodes.append(entry.record)

    def _retirement_blocked(self, entry: NodeEntry, out: _Out) -> bool:
        """Whether a DEAD or LEFT node past the horizon must stay for now: it is
        written this step, it owns a task (the record of the owner a task's
        fencing names), or it is DEAD while the mass-failure guard is active
        (its verdict may belong to the episode that keeps the guard engaged)."""
        return (
            entry.node_id in out.nodes
            or bool(self._tasks.owned_by(entry.node_id))
            or (entry.state is NodeState.DEAD and self._guard.active)
        )

    def _declare_dead(self, entry: NodeEntry, out: _Out) -> None:
        if entry.connected:
            silent = self._now_s - (self._detector.last_heard_s(entry.node_id) or self._now_s)
            out.sends.append(
                CloseSession(
                    entry.node_id,
                    entry.session_id,
                    StatusCode.ABORTED,
                    f"declared DEAD after {silent:.3f} s without a heartbeat; say Hello again",
                )
            )
            entry.session_id = ""
        if entry.unavailable_since_s is None:
            entry.unavailable_since_s = self._detector.last_heard_s(entry.node_id)
        entry.dead_since_s = self._now_s
        self._set_state(entry, NodeTrigger.DECLARED_DEAD, out)

    def _suspect(self, entry: NodeEntry, reason: SuspicionReason, phi: float, out: _Out) -> None:
        self._set_state(entry, NodeTrigger.SUSPECTED, out)
        if entry.unavailable_since_s is None:
            entry.unavailable_since_s = self._now_s
        out.notices.append(
            notices.NodeSuspected(
                node_id=entry.node_id,
                incarnation=entry.record.incarnation,
                reason=reason,
                last_heartbeat_at_s=self._detector.last_heard_s(entry.node_id),
                phi=phi,
            )
        )

    def _move_tasks_of_gone_nodes(self, out: _Out) -> None:
        for node_id in self._tasks.owners():
            entry = self._nodes.get(node_id)
            if entry is not None and entry.state not in _GONE:
                continue
            owned = self._tasks.owned_by(node_id)
            recovery = self._recoveries.get(node_id)
            if recovery is None:
                dead_at = entry.dead_since_s if entry is not None else None
                heard = self._detector.last_heard_s(node_id)
                recovery = _Recovery(
                    incarnation=entry.record.incarnation if entry is not None else "",
                    started_s=dead_at if dead_at is not None else self._now_s,
                    detection_s=(dead_at - heard)
                    if dead_at is not None and heard is not None
                    else 0.0,
                )
                self._recoveries[node_id] = recovery
            heard_s = self._detector.last_heard_s(node_id)
            for task in owned:
                recovery.waiting.add(task.task_id)
                came_from = self._recovering.setdefault(task.task_id, [])
                if node_id not in came_from:
                    came_from.append(node_id)
                if heard_s is not None:
                    self._last_heard[task.task_id] = heard_s
                self._owner_lost(task, MoveReason.NODE_DEAD, out)
            self._recovery_progress(node_id, out)

    def _recovery_progress(self, node_id: str, out: _Out) -> None:
        """Emit RecoveryCompleted once no task of the gone node waits any longer."""
        recovery = self._recoveries.get(node_id)
        if recovery is None or recovery.waiting:
            return
        del self._recoveries[node_id]
        out.notices.append(
            notices.RecoveryCompleted(
                node_id=node_id,
                incarnation=recovery.incarnation,
                tasks_recovered=recovery.recovered,
                tasks_failed=recovery.failed,
                detection_s=recovery.detection_s,
                recovery_s=self._now_s - recovery.started_s,
            )
        )

    def _recovery_task_done(self, task_id: str, running: bool, out: _Out) -> None:
        """A task of a recovery runs on a new owner (``running``) or has ended.

        It counts for every gone node it was moved off since it last ran.
        """
        for node_id in self._recovering.pop(task_id, ()):
            recovery = self._recoveries.get(node_id)
            if recovery is None or task_id not in recovery.waiting:
                continue
            recovery.waiting.discard(task_id)
            if running:
                recovery.recovered += 1
            else:
                recovery.failed += 1
            self._recovery_progress(node_id, out)

    def _expire_releases(self, out: _Out) -> None:
        now = self._now_s
        for task in self._tasks.moving():
            move = task.move
            if move is None or now < move.release_deadline_s:
                continue
            if self._revoking.get(task.task_id) == task.epoch:
                continue
            entry = self._nodes[task.owner_node_id]
            if not entry.connected:
                continue  # revoked when it says Hello again (or moved when DEAD)
            # The owner is told to stop; the task moves once the owner shows it
            # stopped, so two live owners never run it at once.
            self._revoking[task.task_id] = task.epoch
            self._revoke(
                entry,
                task.task_id,
                task.epoch,
                task.epoch,
                RevokeReason.RELEASE_TIMEOUT,
                "",
                out,
                held=False,
                message="not released in time; it will resume elsewhere",
            )

    def _stopped_after_revoke(self, task: TaskRecord, out: _Out) -> None:
        """The owner of a task whose release timed out has stopped it: move it."""
        self._revoking.pop(task.task_id, None)
        self._requeue_task(task, TaskTrigger.RELEASE, MoveReason.RELEASE_TIMEOUT, out)

    def _expire_deadlines(self, out: _Out) -> None:
        for task in self._tasks.deadlines_due(self._now_s):
            owner = task.owner_node_id
            if task.state.owned:
                entry = self._nodes[owner]
                if entry.connected:
                    self._revoke(
                        entry,
                        task.task_id,
                        task.epoch,
                        task.epoch,
                        RevokeReason.DEADLINE_EXCEEDED,
                        "",
                        out,
                        held=False,
                    )
            error = TaskError(
                code=TaskErrorCode.DEADLINE_EXCEEDED,
                message="the task's deadline passed",
                epoch=task.epoch,
                attempt=task.attempt,
            )
            self._finish(task, TaskTrigger.EXPIRE, TaskState.FAILED, out, last_error=error)
            out.notices.append(notices.TaskFailed(task.task_id, owner, task.epoch, error, False))

    # ------------------------------------------------------------------
    # Task intake and updates.
    # ------------------------------------------------------------------

    def _on_task_submitted(self, ev: TaskSubmitted, out: _Out) -> None:
        def refuse(status: StatusCode, message: str) -> None:
            out.sends.append(ReplyToRequest(ev.request_id, status, message))

        if not ev.request_id or len(ev.request_id.encode()) > MAX_ID_BYTES:
            refuse(StatusCode.INVALID_ARGUMENT, f"request_id: must be 1..{MAX_ID_BYTES} bytes")
            return
        existing = self._tasks.by_request(ev.request_id)
        if existing is not None:
            if (
                existing.spec == ev.spec
                and ev.task_id in ("", existing.task_id)
                and ev.forked_from_ref == existing.forked_from_ref
            ):
                out.sends.append(
                    ReplyToRequest(ev.request_id, StatusCode.OK, task_id=existing.task_id)
                )
            else:
                refuse(StatusCode.ALREADY_EXISTS, "request_id: reused with a different request")
            return
        spec = ev.spec
        problem = ""
        if ev.task_id and (
            len(ev.task_id.encode()) > MAX_ID_BYTES
            or any(ord(ch) < 0x21 or ord(ch) == 0x7F or ch == "/" for ch in ev.task_id)
        ):
            problem = (
                f"task_id: must be 1..{MAX_ID_BYTES} bytes without spaces, control "
                "characters or '/'"
            )
        elif len(spec.payload) > MAX_SPEC_PAYLOAD_BYTES:
            problem = (
                f"spec.payload: {len(spec.payload)} bytes, over the limit of "
                f"{MAX_SPEC_PAYLOAD_BYTES} (store large inputs elsewhere and pass a reference)"
            )
        elif not spec.kind or len(spec.kind.encode()) > MAX_ID_BYTES:
            problem = f"spec.kind: must be 1..{MAX_ID_BYTES} bytes"
        elif spec.slots < 0:
            problem = "spec.slots: must be >= 0"
        elif spec.max_attempts < 0:
            problem = "spec.max_attempts: must be >= 0"
        elif spec.deadline_s is not None and not spec.deadline_s > self._now_s:
            problem = "spec.deadline_unix_ms: is in the past"
        if problem:
            refuse(StatusCode.INVALID_ARGUMENT, problem)
            return
        if ev.task_id in self._tasks:
            refuse(StatusCode.ALREADY_EXISTS, f"task_id: {ev.task_id!r} is taken")
            return
        task_id = ev.task_id or self._new_task_id()
        now = self._now_s
        task = TaskRecord(
            task_id=task_id,
            request_id=ev.request_id,
            spec=spec,
            submitted_at_s=now,
            updated_at_s=now,
            written_term=self._term,
            forked_from_ref=ev.forked_from_ref,
        )
        self._tasks.insert(task)
        out.tasks[task_id] = task
        if ev.fork_seed:
            # Written only now that the fork is accepted and its id taken (after
            # the persist); placed only once ForkSeeded says the seed is in Redis.
            self._unseeded.add(task_id)
            out.seeds.append(SeedFork(self._term, task_id, ev.fork_seed))
        self._placement_dirty = True
        out.notices.append(notices.TaskSubmitted(task_id, spec.kind, ev.request_id))
        if ev.forked_from_ref:
            out.notices.append(notices.TaskForked(task_id, ev.forked_from_ref, ev.fork_edits))
        out.sends.append(
            ReplyToRequest(ev.request_id, StatusCode.OK, task_id=task_id, created=True)
        )

    def _new_task_id(self) -> str:
        while True:
            task_id = f"task-{self._rng.getrandbits(64):016x}"
            if task_id not in self._tasks:
                return task_id

    def _on_task_update(self, ev: TaskUpdateReceived, out: _Out) -> None:
        entry = self._current(ev.node_id, ev.session_id)
        if entry is None:
            return  # from a Session already closed: nobody to answer
        task = self._tasks.get(ev.task_id)

        def ack(outcome: UpdateOutcome, message: str = "") -> None:
            current = task.epoch if task is not None else 0
            self._send(
                entry,
                TaskUpdateAck(ev.update_seq, ev.task_id, ev.epoch, outcome, current, message),
                out,
            )

        if task is None:
            ack(UpdateOutcome.UNKNOWN_TASK, f"no task {ev.task_id!r}")
            self._revoke(entry, ev.task_id, ev.epoch, 0, RevokeReason.UNKNOWN_TASK, "", out)
            return
        if ev.epoch < 1 or ev.epoch > task.epoch:
            ack(UpdateOutcome.REJECTED, f"epoch {ev.epoch} was never assigned")
            return
        holder = _epoch_holder(task)
        change = ev.change
        if ev.epoch < task.epoch or holder != ev.node_id:
            ack(UpdateOutcome.STALE_EPOCH, f"task is at epoch {task.epoch} on {holder!r}")
            self._fence(entry, task, ev.epoch, FenceSource.TASK_UPDATE, out)
            return
        # The update comes from the node that holds (or last held) the current epoch.
        if task.state.owned:
            ack(*self._apply_change(task, change, out))
            return
        if task.state is TaskState.PENDING:
            if isinstance(change, Completed):
                self._complete(task, change, out)
                ack(UpdateOutcome.ACCEPTED)
            elif isinstance(change, Released):
                ack(UpdateOutcome.DUPLICATE)
            else:
                ack(UpdateOutcome.STALE_EPOCH, "the task was taken from this node")
                self._fence(entry, task, ev.epoch, FenceSource.TASK_UPDATE, out)
            return
        if (task.state is TaskState.COMPLETED and isinstance(change, Completed)) or (
            task.state is TaskState.FAILED and isinstance(change, Failed)
        ):
            ack(UpdateOutcome.DUPLICATE)
            return
        ack(UpdateOutcome.REJECTED, f"task is {task.state.name}")
        reason = (
            RevokeReason.CANCELLED if task.state is TaskState.CANCELLED else RevokeReason.FINISHED
        )
        self._revoke(entry, task.task_id, ev.epoch, task.epoch, reason, "", out)

    def _apply_change(self, task: TaskRecord, change: Any, out: _Out) -> tuple[UpdateOutcome, str]:
        """Apply a change reported by the task's owner at its current epoch."""
        now = self._now_s
        node_id = task.owner_node_id
        if isinstance(change, Started):
            if task.state is TaskState.RUNNING:
                return UpdateOutcome.DUPLICATE, ""
            started = task.started_at_s if task.started_at_s is not None else now
            self._put_task(
                TaskTrigger.START, replace(task, state=TaskState.RUNNING, started_at_s=started), out
            )
            self._recovery_task_done(task.task_id, True, out)
            interrupted_at = self._interrupted_at.pop(task.task_id, None)
            heard = self._last_heard.pop(task.task_id, None)
            point = change.resume_point_s
            redone_s = 0.0
            if heard is not None:
                redone_s = max(0.0, heard - (point if point is not None else heard))
                if point is None and task.started_at_s is not None:
                    redone_s = max(0.0, heard - task.started_at_s)  # started from scratch
            rep = task.last_replicated_checkpoint
            resumed_seq = change.resumed_from.seq if change.resumed_from is not None else 0
            redone = rep.seq - resumed_seq if rep is not None and rep.seq > resumed_seq else 0
            if change.resumed_from is not None or redone or change.replayed_journal_events:
                out.notices.append(
                    notices.TaskResumed(
                        task.task_id,
                        node_id,
                        task.epoch,
                        resumed_seq,
                        from_redis=change.from_redis,
                        replayed_journal_events=change.replayed_journal_events,
                        redone_checkpoints=redone,
                        interruption_s=now - interrupted_at if interrupted_at is not None else 0.0,
                        work_redone_s=redone_s,
                    )
                )
            else:
                out.notices.append(
                    notices.TaskStarted(task.task_id, node_id, task.epoch, task.attempt)
                )
            return UpdateOutcome.ACCEPTED, ""
        if isinstance(change, Checkpointed):
            ckpt = change.checkpoint
            if ckpt.epoch > task.epoch or ckpt.seq < 1:
                return UpdateOutcome.REJECTED, "checkpoint.epoch or checkpoint.seq out of range"
            last = task.last_checkpoint
            newer = last is None or ckpt.seq > last.seq
            rep = task.last_replicated_checkpoint
            newer_rep = ckpt.replicated and (rep is None or ckpt.seq > rep.seq)
            journal = max(task.last_replicated_journal_seq, change.replicated_journal_seq)
            if task.state is TaskState.ASSIGNED:
                self._recovery_task_done(task.task_id, True, out)
            if (
                not (newer or newer_rep)
                and journal == task.last_replicated_journal_seq
                and task.state is TaskState.RUNNING
            ):
                return UpdateOutcome.DUPLICATE, ""
            # Progress of a task already RUNNING is written with the next flush
            # (see _flush_progress). Written now: ASSIGNED -> RUNNING (a state
            # change), and a record's first checkpoint or first replicated one
            # (from no evidence to some: what a DATA_LOSS check and readers of
            # etcd tell apart; once per task).
            progress_only = (
                task.state is TaskState.RUNNING
                and last is not None
                and (rep is not None or not newer_rep)
            )
            self._put_task(
                TaskTrigger.CHECKPOINT,
                replace(
                    task,
                    state=TaskState.RUNNING,
                    started_at_s=task.started_at_s if task.started_at_s is not None else now,
                    last_checkpoint=ckpt if newer else last,
                    last_replicated_checkpoint=ckpt if newer_rep else rep,
                    last_replicated_journal_seq=journal,
                ),
                out,
                defer=progress_only,
            )
            return UpdateOutcome.ACCEPTED, ""
        if isinstance(change, Completed):
            self._complete(task, change, out)
            return UpdateOutcome.ACCEPTED, ""
        if isinstance(change, Failed):
            error = change.error
            retry = (
                error.retryable
                and task.attempt < self._max_attempts(task)
                and not self._past_deadline(task)
            )
            out.notices.append(
                notices.TaskFailed(task.task_id, node_id, task.epoch, error, will_retry=retry)
            )
            if retry:
                self._requeue_task(task, TaskTrigger.RETRY, None, out, last_error=error)
            else:
                self._finish(task, TaskTrigger.FAIL, TaskState.FAILED, out, last_error=error)
            return UpdateOutcome.ACCEPTED, ""
        if isinstance(change, Released):
            final = change.checkpoint
            rep = task.last_replicated_checkpoint
            newer_rep = (
                final is not None
                and final.epoch <= task.epoch
                and (rep is None or final.seq > rep.seq)
            )
            released = replace(
                task,
                last_replicated_checkpoint=final if newer_rep else rep,
                last_replicated_journal_seq=max(
                    task.last_replicated_journal_seq, change.journal_seq
                ),
            )
            reason = task.move.reason if task.move is not None else MoveReason.DRAIN
            self._requeue_task(released, TaskTrigger.RELEASE, reason, out)
            return UpdateOutcome.ACCEPTED, ""
        raise UsageError(f"unknown task change {type(change).__name__}")

    def _on_lineage(self, ev: LineageReported, out: _Out) -> None:
        """A fenced owner kept divergent progress as a fork: report the conflict, ack."""
        entry = self._current(ev.node_id, ev.session_id)
        if entry is None:
            return
        task = self._tasks.get(ev.task_id)
        stale = task is not None and (ev.epoch < task.epoch or _epoch_holder(task) != ev.node_id)
        if task is not None and stale and (ev.divergent_checkpoints or ev.divergent_events):
            out.notices.append(
                notices.ConflictDetected(
                    fork_id=ev.fork_id,
                    task_id=ev.task_id,
                    node_id=ev.node_id,
                    stale_epoch=ev.epoch,
                    current_epoch=task.epoch,
                    current_owner_node_id=task.owner_node_id,
                    divergent_checkpoints=ev.divergent_checkpoints,
                    divergent_events=ev.divergent_events,
                    first_journal_seq=ev.first_journal_seq,
                    last_journal_seq=ev.last_journal_seq,
                    head_checkpoint_seq=ev.head_checkpoint_seq,
                )
            )
        self._send(entry, LineageAck(ev.fork_id, ev.task_id, ev.epoch), out)

    def _on_fork_seeded(self, ev: ForkSeeded, out: _Out) -> None:
        """The seed of a forked task is in Redis (place it), or could not be written (fail it)."""
        task = self._tasks.get(ev.task_id)
        if ev.task_id not in self._unseeded or task is None:
            return
        self._unseeded.discard(ev.task_id)
        if task.state is not TaskState.PENDING:
            return
        if ev.ok:
            # Recorded so that a new leader knows the seed exists (see _fail_unseeded_forks).
            self._put_task(
                TaskTrigger.ANNOTATE, replace(task, last_replicated_checkpoint=ev.checkpoint), out
            )
            self._placement_dirty = True
            return
        error = TaskError(
            code=TaskErrorCode.RESTORE_FAILED,
            message=f"the fork's seed checkpoint could not be written: {ev.reason}",
            retryable=False,
        )
        self._finish(task, TaskTrigger.EXPIRE, TaskState.FAILED, out, last_error=error)
        out.notices.append(notices.TaskFailed(task.task_id, "", 0, error, False))

    def _fail_unseeded_forks(self, out: _Out) -> None:
        """Forks a previous leader accepted but never saw seeded: their seed is lost; fail them."""
        for task in self._tasks.pending():
            if task.forked_from_ref and task.epoch == 0 and task.last_replicated_checkpoint is None:
                error = TaskError(
                    code=TaskErrorCode.RESTORE_FAILED,
                    message="a leader change interrupted the fork before its seed was "
                    "confirmed; fork again with a new request id",
                    retryable=False,
                )
                self._finish(task, TaskTrigger.EXPIRE, TaskState.FAILED, out, last_error=error)
                out.notices.append(notices.TaskFailed(task.task_id, "", 0, error, False))

    def _complete(self, task: TaskRecord, change: Completed, out: _Out) -> None:
        holder = _epoch_holder(task)
        self._finish(task, TaskTrigger.COMPLETE, TaskState.COMPLETED, out, result=change.result)
        size = change.result.size_bytes or len(change.result.payload)
        submitted = task.submitted_at_s if task.submitted_at_s is not None else self._now_s
        out.notices.append(
            notices.TaskCompleted(
                task.task_id, holder, task.epoch, task.attempt, size, self._now_s - submitted
            )
        )

    # ------------------------------------------------------------------
    # Orchestrator and operator requests.
    # ------------------------------------------------------------------

    def _on_cancel(self, ev: CancelRequested, out: _Out) -> None:
        task = self._tasks.get(ev.task_id)
        if task is None:
            out.sends.append(
                ReplyToRequest(
                    ev.request_id, StatusCode.NOT_FOUND, f"task_id: no task {ev.task_id!r}"
                )
            )
            return
        if task.state is TaskState.CANCELLED:
            out.sends.append(ReplyToRequest(ev.request_id, StatusCode.OK, task_id=task.task_id))
            return
        if task.state.terminal:
            out.sends.append(
                ReplyToRequest(
                    ev.request_id,
                    StatusCode.FAILED_PRECONDITION,
                    f"task is already {task.state.name}",
                    task_id=task.task_id,
                )
            )
            return
        owner = task.owner_node_id
        if task.state.owned:
            entry = self._nodes[owner]
            if entry.connected:
                self._revoke(
                    entry,
                    task.task_id,
                    task.epoch,
                    task.epoch,
                    RevokeReason.CANCELLED,
                    "",
                    out,
                    held=False,
                )
        self._finish(task, TaskTrigger.CANCEL, TaskState.CANCELLED, out, cancel_reason=ev.reason)
        out.notices.append(notices.TaskCancelled(task.task_id, owner, ev.reason))
        out.sends.append(ReplyToRequest(ev.request_id, StatusCode.OK, task_id=task.task_id))

    def _on_drain(self, ev: DrainRequested, out: _Out) -> None:
        entry = self._nodes.get(ev.node_id)
        reply = out.sends.append
        if entry is None:
            reply(
                ReplyToRequest(
                    ev.request_id, StatusCode.NOT_FOUND, f"node_id: no node {ev.node_id!r}"
                )
            )
            return
        timeout = (
            ev.release_timeout_s
            if ev.release_timeout_s is not None
            else self._settings.release_timeout_s
        )
        if not (math.isfinite(timeout) and timeout > 0):
            reply(
                ReplyToRequest(
                    ev.request_id, StatusCode.INVALID_ARGUMENT, "release_timeout_ms: must be > 0"
                )
            )
            return
        if entry.state in _GONE:
            reply(
                ReplyToRequest(
                    ev.request_id,
                    StatusCode.FAILED_PRECONDITION,
                    f"node is {entry.state.name}",
                    node_id=ev.node_id,
                )
            )
            return
        owned = self._tasks.owned_by(ev.node_id)
        if entry.record.cordoned:
            moving = sum(1 for t in owned if t.move is not None)
            reply(
                ReplyToRequest(
                    ev.request_id, StatusCode.OK, node_id=ev.node_id, tasks_to_move=moving
                )
            )
            return
        now = self._now_s
        drain_id = ev.request_id
        record = replace(entry.record, cordoned=True, drain_id=drain_id, drain_reason=ev.reason)
        record = replace(
            record, state=next_node_state(record.state, NodeTrigger.CORDONED, cordoned=True)
        )
        self._put_node(entry, self._stamp_state(entry.record, record), out)
        if entry.connected:
            self._send(entry, Drain(drain_id, ev.reason), out)
        for task in owned:
            move = TaskMove(
                move_id=f"{drain_id}/{task.task_id}",
                reason=MoveReason.DRAIN,
                requested_at_s=now,
                release_deadline_s=now + timeout,
            )
            moved = self._put_task(TaskTrigger.ANNOTATE, replace(task, move=move), out)
            if entry.connected:
                self._send_release(entry, moved, out)
        out.notices.append(notices.NodeDraining(ev.node_id, drain_id, ev.reason, len(owned)))
        reply(
            ReplyToRequest(
                ev.request_id, StatusCode.OK, node_id=ev.node_id, tasks_to_move=len(owned)
            )
        )

    def _on_uncordon(self, ev: UncordonRequested, out: _Out) -> None:
        entry = self._nodes.get(ev.node_id)
        if entry is None:
            out.sends.append(
                ReplyToRequest(
                    ev.request_id, StatusCode.NOT_FOUND, f"node_id: no node {ev.node_id!r}"
                )
            )
            return
        if entry.record.cordoned:
            record = replace(entry.record, cordoned=False, drain_reason="")
            record = replace(
                record, state=next_node_state(record.state, NodeTrigger.UNCORDONED, cordoned=False)
            )
            self._put_node(entry, self._stamp_state(entry.record, record), out)
            if entry.connected:
                self._send(entry, Drain(record.drain_id, cancelled=True), out)
            for task in self._tasks.owned_by(ev.node_id):
                if task.move is not None:
                    self._put_task(TaskTrigger.ANNOTATE, replace(task, move=None), out)
            out.notices.append(notices.NodeUncordoned(ev.node_id, record.drain_id))
            self._placement_dirty = True
        out.sends.append(ReplyToRequest(ev.request_id, StatusCode.OK, node_id=ev.node_id))

    def _on_migrate(self, ev: MigrateRequested, out: _Out) -> None:
        """Release one owned task to its owner for a move to ``ev.target_node_id``.

        Replies NOT_FOUND (task, target node), INVALID_ARGUMENT (release
        timeout), FAILED_PRECONDITION (task not ASSIGNED / RUNNING, a move in
        progress, target not ALIVE, cordoned, disconnected, the owner, or not
        matching the task's node_selector / kind), ABORTED (``expected_epoch``
        is not the task's epoch), RESOURCE_EXHAUSTED (the target's free slots,
        counting migrations already heading there, are too few). On OK the
        task carries a MIGRATE ``TaskMove`` whose ``move_id`` is the request
        id; once the owner reports Released, the task is placed on the target
        (``_place_pinned``). A release timeout revokes it like a drain's and it
        then resumes from its newest replicated checkpoint, still on the target
        when the target can take it.
        """
        task = self._tasks.get(ev.task_id)

        def reply(status: StatusCode, message: str = "") -> None:
            out.sends.append(ReplyToRequest(ev.request_id, status, message, task_id=ev.task_id))

        if task is None:
            reply(StatusCode.NOT_FOUND, f"task_id: no task {ev.task_id!r}")
            return
        timeout = (
            ev.release_timeout_s
            if ev.release_timeout_s is not None
            else self._settings.release_timeout_s
        )
        if not (math.isfinite(timeout) and timeout > 0):
            reply(StatusCode.INVALID_ARGUMENT, "release_timeout_ms: must be > 0")
            return
        if not task.state.owned:
            reply(
                StatusCode.FAILED_PRECONDITION,
                f"task is {task.state.name}, not ASSIGNED or RUNNING",
            )
            return
        if ev.expected_epoch is not None and ev.expected_epoch != task.epoch:
            reply(
                StatusCode.ABORTED,
                f"expected_epoch: the task is at epoch {task.epoch}, not {ev.expected_epoch}",
            )
            return
        if task.move is not None:
            reply(
                StatusCode.FAILED_PRECONDITION,
                f"a move is already in progress (move_id {task.move.move_id!r})",
            )
            return
        owner = task.owner_node_id
        target_id = ev.target_node_id
        if target_id:
            target = self._nodes.get(target_id)
            if target is None:
                reply(StatusCode.NOT_FOUND, f"target_node_id: no node {target_id!r}")
                return
            problem = ""
            if target_id == owner:
                problem = "is the task's current owner"
            elif target.state is not NodeState.ALIVE:
                problem = f"is {target.state.name}, not ALIVE"
            elif target.record.cordoned:
                problem = "is cordoned"
            elif not target.connected:
                problem = "has no open Session"
            elif not labels_match(target.record.labels, task.spec.node_selector):
                problem = "does not match spec.node_selector"
            elif target.record.kinds and task.spec.kind not in target.record.kinds:
                problem = f"does not run kind {task.spec.kind!r}"
            if problem:
                reply(StatusCode.FAILED_PRECONDITION, f"target_node_id: {target_id!r} {problem}")
                return
            candidate = next(c for c in self._candidates() if c.node_id == target_id)
            free = candidate.capacity_slots - candidate.used_slots
            if not is_eligible(candidate) or free < task.spec.effective_slots:
                reply(
                    StatusCode.RESOURCE_EXHAUSTED,
                    f"target_node_id: {target_id!r} has {max(0, free)} free slots, "
                    f"the task needs {task.spec.effective_slots}",
                )
                return
        now = self._now_s
        move = TaskMove(
            move_id=ev.request_id,
            reason=MoveReason.MIGRATE,
            requested_at_s=now,
            release_deadline_s=now + timeout,
            target_node_id=target_id,
        )
        moved = self._put_task(TaskTrigger.ANNOTATE, replace(task, move=move), out)
        entry = self._nodes[owner]
        if entry.connected:
            self._send_release(entry, moved, out)
        reply(StatusCode.OK)

    # ------------------------------------------------------------------
    # Placement.
    # ------------------------------------------------------------------

    def _place(self, out: _Out) -> None:
        if self._role is not Role.LEADER or not self._placement_dirty:
            return
        self._placement_dirty = False
        if self._pinned:
            self._place_pinned(out)
        pending = self._tasks.pending()
        if self._unseeded:
            pending = [t for t in pending if t.task_id not in self._unseeded]
        if not pending:
            return
        candidates = self._candidates()
        limit = self._settings.max_assignments_per_round
        placements = place(pending, candidates, self._rng, limit=limit)
        if len(placements) >= limit:
            self._placement_dirty = True  # the rest follow on the next step
        for placement in placements:
            task = self._tasks.get(placement.task_id)
            if task is None:
                raise InvariantViolation(f"placement chose unknown task {placement.task_id!r}")
            self._assign(task, self._nodes[placement.node_id], out)

    def _candidates(self) -> list[Candidate]:
        """Every node as placement sees it; slots of migrations heading to a node count as used."""
        incoming: dict[str, int] = {}
        for task in self._tasks.moving():
            target = task.move.target_node_id if task.move is not None else ""
            if target:
                incoming[target] = incoming.get(target, 0) + task.spec.effective_slots
        return [
            Candidate(
                node_id=entry.node_id,
                state=entry.state,
                cordoned=entry.record.cordoned,
                connected=entry.connected,
                capacity_slots=entry.record.capacity_slots,
                used_slots=sum(t.spec.effective_slots for t in self._tasks.owned_by(node_id))
                + incoming.get(node_id, 0),
                labels=entry.record.labels,
                kinds=entry.record.kinds,
            )
            for node_id, entry in sorted(self._nodes.items())
        ]

    def _place_pinned(self, out: _Out) -> None:
        """Place released migrations on their target (or off the avoided node); else unpin.

        A pin is consumed either way: a task whose target can no longer take it
        (gone, cordoned, disconnected, full) joins the ordinary placement round.
        """
        for task_id in sorted(self._pinned):
            target, avoid = self._pinned.pop(task_id)
            task = self._tasks.get(task_id)
            if task is None or task.state is not TaskState.PENDING:
                continue
            candidates = [
                c
                for c in self._candidates()
                if (c.node_id == target if target else c.node_id != avoid)
            ]
            chosen = place([task], candidates, self._rng)
            if chosen:
                self._assign(task, self._nodes[chosen[0].node_id], out)

    def _assign(self, task: TaskRecord, entry: NodeEntry, out: _Out) -> None:
        if entry.state is not NodeState.ALIVE or entry.record.cordoned or not entry.connected:
            raise InvariantViolation(
                f"assigning {task.task_id!r} to {entry.node_id!r} in state {entry.state.name}"
            )
        reason, move_reason, from_node = self._requeue.pop(task.task_id, _derived_reason(task))
        assigned = self._put_task(
            TaskTrigger.ASSIGN,
            replace(
                task,
                state=TaskState.ASSIGNED,
                epoch=task.epoch + 1,
                owner_node_id=entry.node_id,
                owner_incarnation=entry.record.incarnation,
                assigned_at_s=self._now_s,
                move=None,
            ),
            out,
        )
        if reason is AssignReason.MOVED:
            rep = assigned.last_replicated_checkpoint
            out.notices.append(
                notices.TaskReassigned(
                    task_id=assigned.task_id,
                    from_node_id=from_node,
                    to_node_id=entry.node_id,
                    epoch=assigned.epoch,
                    attempt=assigned.attempt,
                    reason=move_reason or MoveReason.NODE_DEAD,
                    resume_seq=rep.seq if rep is not None else 0,
                    resume_covers_journal_seq=rep.covers_journal_seq if rep is not None else 0,
                )
            )
        else:
            out.notices.append(
                notices.TaskAssigned(
                    assigned.task_id, entry.node_id, assigned.epoch, assigned.attempt
                )
            )
        directive = self._assign_directive(assigned, reason)
        if move_reason is not None or from_node:
            directive = replace(
                directive, move_reason=move_reason, previous_owner_node_id=from_node
            )
        self._send(entry, directive, out)

    def _assign_directive(self, task: TaskRecord, reason: AssignReason) -> Assign:
        return Assign(
            task_id=task.task_id,
            epoch=task.epoch,
            attempt=task.attempt,
            spec=task.spec,
            reason=reason,
            resume_from=task.last_replicated_checkpoint,
            replay_through_journal_seq=task.last_replicated_journal_seq,
        )

    # ------------------------------------------------------------------
    # Task transitions shared by the handlers.
    # ------------------------------------------------------------------

    def _max_attempts(self, task: TaskRecord) -> int:
        return task.spec.max_attempts or self._settings.default_max_attempts

    def _past_deadline(self, task: TaskRecord) -> bool:
        deadline = task.spec.deadline_s
        return deadline is not None and self._now_s >= deadline

    def _owner_lost(self, task: TaskRecord, reason: MoveReason, out: _Out) -> None:
        """The owner of an ASSIGNED / RUNNING task is gone: requeue it or fail it."""
        owner = task.owner_node_id
        code: TaskErrorCode | None = None
        if self._past_deadline(task):
            code = TaskErrorCode.DEADLINE_EXCEEDED
        elif task.attempt >= self._max_attempts(task):
            code = TaskErrorCode.ATTEMPTS_EXHAUSTED
        if code is None:
            self._requeue_task(task, TaskTrigger.OWNER_LOST, reason, out)
            return
        error = TaskError(
            code=code,
            message=f"owner {owner!r} lost at attempt {task.attempt}",
            retryable=False,
            node_id=owner,
            epoch=task.epoch,
            attempt=task.attempt,
        )
        self._finish(task, TaskTrigger.GIVE_UP, TaskState.FAILED, out, last_error=error)
        out.notices.append(notices.TaskFailed(task.task_id, owner, task.epoch, error, False))

    def _requeue_task(
        self,
        task: TaskRecord,
        trigger: TaskTrigger,
        move_reason: MoveReason | None,
        out: _Out,
        *,
        last_error: TaskError | None = None,
    ) -> None:
        """Send an owned task back to PENDING (owner lost, retry, or release)."""
        owner = task.owner_node_id
        self._interrupted_at.setdefault(task.task_id, self._now_s)
        self._revoking.pop(task.task_id, None)
        spends = trigger in (TaskTrigger.OWNER_LOST, TaskTrigger.RETRY)
        self._put_task(
            trigger,
            replace(
                task,
                state=TaskState.PENDING,
                attempt=task.attempt + 1 if spends else task.attempt,
                owner_node_id="",
                owner_incarnation="",
                move=None,
                last_error=last_error if last_error is not None else task.last_error,
                previous_owner_node_ids=_with_previous(task, owner),
            ),
            out,
        )
        if (
            trigger is TaskTrigger.RELEASE
            and task.move is not None
            and task.move.reason is MoveReason.MIGRATE
        ):
            self._pinned[task.task_id] = (task.move.target_node_id, owner)
        if trigger is TaskTrigger.RETRY:
            self._requeue[task.task_id] = (AssignReason.RETRY, None, owner)
        else:
            self._requeue[task.task_id] = (AssignReason.MOVED, move_reason, owner)

    def _finish(
        self,
        task: TaskRecord,
        trigger: TaskTrigger,
        state: TaskState,
        out: _Out,
        **fields: Any,
    ) -> None:
        """Move a task to a terminal state, clearing its owner."""
        owner = task.owner_node_id
        self._interrupted_at.pop(task.task_id, None)
        self._last_heard.pop(task.task_id, None)
        self._recovery_task_done(task.task_id, state is TaskState.COMPLETED, out)
        self._requeue.pop(task.task_id, None)
        self._revoking.pop(task.task_id, None)
        self._pinned.pop(task.task_id, None)
        self._unseeded.discard(task.task_id)
        self._put_task(
            trigger,
            replace(
                task,
                state=state,
                owner_node_id="",
                owner_incarnation="",
                move=None,
                finished_at_s=self._now_s,
                previous_owner_node_ids=_with_previous(task, owner),
                **fields,
            ),
            out,
        )

    def _put_task(
        self, trigger: TaskTrigger, new: TaskRecord, out: _Out, *, defer: bool = False
    ) -> TaskRecord:
        """Change a task in the table and write it to etcd (persist before send).

        With ``defer`` (progress of a RUNNING task) and a positive
        ``progress_flush_interval_s``, the write waits for ``_flush_progress``
        unless this step writes the task anyway. Any write of a task carries
        its newest record and ends its wait.
        """
        old = self._tasks.get(new.task_id)
        stamped = replace(new, updated_at_s=self._now_s, written_term=self._term)
        self._tasks.transition(trigger, stamped)
        task_id = stamped.task_id
        if defer and self._settings.progress_flush_interval_s > 0 and task_id not in out.tasks:
            if not self._unflushed:
                self._unflushed_since_s = self._now_s
            self._unflushed.add(task_id)
        else:
            out.tasks[task_id] = stamped
            self._unflushed.discard(task_id)
        if stamped.state.terminal and old is not None and not old.state.terminal:
            heapq.heappush(self._retire_tasks, (self._now_s, stamped.task_id))
        if stamped.state is TaskState.PENDING or (
            old is not None and old.state.owned and not stamped.state.owned
        ):
            self._placement_dirty = True
        return stamped

    # ------------------------------------------------------------------
    # Nodes: state changes, writes, directives.
    # ------------------------------------------------------------------

    def _current(self, node_id: str, session_id: str) -> NodeEntry | None:
        """The node if ``session_id`` is its current Session, else None (a stale message)."""
        entry = self._nodes.get(node_id)
        if entry is None or not session_id or entry.session_id != session_id:
            return None
        return entry

    def _set_state(self, entry: NodeEntry, trigger: NodeTrigger, out: _Out) -> None:
        state = next_node_state(entry.state, trigger, entry.record.cordoned)
        if state is entry.state:
            return
        self._put_node(
            entry, self._stamp_state(entry.record, replace(entry.record, state=state)), out
        )
        if state is NodeState.ALIVE:
            self._placement_dirty = True
        elif state in _GONE:
            heapq.heappush(self._retire_nodes, (self._now_s, entry.node_id))

    def _track_health(self, entry: NodeEntry) -> None:
        self._guard_dirty = True
        if entry.state in _LIVE:
            self._unhealthy.discard(entry.node_id)
        else:
            self._unhealthy.add(entry.node_id)

    def _stamp_state(self, old: NodeRecord, new: NodeRecord) -> NodeRecord:
        if new.state is old.state:
            return new
        return replace(new, state_changed_at_s=self._now_s)

    def _put_node(self, entry: NodeEntry, record: NodeRecord, out: _Out) -> None:
        last = self._detector.last_heard_s(entry.node_id)
        stamped = replace(
            record,
            last_heartbeat_at_s=last if last is not None else record.last_heartbeat_at_s,
            written_term=self._term,
        )
        entry.record = stamped
        self._track_health(entry)
        out.nodes[stamped.node_id] = stamped

    def _recovered(self, entry: NodeEntry, previous: NodeState) -> notices.NodeRecovered:
        since = entry.unavailable_since_s
        unavailable = self._now_s - since if since is not None else 0.0
        return notices.NodeRecovered(
            entry.node_id, entry.record.incarnation, previous, max(0.0, unavailable)
        )

    def _send(self, entry: NodeEntry, directive: Directive, out: _Out) -> None:
        out.sends.append(SendDirective(entry.node_id, entry.session_id, directive))

    def _send_release(self, entry: NodeEntry, task: TaskRecord, out: _Out) -> None:
        move = task.move
        if move is None:
            return
        remaining = max(0.0, move.release_deadline_s - self._now_s)
        self._send(
            entry,
            Release(
                move.move_id, task.task_id, task.epoch, move.reason, remaining, move.target_node_id
            ),
            out,
        )

    def _revoke(
        self,
        entry: NodeEntry,
        task_id: str,
        epoch: int,
        current_epoch: int,
        reason: RevokeReason,
        current_owner: str,
        out: _Out,
        *,
        held: bool = True,
        message: str = "",
    ) -> None:
        """Tell the node to drop ``task_id`` at ``epoch`` (once per Session; see
        ``NodeEntry.note_revoked`` for ``held``: False for a Revoke that may
        overtake its Assign, remembered until the task is retired)."""
        entry.note_revoked((task_id, epoch), held=held)
        if not held:
            self._unseen_revokes.setdefault(task_id, set()).add((entry.node_id, epoch))
        self._send(
            entry, Revoke(task_id, epoch, current_epoch, reason, current_owner, message), out
        )

    def _fence(
        self, entry: NodeEntry, task: TaskRecord, stale_epoch: int, source: FenceSource, out: _Out
    ) -> None:
        """A node acts on an epoch it no longer holds: Revoke it and report a zombie."""
        if task.state is TaskState.CANCELLED:
            reason = RevokeReason.CANCELLED
        elif task.state.terminal:
            reason = RevokeReason.FINISHED
        elif stale_epoch < task.epoch or _epoch_holder(task) == entry.node_id:
            reason = RevokeReason.REASSIGNED
        else:
            reason = RevokeReason.STALE_EPOCH
        self._revoke(entry, task.task_id, stale_epoch, task.epoch, reason, task.owner_node_id, out)
        out.notices.append(
            notices.ZombieFenced(
                node_id=entry.node_id,
                incarnation=entry.record.incarnation,
                task_id=task.task_id,
                stale_epoch=stale_epoch,
                current_epoch=task.epoch,
                current_owner_node_id=task.owner_node_id,
                source=source,
            )
        )

    def _advance_clock(self, now_s: float) -> None:
        if not math.isfinite(now_s):
            raise UsageError(f"now_s must be finite, got {now_s!r}")
        if now_s < self._now_s:
            raise UsageError(f"time went backwards: {now_s} < {self._now_s}")
        self._now_s = now_s


def _epoch_holder(task: TaskRecord) -> str:
    """The node that holds (or last held) the task's current epoch; "" if none ever did."""
    if task.state.owned:
        return task.owner_node_id
    if task.epoch > 0 and task.previous_owner_node_ids:
        return task.previous_owner_node_ids[-1]
    return ""


def _with_previous(task: TaskRecord, owner: str) -> tuple[str, ...]:
    if not owner:
        return task.previous_owner_node_ids
    return (*task.previous_owner_node_ids, owner)[-MAX_PREVIOUS_OWNERS:]


def _derived_reason(task: TaskRecord) -> tuple[AssignReason, MoveReason | None, str]:
    """Why a PENDING task waits, when no step of this leader recorded it (loaded from etcd)."""
    if task.epoch == 0:
        return AssignReason.NEW, None, ""
    previous = task.previous_owner_node_ids[-1] if task.previous_owner_node_ids else ""
    if task.last_error is not None and task.last_error.epoch == task.epoch:
        return AssignReason.RETRY, None, previous
    return AssignReason.MOVED, MoveReason.NODE_DEAD, previous
