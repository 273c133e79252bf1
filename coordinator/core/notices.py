"""Notices: bodies of the cluster events the leader emits (``EmitEvent``).

Theory of operation: each class is the twin of one member of the ``Event.body``
oneof in ``records.proto`` and has its name, so the adapter maps
``notices.NodeDead`` to ``Event.node_dead`` mechanically; ``EmitEvent`` adds
the term and the time. Input events (``coordinator.core.events``) are what the
shell observed; notices are what the leader concluded and publishes on
WatchEvents. Refer to them through the module (``notices.TaskSubmitted``) to
keep the two apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.core.records import (
    FenceSource,
    MoveReason,
    NodeState,
    SuspicionReason,
    TaskError,
)

__all__ = [
    "ConflictDetected",
    "IdentityConflict",
    "MassFailureGuardChanged",
    "NodeDead",
    "NodeDraining",
    "NodeJoined",
    "NodeLeft",
    "NodeRecovered",
    "NodeSuspected",
    "NodeUncordoned",
    "Notice",
    "RecordQuarantined",
    "RecoveryCompleted",
    "TaskAssigned",
    "TaskCancelled",
    "TaskCompleted",
    "TaskFailed",
    "TaskForked",
    "TaskReassigned",
    "TaskResumed",
    "TaskStarted",
    "TaskSubmitted",
    "ZombieFenced",
]


@dataclass(frozen=True, slots=True)
class NodeJoined:
    """A node said Hello for the first time, or with a new incarnation."""

    node_id: str
    incarnation: str
    previous_incarnation: str = ""
    address: str = ""
    held_tasks: int = 0


@dataclass(frozen=True, slots=True)
class IdentityConflict:
    """A Hello was refused: another live incarnation holds the node id (or reused its id)."""

    node_id: str
    holder_incarnation: str
    claimant_incarnation: str
    claimant_address: str = ""
    holder_heard_ago_s: float | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class NodeSuspected:
    """A node became SUSPECT."""

    node_id: str
    incarnation: str
    reason: SuspicionReason
    last_heartbeat_at_s: float | None
    phi: float = 0.0


@dataclass(frozen=True, slots=True)
class NodeRecovered:
    """A SUSPECT or DEAD node is ALIVE again (same incarnation)."""

    node_id: str
    incarnation: str
    previous_state: NodeState
    unavailable_s: float


@dataclass(frozen=True, slots=True)
class NodeDead:
    """A node was declared DEAD after ``detection_s`` of silence."""

    node_id: str
    incarnation: str
    last_heartbeat_at_s: float | None
    detection_s: float
    tasks_to_move: int


@dataclass(frozen=True, slots=True)
class NodeDraining:
    """A node was cordoned and its tasks are asked to release."""

    node_id: str
    drain_id: str
    reason: str
    tasks_to_move: int


@dataclass(frozen=True, slots=True)
class NodeUncordoned:
    """A cordon was lifted."""

    node_id: str
    drain_id: str


@dataclass(frozen=True, slots=True)
class NodeLeft:
    """A node left gracefully (Goodbye)."""

    node_id: str
    incarnation: str
    reason: str
    tasks_to_move: int


@dataclass(frozen=True, slots=True)
class MassFailureGuardChanged:
    """The mass-failure guard engaged (redistribution stopped) or released."""

    active: bool
    dead_nodes: int
    total_nodes: int
    threshold_ratio: float


@dataclass(frozen=True, slots=True)
class TaskSubmitted:
    """A task was accepted."""

    task_id: str
    kind: str
    request_id: str


@dataclass(frozen=True, slots=True)
class TaskForked:
    """A task was created from another task's checkpoint (ForkTask)."""

    task_id: str
    from_checkpoint_ref: str
    edits: int


@dataclass(frozen=True, slots=True)
class TaskAssigned:
    """A task was placed for the first time or for a retry."""

    task_id: str
    node_id: str
    epoch: int
    attempt: int


@dataclass(frozen=True, slots=True)
class TaskReassigned:
    """A task moved from one node to another."""

    task_id: str
    from_node_id: str
    to_node_id: str
    epoch: int
    attempt: int
    reason: MoveReason
    resume_seq: int = 0
    resume_covers_journal_seq: int = 0


@dataclass(frozen=True, slots=True)
class TaskStarted:
    """An owner started a task without a checkpoint to restore."""

    task_id: str
    node_id: str
    epoch: int
    attempt: int


@dataclass(frozen=True, slots=True)
class TaskResumed:
    """An owner started a task from a checkpoint.

    ``redone_checkpoints`` > 0 is a data-loss event: the owner resumed from a
    checkpoint older than the newest one the task's records show replicated
    (it must stay 0). ``interruption_s``: from losing the previous owner (or
    its release) to this start, seconds; 0 for a first start.
    ``work_redone_s``: an upper bound of the work the new owner redoes: from
    the newest record it restored to the last time the previous owner was
    heard from (its clock vs ours: skew adds to it), seconds; 0 when the
    previous owner stopped gracefully or nothing was lost.
    """

    task_id: str
    node_id: str
    epoch: int
    resumed_from_seq: int
    from_redis: bool = False
    replayed_journal_events: int = 0
    redone_checkpoints: int = 0
    interruption_s: float = 0.0
    work_redone_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TaskCompleted:
    """A task completed."""

    task_id: str
    node_id: str
    epoch: int
    attempt: int
    result_bytes: int
    total_s: float


@dataclass(frozen=True, slots=True)
class TaskFailed:
    """An attempt failed; ``will_retry`` False means the task is now FAILED."""

    task_id: str
    node_id: str
    epoch: int
    error: TaskError
    will_retry: bool


@dataclass(frozen=True, slots=True)
class TaskCancelled:
    """A task was cancelled."""

    task_id: str
    node_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class ConflictDetected:
    """A fenced owner's divergent progress was kept as a fork (never silently dropped).

    ``current_epoch`` / ``current_owner_node_id``: who owns the task now.
    """

    fork_id: str
    task_id: str
    node_id: str
    stale_epoch: int
    current_epoch: int
    current_owner_node_id: str
    divergent_checkpoints: int
    divergent_events: int
    first_journal_seq: int
    last_journal_seq: int
    head_checkpoint_seq: int


@dataclass(frozen=True, slots=True)
class RecoveryCompleted:
    """Every task a DEAD (or LEFT) node held runs elsewhere again, or has ended.

    ``recovery_s``: from the DEAD verdict to the last of its tasks RUNNING on a
    new owner (the recovery-time metric of state_recovery_patterns.md);
    ``detection_s``: the node's silence before the verdict.
    """

    node_id: str
    incarnation: str
    tasks_recovered: int
    tasks_failed: int
    detection_s: float
    recovery_s: float


@dataclass(frozen=True, slots=True)
class ZombieFenced:
    """A node acting on a stale epoch was told to drop the task."""

    node_id: str
    incarnation: str
    task_id: str
    stale_epoch: int
    current_epoch: int
    current_owner_node_id: str
    source: FenceSource


@dataclass(frozen=True, slots=True)
class RecordQuarantined:
    """A record loaded from etcd did not parse or broke the core's rules; it was moved aside.

    Attributes:
        collection: ``"nodes"`` or ``"tasks"``.
        name: its name in the collection.
        reason: the rule it broke (``coordinator.core.loadcheck``).
    """

    collection: str
    name: str
    reason: str


Notice = (
    NodeJoined
    | IdentityConflict
    | NodeSuspected
    | NodeRecovered
    | NodeDead
    | NodeDraining
    | NodeUncordoned
    | NodeLeft
    | MassFailureGuardChanged
    | TaskSubmitted
    | TaskAssigned
    | TaskReassigned
    | TaskStarted
    | TaskResumed
    | TaskCompleted
    | TaskFailed
    | TaskCancelled
    | ZombieFenced
    | RecoveryCompleted
    | ConflictDetected
    | TaskForked
    | RecordQuarantined
)
