"""Events: past-tense facts the shell feeds into ``CoordinatorCore.step``.

Theory of operation: the shell turns every input it receives (an etcd
election result, a Session message, an orchestrator RPC, the passage of time)
into one of these values and calls ``step``. Each carries ``now_s``: the
leader's clock when the shell observed the fact, in seconds, never
decreasing from one event to the next (see ``coordinator.core.core``). An
event states what happened, not what to do about it; deciding is the core's
job.

Session-scoped events carry the ``session_id`` the shell gave the stream in
``SessionOpened``; the core ignores messages of a session it no longer
considers current (a replaced or closed stream), so a late message can never
revive a node it already judged.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.core.loadcheck import Quarantine
from coordinator.core.records import (
    CheckpointSummary,
    HeldTask,
    Labels,
    NodeLoad,
    NodeRecord,
    TaskError,
    TaskProgress,
    TaskRecord,
    TaskResult,
    TaskSpec,
)

__all__ = [
    "CancelRequested",
    "Checkpointed",
    "Completed",
    "DrainRequested",
    "Event",
    "Failed",
    "ForkSeeded",
    "GoodbyeReceived",
    "HeartbeatReceived",
    "LeadershipAcquired",
    "LeadershipLost",
    "LineageReported",
    "MigrateRequested",
    "PersistFailed",
    "Released",
    "ResignRequested",
    "SessionClosed",
    "SessionOpened",
    "Started",
    "TaskChange",
    "TaskSubmitted",
    "TaskUpdateReceived",
    "Tick",
    "UncordonRequested",
]


NO_LOAD = NodeLoad()
EMPTY_RESULT = TaskResult()

# ---------------------------------------------------------------------------
# Leadership and persistence.
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeadershipAcquired:
    """This replica won the election; the records are what it loaded from etcd.

    Every node gets a full ``dead_after_s`` from ``now_s`` before it is judged.
    ``quarantined``: records the shell moved aside after
    ``coordinator.core.loadcheck.screen_loaded`` (a RecordQuarantined event each).
    """

    term: int
    now_s: float
    nodes: tuple[NodeRecord, ...] = ()
    tasks: tuple[TaskRecord, ...] = ()
    quarantined: tuple[Quarantine, ...] = ()


@dataclass(frozen=True, slots=True)
class LeadershipLost:
    """This replica is no longer leader (lease lost, term comparison failed, resigned)."""

    now_s: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class PersistFailed:
    """The shell gave up on a PersistNodes / PersistTasks command (after its own retries)."""

    now_s: float
    reason: str = ""


# ---------------------------------------------------------------------------
# Node agent Sessions.
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionOpened:
    """A node agent opened a Session and said Hello."""

    session_id: str
    node_id: str
    incarnation: str
    now_s: float
    address: str = ""
    capacity_slots: int = 1
    capacity_cpu_millicores: int = 0
    capacity_memory_bytes: int = 0
    labels: Labels = ()
    kinds: tuple[str, ...] = ()
    held_tasks: tuple[HeldTask, ...] = ()
    agent_version: str = ""
    incarnation_secret_sha256: bytes = b""
    store_id: str = ""
    store_previous_incarnation: str = ""
    hello_seq: int = 0
    """The agent's count of its Hellos; the Welcome echoes it (0: not sent)."""


@dataclass(frozen=True, slots=True)
class HeartbeatReceived:
    """A Heartbeat arrived on a Session (``seq`` strictly increasing within it)."""

    session_id: str
    node_id: str
    seq: int
    now_s: float
    load: NodeLoad = NO_LOAD
    tasks: tuple[TaskProgress, ...] = ()


@dataclass(frozen=True, slots=True)
class HeartbeatDigest:
    """Heartbeats a follower forwarded in one batch, stepped as one event (liveness digest).

    Each heartbeat is judged exactly as if it had been stepped on its own at
    this event's ``now_s`` (the batch's arrival on the leader's clock): the
    same intake limits, seq check, ack, SUSPECT recovery and fencing of stale
    tasks (``docs/fan-in.md`` section 8). Stepping one event per batch instead
    of one per heartbeat is what cuts the leader's cost per node-heartbeat.
    """

    heartbeats: tuple[HeartbeatReceived, ...]
    now_s: float


@dataclass(frozen=True, slots=True)
class SessionClosed:
    """A Session stream ended (closed by the agent, broken, or closed on our command)."""

    session_id: str
    node_id: str
    now_s: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class GoodbyeReceived:
    """A node agent said Goodbye: it leaves and its stream closes after this."""

    session_id: str
    node_id: str
    now_s: float
    reason: str = ""
    released_all: bool = False


# Changes a TaskUpdate can carry (proto TaskUpdate.change).


@dataclass(frozen=True, slots=True)
class Started:
    """The handler started, fresh (``resumed_from`` None) or from a checkpoint."""

    resumed_from: CheckpointSummary | None = None
    from_redis: bool = False
    replayed_journal_events: int = 0
    resume_point_s: float | None = None


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """A checkpoint was committed locally, or Redis acknowledged it (``checkpoint.replicated``)."""

    checkpoint: CheckpointSummary
    journal_seq: int = 0
    replicated_journal_seq: int = 0


@dataclass(frozen=True, slots=True)
class Completed:
    """The handler returned a result."""

    result: TaskResult = EMPTY_RESULT


@dataclass(frozen=True, slots=True)
class Failed:
    """The attempt failed; ``error.retryable`` says whether another attempt may succeed."""

    error: TaskError


@dataclass(frozen=True, slots=True)
class Released:
    """The owner stopped the task for a graceful move after a final replicated checkpoint."""

    move_id: str = ""
    checkpoint: CheckpointSummary | None = None
    journal_seq: int = 0


TaskChange = Started | Checkpointed | Completed | Failed | Released


@dataclass(frozen=True, slots=True)
class TaskUpdateReceived:
    """A TaskUpdate arrived: a change of one task at the epoch the agent holds it."""

    session_id: str
    node_id: str
    update_seq: int
    task_id: str
    epoch: int
    change: TaskChange
    now_s: float


# ---------------------------------------------------------------------------
# Orchestrator requests (each answered by one ReplyToRequest command).
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskSubmitted:
    """An orchestrator submitted a task; idempotent on ``request_id``.

    ``task_id`` empty asks the leader to generate one. ``forked_from_ref`` is
    set by ForkTask: the checkpoint the new task starts from (already seeded in
    Redis under the new task's id); ``fork_edits`` counts the state edits.
    ``fork_seed`` is the new task's first checkpoint, opaque to the core: only
    once the core accepted the fork does it ask the shell to write it
    (``SeedFork``, after the task's persist), and the task is not placed
    before ``ForkSeeded`` reports the outcome — a refused fork leaves nothing.
    """

    request_id: str
    spec: TaskSpec
    now_s: float
    task_id: str = ""
    forked_from_ref: str = ""
    fork_edits: int = 0
    fork_seed: bytes = b""


@dataclass(frozen=True, slots=True)
class ForkSeeded:
    """The shell ran ``SeedFork``: the forked task's first checkpoint is in Redis, or not.

    ``checkpoint`` summarises the seed written (``ok``); ``reason`` says why not.
    """

    task_id: str
    now_s: float
    ok: bool
    checkpoint: CheckpointSummary | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """An orchestrator asked to cancel a task."""

    request_id: str
    task_id: str
    now_s: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DrainRequested:
    """An operator asked to cordon a node and move its tasks gracefully.

    ``release_timeout_s`` None uses ``CoreSettings.release_timeout_s``.
    """

    request_id: str
    node_id: str
    now_s: float
    reason: str = ""
    release_timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class MigrateRequested:
    """An operator asked to move one owned task to another node gracefully (live migration).

    ``target_node_id`` empty lets placement choose among the other nodes;
    ``expected_epoch`` None skips the epoch check; ``release_timeout_s`` None
    uses ``CoreSettings.release_timeout_s``.
    """

    request_id: str
    task_id: str
    now_s: float
    target_node_id: str = ""
    expected_epoch: int | None = None
    reason: str = ""
    release_timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class UncordonRequested:
    """An operator asked to lift a node's cordon (ending its drain)."""

    request_id: str
    node_id: str
    now_s: float


# ---------------------------------------------------------------------------
# Time.
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed; the shell feeds one every ``CoreSettings.tick_interval_s``."""

    now_s: float


@dataclass(frozen=True, slots=True)
class ResignRequested:
    """This replica is about to resign (SIGTERM): write what it holds back, now.

    The core answers with the progress it had not flushed yet
    (``CoreSettings.progress_flush_interval_s``), so a graceful leader change
    loses none of it; it stays leader until the shell resigns.
    """

    now_s: float


@dataclass(frozen=True, slots=True)
class LineageReported:
    """A node reports progress it made at a stale epoch that never reached Redis.

    After a Revoke (or Redis refusing its epoch) the old owner's local store
    may hold checkpoints and journal events beyond what it replicated. It
    keeps them (a fork, DESIGN.md §7), writes a ForkRecord and the records to
    Redis under the task's hash tag, and reports them here.

    Attributes:
        fork_id: the agent's id of the fork (unique per task, node and epoch).
        task_id, epoch: the task and the stale epoch the progress was made at.
        divergent_checkpoints, divergent_events: how much diverged.
        first_journal_seq, last_journal_seq: the divergent journal range (0 = none).
        head_checkpoint_seq: the newest divergent checkpoint's seq (0 = none).
    """

    session_id: str
    node_id: str
    now_s: float
    fork_id: str
    task_id: str
    epoch: int
    divergent_checkpoints: int = 0
    divergent_events: int = 0
    first_journal_seq: int = 0
    last_journal_seq: int = 0
    head_checkpoint_seq: int = 0


Event = (
    LeadershipAcquired
    | LeadershipLost
    | PersistFailed
    | SessionOpened
    | HeartbeatReceived
    | HeartbeatDigest
    | SessionClosed
    | GoodbyeReceived
    | TaskUpdateReceived
    | TaskSubmitted
    | CancelRequested
    | DrainRequested
    | MigrateRequested
    | UncordonRequested
    | LineageReported
    | ForkSeeded
    | Tick
    | ResignRequested
)
