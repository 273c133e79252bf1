"""Domain values of the coordinator core: node and task records, and their enums.

Theory of operation: these are the plain-Python twins of the messages in
``proto/lazarus/v1/records.proto`` (``NodeRecord``, ``TaskRecord``,
``TaskSpec``, ``CheckpointSummary``, ...). The core never imports the
generated stubs; an adapter in the shell converts field by field. To keep that
adapter mechanical:

- every enum here has the same member names as its proto twin without the
  prefix (``NodeState.DEAD`` is ``NODE_STATE_DEAD``) and the same numbers, so
  ``pb.NODE_STATE_DEAD == NodeState.DEAD.value``; ``*_UNSPECIFIED`` has no
  member because the core never produces it;
- strings that the proto leaves empty for "none" are ``""`` here too
  (``owner_node_id``); optional messages are ``None``;
- times that the core decides on are ``*_s`` floats on the leader's clock (the
  clock the shell passes as ``now_s``; see ``coordinator.core.core``). The
  adapter converts them to ``*_unix_ms``; ``None`` means "never" (proto 0).
  Times written by node agents (``created_at_unix_ms`` of a checkpoint) are
  opaque to the core and stay in their wire unit;
- maps become sorted tuples of pairs (``Labels``), so records stay hashable and
  print the same way on every run.

Every value is a frozen, slotted dataclass: the core changes a record by
building a new one with ``dataclasses.replace``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "AssignReason",
    "CheckpointDurability",
    "CheckpointSummary",
    "FenceSource",
    "HeldTask",
    "HeldTaskStatus",
    "Labels",
    "MoveReason",
    "NodeLoad",
    "NodeRecord",
    "NodeState",
    "RevokeReason",
    "StateModel",
    "SuspicionReason",
    "TaskError",
    "TaskErrorCode",
    "TaskMove",
    "TaskProgress",
    "TaskRecord",
    "TaskResult",
    "TaskSpec",
    "TaskState",
    "UpdateOutcome",
    "as_labels",
    "labels_match",
]

Labels = tuple[tuple[str, str], ...]
"""A string map as a tuple of (key, value) pairs sorted by key (proto ``map<string, string>``)."""


def as_labels(mapping: Mapping[str, str] | Labels = ()) -> Labels:
    """Normalise a mapping (or pairs) into ``Labels``: sorted by key, one pair per key.

    Args:
        mapping: a dict or an iterable of (key, value) pairs; a later pair wins.

    Returns:
        The pairs sorted by key.
    """
    items = dict(mapping.items() if isinstance(mapping, Mapping) else mapping)
    return tuple(sorted(items.items()))


def labels_match(labels: Labels, selector: Labels) -> bool:
    """Tell whether ``labels`` contain every (key, value) pair of ``selector``.

    Args:
        labels: a node's labels.
        selector: a task's ``node_selector``; empty matches every node.

    Returns:
        True when each selector pair is among the labels.
    """
    if not selector:
        return True
    have = dict(labels)
    return all(have.get(key) == value for key, value in selector)


# ---------------------------------------------------------------------------
# Enums (names and numbers as in records.proto / agent.proto).
# ---------------------------------------------------------------------------


class NodeState(enum.Enum):
    """Liveness of a node agent as judged by the leader (proto ``NodeState``)."""

    ALIVE = 1
    SUSPECT = 2
    DEAD = 3
    DRAINING = 4
    LEFT = 5


class TaskState(enum.Enum):
    """Lifecycle state of a task (proto ``TaskState``)."""

    PENDING = 1
    ASSIGNED = 2
    RUNNING = 3
    COMPLETED = 4
    FAILED = 5
    CANCELLED = 6

    @property
    def terminal(self) -> bool:
        """True for COMPLETED, FAILED and CANCELLED."""
        return self.value >= 4

    @property
    def owned(self) -> bool:
        """True for ASSIGNED and RUNNING: the states in which a node owns the task."""
        return self is TaskState.ASSIGNED or self is TaskState.RUNNING


class CheckpointDurability(enum.Enum):
    """When a checkpoint call returns to the handler (proto ``CheckpointDurability``)."""

    UNSPECIFIED = 0
    LOCAL = 1
    REPLICATED = 2


class StateModel(enum.Enum):
    """Whether a task state is opaque or a CRDT document (proto ``StateModel``)."""

    UNSPECIFIED = 0
    OPAQUE = 1
    CRDT = 2


class MoveReason(enum.Enum):
    """Why a task leaves its owner other than by finishing (proto ``MoveReason``)."""

    NODE_DEAD = 1
    DRAIN = 2
    MIGRATE = 3
    REBALANCE = 4
    ASSIGN_REJECTED = 5
    RELEASE_TIMEOUT = 6


class TaskErrorCode(enum.Enum):
    """Machine-readable class of a task failure (proto ``TaskErrorCode``)."""

    HANDLER_ERROR = 1
    UNKNOWN_KIND = 2
    PAYLOAD_TOO_LARGE = 3
    RESULT_NOT_SERIALIZABLE = 4
    DEADLINE_EXCEEDED = 5
    ATTEMPTS_EXHAUSTED = 6
    CHECKPOINT_CORRUPTED = 7
    RESTORE_FAILED = 8
    INTERNAL = 9
    DATA_LOSS = 10


class SuspicionReason(enum.Enum):
    """Why the failure detector suspects a node (proto ``SuspicionReason``)."""

    STREAM_CLOSED = 1
    HEARTBEAT_TIMEOUT = 2
    PHI_THRESHOLD = 3


class FenceSource(enum.Enum):
    """Where the leader saw a node act on a stale epoch (proto ``FenceSource``)."""

    HELLO = 1
    TASK_UPDATE = 2
    CHECKPOINT_WRITE = 3


class HeldTaskStatus(enum.Enum):
    """What a node agent does with a task it lists in Hello (proto ``HeldTaskStatus``)."""

    RUNNING = 1
    PAUSED = 2
    COMPLETED = 3
    FAILED = 4
    RELEASED = 5


class AssignReason(enum.Enum):
    """Why a task is assigned to a node (proto ``AssignReason``)."""

    NEW = 1
    RETRY = 2
    MOVED = 3
    REATTACH = 4


class RevokeReason(enum.Enum):
    """Why a task is revoked from a node (proto ``RevokeReason``)."""

    CANCELLED = 1
    REASSIGNED = 2
    STALE_EPOCH = 3
    UNKNOWN_TASK = 4
    FINISHED = 5
    DEADLINE_EXCEEDED = 6
    RELEASE_TIMEOUT = 7


class UpdateOutcome(enum.Enum):
    """Verdict on one TaskUpdate (proto ``UpdateOutcome``)."""

    ACCEPTED = 1
    DUPLICATE = 2
    STALE_EPOCH = 3
    UNKNOWN_TASK = 4
    REJECTED = 5


# ---------------------------------------------------------------------------
# Values carried inside records and events.
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointSummary:
    """Metadata of one checkpoint, no payload (proto ``CheckpointSummary``)."""

    checkpoint_ref: str
    epoch: int
    seq: int
    covers_journal_seq: int = 0
    replicated: bool = False
    terminal: bool = False
    task_id: str = ""
    label: str = ""
    created_at_unix_ms: int = 0
    stored_bytes: int = 0
    node_id: str = ""
    parent_ref: str = ""


@dataclass(frozen=True, slots=True)
class TaskResult:
    """What a completed task returned (proto ``TaskResult``); opaque to the core."""

    payload: bytes = b""
    content_type: str = ""
    size_bytes: int = 0
    redis_key: str = ""
    crc32: int = 0


@dataclass(frozen=True, slots=True)
class TaskError:
    """Why an attempt failed (proto ``TaskError``)."""

    code: TaskErrorCode
    message: str = ""
    retryable: bool = False
    exception_type: str = ""
    traceback: str = ""
    node_id: str = ""
    epoch: int = 0
    attempt: int = 0
    occurred_at_unix_ms: int = 0


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """What an orchestrator asks to run; immutable after submission (proto ``TaskSpec``).

    ``slots`` 0 means 1 and ``max_attempts`` 0 means the cluster default, as on
    the wire. ``deadline_s`` is on the leader's clock (``None``: no deadline).
    """

    kind: str
    payload: bytes = b""
    content_type: str = ""
    labels: Labels = ()
    node_selector: Labels = ()
    slots: int = 1
    priority: int = 0
    max_attempts: int = 0
    deadline_s: float | None = None
    durability: CheckpointDurability = CheckpointDurability.UNSPECIFIED
    state_model: StateModel = StateModel.UNSPECIFIED
    checkpoint_interval_ms: int = 0

    @property
    def effective_slots(self) -> int:
        """Capacity slots the task occupies (``slots``, with 0 read as 1)."""
        return max(1, self.slots)


@dataclass(frozen=True, slots=True)
class TaskMove:
    """A graceful move (drain) in progress for a task (proto ``TaskMove``)."""

    move_id: str
    reason: MoveReason
    requested_at_s: float
    release_deadline_s: float
    target_node_id: str = ""


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node agent as stored in etcd (proto ``NodeRecord``); written on membership changes only."""

    node_id: str
    incarnation: str
    state: NodeState = NodeState.ALIVE
    address: str = ""
    capacity_slots: int = 1
    capacity_cpu_millicores: int = 0
    capacity_memory_bytes: int = 0
    labels: Labels = ()
    kinds: tuple[str, ...] = ()
    cordoned: bool = False
    drain_id: str = ""
    drain_reason: str = ""
    registered_at_s: float | None = None
    incarnation_started_at_s: float | None = None
    state_changed_at_s: float | None = None
    last_heartbeat_at_s: float | None = None
    agent_version: str = ""
    written_term: int = 0
    incarnation_secret_sha256: bytes = b""
    store_id: str = ""


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task as stored in etcd (proto ``TaskRecord``).

    ``epoch`` is the fencing token: 0 before the first assignment, +1 on every
    assignment. ``attempt`` is 1-based and grows when the owner is lost or a
    retryable failure happens, not on graceful moves. ``owner_node_id`` is set
    exactly while the task is ASSIGNED or RUNNING.
    """

    task_id: str
    request_id: str
    spec: TaskSpec
    state: TaskState = TaskState.PENDING
    epoch: int = 0
    attempt: int = 1
    owner_node_id: str = ""
    owner_incarnation: str = ""
    submitted_at_s: float | None = None
    assigned_at_s: float | None = None
    started_at_s: float | None = None
    finished_at_s: float | None = None
    updated_at_s: float | None = None
    last_checkpoint: CheckpointSummary | None = None
    last_replicated_checkpoint: CheckpointSummary | None = None
    last_replicated_journal_seq: int = 0
    result: TaskResult | None = None
    last_error: TaskError | None = None
    move: TaskMove | None = None
    cancel_reason: str = ""
    forked_from_ref: str = ""
    fork_count: int = 0
    previous_owner_node_ids: tuple[str, ...] = ()
    written_term: int = 0


@dataclass(frozen=True, slots=True)
class HeldTask:
    """A task a node agent still holds, as listed in its Hello (proto ``HeldTask``)."""

    task_id: str
    epoch: int
    status: HeldTaskStatus = HeldTaskStatus.RUNNING
    checkpoint_seq: int = 0
    replicated_checkpoint_seq: int = 0


@dataclass(frozen=True, slots=True)
class TaskProgress:
    """One task a node agent runs, as listed in a heartbeat (proto ``TaskProgress``, trimmed)."""

    task_id: str
    epoch: int
    checkpoint_seq: int = 0
    replicated_checkpoint_seq: int = 0


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """A node agent's load from its last heartbeat (proto ``NodeLoad``); informational."""

    running_tasks: int = 0
    used_slots: int = 0
    cpu_utilization_ratio: float = 0.0
    memory_used_bytes: int = 0
    replication_backlog_records: int = 0
    replication_lag_ms: int = 0
