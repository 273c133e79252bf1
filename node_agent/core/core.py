"""AgentCore: the node agent's decisions as one sans-IO state machine.

Theory of operation: the shell (``node_agent.agent``) owns the gRPC stream,
the task runner, the store and the clocks. It turns what happens into calls
(``on_welcome``, ``on_message``, ``on_session_closed``, ``task_*``, ``tick``)
and carries out the commands each returns, in order. Time is an input: every
call takes ``now`` (monotonic seconds) and ``wall_ms`` (Unix milliseconds, only
copied into messages). Nothing here reads a clock, a socket or a random source
(DESIGN.md §2), so the rules below are driven by unit tests step by step.

**Self-fencing** (DESIGN.md §6). The leader acks every heartbeat. Let ``s`` be
the send time of the oldest heartbeat not yet acked — or, when none is
outstanding, the time the next one was due (last acked send +
``heartbeat_interval``), so a stream that died silently or a send that never
happened counts too. By ``s + fence_after`` every task must be paused: the
leader can only declare this node DEAD at ``last received + dead_after``, and
``fence_after < dead_after`` by a margin, so the old owner has stopped before
any new owner can start. The core begins pausing at ``s + fence_after -
fence_lead`` (the pause takes a moment: the handler is cancelled and in-flight
writes finish), closes the Session, and starts or resumes nothing until a new
Welcome. Its next Hello lists the paused tasks; the leader re-attaches (Assign
REATTACH, same epoch) what it still owns here and revokes the rest.

**Directives.** Assign starts a task (or resumes a paused one at the same
epoch); a newer epoch of a task still stopping waits for the stop. Revoke stops
a task at or below the revoked epoch. A task that is over for this node
(finished, cancelled, unknown, or failed by its deadline) is forgotten once
stopped. A task that moved on (reassigned, stale epoch, a release that timed
out, a refused update, an epoch Redis refused) is DETACHED: its progress beyond
what Redis holds is reported as a lineage (``ReportLineage``) and its local
records are kept until the detach is settled (see **Forgetting a detached
task**). Release stops the task, then reports Released with its final
checkpoint so the next owner redoes nothing. NotLeader closes the Session and
names where to go.

**Forgetting a detached task.** A DETACHED task is dropped from the table and
its local records deleted (``ForgetTask``) once both hold:

- the leader confirmed the loss (a Revoke, or its refusal of our update): until
  then Hello lists it at its stale epoch so the leader revokes it and records
  the zombie (``_held_status``), and the leader may still re-attach that epoch;
- its lineage is settled: the shell found nothing beyond what Redis holds
  (``lineage_empty``), or it wrote the fork's records to Redis and the leader
  acknowledged the fork's LineageReport (``LineageAck``; agent.proto: "the
  agent may delete it locally").

Why no sooner: the local records are the only full copy of what this node did
at the stale epoch until the fork is in Redis (DESIGN.md §7: kept as a fork,
never silently dropped), and the shell reads them to build the report. A fork
that could not be written to Redis (``lineage_ready(stored=False)``) keeps them
(the agent reports it again after a restart). A revoke never needs them again:
the leader never re-assigns an epoch it revoked (a move is a higher epoch,
which resumes from Redis), and a fenced task is PAUSED, not DETACHED. After a
restart a DETACHED meta is restored as a DETACHED slot (not listed in Hello)
whose lineage is reported again, so it too ends forgotten.

**Forgetting a lineage copy.** When a task starts at a newer epoch and Redis
holds a newer lineage, the runner adopts it and the store moves this node's
divergent local rows to a lineage copy ``<task>~lineage-e<epoch>``
(``CheckpointStore.adopt``). Nothing else reports those rows: when this node's
own fork of that epoch raced the adopt (or was never due: a PAUSED task
assigned again at a newer epoch, or its fork could not be written to Redis),
the copy is their only record. The shell tells the core of each copy
(``lineage_copy_kept``: right after the adopt, and for every copy left in the
store at a restart); the core asks for it to be reported
(``ReportLineageCopy``: a ForkRecord and the records in Redis, a
LineageReport) and forgets it (``ForgetTask`` of the copy) only once the fork
is in Redis and the leader acknowledged it, by the rule above. A copy may
repeat rows a fork of the same epoch already reported (the adopt cannot tell);
a duplicate fork is noise, a dropped one is loss. A copy whose fork could not
be written to Redis is kept and reported again after a restart.

**Updates** (TaskUpdate) carry a per-incarnation ``update_seq``. Completed,
Failed and Released are kept until the leader acks them and are sent again
after a reconnect; an ack of a terminal update forgets the task locally.
Checkpointed updates are coalesced per task to one per
``progress_report_interval_s`` (``local_progress_report_interval_s`` for
``local``-durability tasks); the leader writes them to etcd in batches
(``CoreSettings.progress_flush_interval_s``).

**What the leader assumes of us** (``coordinator.core.core``): a self-fenced
agent closes its Session and starts nothing until a new Welcome; every
heartbeat lists the tasks it runs with their epochs.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .records import (
    AgentMessage,
    Assign,
    Checkpointed,
    CheckpointSummary,
    Completed,
    CoordinatorMessage,
    Drain,
    Failed,
    Heartbeat,
    HeartbeatAck,
    HeldTask,
    HeldTaskStatus,
    Hello,
    LineageAck,
    LineageReport,
    NotLeader,
    Reattach,
    Release,
    Released,
    Revoke,
    RevokeReason,
    Started,
    TaskError,
    TaskProgress,
    TaskResult,
    TaskUpdate,
    TaskUpdateAck,
    UpdateOutcome,
    Welcome,
)

__all__ = [
    "DEFAULT_LOCAL_PROGRESS_REPORT_INTERVAL_S",
    "DEFAULT_PROGRESS_REPORT_INTERVAL_S",
    "AgentCore",
    "CloseSession",
    "Command",
    "ForgetTask",
    "Notice",
    "Ownership",
    "PersistMeta",
    "PersistMetas",
    "ReportLineage",
    "ReportLineageCopy",
    "Send",
    "SessionState",
    "SlotState",
    "StartTask",
    "StopReason",
    "StopTask",
    "TaskMeta",
    "check_command_order",
    "ready_batch",
]

PROTOCOL_VERSION = 1


class StopReason(enum.Enum):
    """Why the core stops a running task."""

    FENCED = "fenced"  # no heartbeat ack in time: pause, keep, await re-attach
    REVOKED = "revoked"  # the leader took it away
    RELEASED = "released"  # graceful move (drain / migrate)
    SUPERSEDED = "superseded"  # a newer epoch of the same task was assigned here
    SHUTDOWN = "shutdown"  # the agent is stopping


class SessionState(enum.Enum):
    """Where this process stands with the leader (what may run follows from it).

    ``IDLE`` -(Welcome)-> ``OPEN`` -(Session ends, NotLeader)-> ``RECONNECTING``
    -(Welcome)-> ``OPEN``; from ``OPEN`` or ``RECONNECTING`` the fence deadline
    passing -> ``FENCED`` -(Welcome)-> ``OPEN``. Tasks may run in ``OPEN`` and
    ``RECONNECTING`` (until the fence deadline); nothing starts outside ``OPEN``.
    """

    IDLE = "idle"  # no Welcome yet in this process: nothing may run
    OPEN = "open"  # a Welcome arrived on the current Session
    RECONNECTING = "reconnecting"  # the Session ended; tasks run until the fence deadline
    FENCED = "fenced"  # paused everything at the fence; wait for a new Welcome

    @property
    def armed(self) -> bool:
        """Tasks may run: a Welcome came and no fence since."""
        return self in (SessionState.OPEN, SessionState.RECONNECTING)


class SlotState(enum.Enum):
    """A task's state on this node."""

    RUNNING = "running"  # handler started (or starting)
    STOPPING = "stopping"  # StopTask issued, TaskStopped not yet seen
    PAUSED = "paused"  # stopped by a fence or shutdown; kept, resumable at its epoch
    DONE = "done"  # completed / failed / released; its update awaits the leader's ack
    DETACHED = "detached"  # revoked: lineage kept until settled, then forgotten; not listed


@dataclass(frozen=True, slots=True)
class TaskMeta:
    """What survives a restart about a task (``CheckpointStore.put_meta``).

    The shell stores it with ``node_agent.convert.encode_meta`` (JSON, the
    update as serialized protobuf) and reads it back with ``decode_meta``.

    Attributes:
        epoch, attempt, kind: of the newest assignment here.
        state: a ``SlotState`` value.
        update: the unacked terminal TaskUpdate, or None.
    """

    epoch: int
    attempt: int
    kind: str
    state: str
    update: TaskUpdate | None = None


@dataclass(frozen=True, slots=True)
class Ownership:
    """Until when this incarnation may act for the tasks it runs: a snapshot of the fence.

    The shell publishes one after every step of the core; a handler's thread
    (or worker process) asks ``valid_at(time.monotonic())`` right before an
    effect, so after a pause (SIGSTOP, a long GC) the handler cannot act past
    its fence before the agent's event loop has run again. A snapshot is never
    later than the core's own view (the deadline only moves forward between
    fences), so a stale one errs on the safe side.

    Attributes:
        deadline_s: monotonic time of the fence deadline (``s + fence_after``),
            or None when nothing may run (before any Welcome).
        fenced: the core began pausing every task (``deadline_s`` is the
            deadline it fenced for): no new effect may start, but a result
            committed before ``deadline_s`` is still this owner's.
    """

    deadline_s: float | None = None
    fenced: bool = False

    def valid_at(self, now_s: float) -> bool:
        """True when an effect started at monotonic ``now_s`` is still this owner's."""
        return self.deadline_s is not None and now_s < self.deadline_s

    def may_start_at(self, now_s: float) -> bool:
        """True when a new effect may start at ``now_s``: owner, and not being fenced."""
        return not self.fenced and self.valid_at(now_s)


# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``message`` on the current Session (drop it when there is none)."""

    message: AgentMessage


@dataclass(frozen=True, slots=True)
class StartTask:
    """Start (or resume) the handler of ``assign``; report ``task_started`` / ``task_finished``."""

    assign: Assign


@dataclass(frozen=True, slots=True)
class StopTask:
    """Cancel the handler at ``epoch``, let in-flight writes finish, report ``task_stopped``.

    ``flush`` asks the runner to wait until the task's records are replicated
    (a Release must hand over everything).
    """

    task_id: str
    epoch: int
    reason: StopReason
    flush: bool = False


@dataclass(frozen=True, slots=True)
class CloseSession:
    """Close the Session; reconnect (to ``redirect`` first when it is set).

    ``retry_after_s`` > 0 (a NotLeader's ``retry_after_ms``: no leader yet, or
    a leader deferring Hellos) is the pause before that reconnect, in place of
    the growing backoff: the coordinator asked for it, nothing failed.
    """

    reason: str
    redirect: str = ""
    retry_after_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PersistMeta:
    """Store the task's meta durably before the commands after it run."""

    task_id: str
    meta: TaskMeta


@dataclass(frozen=True, slots=True)
class PersistMetas:
    """Store every meta here durably, in one group commit, before the commands after it run.

    ``ready_batch`` makes one out of a batch's PersistMeta commands.
    """

    metas: tuple[tuple[str, TaskMeta], ...]


@dataclass(frozen=True, slots=True)
class ForgetTask:
    """Delete the task's local records (its outcome was acknowledged, or its detach settled)."""

    task_id: str


@dataclass(frozen=True, slots=True)
class Notice:
    """Something to log and count: ``kind`` plus fields."""

    kind: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReportLineage:
    """Keep and report what the task did at ``epoch`` beyond what reached Redis.

    The shell reads the local records after ``replicated_checkpoint_seq`` /
    ``replicated_journal_seq``; when there are any it writes a ForkRecord and
    the records to Redis and sends a LineageReport (DESIGN.md §7: a fenced
    owner's progress is kept as a fork, never silently dropped).
    """

    task_id: str
    epoch: int
    current_epoch: int
    current_owner_node_id: str
    replicated_checkpoint_seq: int
    replicated_journal_seq: int


@dataclass(frozen=True, slots=True)
class ReportLineageCopy:
    """Report the rows an adopt kept under ``copy_task_id`` as a fork of ``task_id``.

    The shell reads every record of the copy (each one divergent: the adopt
    moved only rows that differ from the lineage it took), writes a ForkRecord
    (``lineage_task_id`` = the copy) and the records to Redis, sends a
    LineageReport and calls ``lineage_ready(..., copy_task_id=...)``; a copy
    without records is settled with ``lineage_copy_empty``.

    Attributes:
        task_id: the task the copy was split from.
        copy_task_id: the copy's id in the store, ``<task_id>~lineage-e<epoch>[-<n>]``.
        report_seq: this process's count of copy reports (>= 1), part of the
            fork id so that a copy name the store reuses later is a new fork.
    """

    task_id: str
    copy_task_id: str
    report_seq: int


Command = (
    Send
    | StartTask
    | StopTask
    | CloseSession
    | PersistMeta
    | PersistMetas
    | ForgetTask
    | Notice
    | ReportLineage
    | ReportLineageCopy
)


def ready_batch(commands: list[Command]) -> list[Command]:
    """A batch's commands with every PersistMeta merged into one leading PersistMetas.

    Like etcd/raft's ``Ready``: the shell writes the batch's state in one group
    commit (one fsync: after a node dies its tasks arrive by the hundred), then
    runs the rest in order. Persisting a task's meta earlier than its place is
    safe: it only has to precede that task's later commands (its StartTask, its
    terminal update). The newest meta of a task wins, as in order. With a
    ForgetTask in the batch, or fewer than two metas, the list is returned as is.
    """
    metas = [c for c in commands if isinstance(c, PersistMeta)]
    if len(metas) < 2 or any(isinstance(c, ForgetTask) for c in commands):
        return commands
    newest: dict[str, TaskMeta] = {}
    for c in metas:
        newest[c.task_id] = c.meta
    rest = [c for c in commands if not isinstance(c, PersistMeta)]
    return [PersistMetas(tuple(newest.items())), *rest]


def check_command_order(commands: list[Command]) -> None:
    """Check one list of the core's commands against the persist-before-start rule.

    A StartTask's meta (epoch, RUNNING) is persisted earlier in the same list
    (by a PersistMeta, or the leading PersistMetas of a batch), so a restart
    never finds a handler that ran at an epoch the store does not know; a
    PersistMetas is only ever first.

    Raises:
        AssertionError: the list breaks the rule (a bug in the core); names the command.
    """
    persisted: dict[str, TaskMeta] = {}
    for index, c in enumerate(commands):
        if isinstance(c, PersistMeta):
            persisted[c.task_id] = c.meta
        elif isinstance(c, PersistMetas):
            if index != 0:
                raise AssertionError(f"command {index}: PersistMetas must lead its batch")
            persisted.update(c.metas)
        elif isinstance(c, StartTask):
            meta = persisted.get(c.assign.task_id)
            if meta is None or meta.epoch != c.assign.epoch or meta.state != "running":
                raise AssertionError(
                    f"command {index}: StartTask {c.assign.task_id}@{c.assign.epoch} "
                    "before its meta was persisted"
                )


# ---------------------------------------------------------------------------
# The state machine
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Progress:
    """A task's progress as the core tracks it (a Heartbeat lists it as ``TaskProgress``)."""

    checkpoint_seq: int = 0
    covers_journal_seq: int = 0
    replicated_checkpoint_seq: int = 0
    journal_seq: int = 0
    replicated_journal_seq: int = 0
    progress_ratio: float = 0.0
    progress_message: str = ""

    def record(self, task_id: str, epoch: int) -> TaskProgress:
        return TaskProgress(
            task_id=task_id,
            epoch=epoch,
            checkpoint_seq=self.checkpoint_seq,
            covers_journal_seq=self.covers_journal_seq,
            replicated_checkpoint_seq=self.replicated_checkpoint_seq,
            journal_seq=self.journal_seq,
            replicated_journal_seq=self.replicated_journal_seq,
            progress_ratio=self.progress_ratio,
            progress_message=self.progress_message,
        )


@dataclass(slots=True)
class _Slot:
    task_id: str
    epoch: int
    attempt: int
    kind: str
    state: SlotState
    assign: Assign | None = None
    stop_reason: StopReason | None = None
    pending_assign: Assign | None = None
    release_move_id: str = ""
    update: TaskUpdate | None = None  # unacked terminal update
    progress: _Progress = field(default_factory=_Progress)
    checkpoint: CheckpointSummary | None = None
    report_due: bool = False
    local: bool = False  # durability="local": reported at the local interval
    forget_on_stop: bool = False
    lost_to_epoch: int = 0  # the epoch that superseded ours (revoke / Redis refusal)
    lost_to_owner: str = ""
    revoke_seen: bool = False  # the leader confirmed the loss (else Hello still lists it)
    lineage_due: bool = False  # DETACHED: a ReportLineage not settled yet (keep the records)
    fork_id: str = ""  # DETACHED: the fork in Redis whose LineageAck settles the lineage

    def meta(self) -> TaskMeta:
        return TaskMeta(self.epoch, self.attempt, self.kind, self.state.value, self.update)


DEFAULT_PROGRESS_REPORT_INTERVAL_S = 1.0
"""Least time between two Checkpointed updates of one task, seconds.

Each update tells the leader the task's newest checkpoint (what ``lazarus
tasks`` shows) and the newest one Redis acknowledged; the leader acks it at once
and writes the progress of all its running tasks to etcd in one transaction at
most every ``progress_flush_interval_s`` (``coordinator.core.settings``, 1 s;
before that setting, each update was one etcd write, about 2 ms of leader plus
etcd CPU on a 2-core machine). That record is the evidence a new owner's
restore is judged by: resuming below it means Redis lost acknowledged data
(``core/redisloss.py``), reported as DATA_LOSS instead of silently redoing
work; after a leader change it can be older by up to this interval plus the
leader's flush interval. Hence 1 s for tasks whose checkpoints are promised replicated
(``durability="replicated"``).
"""

DEFAULT_LOCAL_PROGRESS_REPORT_INTERVAL_S = 5.0
"""As :data:`DEFAULT_PROGRESS_REPORT_INTERVAL_S`, for ``durability="local"`` tasks.

Their checkpoints promise nothing of Redis, so the leader's record of them is
for display; at 1 s, on a 2-core machine running CPU-bound handlers, these
updates cost the leader and etcd about 0.6 ms of CPU per checkpoint, taken out
of the handlers' cores (``bench/taskpath_bench.py``; when each update was its own
etcd write). A fleet of N checkpointing tasks sends the leader about N /
interval updates per second, which it writes in one etcd transaction (of up to
128 records) per ``progress_flush_interval_s``.
"""


class AgentCore:
    """The node agent's session and task decisions; see the module docstring.

    Args:
        node_id: this node's stable name.
        incarnation: unique per process start.
        fence_lead_s: start pausing this long before the fence deadline, seconds.
        progress_report_interval_s: least time between two Checkpointed updates of
            a task, seconds (default :data:`DEFAULT_PROGRESS_REPORT_INTERVAL_S`).
        local_progress_report_interval_s: the same for tasks the runner marked
            ``local`` (default :data:`DEFAULT_LOCAL_PROGRESS_REPORT_INTERVAL_S`).
        unsafe_disable_self_fence: never self-fence (UNSAFE: a cut-off agent keeps
            running tasks the leader moves), neither in the tick nor in the
            handler's ownership check. Only for the drills' mutation test,
            which shows the partition-heal drill fails without the fence.
    """

    def __init__(
        self,
        node_id: str,
        incarnation: str,
        *,
        fence_lead_s: float = 0.5,
        progress_report_interval_s: float = DEFAULT_PROGRESS_REPORT_INTERVAL_S,
        local_progress_report_interval_s: float = DEFAULT_LOCAL_PROGRESS_REPORT_INTERVAL_S,
        unsafe_disable_self_fence: bool = False,
    ) -> None:
        if not node_id:
            raise ValueError("node_id: must not be empty")
        if not incarnation:
            raise ValueError("incarnation: must not be empty")
        self.node_id = node_id
        self.incarnation = incarnation
        self.fence_lead_s = fence_lead_s
        self.unsafe_disable_self_fence = unsafe_disable_self_fence
        self.progress_report_interval_s = progress_report_interval_s
        self.local_progress_report_interval_s = local_progress_report_interval_s
        self._slots: dict[str, _Slot] = {}
        self._session = SessionState.IDLE
        self._interval_s = 0.5
        self._fence_after_s = 2.0
        self._term = 0
        self._hb_seq = 0
        self._unacked: dict[int, float] = {}  # heartbeat seq -> send time
        self._acked_send_s = 0.0  # send time of the newest acked heartbeat (or Hello)
        self._next_hb_s = 0.0
        self._hello_sent_s = 0.0
        self._hello_seq = 0  # Hellos built so far; a Welcome must answer the newest
        self._update_seq = 0
        self._updates: dict[int, str] = {}  # update_seq -> task_id of terminal updates
        self._next_report_s = 0.0
        self._next_local_report_s = 0.0
        self._fenced_deadline_s: float | None = None  # the deadline of the newest fence
        self._shutting_down = False
        self._forks: dict[str, LineageReport] = {}  # fork id -> report, until the leader acks it
        self._copies: set[str] = set()  # lineage copies asked to be reported, not forgotten yet
        self._copy_forks: dict[str, str] = {}  # fork id in Redis -> lineage copy it settles
        self._copy_reports = 0

    # ------------------------------------------------------------------ views

    @property
    def session(self) -> SessionState:
        """Where this process stands with the leader."""
        return self._session

    @property
    def session_open(self) -> bool:
        """True between a Welcome and the Session's end."""
        return self._session is SessionState.OPEN

    @property
    def fenced(self) -> bool:
        """True from a self-fence until the next Welcome."""
        return self._session is SessionState.FENCED

    @property
    def term(self) -> int:
        """The leader's term from the newest Welcome (0 before any)."""
        return self._term

    def slot_state(self, task_id: str) -> SlotState | None:
        """The task's state here, or None when the core does not know it."""
        slot = self._slots.get(task_id)
        return slot.state if slot is not None else None

    def running(self) -> list[tuple[str, int]]:
        """(task id, epoch) of tasks whose handler runs or is stopping, sorted."""
        return sorted(
            (s.task_id, s.epoch)
            for s in self._slots.values()
            if s.state in (SlotState.RUNNING, SlotState.STOPPING)
        )

    def fence_deadline(self) -> float | None:
        """Monotonic time by which every task must be paused, or None when nothing may run."""
        if not self._session.armed:
            return None
        due = self._acked_send_s + self._interval_s
        if self._unacked:
            due = min(due, min(self._unacked.values()))
        return due + self._fence_after_s

    def ownership(self) -> Ownership:
        """The fence as a snapshot that other threads and processes may test (``Ownership``)."""
        if self.unsafe_disable_self_fence:
            return Ownership(math.inf)  # the mutation turns the whole self-fence off, here too
        deadline = self.fence_deadline()
        if deadline is None and self._session is SessionState.FENCED:
            return Ownership(self._fenced_deadline_s, fenced=True)
        return Ownership(deadline)

    # --------------------------------------------------------------- restart

    def restore(
        self, metas: Mapping[str, TaskMeta], unreadable: Mapping[str, str] | None = None
    ) -> list[Command]:
        """Rebuild the task table from the store after a restart (before any Hello).

        ``metas`` are the stored metas the shell could decode; ``unreadable``
        names the others (task id -> why), reported and skipped, never fatal.
        A task that was running is PAUSED now (its handler died with the old
        process); an unacked terminal update is kept to be sent again. A
        DETACHED task stays DETACHED (never listed in a Hello) and its lineage
        is reported again (``ReportLineage``; the old process's report died with
        it, or its fork never reached Redis), so it is forgotten once settled
        (module docstring, **Forgetting a detached task**). Lineage copies left
        in the store are named by the shell afterwards (``lineage_copy_kept``).
        """
        out: list[Command] = [
            Notice("meta_unreadable", {"task_id": task_id, "error": error})
            for task_id, error in sorted((unreadable or {}).items())
        ]
        for task_id, meta in sorted(metas.items()):
            try:
                state = SlotState(meta.state)
            except ValueError:
                out.append(
                    Notice(
                        "meta_unreadable", {"task_id": task_id, "error": f"state {meta.state!r}"}
                    )
                )
                continue
            if state is SlotState.DETACHED:
                slot = _Slot(task_id, meta.epoch, meta.attempt, meta.kind, state)
                slot.revoke_seen = True  # this process cannot tell; as before, never listed
                self._slots[task_id] = slot
                out.append(self._report_lineage(slot))
                continue
            update = meta.update if meta.update is not None and meta.update.terminal else None
            if state in (SlotState.RUNNING, SlotState.STOPPING):
                state = SlotState.PAUSED
            if state is SlotState.DONE and update is None:
                state = SlotState.PAUSED
            slot = _Slot(task_id, meta.epoch, meta.attempt, meta.kind, state, update=update)
            self._slots[task_id] = slot
        return out

    # ---------------------------------------------------------------- session

    def hello(self, now: float, wall_ms: int) -> Hello:
        """The Hello to open a Session with: every task still held, with its status.

        Each Hello gets the next ``hello_seq``; only a Welcome echoing the
        newest one is taken (``on_welcome``).
        """
        self._hello_sent_s = now
        self._hello_seq += 1
        held: list[HeldTask] = []
        for slot in sorted(self._slots.values(), key=lambda s: s.task_id):
            status = _held_status(slot)
            if status is None:
                continue
            held.append(
                HeldTask(
                    task_id=slot.task_id,
                    epoch=slot.epoch,
                    attempt=slot.attempt,
                    kind=slot.kind,
                    status=status,
                    checkpoint=slot.checkpoint,
                    journal_seq=slot.progress.journal_seq,
                    replicated_journal_seq=slot.progress.replicated_journal_seq,
                    replicated_checkpoint_seq=slot.progress.replicated_checkpoint_seq,
                )
            )
        return Hello(self.node_id, self.incarnation, PROTOCOL_VERSION, tuple(held), self._hello_seq)

    def on_welcome(self, welcome: Welcome, now: float, wall_ms: int) -> list[Command]:
        """The leader accepted our Hello: start heartbeating, resend unacked outcomes.

        The fence then runs from the newest Hello's send time, so a Welcome
        that answers an earlier Hello (``welcome.hello_seq`` set and not the
        newest: a reply delivered late, e.g. by a relay after a Reattach) is
        ignored with a ``stale_welcome`` notice: taking it would start the fence
        from a Hello its leader never saw, later than the one it judges the
        node by. A Welcome without ``hello_seq`` (a leader that does not echo
        it) is taken as before.
        """
        if welcome.hello_seq and welcome.hello_seq != self._hello_seq:
            return [
                Notice(
                    "stale_welcome",
                    {
                        "hello_seq": welcome.hello_seq,
                        "newest_hello_seq": self._hello_seq,
                        "term": welcome.term,
                        "leader": welcome.leader_id,
                    },
                )
            ]
        out: list[Command] = []
        was_fenced = self._session is SessionState.FENCED
        self._session = SessionState.OPEN
        self._term = welcome.term
        if welcome.heartbeat_interval_ms:
            self._interval_s = welcome.heartbeat_interval_ms / 1000.0
        if welcome.fence_after_ms:
            self._fence_after_s = welcome.fence_after_ms / 1000.0
        self._unacked.clear()
        self._acked_send_s = self._hello_sent_s
        self._next_hb_s = now
        self._updates.clear()
        out.append(
            Notice(
                "session_open",
                {
                    "term": welcome.term,
                    "leader": welcome.leader_id,
                    "after_fence": was_fenced,
                    "heartbeat_interval_s": self._interval_s,
                    "fence_after_s": self._fence_after_s,
                },
            )
        )
        for slot in sorted(self._slots.values(), key=lambda s: s.task_id):
            if slot.state is SlotState.DONE and slot.update is not None:
                out.append(self._send_update(slot, slot.update, wall_ms))
        out.extend(Send(report) for _, report in sorted(self._forks.items()))  # not acked yet
        out.extend(self.tick(now, wall_ms))
        return out

    def on_session_closed(self, now: float, reason: str) -> list[Command]:
        """The Session ended (either side). Tasks keep running until the fence says stop."""
        self._lapse()
        self._updates.clear()
        return [Notice("session_closed", {"reason": reason})]

    def on_messages(
        self, msgs: list[CoordinatorMessage], now: float, wall_ms: int
    ) -> list[Command]:
        """Messages that arrived together, stepped in order, as one ``ready_batch``."""
        out: list[Command] = []
        for msg in msgs:
            out += self.on_message(msg, now, wall_ms)
        return ready_batch(out)

    def on_message(self, msg: CoordinatorMessage, now: float, wall_ms: int) -> list[Command]:
        """One message from the leader on the open Session."""
        if isinstance(msg, Welcome):
            return self.on_welcome(msg, now, wall_ms)
        if isinstance(msg, NotLeader):
            self._lapse()
            return [
                CloseSession(
                    f"not the leader (leader {msg.leader_id!r})",
                    msg.leader_address,
                    retry_after_s=max(0, msg.retry_after_ms) / 1000.0,
                )
            ]
        if isinstance(msg, Reattach):
            return self._on_reattach(msg, now, wall_ms)
        if self._session is not SessionState.OPEN:
            return []  # stale directives of a Session we gave up on
        if isinstance(msg, HeartbeatAck):
            return self._on_ack(msg, now)
        if isinstance(msg, Assign):
            return self._on_assign(msg, wall_ms)
        if isinstance(msg, Revoke):
            return self._on_revoke(msg, wall_ms)
        if isinstance(msg, Release):
            return self._on_release(msg)
        if isinstance(msg, Drain):
            return [Notice("drain", {"drain_id": msg.drain_id, "cancelled": msg.cancelled})]
        if isinstance(msg, TaskUpdateAck):
            return self._on_update_ack(msg, wall_ms)
        if isinstance(msg, LineageAck):
            report = self._forks.pop(msg.fork_id, None)
            if report is None:
                return []
            out: list[Command] = [
                Notice("fork_recorded", {"fork_id": msg.fork_id, "task_id": msg.task_id})
            ]
            copy = self._copy_forks.pop(msg.fork_id, None)
            if copy is not None:  # in Redis and acknowledged: the copy is settled
                self._copies.discard(copy)
                note = Notice(
                    "lineage_copy_forgotten",
                    {"task_id": report.task_id, "copy": copy, "fork_id": msg.fork_id},
                )
                return [*out, note, ForgetTask(copy)]
            slot = self._slots.get(report.task_id)
            if (
                slot is not None
                and slot.state is SlotState.DETACHED
                and slot.epoch == report.epoch
                and slot.fork_id == msg.fork_id
            ):
                slot.lineage_due = False
                slot.fork_id = ""
                out += self._forget_if_settled(slot)
            return out
        return [Notice("ignored_message", {"body": getattr(msg, "body", "")})]

    def _on_reattach(self, msg: Reattach, now: float, wall_ms: int) -> list[Command]:
        """Fan-in: the replica holding the Session reached a new leader; Hello again on it.

        The session with the old leader is over, as if the stream had ended
        (``on_session_closed``): tasks run on until the fence deadline, which
        only a Welcome (or an ack after it) moves; directives are ignored
        until then. Before any Welcome too: the first Hello went to the old
        leader, which never answered, and the replica waits for a new one
        (found by the fleet simulator: without it the agent waited forever).
        """
        self._lapse()
        self._updates.clear()
        return [Notice("reattach", {"term": msg.term}), Send(self.hello(now, wall_ms))]

    def _lapse(self) -> None:
        """The Session ended: tasks run on until the fence deadline (IDLE, FENCED stay)."""
        if self._session is SessionState.OPEN:
            self._session = SessionState.RECONNECTING

    def _on_ack(self, ack: HeartbeatAck, now: float) -> list[Command]:
        sent = self._unacked.get(ack.seq)
        if sent is None:
            return []
        for seq in [s for s in self._unacked if s <= ack.seq]:
            del self._unacked[seq]
        self._acked_send_s = max(self._acked_send_s, sent)
        return [Notice("heartbeat_rtt", {"seconds": max(0.0, now - sent)})]

    # ------------------------------------------------------------------- time

    def tick(self, now: float, wall_ms: int) -> list[Command]:
        """Heartbeats, the self-fence and coalesced progress reports. Call every ~50 ms."""
        out: list[Command] = []
        deadline = self.fence_deadline()
        if (
            deadline is not None
            and now >= deadline - self.fence_lead_s
            and not self.unsafe_disable_self_fence
        ):
            return self._fence(now, deadline)
        if self._session is not SessionState.OPEN:
            return out
        if now >= self._next_hb_s:
            self._hb_seq += 1
            tasks = tuple(
                slot.progress.record(slot.task_id, slot.epoch)
                for slot in sorted(self._slots.values(), key=lambda s: s.task_id)
                if slot.state in (SlotState.RUNNING, SlotState.STOPPING)
            )
            hb = Heartbeat(
                seq=self._hb_seq,
                sent_at_unix_ms=wall_ms,
                sent_at_monotonic_ms=int(now * 1000),
                tasks=tasks,
                running_tasks=len(tasks),
                used_slots=len(tasks),
            )
            self._unacked[self._hb_seq] = now
            self._next_hb_s = now + self._interval_s
            out.append(Send(hb))
        due = now >= self._next_report_s
        due_local = now >= self._next_local_report_s
        if due:
            self._next_report_s = now + self.progress_report_interval_s
        if due_local:
            self._next_local_report_s = now + self.local_progress_report_interval_s
        if due or due_local:
            for slot in sorted(self._slots.values(), key=lambda s: s.task_id):
                if not (due_local if slot.local else due):
                    continue
                if slot.report_due and slot.state is SlotState.RUNNING and slot.checkpoint:
                    slot.report_due = False
                    update = TaskUpdate(
                        slot.task_id,
                        slot.epoch,
                        Checkpointed(
                            slot.checkpoint,
                            journal_seq=slot.progress.journal_seq,
                            replicated_journal_seq=slot.progress.replicated_journal_seq,
                        ),
                    )
                    out.append(self._send_update(slot, update, wall_ms, terminal=False))
        return out

    def _fence(self, now: float, deadline: float) -> list[Command]:
        self._session = SessionState.FENCED
        self._fenced_deadline_s = deadline
        out: list[Command] = []
        stopped = []
        for slot in sorted(self._slots.values(), key=lambda s: s.task_id):
            if slot.state is SlotState.STOPPING:
                # An Assign waiting for this stop came on the Session we give up
                # on: it may be stale, and nothing starts before a new Welcome.
                slot.pending_assign = None
                if slot.stop_reason is StopReason.SUPERSEDED:
                    slot.stop_reason = StopReason.FENCED
            if slot.state is SlotState.RUNNING:
                slot.state = SlotState.STOPPING
                slot.stop_reason = StopReason.FENCED
                stopped.append(slot.task_id)
                out.append(StopTask(slot.task_id, slot.epoch, StopReason.FENCED))
        out.insert(
            0,
            Notice(
                "self_fence",
                {
                    "tasks": len(stopped),
                    "deadline_in_s": round(deadline - now, 3),
                    "unacked_heartbeats": len(self._unacked),
                },
            ),
        )
        out.append(CloseSession("self-fenced: no heartbeat ack in time"))
        return out

    # -------------------------------------------------------------- directives

    def _on_assign(self, a: Assign, wall_ms: int) -> list[Command]:
        slot = self._slots.get(a.task_id)
        if slot is not None:
            if a.epoch < slot.epoch:
                return [Notice("stale_assign", {"task_id": a.task_id, "epoch": a.epoch})]
            if a.epoch == slot.epoch:
                if slot.state is SlotState.PAUSED:
                    return self._start(slot, a)
                if slot.state is SlotState.DETACHED:
                    return self._start(slot, a)
                if slot.state is SlotState.STOPPING and slot.stop_reason is StopReason.FENCED:
                    slot.pending_assign = a  # REATTACH: resume once the pause completes
                    return []
                return []  # duplicate: running, stopping or done at this epoch
            # A newer epoch of a task we hold.
            if slot.state in (SlotState.RUNNING, SlotState.STOPPING):
                slot.pending_assign = a
                if slot.state is SlotState.RUNNING:
                    slot.state = SlotState.STOPPING
                    slot.stop_reason = StopReason.SUPERSEDED
                    return [StopTask(slot.task_id, slot.epoch, StopReason.SUPERSEDED)]
                return []
        slot = _Slot(a.task_id, a.epoch, a.attempt, a.kind, SlotState.RUNNING)
        self._slots[a.task_id] = slot
        return self._start(slot, a)

    def _start(self, slot: _Slot, a: Assign) -> list[Command]:
        slot.epoch = a.epoch
        slot.attempt = a.attempt
        slot.kind = a.kind
        slot.state = SlotState.RUNNING
        slot.assign = a
        slot.stop_reason = None
        slot.pending_assign = None
        slot.update = None
        slot.progress = _Progress()
        slot.checkpoint = None  # the handler reports what it resumed from (task_started)
        slot.report_due = False  # never report an older incarnation's checkpoint at this epoch
        return [PersistMeta(slot.task_id, slot.meta()), StartTask(a)]

    def _on_revoke(self, r: Revoke, wall_ms: int) -> list[Command]:
        slot = self._slots.get(r.task_id)
        if slot is None or slot.epoch > r.epoch:
            return []
        slot.revoke_seen = True
        # Over for this node: the leader ended the task (DEADLINE_EXCEEDED: it
        # failed it) or does not know it; nothing is left to reconcile. Any
        # other reason (REASSIGNED, STALE_EPOCH, RELEASE_TIMEOUT, a reason this
        # build does not know) moved the task on: keep and report the lineage.
        keep = r.reason not in (
            RevokeReason.CANCELLED,
            RevokeReason.FINISHED,
            RevokeReason.UNKNOWN_TASK,
            RevokeReason.DEADLINE_EXCEEDED,
        )
        if keep:
            slot.lost_to_epoch = max(slot.lost_to_epoch, r.current_epoch)
            slot.lost_to_owner = r.current_owner_node_id or slot.lost_to_owner
        note = Notice(
            "revoked",
            {
                "task_id": r.task_id,
                "epoch": r.epoch,
                "current_epoch": r.current_epoch,
                "reason": f"REVOKE_REASON_{RevokeReason(r.reason).name}",
                "owner": r.current_owner_node_id,
            },
        )
        if slot.state in (SlotState.RUNNING, SlotState.STOPPING):
            if slot.pending_assign is not None and slot.pending_assign.epoch <= r.epoch:
                slot.pending_assign = None  # a newer epoch assigned here still starts
            slot.forget_on_stop = not keep
            if slot.state is SlotState.RUNNING:
                slot.state = SlotState.STOPPING
                slot.stop_reason = StopReason.REVOKED
                return [note, StopTask(slot.task_id, slot.epoch, StopReason.REVOKED)]
            slot.stop_reason = StopReason.REVOKED
            return [note]
        if slot.state is SlotState.DETACHED and keep:
            # Lost already (Redis refused its epoch; the fork was reported): the
            # leader's confirmation may be all its forgetting waited for.
            return [note, *self._forget_if_settled(slot)]
        return [note, *self._detach(slot, forget=not keep, report=keep)]

    def _detach(self, slot: _Slot, *, forget: bool, report: bool = False) -> list[Command]:
        if forget:
            del self._slots[slot.task_id]
            return [ForgetTask(slot.task_id)]
        slot.state = SlotState.DETACHED
        slot.update = None
        slot.assign = None  # its spec (payload up to 256 KiB) is never needed again
        out: list[Command] = [PersistMeta(slot.task_id, slot.meta())]
        if report:
            out.append(self._report_lineage(slot))
        return out

    def _report_lineage(self, slot: _Slot) -> ReportLineage:
        """The slot's ReportLineage; its records are kept until the shell's answer settles it."""
        slot.lineage_due = True
        slot.fork_id = ""
        return ReportLineage(
            slot.task_id,
            slot.epoch,
            slot.lost_to_epoch,
            slot.lost_to_owner,
            slot.progress.replicated_checkpoint_seq,
            slot.progress.replicated_journal_seq,
        )

    def _forget_if_settled(self, slot: _Slot) -> list[Command]:
        """Forget a DETACHED task once the leader confirmed the loss and its lineage is settled.

        The rule and its reasons: the module docstring, **Forgetting a detached task**.
        """
        if slot.state is not SlotState.DETACHED or not slot.revoke_seen or slot.lineage_due:
            return []
        note = Notice("detached_forgotten", {"task_id": slot.task_id, "epoch": slot.epoch})
        return [note, *self._detach(slot, forget=True)]

    def _on_release(self, r: Release) -> list[Command]:
        slot = self._slots.get(r.task_id)
        if slot is None or slot.epoch != r.epoch or slot.state is not SlotState.RUNNING:
            return [Notice("release_ignored", {"task_id": r.task_id, "epoch": r.epoch})]
        slot.state = SlotState.STOPPING
        slot.stop_reason = StopReason.RELEASED
        slot.release_move_id = r.move_id
        return [StopTask(slot.task_id, slot.epoch, StopReason.RELEASED, flush=True)]

    def _on_update_ack(self, ack: TaskUpdateAck, wall_ms: int) -> list[Command]:
        task_id = self._updates.pop(ack.update_seq, None)
        if task_id is None:
            return []
        slot = self._slots.get(task_id)
        if slot is None or slot.state is not SlotState.DONE or slot.epoch != ack.epoch:
            return []
        outcome = ack.outcome
        if outcome in (UpdateOutcome.ACCEPTED, UpdateOutcome.DUPLICATE):
            return self._detach(slot, forget=True)  # the leader has it; Redis has the state
        # Refused: the task is no longer ours at this epoch; keep the lineage.
        slot.revoke_seen = True  # the leader knows
        return [
            Notice(
                "update_refused",
                {
                    "task_id": task_id,
                    "outcome": f"UPDATE_OUTCOME_{UpdateOutcome(outcome).name}",
                    "message": ack.message,
                },
            ),
            *self._detach(slot, forget=False, report=True),
        ]

    # ------------------------------------------------------------ task events

    def task_started(
        self,
        task_id: str,
        epoch: int,
        started: Started,
        wall_ms: int,
    ) -> list[Command]:
        """The runner restored and started the handler."""
        slot = self._live(task_id, epoch)
        if slot is None:
            return []
        if started.resumed_from is not None:
            slot.checkpoint = started.resumed_from
            slot.progress.checkpoint_seq = started.resumed_from.seq
            slot.progress.covers_journal_seq = started.resumed_from.covers_journal_seq
        update = TaskUpdate(task_id, epoch, started)
        return [self._send_update(slot, update, wall_ms, terminal=False)]

    def task_progress(
        self,
        task_id: str,
        epoch: int,
        *,
        checkpoint: CheckpointSummary | None = None,
        journal_seq: int | None = None,
        replicated_checkpoint_seq: int | None = None,
        replicated_journal_seq: int | None = None,
        ratio: float | None = None,
        message: str | None = None,
        local: bool | None = None,
    ) -> list[Command]:
        """The handler checkpointed, recorded, replicated or reported progress.

        ``local`` (sticky): the task's checkpoints promise nothing of Redis, so
        its Checkpointed updates go at ``local_progress_report_interval_s``.
        """
        slot = self._slots.get(task_id)
        if slot is None or slot.epoch != epoch:
            return []
        if local is not None:
            slot.local = local
        p = slot.progress
        if checkpoint is not None and checkpoint.seq >= p.checkpoint_seq:
            slot.checkpoint = checkpoint
            p.checkpoint_seq = checkpoint.seq
            p.covers_journal_seq = checkpoint.covers_journal_seq
            slot.report_due = True
        if journal_seq is not None:
            p.journal_seq = max(p.journal_seq, journal_seq)
        if replicated_checkpoint_seq is not None and (
            replicated_checkpoint_seq > p.replicated_checkpoint_seq
        ):
            p.replicated_checkpoint_seq = replicated_checkpoint_seq
            if slot.checkpoint is not None and slot.checkpoint.seq == replicated_checkpoint_seq:
                slot.checkpoint = replace(slot.checkpoint, replicated=True)
            slot.report_due = True
        if replicated_journal_seq is not None:
            p.replicated_journal_seq = max(p.replicated_journal_seq, replicated_journal_seq)
        if ratio is not None:
            p.progress_ratio = min(1.0, max(0.0, ratio))
        if message is not None:
            p.progress_message = message[:256]
        return []

    def task_finished(
        self,
        task_id: str,
        epoch: int,
        *,
        result: TaskResult | None = None,
        error: TaskError | None = None,
        final_checkpoint: CheckpointSummary | None = None,
        run_ms: int = 0,
        wall_ms: int = 0,
    ) -> list[Command]:
        """The handler returned (``result``) or failed (``error``); exactly one is given."""
        if (result is None) == (error is None):
            raise ValueError("task_finished: give exactly one of result and error")
        slot = self._live(task_id, epoch)
        if slot is None or slot.state is not SlotState.RUNNING:
            return [Notice("late_finish_dropped", {"task_id": task_id, "epoch": epoch})]
        change: Completed | Failed
        if result is not None:
            change = Completed(result, final_checkpoint, run_ms)
        else:
            assert error is not None
            change = Failed(error, final_checkpoint)
        update = TaskUpdate(task_id, epoch, change, attempt=slot.attempt)
        slot.state = SlotState.DONE
        slot.update = update
        return [PersistMeta(task_id, slot.meta()), self._send_update(slot, update, wall_ms)]

    def task_stopped(
        self,
        task_id: str,
        epoch: int,
        *,
        checkpoint: CheckpointSummary | None = None,
        journal_seq: int = 0,
        wall_ms: int = 0,
    ) -> list[Command]:
        """The handler stopped after a StopTask (or died on its own after one)."""
        slot = self._slots.get(task_id)
        if slot is None or slot.epoch != epoch or slot.state is not SlotState.STOPPING:
            return []
        reason = slot.stop_reason
        slot.stop_reason = None
        out: list[Command] = [
            Notice(
                "task_paused" if reason is StopReason.FENCED else "task_stopped",
                {"task_id": task_id, "epoch": epoch, "reason": reason.value if reason else ""},
            )
        ]
        if reason is StopReason.RELEASED:
            update = TaskUpdate(
                task_id,
                epoch,
                Released(slot.release_move_id, checkpoint, journal_seq),
                attempt=slot.attempt,
            )
            slot.state = SlotState.DONE
            slot.update = update
            out += [PersistMeta(task_id, slot.meta()), self._send_update(slot, update, wall_ms)]
            return out
        pending = slot.pending_assign if self._session is not SessionState.FENCED else None
        if reason is StopReason.REVOKED:
            forget = slot.forget_on_stop
            slot.forget_on_stop = False
            if pending is not None:  # a newer epoch was assigned here meanwhile
                if not forget:
                    out.append(
                        ReportLineage(
                            task_id,
                            epoch,
                            slot.lost_to_epoch,
                            slot.lost_to_owner,
                            slot.progress.replicated_checkpoint_seq,
                            slot.progress.replicated_journal_seq,
                        )
                    )
                return out + self._start(slot, pending)
            return out + self._detach(slot, forget=forget, report=not forget)
        if reason in (StopReason.SUPERSEDED, StopReason.FENCED) and pending is not None:
            return out + self._start(slot, pending)
        slot.pending_assign = None
        slot.state = SlotState.PAUSED
        out.append(PersistMeta(task_id, slot.meta()))
        return out

    def lineage_ready(
        self, report: LineageReport, *, stored: bool = True, copy_task_id: str = ""
    ) -> list[Command]:
        """The shell kept a fork (``ReportLineage``): report it, and again after each Welcome.

        The report is sent now when a Session is open and kept until the
        leader's LineageAck names its ``fork_id``; a Welcome sends every
        report not acknowledged yet (the leader records a fork once).

        Args:
            report: the fork, as ``ReportLineage`` asked for (task id and epoch).
            stored: the fork's records were written to Redis. When False the
                local records are their only full copy: the task stays DETACHED
                with its records after the LineageAck (they are reported again
                after a restart), instead of being forgotten.
            copy_task_id: the fork is a lineage copy's (``ReportLineageCopy``):
                with ``stored``, the LineageAck forgets the copy.
        """
        self._forks[report.fork_id] = report
        slot = self._slots.get(report.task_id)
        if copy_task_id:
            if stored and copy_task_id in self._copies:
                self._copy_forks[report.fork_id] = copy_task_id  # its LineageAck settles it
        elif (
            stored
            and slot is not None
            and slot.state is SlotState.DETACHED
            and slot.epoch == report.epoch
            and slot.lineage_due
        ):
            slot.fork_id = report.fork_id  # its LineageAck settles the lineage
        if self._session is SessionState.OPEN:
            return [Send(report)]
        return []

    def lineage_empty(self, task_id: str, epoch: int) -> list[Command]:
        """The shell found nothing of the task at ``epoch`` beyond what Redis holds (no fork).

        The lineage is settled: the task is forgotten now if the leader
        confirmed the loss, else when it does (``ForgetTask``).
        """
        slot = self._slots.get(task_id)
        if slot is None or slot.state is not SlotState.DETACHED or slot.epoch != epoch:
            return []
        slot.lineage_due = False
        slot.fork_id = ""
        return self._forget_if_settled(slot)

    def lineage_copy_kept(self, task_id: str, copy_task_id: str) -> list[Command]:
        """The store holds a lineage copy of ``task_id`` (an adopt, or a restart found it).

        Returns a ``ReportLineageCopy`` the first time a copy is named in this
        process; the copy is forgotten once its fork is in Redis and
        acknowledged (module docstring, **Forgetting a lineage copy**). A copy
        named again while it is reported, or after its fork could not be
        stored, gets nothing more until the next process.

        Args:
            task_id: the task the copy was split from.
            copy_task_id: the copy's id in the store.
        """
        if copy_task_id in self._copies:
            return []
        self._copies.add(copy_task_id)
        self._copy_reports += 1
        return [
            Notice("lineage_copy_kept", {"task_id": task_id, "copy": copy_task_id}),
            ReportLineageCopy(task_id, copy_task_id, self._copy_reports),
        ]

    def lineage_copy_empty(self, copy_task_id: str) -> list[Command]:
        """The shell found no record in the lineage copy: nothing to keep, forget it."""
        if copy_task_id not in self._copies:
            return []
        self._copies.discard(copy_task_id)
        return [ForgetTask(copy_task_id)]

    @property
    def pending_forks(self) -> list[str]:
        """Ids of the forks reported and not acknowledged yet, sorted."""
        return sorted(self._forks)

    def task_lost(self, task_id: str, epoch: int, current_epoch: int) -> list[Command]:
        """Redis (or the store) refused the task's epoch: a newer owner exists. Stop it.

        Its local lineage is kept; the leader's Revoke, when it comes, finds it stopped.
        """
        slot = self._slots.get(task_id)
        if slot is None or slot.epoch != epoch:
            return []
        note = Notice(
            "epoch_superseded", {"task_id": task_id, "epoch": epoch, "current": current_epoch}
        )
        slot.lost_to_epoch = max(slot.lost_to_epoch, current_epoch)
        if slot.state is SlotState.RUNNING:
            slot.state = SlotState.STOPPING
            slot.stop_reason = StopReason.REVOKED
            slot.forget_on_stop = False
            return [note, StopTask(task_id, epoch, StopReason.REVOKED)]
        if slot.state in (SlotState.PAUSED, SlotState.DONE):
            return [note, *self._detach(slot, forget=False, report=True)]
        return [note]

    def shutdown(self) -> list[Command]:
        """Pause every running task (SIGTERM); the shell then says Goodbye."""
        self._shutting_down = True
        out: list[Command] = []
        for slot in sorted(self._slots.values(), key=lambda s: s.task_id):
            if slot.state is SlotState.RUNNING:
                slot.state = SlotState.STOPPING
                slot.stop_reason = StopReason.SHUTDOWN
                out.append(StopTask(slot.task_id, slot.epoch, StopReason.SHUTDOWN))
        return out

    # ---------------------------------------------------------------- helpers

    def _live(self, task_id: str, epoch: int) -> _Slot | None:
        slot = self._slots.get(task_id)
        if slot is None or slot.epoch != epoch:
            return None
        return slot

    def _send_update(
        self, slot: _Slot, update: TaskUpdate, wall_ms: int, *, terminal: bool = True
    ) -> Command:
        self._update_seq += 1
        msg = replace(
            update,
            update_seq=self._update_seq,
            attempt=slot.attempt,
            occurred_at_unix_ms=update.occurred_at_unix_ms or wall_ms,
        )
        if terminal:
            self._updates[self._update_seq] = slot.task_id
        return Send(msg)


def _held_status(slot: _Slot) -> HeldTaskStatus | None:
    if slot.state is SlotState.DETACHED and not slot.revoke_seen:
        # Lost through Redis's fence, not yet through the leader: list it (at its
        # stale epoch) so the leader revokes it and records the zombie.
        return HeldTaskStatus.PAUSED
    if slot.state is SlotState.STOPPING and slot.stop_reason is StopReason.FENCED:
        # Being paused by a self-fence: the leader must re-attach it (it does so
        # only for PAUSED), or it would stay paused once the stop completes.
        return HeldTaskStatus.PAUSED
    if slot.state in (SlotState.RUNNING, SlotState.STOPPING):
        return HeldTaskStatus.RUNNING
    if slot.state is SlotState.PAUSED:
        return HeldTaskStatus.PAUSED
    if slot.state is SlotState.DONE and slot.update is not None:
        change = slot.update.change
        if isinstance(change, Completed):
            return HeldTaskStatus.COMPLETED
        if isinstance(change, Failed):
            return HeldTaskStatus.FAILED
        return HeldTaskStatus.RELEASED
    return None
